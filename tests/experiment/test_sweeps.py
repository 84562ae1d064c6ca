"""gpinfer's sweeper, run for real (``gpinfer-run -m`` subprocesses with the basic launcher):
job folders that name every swept key, rejected jobs counted and listed, the report of an
interrupted sweep, a clean Ctrl-C while composing, lazy composition of big sweeps; and the
report's figure (panels, colours, markers, text inside the figure)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.experiment import report
from hydra_plugins.gpinfer_hydra.sweeper import covering_jobs, swept_suffix

from .test_app import GPINFER_RUN, TOY_METHOD, _default_sigint, _env, _run

TOY = (*TOY_METHOD, "method.likelihood=null")


def _folders(sweep: Path) -> list[str]:
    return sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit())


def test_covering_jobs_use_every_group_choice() -> None:
    batch = [[f"method={m}", f"+kernel={k}", f"seed={s}"]
             for m in ("ep", "sep") for k in ("rbf", "linear", "matern32") for s in range(4)]
    jobs = covering_jobs(batch, groups={"method", "kernel"})
    assert len(jobs) == 3  # the longest list of group choices: kernel
    assert {job[0] for job in jobs} == {"method=ep", "method=sep"}
    assert {job[1] for job in jobs} == {"+kernel=rbf", "+kernel=linear", "+kernel=matern32"}
    assert all(job in batch for job in jobs)  # real jobs of the sweep
    assert len(covering_jobs(batch)) == 4  # every key counted: seed's four values
    assert len(covering_jobs(batch, groups=set())) == 1
    assert covering_jobs([]) == [] and swept_suffix("") == "" and swept_suffix("a=b/c") == "_a=b-c"


def test_folders_name_every_swept_key_and_rejected_jobs_are_reported(
    tmp_path: Path, toy_site: Path
) -> None:
    """toygp has no inducing points: M=5 is rejected before its run; M=null runs."""
    sweep = tmp_path / "sweep"
    proc, uri = _run([str(GPINFER_RUN), "-m", *TOY, "M=null,5", "seed=0,1", "iterations=2",
                      f"hydra.sweep.dir={sweep}"], tmp_path, toy_site)
    assert proc.returncode == 1, proc.stderr[-2000:]  # two jobs rejected
    assert "Traceback" not in proc.stderr
    assert _folders(sweep) == ["0_toygp_breast_cancer_M=null,seed=0",
                               "1_toygp_breast_cancer_M=null,seed=1"]  # rejected: no folder
    assert sorted(p.name for p in (sweep / "rejected").iterdir()) == [
        "2_toygp_breast_cancer_M=5,seed=0.json", "3_toygp_breast_cancer_M=5,seed=1.json"]
    rejected = json.loads((sweep / "rejected" / "2_toygp_breast_cancer_M=5,seed=0.json")
                          .read_text())
    assert rejected["status"] == "REJECTED" and rejected["M"] == 5
    assert "has no inducing points" in rejected["error"] or "M" in rejected["error"]
    assert json.loads((sweep / "sweep.json").read_text()) == {"jobs": 4, "swept": ["M", "seed"]}
    md = (sweep / "report.md").read_text()
    assert "2 finished, 2 rejected of 4 job(s)" in md
    assert "| toygp | breast_cancer | - | 2 |" in md
    assert "| toygp | breast_cancer | 5 | 0 (2 rejected) |" in md
    assert "## Jobs that did not finish" in md
    assert "- `3_toygp_breast_cancer_M=5,seed=1`: rejected, toygp on breast_cancer" in md
    # the report run: in its own experiment, a unique name, beside the training runs
    client = MlflowClient(uri)
    training = client.search_runs([client.get_experiment_by_name("gpinfer").experiment_id])
    assert len(training) == 2 and not any(
        r.data.tags.get(report.KIND_TAG) == report.KIND_REPORT for r in training)
    reports = client.get_experiment_by_name("gpinfer-reports")
    (logged,) = client.search_runs([reports.experiment_id])
    assert logged.info.run_name.startswith("report-sweep-")
    assert logged.data.tags["report.experiment_id"] == training[0].info.experiment_id
    assert report.collect_experiment("gpinfer", uri) and len(
        report.collect_experiment("gpinfer", uri)) == 2


def _wait_for(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, path.read_text()):
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.05)


def _interrupt(args: list[str], tmp_path: Path, toy_site: Path, ready,
               ) -> tuple[int, str]:
    """Start ``args``, send SIGINT once ``ready(log_path, proc)`` returns; (exit status, log)."""
    env, _ = _env(tmp_path, toy_site)
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=fh, stderr=fh,
                                preexec_fn=_default_sigint)
    try:
        ready(log, proc)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return status, log.read_text()


def test_ctrl_c_during_a_sweep_writes_the_report_of_the_finished_jobs(
    tmp_path: Path, toy_site: Path
) -> None:
    sweep = tmp_path / "sweep"

    def two_finished(log: Path, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 120
        # the third job is training (its log has an evaluation line): Ctrl-C lands in training,
        # where the run ends KILLED (a Ctrl-C inside MLflow's own store calls while a run is set
        # up is logged by MLflow itself; see the report)
        third_log = sweep / "2_toygp_breast_cancer_seed=2" / "gpinfer.log"
        while (len(list(sweep.glob("*/result.json"))) < 2 or not third_log.is_file()
               or "iteration 10/" not in third_log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)

    status, text = _interrupt(
        [str(GPINFER_RUN), "-m", *TOY, "+method.options.sleep_s=0.02", "iterations=40",
         "seed=range(0,6)", f"hydra.sweep.dir={sweep}"], tmp_path, toy_site, two_finished)
    assert status == 130, text[-3000:]
    assert "gpinfer-run: interrupted" in text and "Traceback" not in text
    md = (sweep / "report.md").read_text()
    counts = r"2 finished, 1 killed of 6 job\(s\); interrupted, 3 never started"
    assert re.search(counts, md), md
    assert "- `2_toygp_breast_cancer_seed=2`: killed, toygp on breast_cancer" in md, md
    assert re.search(r"Sweep report \(" + counts, text), text[-2000:]


def test_ctrl_c_while_composing_is_one_line(tmp_path: Path, toy_site: Path) -> None:
    """SIGINT while the sweeper checks a big sweep's configs (OmegaConf inside a composition
    used to turn it into an AttributeError traceback): every method config, 22 compositions."""
    from gpinfer.experiment.app import CONF_DIR

    sweep = tmp_path / "sweep"
    methods = ",".join(sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml")))
    status, text = _interrupt(
        [str(GPINFER_RUN), "-m", f"method={methods}", "dataset=breast_cancer",
         "seed=range(0,5)", f"hydra.sweep.dir={sweep}"],
        tmp_path, toy_site,
        lambda log, proc: (_wait_for(log, "checking the configs", proc), time.sleep(0.3)))
    assert status == 130, text[-3000:]
    assert "Traceback" not in text and "_invalidate_flags_cache" not in text, text[-3000:]
    assert "gpinfer-run: interrupted" in text
    assert "Launching" not in text and not list(sweep.glob("*/result.json"))  # no job started


def test_first_job_of_a_big_sweep_starts_without_composing_every_job(
    tmp_path: Path, toy_site: Path
) -> None:
    """4 kernels x 5 iteration counts x 20 seeds x 5 evaluation intervals = 2000 jobs: the 4
    that use every kernel are checked (Hydra's sweeper composed all 2000 first: minutes), then
    the first job runs. How many are composed is counted in test_protocols.py; here the real
    sweeper and launcher get to the first job."""
    sweep = tmp_path / "sweep"

    def first_job(log: Path, proc: subprocess.Popen) -> None:
        _wait_for(log, "FINISHED: toygp", proc, timeout=300)

    status, text = _interrupt(
        [str(GPINFER_RUN), "-m", *TOY, "kernel=rbf,matern52,matern32,linear",
         "iterations=1,2,3,4,5", "seed=range(0,20)", "eval_every=1,2,3,4,5",
         f"hydra.sweep.dir={sweep}"], tmp_path, toy_site, first_job)
    assert "2000 jobs; checking the configs of the 4 that use every swept config-group choice" in text
    assert status == 130, text[-2000:]
    assert json.loads((sweep / "sweep.json").read_text()) == {
        "jobs": 2000, "swept": ["kernel", "iterations", "seed", "eval_every"]}
    # the swept keys in the folder's name, sorted as Hydra's override_dirname sorts them
    assert (sweep / "0_toygp_breast_cancer_eval_every=1,iterations=1,kernel=rbf,seed=0").is_dir()


# -- the report's figure ---------------------------------------------------------------------


def _records() -> list[report.RunRecord]:
    out = []
    for dataset, metric in (("wine", "test_error"), ("new_thyroid", "test_error"),
                            ("diabetes", "test_rmse")):
        for method in ("ep", "sep", "a-method-with-a-long-name"):
            for i, M in enumerate(("0.05", "0.1", "0.2")):
                out.append(report.RunRecord(method, dataset, "rbf", M, "0", "FINISHED", {
                    metric: 0.1, "test_nll": 0.3 + 0.1 * i, "train_time_s": 1.0 + 30 * i}))
    return out


def test_report_figure_has_a_panel_per_dataset_and_task_and_all_text_inside() -> None:
    from gpinfer.plots import _pyplot

    title = "/a/very/long/path/to/outputs/multirun/2026-11-27_09-00-00_" + "x" * 80
    fig = report.nll_vs_time_figure(_records(), title)
    try:
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == [
            "new_thyroid (classification)", "wine (classification)", "diabetes (regression)"]
        legend = fig.legends[0]
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["a-method-with-a-long-name", "ep", "sep", "M = 0.05", "M = 0.1",
                          "M = 0.2"]
        assert "/a/very/long" not in fig._suptitle.get_text()  # the folder's name, not its path
        _assert_text_inside(fig)
    finally:
        _pyplot().close(fig)


def _assert_text_inside(fig) -> None:
    """What ``fig`` draws (each panel with its title, labels and tick labels, the legends, the
    title) lies inside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    parts = [(ax.get_title() or "panel", ax.get_tightbbox(renderer))
             for ax in fig.axes if ax.get_visible()]
    parts += [("legend", legend.get_window_extent(renderer)) for legend in fig.legends]
    if fig._suptitle is not None:
        parts.append(("title", fig._suptitle.get_window_extent(renderer)))
    for name, ext in parts:
        assert (ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1
                and ext.y1 <= box.y1 + 1), (name, ext, box.bounds)


@pytest.mark.parametrize("tests", [(), ("test_error",), ("test_error", "test_nll")])
def test_training_curves_labels_fit_whatever_the_panel_count(tests: tuple[str, ...]) -> None:
    from gpinfer.experiment.figures import TrainingCurve, training_curves_figure
    from gpinfer.plots import _pyplot

    curve = TrainingCurve()
    for i in range(5):
        curve.add(0.1 * i, -10.0 + i, {k: 0.2 for k in tests})
    fig = training_curves_figure(curve, "sep-waveform-rbf-s0-3fa2c1 " * 5)
    try:
        _assert_text_inside(fig)
    finally:
        _pyplot().close(fig)


def test_a_report_of_runs_logged_before_still_opens(tmp_path: Path) -> None:
    """Folders of older sweeps: no sweep.json, no rejected.json, the old folder names."""
    folder = tmp_path / "0_ep_wine_rbf_s0"
    folder.mkdir()
    (folder / "result.json").write_text(json.dumps(
        {"method": "ep", "dataset": "wine", "kernel": "rbf", "M": None, "seed": 0,
         "status": "FINISHED", "test_error": 0.1, "test_nll": 0.3, "train_time_s": 1.0}))
    done = report.write_report(report.collect_folder(tmp_path), tmp_path, str(tmp_path),
                               log_to_mlflow=False, plan=report.read_plan(tmp_path))
    assert done.summary == "1 finished of 1 job(s)"

