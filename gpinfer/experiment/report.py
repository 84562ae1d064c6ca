"""The sweep report: method x dataset (x kernel, M) means and standard errors over seeds.

``collect_folder(path)`` reads the ``result.json`` of every run under a sweep folder;
``collect_experiment(name, uri)`` reads the runs of an MLflow experiment. A sweep folder also
holds ``rejected/<job>.json`` for each job stopped before its run (bad option, method and data
that do not fit; written by ``gpinfer-run``, ``write_rejected``; the job's folder is removed)
and ``sweep.json`` (the planned jobs, written by gpinfer's sweeper; ``read_plan``).
``summarise`` groups the FINISHED runs by method and dataset, and by kernel and M when those
vary among the runs, and gives per group the number of runs (and of failed and rejected ones)
and the mean and standard error (``std / sqrt(n)``,
``ddof = 1``; none for a single run) of the test error (test RMSE for regression), the test NLL
and the training time.

``write_report`` writes into a folder ``report.md`` (the jobs counted by status: finished,
failed, killed, rejected, incomplete, never started; a list of the jobs that did not finish),
``report.csv`` and ``nll_vs_time.png`` (test NLL against training time, one point per run, one
panel per dataset and task, coloured by method, marker by M), and logs them to MLflow as a run
tagged ``gpinfer.kind = report`` in the experiment ``<experiment>-reports``, apart from the
training runs. Entry points: the Hydra callback ``SweepReport`` (end of every multirun, and
from the sweeper when a sweep fails or is interrupted) and ``gpinfer report
<experiment-or-sweep-folder>``.
"""

from __future__ import annotations

import collections
import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.errors import InputError
from gpinfer.experiment.redact import redact_uri, store_error
from gpinfer.experiment.results import RESULT_FILE

REPORT_MD, REPORT_CSV, REPORT_PNG = "report.md", "report.csv", "nll_vs_time.png"
#: a job stopped before its run (no ``result.json``): its keys and the error
REJECTED_DIR = "rejected"
#: written by gpinfer's sweeper into the sweep folder: ``{"jobs": n, "swept": [keys]}``
SWEEP_FILE = "sweep.json"
#: ``RunRecord.status`` of a job stopped before its run, and of a job folder with no result
REJECTED, INCOMPLETE = "REJECTED", "INCOMPLETE"
#: the composed config Hydra saves in every job folder
HYDRA_CONFIG = ".hydra/config.yaml"
#: tag marking report runs (they are skipped when an experiment's runs are collected)
KIND_TAG, KIND_REPORT = "gpinfer.kind", "report"
#: report runs are logged to the experiment ``<experiment of the reported runs><this>``
REPORTS_EXPERIMENT_SUFFIX = "-reports"
#: at most this many unfinished jobs are listed by name in report.md
LIST_AT_MOST = 50
#: (result key, column label) of the reported metrics; test_rmse replaces test_error for
#: regression runs
METRICS: tuple[tuple[str, str], ...] = (
    ("test_error", "test error"),
    ("test_rmse", "test RMSE"),
    ("test_nll", "test NLL"),
    ("train_time_s", "train time [s]"),
)
#: grouping keys beyond method and dataset, used when they vary among the runs
_OPTIONAL_KEYS = ("kernel", "M")


@dataclass
class RunRecord:
    """One run as the report sees it."""

    method: str
    dataset: str
    kernel: str
    M: str
    seed: str
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None
    tracking_uri: str | None = None
    #: why the run did not finish (rejected or failed jobs), where known
    error: str | None = None
    #: the run's folder relative to the collected folder (``None`` for MLflow runs)
    folder: str | None = None

    @property
    def task(self) -> str:
        """``regression`` (a run with a test RMSE) or ``classification``."""
        return "regression" if "test_rmse" in self.metrics else "classification"


@dataclass
class SweepPlan:
    """What the sweep meant to run: ``jobs`` planned (``None``: unknown), ``swept`` keys, and
    whether it was ``interrupted``."""

    jobs: int | None = None
    swept: list[str] = field(default_factory=list)
    interrupted: bool = False


def write_plan(folder: str | Path, jobs: int, swept: Sequence[str]) -> Path:
    """Record a sweep's plan in ``folder/sweep.json`` (gpinfer's sweeper, before launching)."""
    path = Path(folder) / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": int(jobs), "swept": list(swept)}) + "\n")
    return path


def read_plan(folder: str | Path, interrupted: bool = False) -> SweepPlan:
    """The sweep folder's ``sweep.json`` (an empty plan when it has none: older sweeps)."""
    try:
        data = json.loads((Path(folder) / SWEEP_FILE).read_text())
        return SweepPlan(int(data["jobs"]), [str(k) for k in data.get("swept", [])],
                         interrupted)
    except (OSError, ValueError, KeyError, TypeError):
        return SweepPlan(interrupted=interrupted)


def rejected_path(job_folder: str | Path) -> Path:
    """Where the rejection of the sweep job ``job_folder`` is recorded:
    ``<sweep folder>/rejected/<job folder name>.json`` (the job's own folder is removed)."""
    job = Path(job_folder)
    return job.parent / REJECTED_DIR / f"{job.name}.json"


def write_rejected(job_folder: str | Path, keys: Mapping[str, Any], error: str) -> Path:
    """Record a sweep job stopped before its run (``rejected_path``) with ``keys`` (method,
    dataset, kernel, M, seed) and ``error``, read back by ``collect_folder`` as a ``REJECTED``
    run of ``job_folder``."""
    path = rejected_path(job_folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**{k: keys.get(k) for k in ("method", "dataset", "kernel",
                                                            "M", "seed")},
                                "status": REJECTED, "error": error}, default=str) + "\n")
    return path


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _record(data: Mapping[str, Any]) -> RunRecord:
    return RunRecord(
        method=str(data.get("method")), dataset=str(data.get("dataset")),
        kernel=str(data.get("kernel") or "-"),
        M="-" if data.get("M") in (None, "null") else str(data.get("M")),
        seed=str(data.get("seed")), status=str(data.get("status") or "FINISHED"),
        metrics={k: v for k, _ in METRICS if (v := _number(data.get(k))) is not None},
        run_id=data.get("mlflow_run_id"), tracking_uri=data.get("mlflow_tracking_uri"),
        error=None if data.get("error") in (None, "") else str(data.get("error")),
    )


def _incomplete(job: Path) -> RunRecord | None:
    """A Hydra job folder (``.hydra/config.yaml``) without a result: a job running, or stopped
    before it recorded one (killed, interrupted)."""
    import yaml

    try:
        cfg = yaml.safe_load((job / HYDRA_CONFIG).read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return None

    def name(group: str) -> Any:
        node = cfg.get(group)
        return node.get("name") if isinstance(node, dict) else node

    return _record({"method": name("method"), "dataset": name("dataset"),
                    "kernel": name("kernel"), "M": cfg.get("M"), "seed": cfg.get("seed"),
                    "status": INCOMPLETE, "error": "no result: still running, or stopped"})


def collect_folder(folder: str | Path) -> list[RunRecord]:
    """Every run under ``folder`` (its ``result.json`` files, at any depth), every job
    rejected before its run (``rejected/<job>.json``), and every job folder with neither
    (``INCOMPLETE``: running, or killed before it wrote a result)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"gpinfer report: folder {str(root)!r} does not exist")
    records = []
    results = {p.parent: p for p in root.rglob(RESULT_FILE)}
    for p in root.rglob(f"{REJECTED_DIR}/*.json"):  # job folder: the file's name
        results.setdefault(p.parent.parent / p.stem, p)
    jobs = {p.parent.parent for p in root.rglob(HYDRA_CONFIG.split("/")[-1])
            if p.parent.name == HYDRA_CONFIG.split("/")[0]}
    for job in sorted(results.keys() | jobs):
        if job in results:
            try:
                record: RunRecord | None = _record(json.loads(results[job].read_text()))
            except (OSError, ValueError):
                record = None  # a run still writing, or a foreign file
        else:
            record = _incomplete(job)
        if record is not None:
            record.folder = str(job.relative_to(root))
            records.append(record)
    return records


def collect_experiment(name: str, tracking_uri: str) -> list[RunRecord]:
    """Every run of MLflow experiment ``name`` in ``tracking_uri`` (report runs excepted)."""
    from mlflow.tracking import MlflowClient

    from gpinfer.experiment.tracking import resolve_tracking_uri, sqlite_path

    tracking_uri = resolve_tracking_uri(tracking_uri)  # credentials to the environment
    shown = redact_uri(tracking_uri)
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():  # do not create an empty store by asking
        raise InputError(f"gpinfer report: no folder and no MLflow experiment named {name!r} "
                         f"(store {shown} does not exist)")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        exp = client.get_experiment_by_name(name)
    except Exception as exc:
        raise InputError(f"gpinfer report: MLflow store {shown!r} cannot be read: "
                         f"{store_error(exc, tracking_uri)}") from None
    if exp is None:
        raise InputError(
            f"gpinfer report: no folder and no MLflow experiment named {name!r} "
            f"(store {shown})")
    records, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if tags.get(KIND_TAG) == KIND_REPORT:
                continue
            data: dict[str, Any] = {k: tags.get(k) for k in ("method", "dataset", "kernel",
                                                             "M", "seed")}
            data.update(run.data.metrics, status=run.info.status, mlflow_run_id=run.info.run_id,
                        mlflow_tracking_uri=tracking_uri)
            records.append(_record(data))
        token = page.token
        if not token:
            return records


@dataclass
class Row:
    """One group of the report: its keys, run counts (finished, failed, rejected) and
    ``metric -> (mean, se, n)``."""

    keys: dict[str, str]
    n_runs: int
    n_failed: int
    stats: dict[str, tuple[float, float | None, int]]
    n_rejected: int = 0


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (``std(ddof=1) / sqrt(n)``; ``None`` for one value)."""
    arr = np.asarray(values, dtype=float)
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else None
    return float(arr.mean()), se


def group_keys(records: Iterable[RunRecord]) -> list[str]:
    """``method``, ``dataset``, then ``kernel`` and ``M`` where they vary among the runs."""
    records = list(records)
    extra = [k for k in _OPTIONAL_KEYS if len({getattr(r, k) for r in records}) > 1]
    return ["method", "dataset", *extra]


def summarise(records: Sequence[RunRecord]) -> tuple[list[str], list[Row]]:
    """The grouping keys and one ``Row`` per group (sorted), over FINISHED runs."""
    keys = group_keys(records)
    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    for r in records:
        groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    rows = []
    for key in sorted(groups):
        runs = groups[key]
        done = [r for r in runs if r.status == "FINISHED"]
        stats: dict[str, tuple[float, float | None, int]] = {}
        for metric, _ in METRICS:
            values = [r.metrics[metric] for r in done if metric in r.metrics]
            if values:
                stats[metric] = (*mean_se(values), len(values))
        rejected = sum(r.status == REJECTED for r in runs)
        rows.append(Row(dict(zip(keys, key)), len(done), len(runs) - len(done) - rejected,
                        stats, rejected))
    return keys, rows


def _metric_columns(rows: Sequence[Row]) -> list[tuple[str, str]]:
    return [(m, label) for m, label in METRICS if any(m in row.stats for row in rows)]


def _cell(stat: tuple[float, float | None, int] | None) -> str:
    if stat is None:
        return "n/a"
    mean, se, _ = stat
    return f"{mean:.4g}" if se is None else f"{mean:.4g} ± {se:.2g}"


def markdown_table(keys: Sequence[str], rows: Sequence[Row]) -> str:
    """The report as a Markdown table (``mean ± standard error``)."""
    metrics = _metric_columns(rows)
    header = [*keys, "runs", *(label for _, label in metrics)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        notes = [f"{n} {what}" for n, what in ((row.n_failed, "failed"),
                                               (row.n_rejected, "rejected")) if n]
        runs = str(row.n_runs) + (f" ({', '.join(notes)})" if notes else "")
        cells = [*(row.keys[k] for k in keys), runs,
                 *(_cell(row.stats.get(m)) for m, _ in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, keys: Sequence[str], rows: Sequence[Row]) -> Path:
    """One line per group: keys, ``n_runs``, ``n_failed``, ``n_rejected``, ``<metric>_mean`` /
    ``_se``."""
    metrics = [m for m, _ in _metric_columns(rows)]
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*keys, "n_runs", "n_failed", "n_rejected",
                         *(f"{m}_{s}" for m in metrics for s in ("mean", "se"))])
        for row in rows:
            values: list[Any] = [*(row.keys[k] for k in keys), row.n_runs, row.n_failed,
                                 row.n_rejected]
            for m in metrics:
                mean, se, _ = row.stats.get(m, (None, None, 0))
                values += ["" if mean is None else repr(mean), "" if se is None else repr(se)]
            writer.writerow(values)
    return path


#: marker of each value of M in the report figure, in sorted order of the values
_MARKERS = "osD^vP*Xh<>p"


def _facets(done: Sequence[RunRecord]) -> list[tuple[str, str]]:
    """``(task, dataset)`` panels of the report figure: classification first, then by name."""
    return sorted({(r.task, r.dataset) for r in done}, key=lambda f: (f[0] != "classification",
                                                                      f[1]))


def _panel(ax: Any, panel: Sequence[RunRecord], task: str, dataset: str,
           colour: Mapping[str, Any], marker: Mapping[str, str]) -> None:
    """One ``(task, dataset)`` panel: test NLL against training time of its runs (a log time
    axis where they span more than a decade)."""
    for r in panel:
        ax.scatter(r.metrics["train_time_s"], r.metrics["test_nll"], s=24, alpha=0.8,
                   color=colour[r.method], marker=marker[r.M])
    times = [r.metrics["train_time_s"] for r in panel]
    if times and min(times) > 0 and max(times) > 10 * min(times):  # a decade: log axis
        ax.set_xscale("log")
    ax.set_title(f"{dataset} ({task})", fontsize=9)
    ax.set_xlabel("training time [s]", fontsize=8)
    ax.set_ylabel("test NLL", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _legend(fig: Any, methods: Sequence[str], Ms: Sequence[str], colour: Mapping[str, Any],
            marker: Mapping[str, str]) -> None:
    """The figure's legend: a colour per method, a marker per M (unless M is always "-")."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=colour[m], label=m) for m in methods]
    if len(Ms) > 1 or list(Ms) != ["-"]:
        handles += [Line2D([], [], ls="", marker=marker[m], color="0.4", label=f"M = {m}")
                    for m in Ms]
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


def nll_vs_time_figure(records: Sequence[RunRecord], title: str = "") -> Any:
    """Test NLL against training time, one point per finished run: one panel per dataset and
    task (classification, regression), colour by method, marker by M; returns the figure."""
    import textwrap

    from gpinfer.plots import _pyplot

    plt = _pyplot()
    done = [r for r in records if r.status == "FINISHED"
            and "test_nll" in r.metrics and "train_time_s" in r.metrics]
    facets = _facets(done) or [("classification", "no finished run")]
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols + 1.6, 2.9 * nrows + 0.7),
                             squeeze=False, layout="constrained")
    methods = sorted({r.method for r in done})
    Ms = sorted({r.M for r in done}, key=lambda m: (_number(m) is None, _number(m) or 0.0, m))
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    colour = {m: cmap(i % cmap.N) for i, m in enumerate(methods)}
    marker = {m: _MARKERS[i % len(_MARKERS)] for i, m in enumerate(Ms)}
    for ax, (task, dataset) in zip(axes.flat, facets):
        _panel(ax, [r for r in done if (r.task, r.dataset) == (task, dataset)], task, dataset,
               colour, marker)
    for ax in axes.flat[len(facets):]:
        ax.set_visible(False)
    _legend(fig, methods, Ms, colour, marker)
    name = Path(title).name if title else ""
    heading = "test NLL against training time" + (f": {name}" if name else "")
    fig.suptitle("\n".join(textwrap.wrap(heading, width=int(14 * ncols + 16))), fontsize=10)
    return fig


def scatter_png(path: Path, records: Sequence[RunRecord], title: str = "") -> Path:
    """``nll_vs_time_figure`` of ``records`` as a PNG at ``path``."""
    from gpinfer.plots import _pyplot

    fig = nll_vs_time_figure(records, title)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


@dataclass
class Report:
    """What ``write_report`` produced; ``summary`` is the counts line
    (``40 finished, 2 rejected of 1200 jobs; interrupted: 1158 never started``)."""

    markdown: str
    paths: list[Path]
    n_runs: int
    summary: str = ""
    mlflow_run_id: str | None = None
    mlflow_error: str | None = None


def counts_line(records: Sequence[RunRecord], plan: SweepPlan | None = None) -> str:
    """Finished jobs and the others by status (failed, killed, rejected), of the planned ones
    when known, and how many never started (an interrupted or aborted sweep)."""
    plan = plan or SweepPlan()
    statuses = [r.status for r in records]
    parts = [f"{statuses.count('FINISHED')} finished"]
    parts += [f"{statuses.count(s)} {s.lower()}"
              for s in sorted(set(statuses) - {"FINISHED"}, key=lambda s: _STATUS_ORDER[s])]
    total = plan.jobs if plan.jobs is not None else len(records)
    line = f"{', '.join(parts)} of {total} job(s)"
    missing = total - len(records)
    if plan.interrupted:
        line += f"; interrupted, {max(missing, 0)} never started"
    elif missing > 0:
        line += f"; {missing} never started"
    return line


#: the order of the statuses in the counts line (others after them)
_STATUS_ORDER: dict[str, int] = collections.defaultdict(
    lambda: 9, {"FAILED": 0, "KILLED": 1, REJECTED: 2, INCOMPLETE: 3})


def unfinished_list(records: Sequence[RunRecord]) -> str:
    """Markdown list of the jobs that did not finish (folder, keys, status, error), at most
    ``LIST_AT_MOST`` of them."""
    bad = [r for r in records if r.status != "FINISHED"]
    lines = []
    for r in bad[:LIST_AT_MOST]:
        where = f"`{r.folder}`: " if r.folder else ""
        keys = f"{r.method} on {r.dataset} (kernel {r.kernel}, M {r.M}, seed {r.seed})"
        why = f": {r.error}" if r.error else ""
        lines.append(f"- {where}{r.status.lower()}, {keys}{why}")
    if len(bad) > LIST_AT_MOST:
        lines.append(f"- ... and {len(bad) - LIST_AT_MOST} more")
    return "\n".join(lines)


def write_report(
    records: Sequence[RunRecord], out_dir: str | Path, title: str, *, log_to_mlflow: bool = True,
    tracking_uri: str | None = None, experiment_id: str | None = None,
    plan: SweepPlan | None = None,
) -> Report:
    """Write the report files into ``out_dir`` and log them to MLflow (a ``report`` run).

    The MLflow run goes to the experiment ``<name>-reports`` next to ``experiment_id`` when
    given, else next to the experiment of the first run that has an MLflow run id, in
    ``tracking_uri`` when given (a ``result.json`` holds the store's URI without credentials),
    else the run's. ``plan``: the planned jobs (``read_plan``), for the counts line.
    ``InputError`` when no run FINISHED.
    """
    finished = [r for r in records if r.status == "FINISHED"]
    summary = counts_line(records, plan)
    if not finished:
        raise InputError(f"gpinfer report: no finished runs in {title} ({summary})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys, rows = summarise(records)
    table = markdown_table(keys, rows)
    unfinished = unfinished_list(records)
    md = (f"# Sweep report: {title}\n\n{summary}; mean ± standard error over seeds of the "
          f"finished runs.\n\n{table}\n\n![test NLL against training time]({REPORT_PNG})\n"
          + (f"\n## Jobs that did not finish\n\n{unfinished}\n" if unfinished else ""))
    (out / REPORT_MD).write_text(md)
    paths = [out / REPORT_MD, write_csv(out / REPORT_CSV, keys, rows),
             scatter_png(out / REPORT_PNG, records, title)]
    report = Report(table, paths, len(records), summary)
    if log_to_mlflow:
        try:
            report.mlflow_run_id = _log_report(paths, title, finished, tracking_uri,
                                               experiment_id)
        except Exception as exc:  # the files are written; MLflow is a bonus here
            report.mlflow_error = store_error(exc, tracking_uri)
    return report


def reports_experiment(client: Any, tracking_uri: str, source_experiment_id: str) -> str:
    """The id of the experiment ``<source name>-reports`` (created when missing, its artifacts
    beside the store's, as for the training runs), where report runs go."""
    from gpinfer.experiment.tracking import default_artifact_location

    name = client.get_experiment(source_experiment_id).name + REPORTS_EXPERIMENT_SUFFIX
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(
            name, artifact_location=default_artifact_location(tracking_uri),
            tags={KIND_TAG: KIND_REPORT, "report.experiment_id": str(source_experiment_id)}))
    except Exception:  # another process created it meanwhile
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _log_report(paths: Sequence[Path], title: str, finished: Sequence[RunRecord],
                tracking_uri: str | None, experiment_id: str | None) -> str | None:
    from mlflow.tracking import MlflowClient

    from gpinfer.experiment.tracking import unique_run_name

    if experiment_id is None:  # the experiment of the first run that was logged
        source = next((r for r in finished if r.run_id and (tracking_uri or r.tracking_uri)),
                      None)
        if source is None:
            return None
        tracking_uri = tracking_uri or source.tracking_uri
        experiment_id = MlflowClient(tracking_uri).get_run(str(source.run_id)).info.experiment_id
    client = MlflowClient(tracking_uri)
    target = reports_experiment(client, str(tracking_uri), str(experiment_id))
    run = client.create_run(target, run_name=unique_run_name(["report", Path(title).name]),
                            tags={KIND_TAG: KIND_REPORT, "mlflow.source.name": "gpinfer report",
                                  "report.source": title,
                                  "report.experiment_id": str(experiment_id)})
    try:
        for path in paths:
            client.log_artifact(run.info.run_id, str(path))
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    return str(run.info.run_id)
