"""The sweep report: method x dataset (x kernel, M) means and standard errors over seeds.

``collect_folder(path)`` reads the ``result.json`` of every run under a sweep folder;
``collect_experiment(name, uri)`` reads the runs of an MLflow experiment. ``summarise`` groups
the FINISHED runs by method and dataset, and by kernel and M when those vary among the runs,
and gives per group the number of runs (and of failed ones) and the mean and standard error
(``std / sqrt(n)``, ``ddof = 1``; none for a single run) of the test error (test RMSE for
regression), the test NLL and the training time. ``write_report`` writes ``report.md``,
``report.csv`` and ``nll_vs_time.png`` (test NLL against training time, one point per run,
coloured by method) into a folder and logs them to MLflow as a run tagged ``gpinfer.kind =
report``. Entry points: the Hydra callback ``SweepReport`` (end of every multirun) and
``gpinfer report <experiment-or-sweep-folder>``.
"""

from __future__ import annotations

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
#: tag marking report runs (they are skipped when an experiment's runs are collected)
KIND_TAG, KIND_REPORT = "gpinfer.kind", "report"
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
    )


def collect_folder(folder: str | Path) -> list[RunRecord]:
    """Every run under ``folder`` (its ``result.json`` files, at any depth)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"gpinfer report: folder {str(root)!r} does not exist")
    records = []
    for path in sorted(root.rglob(RESULT_FILE)):
        try:
            records.append(_record(json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # a run still writing, or a foreign file
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
    """One group of the report: its keys, run counts and ``metric -> (mean, se, n)``."""

    keys: dict[str, str]
    n_runs: int
    n_failed: int
    stats: dict[str, tuple[float, float | None, int]]


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
        rows.append(Row(dict(zip(keys, key)), len(done), len(runs) - len(done), stats))
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
        runs = str(row.n_runs) + (f" ({row.n_failed} failed)" if row.n_failed else "")
        cells = [*(row.keys[k] for k in keys), runs,
                 *(_cell(row.stats.get(m)) for m, _ in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, keys: Sequence[str], rows: Sequence[Row]) -> Path:
    """One line per group: keys, ``n_runs``, ``n_failed``, ``<metric>_mean`` / ``_se``."""
    metrics = [m for m, _ in _metric_columns(rows)]
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*keys, "n_runs", "n_failed",
                         *(f"{m}_{s}" for m in metrics for s in ("mean", "se"))])
        for row in rows:
            values: list[Any] = [*(row.keys[k] for k in keys), row.n_runs, row.n_failed]
            for m in metrics:
                mean, se, _ = row.stats.get(m, (None, None, 0))
                values += ["" if mean is None else repr(mean), "" if se is None else repr(se)]
            writer.writerow(values)
    return path


def scatter_png(path: Path, records: Sequence[RunRecord], title: str = "") -> Path:
    """Test NLL against training time, one point per finished run, coloured by method."""
    from gpinfer.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    done = [r for r in records if r.status == "FINISHED"
            and "test_nll" in r.metrics and "train_time_s" in r.metrics]
    for method in sorted({r.method for r in done}):
        pts = [(r.metrics["train_time_s"], r.metrics["test_nll"]) for r in done
               if r.method == method]
        ax.scatter(*zip(*pts), label=method, s=22, alpha=0.8)
    times = [r.metrics["train_time_s"] for r in done]
    if times and min(times) > 0 and max(times) > 10 * min(times):  # spans a decade: log axis
        ax.set_xscale("log")
    ax.set_xlabel("training time [s]")
    ax.set_ylabel("test NLL")
    ax.set_title(title or "test NLL against training time")
    ax.grid(alpha=0.3)
    if done:
        ax.legend(fontsize=8, title="method")
    fig.subplots_adjust(left=0.12, right=0.97, top=0.92, bottom=0.12)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@dataclass
class Report:
    """What ``write_report`` produced."""

    markdown: str
    paths: list[Path]
    n_runs: int
    mlflow_run_id: str | None = None
    mlflow_error: str | None = None


def write_report(
    records: Sequence[RunRecord], out_dir: str | Path, title: str, *, log_to_mlflow: bool = True,
    tracking_uri: str | None = None, experiment_id: str | None = None,
) -> Report:
    """Write the report files into ``out_dir`` and log them to MLflow (a ``report`` run).

    The MLflow run goes to ``experiment_id`` when given, else to the experiment of the first
    run that has an MLflow run id, in ``tracking_uri`` when given (a ``result.json`` holds the
    store's URI without credentials), else the run's. ``InputError`` when no run FINISHED.
    """
    finished = [r for r in records if r.status == "FINISHED"]
    if not finished:
        raise InputError(f"gpinfer report: no finished runs in {title} "
                         f"({len(records)} run(s) found, none FINISHED)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys, rows = summarise(records)
    table = markdown_table(keys, rows)
    md = (f"# Sweep report: {title}\n\n{len(finished)} finished run(s) of {len(records)}; "
          "mean ± standard error over seeds.\n\n" + table + f"\n\n![test NLL against training "
          f"time]({REPORT_PNG})\n")
    (out / REPORT_MD).write_text(md)
    paths = [out / REPORT_MD, write_csv(out / REPORT_CSV, keys, rows),
             scatter_png(out / REPORT_PNG, records, f"test NLL against training time: {title}")]
    report = Report(table, paths, len(records))
    if log_to_mlflow:
        try:
            report.mlflow_run_id = _log_report(paths, title, finished, tracking_uri,
                                               experiment_id)
        except Exception as exc:  # the files are written; MLflow is a bonus here
            report.mlflow_error = store_error(exc, tracking_uri)
    return report


def _log_report(paths: Sequence[Path], title: str, finished: Sequence[RunRecord],
                tracking_uri: str | None, experiment_id: str | None) -> str | None:
    from mlflow.tracking import MlflowClient

    if experiment_id is None:  # the experiment of the first run that was logged
        source = next((r for r in finished if r.run_id and (tracking_uri or r.tracking_uri)),
                      None)
        if source is None:
            return None
        tracking_uri = tracking_uri or source.tracking_uri
        experiment_id = MlflowClient(tracking_uri).get_run(str(source.run_id)).info.experiment_id
    client = MlflowClient(tracking_uri)
    run = client.create_run(str(experiment_id), run_name=f"report-{Path(title).name}",
                            tags={KIND_TAG: KIND_REPORT, "mlflow.source.name": "gpinfer report",
                                  "report.source": title})
    try:
        for path in paths:
            client.log_artifact(run.info.run_id, str(path))
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    return str(run.info.run_id)
