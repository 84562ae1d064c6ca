"""Issue 16 through the runner: bad input refused before any MLflow run, runs of killed processes
ended as KILLED, and tracking URIs without credentials wherever they are printed or stored."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.cli import main as gpinfer_main
from gpinfer.errors import InputError
from gpinfer.experiment import stale_runs
from gpinfer.experiment.redact import redact_text, redact_uri, scrub_files
from gpinfer.experiment.runner import run_experiment

from .helpers import compose_cfg
from .test_app import GPINFER_RUN, TOY_METHOD, _env
from .test_server import mlflow_server  # noqa: F401  (the fixture of a real mlflow server)

pytestmark = pytest.mark.usefixtures("toy_site")


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              max_results=1000)


# --------------------------------------------------------------------------------------------
# bad input: one InputError, no MLflow run
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (["method=sep", "dataset=iris", "method.options.damping=abc"],
         r"method 'sep': option 'damping' = 'abc' is not allowed; expected a real number in "
         r"\(0, 1\]"),
        (["method=sep", "dataset=iris", "method.options.damping=7"],
         r"method 'sep': option 'damping' = 7 is not allowed"),
        (["method=ep", "dataset=iris", "method.options.outer_tol=-0.001"],
         r"method 'ep': option 'outer_tol' = -0.001 is not allowed; expected a real number in "
         r"\(0, inf\)"),
        (["method=pep", "method.options.max_sweeps=0"],
         r"method 'pep': option 'max_sweeps' = 0 is not allowed; expected an integer in \[1, "),
        (["method=svi", "method.options.optimizer=sgd"],
         r"method 'svi': option 'optimizer' = 'sgd' is not allowed; expected one of 'adadelta'"),
    ],
    ids=["sep-damping-abc", "sep-damping-7", "ep-negative-tol", "pep-zero-sweeps", "svi-sgd"],
)
def test_bad_method_option_is_refused_before_any_run(tmp_path, store_uri, overrides, pattern):
    before = len(_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", *overrides)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(_runs(store_uri)) == before
    assert not (tmp_path / "run" / "result.json").exists()


def test_oversized_libsvm_file_is_refused_before_any_run(tmp_path, store_uri, monkeypatch):
    monkeypatch.delenv("GPINFER_MAX_DENSE_GB", raising=False)
    path = tmp_path / "stray.libsvm"
    lines = [f"{1 if i % 2 else -1} 1:{0.01 * i:.2f} 2:0.5" for i in range(79)]
    path.write_text("\n".join([*lines, "1 1:0.5 2000000000:1.0"]) + "\n")
    before = len(_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method.name=toygp",
                      "method.likelihood=null", "dataset=file", f"dataset.path='{path}'")
    with pytest.raises(InputError, match=r"80 x 2000000000 float64 = 1280 GB, more than the "
                                         r"limit of 4 GB .*max_dense_gb="):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(_runs(store_uri)) == before


def test_gpinfer_run_prints_one_line_for_a_bad_option(tmp_path, toy_site):
    """The issue's command: one error line, exit status 1, no traceback, no run."""
    env, uri = _env(tmp_path, toy_site)
    proc = subprocess.run(
        [str(GPINFER_RUN), "method=sep", "method.options.damping=abc", "dataset=iris",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert any("option 'damping' = 'abc' is not allowed" in ln for ln in lines), proc.stderr
    assert not Path(uri.removeprefix("sqlite:///")).exists() or _runs(uri) == []


# --------------------------------------------------------------------------------------------
# runs of killed processes
# --------------------------------------------------------------------------------------------


def test_run_of_a_sigkilled_process_is_ended_by_the_next_run(tmp_path, toy_site):
    """A real ``gpinfer-run`` killed by SIGKILL leaves its run RUNNING; the next run in the same
    store ends it as KILLED (host and pid recorded as tags); the CLI then finds nothing."""
    env, uri = _env(tmp_path, toy_site)
    err_path = tmp_path / "stderr.txt"
    args = [str(GPINFER_RUN), *TOY_METHOD, "method.likelihood=null",
            "+method.options.sleep_s=0.05", "iterations=2000", "progress.bar=true",
            f"hydra.run.dir={tmp_path / 'killed'}"]
    with open(err_path, "w") as err:
        proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 90.0
        while not re.search(r" [1-9]\d*/2000 ", err_path.read_text()):  # training is under way
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    (killed,) = _runs(uri)
    assert killed.info.status == "RUNNING"  # nothing ended it
    assert killed.data.tags[stale_runs.PID_TAG] == str(proc.pid)
    assert killed.data.tags[stale_runs.HOST_TAG] == os.uname().nodename

    cfg = compose_cfg(f"mlflow.tracking_uri='{uri}'", "method.name=toygp",
                      "method.likelihood=null", "iterations=2")
    notes = io.StringIO()
    result = run_experiment(cfg, output_dir=tmp_path / "next", progress_stream=notes)
    client = MlflowClient(uri)
    ended = client.get_run(killed.info.run_id)
    assert ended.info.status == "KILLED" and ended.info.end_time is not None
    assert f"process {proc.pid} on" in ended.data.tags[stale_runs.ENDED_BY_TAG]
    assert f"ended stale run {killed.info.run_id}" in notes.getvalue()
    assert client.get_run(result["mlflow_run_id"]).info.status == "FINISHED"

    out = io.StringIO()
    assert gpinfer_main(["end-stale-runs", "--tracking-uri", uri], out=out) == 0
    assert "0 stale run(s) ended" in out.getvalue()


def test_live_runs_are_left_alone_and_other_hosts_need_idle_hours(tmp_path):
    """A run of a live process (this one) is not stale; a run of another host is ended only
    with ``--idle-hours`` once nothing was logged for that long (the CLI for shared stores)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("stale")
    live = client.create_run(exp, tags=stale_runs.run_tags()).info.run_id
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    reused = client.create_run(exp, tags={**stale_runs.run_tags(),  # this pid, another start
                                          stale_runs.PID_START_TAG: "1.0"}).info.run_id
    gone = client.create_run(exp, tags={**stale_runs.run_tags(),
                                        stale_runs.PID_TAG: str(dead_pid.pid)}).info.run_id
    other = client.create_run(exp, tags={stale_runs.HOST_TAG: "elsewhere",
                                         stale_runs.PID_TAG: "1"}).info.run_id
    found = {r.run_id: r.reason for r in stale_runs.find_stale_runs(client)}
    assert set(found) == {reused, gone}
    assert f"process {dead_pid.pid} on" in found[gone]

    out = io.StringIO()
    assert gpinfer_main(["end-stale-runs", "--tracking-uri", uri, "--dry-run"], out=out) == 0
    assert "2 stale run(s) would end" in out.getvalue()
    assert client.get_run(gone).info.status == "RUNNING"
    found = stale_runs.find_stale_runs(client, idle_hours=1.0, now=time.time() + 7200)
    assert {r.run_id for r in found} == {reused, gone, other}
    assert "nothing logged for 2.0 h (>= 1 h) by process 1 on elsewhere" in \
        {r.run_id: r.reason for r in found}[other]
    assert gpinfer_main(["end-stale-runs", "--tracking-uri", uri, "--experiment", "stale"],
                        out=io.StringIO()) == 0
    status = {r: client.get_run(r).info.status for r in (live, reused, gone, other)}
    assert status == {live: "RUNNING", reused: "KILLED", gone: "KILLED", other: "RUNNING"}


def test_end_stale_runs_refuses_bad_arguments(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("x")
    assert gpinfer_main(["end-stale-runs", "--tracking-uri", uri, "--idle-hours", "-1"]) == 2
    assert "idle_hours must be a positive number of hours, got -1.0" in capsys.readouterr().err
    assert gpinfer_main(["end-stale-runs", "--tracking-uri", uri, "--experiment", "nope"]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# credentials in the tracking URI
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, safe",
    [
        ("https://alice:s3cret@mlflow.example.org/", "https://mlflow.example.org/"),
        ("http://alice@127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("postgresql://u:p%40ss@db:5432/mlflow?password=x&sslmode=require",
         "postgresql://db:5432/mlflow?sslmode=require"),
        ("https://host/path?token=abc", "https://host/path"),
        ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db"),
        ("file:///tmp/mlruns", "file:///tmp/mlruns"),
        ("databricks", "databricks"),
        (None, None),
    ],
)
def test_redact_uri(uri, safe):
    assert redact_uri(uri) == safe


def test_redact_text_and_scrub_files(tmp_path):
    uri = "https://alice:s3cret@h.example/"
    (tmp_path / ".hydra").mkdir()
    over = tmp_path / ".hydra" / "overrides.yaml"
    over.write_text(f"- mlflow.tracking_uri='{uri}'\n- seed=1\n")
    (tmp_path / ".hydra" / "other.yaml").write_text("seed: 1\n")
    assert scrub_files(tmp_path / ".hydra", uri) == [over]
    assert over.read_text() == "- mlflow.tracking_uri='https://h.example/'\n- seed=1\n"
    assert redact_text(f"see {uri} now", uri) == "see https://h.example/ now"
    assert scrub_files(tmp_path / ".hydra", "sqlite:///x.db") == []


@pytest.mark.network
def test_credentials_never_printed_or_stored(tmp_path, mlflow_server, monkeypatch):  # noqa: F811
    """A run against a server URI with user and password: the run works (the credentials go
    to MLflow's variables), and neither result.json, the summary line, the params, the tags,
    the config artifact nor Hydra's record of the overrides holds the password."""
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "-")  # put back as it was after the test
    host = mlflow_server.removeprefix("http://")
    uri = f"http://alice:s3cret@{host}"
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- mlflow.tracking_uri='{uri}'\n")
    cfg = compose_cfg(f"mlflow.tracking_uri='{uri}'", "mlflow.experiment=creds",
                      "method.name=toygp", "method.likelihood=null", "iterations=3")
    printed = io.StringIO()
    result = run_experiment(cfg, output_dir=run_dir, stream=printed)
    assert result["status"] == "FINISHED"
    stored = [printed.getvalue(), (run_dir / "result.json").read_text(),
              (run_dir / "config.yaml").read_text(),
              (run_dir / ".hydra" / "overrides.yaml").read_text()]
    run = MlflowClient(mlflow_server).get_run(result["mlflow_run_id"])
    stored += [json.dumps(run.data.params), json.dumps(run.data.tags)]
    for text in stored:
        assert "s3cret" not in text and "alice" not in text
    assert json.loads(stored[1])["mlflow_tracking_uri"] == mlflow_server
    assert run.data.params["mlflow.tracking_uri"] == mlflow_server


def test_mcmc_ais_runs_with_its_defaults_through_the_runner(tmp_path, store_uri):
    """``optimize: null`` (the config's default) means the method's default: fixed
    hyper-parameters for AIS, which has no gradient (it used to fail with optimize=true)."""
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=mcmc-ais",
                      "dataset=breast_cancer", "dataset.n_max=60", "iterations=3",
                      "method.options.budget=tiny")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    assert result["status"] == "FINISHED" and result["optimize"] is False
    assert 1 <= result["n_iter"] <= 3 and result["test_error"] < 0.2
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert run.data.params["optimize"] == "null"
