"""``gpinfer-run`` / ``python -m gpinfer`` as real subprocesses: errors, sweeps, joblib.

Every subprocess gets a temporary MLflow store (``MLFLOW_TRACKING_URI``) and temporary Hydra
output folders, and sees the toy plugin through ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .helpers import REPO, require_plugin

GPINFER_RUN = Path(sys.executable).with_name("gpinfer-run")
TIMEOUT_S = 240


#: the toy methods run on a binary dataset with laplace's (empty) option set, whatever the
#: project's default experiment is
TOY_BASE = ("method=laplace", "dataset=breast_cancer")
TOY_METHOD = (*TOY_BASE, "method.name=toygp")

def _env(tmp_path: Path, toy_site: Path) -> tuple[dict[str, str], str]:
    """Environment for a subprocess: a fresh store in ``tmp_path``, the toy plugin importable."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONPATH": os.pathsep.join([str(toy_site), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("HYDRA_FULL_ERROR", None)  # the one-line error messages are under test
    return env, uri


def _run(args: list[str], tmp_path: Path, toy_site: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``args`` in ``tmp_path`` with a fresh store; returns the process and the store URI."""
    env, uri = _env(tmp_path, toy_site)
    proc = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    return proc, uri


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpinfer")
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=100)


def test_module_entry_point_composes_the_config(tmp_path: Path, toy_site: Path) -> None:
    proc, _ = _run([sys.executable, "-m", "gpinfer", "--cfg", "job"], tmp_path, toy_site)
    assert proc.returncode == 0, proc.stderr
    for line in ("name: sep", "name: waveform", "name: rbf", "name: lbfgs", "M: null",
                 "seed: 0", "iterations: 50", "optimize: null", "eval_every: 10",
                 "experiment: gpinfer"):
        assert line in proc.stdout, line


def test_bad_name_is_one_clear_line(tmp_path: Path, toy_site: Path) -> None:
    proc, uri = _run(
        [str(GPINFER_RUN), *TOY_BASE, "method.name=toygq", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        toy_site,
    )
    assert proc.returncode == 1
    assert "unknown method 'toygq'" in proc.stderr and "did you mean 'toygp'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # rejected before it started: no folder at all
    assert not (tmp_path / "mlflow.db").exists()  # failed before the store was even opened


def test_a_rejected_job_of_a_sweep_leaves_no_folder(tmp_path: Path, toy_site: Path) -> None:
    sweep = tmp_path / "sweep"
    proc, _ = _run(
        [str(GPINFER_RUN), "-m", *TOY_BASE, "method.name=toygq,toygp", "method.likelihood=null",
         "iterations=2", "mlflow.log_model=false", "mlflow.log_datasets=false",
         "mlflow.log_plots=false", f"hydra.sweep.dir={sweep}"],
        tmp_path, toy_site,
    )
    assert proc.returncode == 1 and "unknown method 'toygq'" in proc.stderr
    jobs = sorted(p.name for p in sweep.iterdir()
                  if p.is_dir() and p.name not in (".hydra", "rejected"))
    assert len(jobs) == 1 and (sweep / jobs[0] / "result.json").is_file()  # the toygp job
    assert len(list((sweep / "rejected").glob("*.json"))) == 1  # the report's record of toygq
    assert proc.stdout.count("FINISHED: toygp on breast_cancer") == 1


def test_only_a_folder_holding_nothing_but_hydra_files_is_removed(tmp_path: Path,
                                                                   monkeypatch) -> None:
    import logging

    from gpinfer.experiment.app import remove_unstarted_run_folder

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    handler = logging.FileHandler(run / "gpinfer.log")
    logging.getLogger().addHandler(handler)
    try:
        (run / "result.json").write_text("{}")  # the run started: kept
        assert not remove_unstarted_run_folder(run, ".hydra") and run.is_dir()
        (run / "result.json").unlink()
        assert remove_unstarted_run_folder(run, ".hydra") and not run.exists()
        assert handler not in logging.getLogger().handlers  # closed and detached first
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    (tmp_path / ".hydra").mkdir()
    assert not remove_unstarted_run_folder(tmp_path, ".hydra")  # never the working directory


def test_unwritable_output_folder_is_one_clear_line(tmp_path: Path, toy_site: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for args in (
        [f"hydra.run.dir={blocker / 'run'}"],
        ["-m", "seed=0,1", f"hydra.sweep.dir={blocker / 'sweep'}"],
    ):
        proc, _ = _run([str(GPINFER_RUN), *args, *TOY_METHOD], tmp_path, toy_site)
        assert proc.returncode == 1
        assert "output folder" in proc.stderr and "a_file" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_fit_no_better_than_the_class_frequencies_fails_the_run(
    tmp_path: Path, toy_site: Path
) -> None:
    """An untrained svi (one Adadelta step from the prior) on breast_cancer: one clear line, exit
    status 1, result.json and the MLflow run FAILED with the fit guard's numbers."""
    require_plugin("svi")
    run_dir = tmp_path / "run"
    proc, uri = _run([str(GPINFER_RUN), "method=svi", "dataset=breast_cancer", "M=5",
                      "iterations=1", "method.options.optimizer=adadelta",
                      "mlflow.log_model=false", f"hydra.run.dir={run_dir}"], tmp_path, toy_site)
    assert proc.returncode == 1, proc.stderr
    assert "no better than predicting the class frequencies" in proc.stderr
    assert "Traceback" not in proc.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "FAILED" and result["fit_warnings"] == ["no_better_than_baseline"]
    assert result["train_nll"] > result["baseline_nll"]
    run = MlflowClient(uri).get_run(result["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["fit_warnings"] == "no_better_than_baseline"


def test_ctrl_c_ends_the_mlflow_run_killed(tmp_path: Path, toy_site: Path) -> None:
    require_plugin("toygp")
    env, uri = _env(tmp_path, toy_site)
    run_dir = tmp_path / "run"
    err_path = tmp_path / "stderr.txt"
    args = [str(GPINFER_RUN), *TOY_METHOD, "method.likelihood=null",
            "+method.options.sleep_s=0.05", "iterations=2000", "progress.bar=true",
            f"hydra.run.dir={run_dir}"]
    with open(err_path, "w") as err:
        # a test session started in the background (``cmd &`` in a script) inherits SIGINT as
        # ignored, and Python keeps it ignored; a user's Ctrl-C is what is tested, so restore it
        proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=err, stderr=err,
                                preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 60.0
        # training is under way: the bar (redrawn every half second) is past iteration 3
        while max(map(int, re.findall(r"\| *(\d+)/2000 \[", err_path.read_text())),
                  default=0) < 3:
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "KILLED" and result["n_iter"] >= 3
    client = MlflowClient(uri)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "KILLED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "objective")]
    assert steps[:3] == [1, 2, 3] and len(steps) >= result["n_iter"] - 1


def test_laplace_multirun_two_by_two(tmp_path: Path, toy_site: Path) -> None:
    require_plugin("laplace")
    sweep = tmp_path / "sweep"
    proc, uri = _run(
        [str(GPINFER_RUN), "-m", "method=laplace", "dataset=breast_cancer",
         "kernel=rbf,matern52", "seed=0,1", "iterations=3", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        toy_site,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted(sweep.glob("*/result.json"))
    assert len(found) == 4
    combos = set()
    for path in found:
        result = json.loads(path.read_text())
        assert result["status"] == "FINISHED" and result["method"] == "laplace"
        assert 0.0 <= result["test_error"] <= 0.2 and result["n_iter"] >= 1
        combos.add((result["kernel"], result["seed"]))
    assert combos == {("rbf", 0), ("rbf", 1), ("matern52", 0), ("matern52", 1)}
    runs = _runs(uri)  # the training runs alone: the report run has its own experiment
    client = MlflowClient(uri)
    reports = client.search_runs([client.get_experiment_by_name("gpinfer-reports").experiment_id])
    assert not any(r.data.tags.get("gpinfer.kind") == "report" for r in runs)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.info.run_name for r in runs}) == 4  # readable and unique
    assert {r.data.tags["method.distribution"] for r in runs} == {"gpinfer-laplace"}
    assert proc.stdout.count("FINISHED: laplace on breast_cancer") == 4  # one line per run
    # the sweep report: printed, written into the sweep folder, logged as one MLflow run
    assert "Sweep report (4 finished of 4 job(s))" in proc.stdout
    # the folders name the swept keys (kernel, seed) after the method and the dataset
    assert sorted(p.parent.name for p in found) == [
        "0_laplace_breast_cancer_kernel=rbf,seed=0", "1_laplace_breast_cancer_kernel=rbf,seed=1",
        "2_laplace_breast_cancer_kernel=matern52,seed=0",
        "3_laplace_breast_cancer_kernel=matern52,seed=1"]
    table = (sweep / "report.md").read_text()
    assert "| laplace | breast_cancer | matern52 | 2 |" in table
    assert "| laplace | breast_cancer | rbf | 2 |" in table
    assert (sweep / "report.csv").read_text().count("\n") == 3  # header + two groups
    assert len(reports) == 1 and reports[0].info.status == "FINISHED"
    logs = sorted(sweep.glob("*/gpinfer.log"))  # each run's log holds that run's lines
    assert len(logs) == 4
    for log in logs:
        text = log.read_text()
        assert "FINISHED: laplace on breast_cancer" in text and "learned.kernel." in text


def test_joblib_sweep_runs_in_parallel_and_survives_a_failed_job(
    tmp_path: Path, toy_site: Path
) -> None:
    require_plugin("toygp")
    sweep = tmp_path / "sweep"
    proc, uri = _run(
        [str(GPINFER_RUN), "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         *TOY_METHOD, "method.likelihood=null", "+method.options.fail_at=0,3",
         "seed=0,1", "iterations=4", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        toy_site,
    )
    assert proc.returncode == 1  # two jobs failed; the sweep still ran all four
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("NumericalError: toy: Cholesky of B failed (iteration 3") >= 2
    statuses = sorted(json.loads(p.read_text())["status"] for p in sweep.glob("*/result.json"))
    assert statuses == ["FAILED", "FAILED", "FINISHED", "FINISHED"]
    runs = [r for r in _runs(uri) if r.data.tags.get("gpinfer.kind") != "report"]
    assert sorted(r.info.status for r in runs) == statuses
    # Hydra skips on_multirun_end after a failed job; the sweeper reports all the same
    assert "| toygp | breast_cancer | 2 (2 failed) |" in (sweep / "report.md").read_text()
    assert {r.data.tags.get("hydra.job.num") for r in runs} == {"0", "1", "2", "3"}
    assert "joblib" in (sweep / "multirun.yaml").read_text()


def test_repository_conf_is_the_one_used() -> None:
    from gpinfer.experiment.app import CONF_DIR

    assert CONF_DIR == REPO / "conf" and (CONF_DIR / "config.yaml").is_file()
    for group, names in {
        "method": ["laplace"],
        "kernel": ["rbf", "matern32", "matern52", "linear"],
        "optimizer": ["lbfgs", "adam", "adadelta"],
        "dataset": ["breast_cancer", "waveform", "wine", "iris", "digits", "synthetic2d", "file",
                    "new_thyroid", "svmguide2", "vowel", "australian", "crabs", "ionosphere",
                    "sonar", "german", "mnist", "ijcnn1"],
    }.items():
        present = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
        assert set(names) <= present, f"conf/{group} lacks {sorted(set(names) - present)}"



@pytest.mark.parametrize(("status", "code"), [(None, 0), (3, 3), ("a message", 1)])
def test_the_fast_exit_keeps_atexit_handlers_output_and_status(status, code) -> None:
    """``exit_without_teardown`` skips the interpreter's module teardown only: atexit handlers
    run, buffered output arrives, the status means what ``SystemExit``'s does."""
    script = ("import atexit, sys; from gpinfer.experiment.app import exit_without_teardown; "
              "atexit.register(lambda: print(' atexit ran')); sys.stdout.write('buffered'); "
              f"exit_without_teardown({status!r})")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == code
    assert proc.stdout == "buffered atexit ran\n"
    assert proc.stderr == ("a message\n" if code == 1 else "")
