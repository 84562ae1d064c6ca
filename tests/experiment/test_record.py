"""One record per run (issue 26): the terminal line, ``result.json``, MLflow and both reports
(the sweep report, from the run folders, and ``gpinfer report``, from MLflow) show the same
numbers, for default-config runs whose iterations are (20) and are not (25) multiples of
``eval_every`` (10): the first used to lose its final numbers to the last periodic evaluation.

The runs are real ``gpinfer-run`` processes (one multirun) on a temporary SQLite store.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer import cli
from gpinfer.experiment import report

GPINFER_RUN = Path(sys.executable).with_name("gpinfer-run")
#: the numbers every place must agree on, with the format of the terminal line
NUMBERS = (("test_error", "test error", ".4f"), ("test_nll", "test NLL", ".4f"))


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_terminal_result_json_mlflow_and_both_reports_agree(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(GPINFER_RUN), "-m", "iterations=20,25", "mlflow.log_model=false",
         "mlflow.log_datasets=false", "mlflow.log_plots=false", "hydra.sweep.dir=sweep"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the terminal: one line per run, paths relative to the working directory
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FINISHED: sep on waveform")]
    assert len(lines) == 2
    assert str(tmp_path) not in "\n".join(lines)
    by_run = {re.search(r"MLflow run (\w+) in sqlite:///mlflow\.db$", ln).group(1): ln
              for ln in lines}

    results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]
    assert sorted(r["n_iter"] for r in results) == [20, 25]
    client = MlflowClient(uri)
    from_folder = {r.run_id: r for r in report.collect_folder(sweep)}
    from_mlflow = {r.run_id: r for r in report.collect_experiment("gpinfer", uri)}
    for result in results:
        run_id = result["mlflow_run_id"]
        line = by_run[run_id]
        metrics = client.get_run(run_id).data.metrics
        assert f" in {result['train_time_s']:.2f} s" in line
        for key, label, fmt in NUMBERS:
            value = result[key]
            assert f"{label} {value:{fmt}}" in line, (key, line)
            assert metrics[key] == value, key  # MLflow's value of the key: the final number
            assert from_folder[run_id].metrics[key] == value, key  # the sweep report's source
            assert from_mlflow[run_id].metrics[key] == value, key  # gpinfer report's source
            history = client.get_metric_history(run_id, key)
            assert [(m.step, m.value) for m in history] == [(result["n_iter"], value)]
        for key in ("log_evidence", "train_time_s", "n_iter", "peak_rss_mb"):
            assert metrics[key] == result[key], key
        # the periodic evaluations are a history of their own (eval/...); the last iteration
        # is evaluated once, by the final evaluation
        steps = [m.step for m in client.get_metric_history(run_id, "eval/test_error")]
        assert steps == list(range(10, result["n_iter"], 10))

    # the two reports: the same table, whichever source they read
    printed = io.StringIO()
    status = cli.main(["report", "gpinfer", "--tracking-uri", uri, "--out",
                       str(tmp_path / "from_mlflow"), "--no-mlflow"], out=printed)
    assert status == 0
    sweep_rows = _csv(sweep / report.REPORT_CSV)
    mlflow_rows = _csv(tmp_path / "from_mlflow" / report.REPORT_CSV)
    assert sweep_rows == mlflow_rows and len(sweep_rows) == 1
    mean = sum(r["test_error"] for r in results) / 2
    assert float(sweep_rows[0]["test_error_mean"]) == pytest.approx(mean, rel=1e-15)
    table = (sweep / report.REPORT_MD).read_text()
    assert printed.getvalue().split("\n\n")[0] in table  # the printed table is the sweep's


def test_runs_logged_before_the_change_still_open_in_gpinfer_report(tmp_path: Path) -> None:
    """A run of the old layout (test metrics every eval_every under test_error, the final
    numbers at the same keys) is read as before: the latest value of each key."""
    uri = f"sqlite:///{tmp_path / 'old.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("old", artifact_location=(tmp_path / "arts").as_uri())
    tags = {"method": "sep", "dataset": "waveform", "kernel": "rbf", "M": "null", "seed": "0"}
    run = client.create_run(exp, tags=tags)
    for step, error in ((10, 0.1686), (20, 0.1657)):
        client.log_metric(run.info.run_id, "test_error", error, step=step)
    for key, value in (("test_nll", 0.3629), ("train_time_s", 0.35), ("n_iter", 20.0)):
        client.log_metric(run.info.run_id, key, value, step=20)
    client.set_terminated(run.info.run_id, "FINISHED")
    (record,) = report.collect_experiment("old", uri)
    assert record.status == "FINISHED" and record.M == "-"
    assert record.metrics == {"test_error": 0.1657, "test_nll": 0.3629, "train_time_s": 0.35}
    status = cli.main(["report", "old", "--tracking-uri", uri, "--out", str(tmp_path / "rep"),
                       "--no-mlflow"], out=io.StringIO())
    assert status == 0 and "0.1657" in (tmp_path / "rep" / report.REPORT_MD).read_text()
