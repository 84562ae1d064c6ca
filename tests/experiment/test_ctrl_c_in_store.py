"""Ctrl-C inside MLflow's own database calls while a run is set up: one line, exit 130, and the
run (where one was created) ends KILLED.

The child ``gpinfer-run`` gets a ``sitecustomize`` (on its ``PYTHONPATH``, test-only) that
pauses inside SQLite's execution of the first statement matching a pattern (SQLite's progress
handler, armed by a listener on every engine's ``before_cursor_execute``) and says so in a
marker file; the test sends SIGINT
there, then lets the statement go on. The signal therefore lands inside MLflow's call, every
time, with no timing guesses.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .helpers import require_plugin
from .test_app import GPINFER_RUN, TOY_METHOD, _default_sigint, _env

SITECUSTOMIZE = '''
import os
import re
import time

if os.environ.get("GPINFER_TEST_PAUSE_SQL"):
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    _PATTERN = re.compile(os.environ["GPINFER_TEST_PAUSE_SQL"], re.IGNORECASE | re.DOTALL)
    _MARK, _GO = os.environ["GPINFER_TEST_PAUSE_MARK"], os.environ["GPINFER_TEST_PAUSE_GO"]
    _armed = [False]

    def _inside_sqlite():  # SQLite's progress handler: called from inside its C execution
        if _armed[0]:
            _armed[0] = False
            open(_MARK, "w").close()
            deadline = time.monotonic() + 60.0
            while not os.path.exists(_GO) and time.monotonic() < deadline:
                time.sleep(0.01)
        return 0

    @event.listens_for(Engine, "connect")
    def _connect(dbapi_connection, record):
        dbapi_connection.set_progress_handler(_inside_sqlite, 1)

    @event.listens_for(Engine, "before_cursor_execute")
    def _arm(conn, cursor, statement, parameters, context, executemany):
        _armed[0] = bool(_PATTERN.search(statement)) and not os.path.exists(_MARK)
'''


@pytest.mark.parametrize("statement, run_created", [
    (r"^\s*SELECT\b.*\bFROM experiments\b", False),  # RunLogger opens the store, finds the experiment
    (r"^\s*INSERT INTO runs", True),             # create_run
    (r"^\s*INSERT INTO params", True),           # the run's params (log_batch)
])
def test_ctrl_c_inside_mlflow_while_a_run_is_set_up_is_one_line(
    tmp_path: Path, toy_site: Path, statement: str, run_created: bool
) -> None:
    require_plugin("toygp")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env, uri = _env(tmp_path, toy_site)
    # the store's tables first (a new store runs MLflow's migrations, statements of their own)
    MlflowClient(uri).search_experiments()
    mark, go = tmp_path / "paused", tmp_path / "go"
    env.update(PYTHONPATH=f"{hook}:{env['PYTHONPATH']}", GPINFER_TEST_PAUSE_SQL=statement,
               GPINFER_TEST_PAUSE_MARK=str(mark), GPINFER_TEST_PAUSE_GO=str(go))
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [str(GPINFER_RUN), *TOY_METHOD, "method.likelihood=null", "iterations=2",
             "mlflow.log_model=false", "mlflow.log_datasets=false", "mlflow.log_plots=false",
             f"hydra.run.dir={run_dir}"],
            cwd=tmp_path, env=env, stdout=fh, stderr=fh, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 120.0
        while not mark.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # the child sits inside SQLAlchemy's execute
        time.sleep(0.2)
        go.touch()
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = log.read_text()
    assert status == 130, text[-3000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert [line for line in text.splitlines() if line.strip()] == [
        "gpinfer-run: interrupted (a run in progress ends KILLED in MLflow; a sweep reports its "
        "finished jobs)"], text[-3000:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpinfer")
    runs = [] if exp is None else client.search_runs([exp.experiment_id])
    # the statement was completed (the Ctrl-C waited for it): the run exists from its INSERT on
    assert [r.info.status for r in runs] == (["KILLED"] if run_created else [])
