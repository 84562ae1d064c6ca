"""The sweep report: grouping, mean and standard error, files, MLflow, and ``gpinfer report``."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer import cli
from gpinfer.errors import InputError
from gpinfer.experiment import report
from gpinfer.experiment.runner import run_experiment

from .helpers import compose_cfg


def _result(folder: Path, **fields) -> None:
    folder.mkdir(parents=True)
    base = {"method": "ep", "dataset": "wine", "kernel": "rbf", "M": None, "seed": 0,
            "status": "FINISHED", "test_error": 0.1, "test_nll": 0.3, "train_time_s": 1.0}
    (folder / "result.json").write_text(json.dumps({**base, **fields}))


def test_mean_and_standard_error_per_group(tmp_path: Path) -> None:
    # ep on wine: three seeds; sep on wine: one seed and one failed run
    for i, (err, nll, t) in enumerate([(0.1, 0.3, 1.0), (0.2, 0.5, 2.0), (0.3, 0.4, 6.0)]):
        _result(tmp_path / f"{i}_ep", seed=i, test_error=err, test_nll=nll, train_time_s=t)
    _result(tmp_path / "3_sep", method="sep", test_error=0.05, test_nll=0.2, train_time_s=0.5)
    _result(tmp_path / "4_sep", method="sep", seed=1, status="FAILED", test_error=None)
    records = report.collect_folder(tmp_path)
    keys, rows = report.summarise(records)
    assert keys == ["method", "dataset"]  # kernel and M do not vary
    ep, sep = rows
    assert (ep.keys, ep.n_runs, ep.n_failed) == ({"method": "ep", "dataset": "wine"}, 3, 0)
    mean, se, n = ep.stats["test_error"]
    # by hand: mean 0.2, sample std 0.1, se = 0.1 / sqrt(3)
    assert (mean, n) == (pytest.approx(0.2), 3) and se == pytest.approx(0.1 / math.sqrt(3))
    assert ep.stats["train_time_s"][:2] == (pytest.approx(3.0),
                                            pytest.approx(math.sqrt(7.0) / math.sqrt(3)))
    assert (sep.n_runs, sep.n_failed, sep.stats["test_nll"]) == (1, 1, (0.2, None, 1))

    done = report.write_report(records, tmp_path, "sweep", log_to_mlflow=False)
    md = (tmp_path / "report.md").read_text()
    assert "| ep | wine | 3 | 0.2 ± 0.058 | 0.4 ± 0.058 | 3 ± 1.5 |" in md
    assert "| sep | wine | 1 (1 failed) | 0.05 | 0.2 | 0.5 |" in md
    assert done.markdown in md and (tmp_path / "nll_vs_time.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "report.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [r["method"] for r in table] == ["ep", "sep"]
    assert float(table[0]["test_nll_mean"]) == pytest.approx(0.4)
    assert table[1]["test_error_se"] == ""  # one run: no standard error


def test_kernel_and_M_become_columns_when_they_vary(tmp_path: Path) -> None:
    _result(tmp_path / "a", kernel="rbf", M=0.1)
    _result(tmp_path / "b", kernel="matern52", M=0.1)
    keys, rows = report.summarise(report.collect_folder(tmp_path))
    assert keys == ["method", "dataset", "kernel"] and len(rows) == 2
    _result(tmp_path / "c", kernel="rbf", M=0.2)
    keys, rows = report.summarise(report.collect_folder(tmp_path))
    assert keys == ["method", "dataset", "kernel", "M"] and len(rows) == 3


def test_bad_sources_are_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none.db'}")
    _result(tmp_path / "failed" / "0", status="FAILED")
    cases = {
        str(tmp_path / "missing"): "folder '" + str(tmp_path / "missing") + "' does not exist",
        "no-such-experiment": "no folder and no MLflow experiment named 'no-such-experiment'",
        str(tmp_path / "failed"): "no finished runs in",  # (0 finished, 1 failed of 1 job(s))
    }
    for source, message in cases.items():
        assert cli.main(["report", source], out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "none.db").exists()  # asking did not create a store
    with pytest.raises(InputError, match="does not exist"):
        report.collect_folder(tmp_path / "missing")


def test_report_of_an_experiment_is_logged_to_mlflow(
    tmp_path: Path, store_uri: str, toy_site: Path
) -> None:
    for seed in (0, 1):
        cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "mlflow.experiment=reported",
                          "method.name=toygp", "method.likelihood=null", "iterations=2",
                          f"seed={seed}")
        run_experiment(cfg, output_dir=tmp_path / f"run{seed}", stream=io.StringIO())
    out = io.StringIO()
    status = cli.main(["report", "reported", "--tracking-uri", store_uri,
                       "--out", str(tmp_path / "rep")], out=out)
    assert status == 0, out.getvalue()
    assert "| toygp | breast_cancer | 2 |" in out.getvalue()
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {
        report.REPORT_MD, report.REPORT_CSV, report.REPORT_PNG}
    client = MlflowClient(store_uri)
    exp = client.get_experiment_by_name("reported")
    assert len(client.search_runs([exp.experiment_id])) == 2  # the training runs alone
    reports = client.get_experiment_by_name("reported" + report.REPORTS_EXPERIMENT_SUFFIX)
    (logged,) = client.search_runs([reports.experiment_id])
    assert logged.data.tags[report.KIND_TAG] == report.KIND_REPORT
    assert logged.data.tags["report.experiment_id"] == exp.experiment_id
    assert {a.path for a in client.list_artifacts(logged.info.run_id)} == {
        report.REPORT_MD, report.REPORT_CSV, report.REPORT_PNG}
    # a second report: counts only the training runs, gets a name of its own
    assert len(report.collect_experiment("reported", store_uri)) == 2
    assert cli.main(["report", "reported", "--tracking-uri", store_uri,
                     "--out", str(tmp_path / "rep2")], out=io.StringIO()) == 0
    names = {r.info.run_name for r in client.search_runs([reports.experiment_id])}
    assert len(names) == 2 and all(n.startswith("report-reported-") for n in names)


def test_report_runs_logged_beside_the_training_runs_are_still_skipped(
    tmp_path: Path, store_uri: str, toy_site: Path
) -> None:
    """Before report runs had their own experiment they were logged among the training runs
    (tag gpinfer.kind=report): such an experiment still reports its training runs only."""
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "mlflow.experiment=old-style",
                      "method.name=toygp", "method.likelihood=null", "iterations=2")
    run_experiment(cfg, output_dir=tmp_path / "run", stream=io.StringIO())
    client = MlflowClient(store_uri)
    exp = client.get_experiment_by_name("old-style")
    old = client.create_run(exp.experiment_id, run_name="report-old-style",
                            tags={report.KIND_TAG: report.KIND_REPORT})
    client.set_terminated(old.info.run_id, "FINISHED")
    records = report.collect_experiment("old-style", store_uri)
    assert [r.method for r in records] == ["toygp"]
    done = report.write_report(records, tmp_path / "rep", "old-style", log_to_mlflow=False)
    assert done.summary == "1 finished of 1 job(s)"
