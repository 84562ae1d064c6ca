"""Shared pieces of the Bui et al. (2017) reproduction scripts: the command-line options of a
resumable run, win fractions, the summary, plots, MLflow."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

#: alpha grid of the paper's figures (0 is VFE, 1 is EP/FITC)
ALPHAS = (0.0, 0.1, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0)
#: the alpha pairs whose win fractions are reported: 0.5 against VFE and EP, VFE against EP
PAIRS = ((0.5, 0.0), (0.5, 1.0), (0.0, 1.0))


def label(alpha: float) -> str:
    return {0.0: "VFE", 1.0: "EP"}.get(float(alpha), f"{alpha:g}")


def win_fraction(rows: list[dict], metric: str, a: float, b: float) -> float:
    """Share of (data set, split, M) cases where alpha ``a`` has a lower ``metric`` than ``b``
    (ties count one half)."""
    by_case: dict[tuple, dict[float, float]] = defaultdict(dict)
    for r in rows:
        by_case[(r["dataset"], r["split"], r["M"])][r["alpha"]] = r[metric]
    wins = [1.0 if c[a] < c[b] else 0.5 if c[a] == c[b] else 0.0
            for c in by_case.values() if a in c and b in c]
    return float(np.mean(wins)) if wins else float("nan")


def summary_table(rows: list[dict], metrics: tuple[str, ...]) -> str:
    """Mean (and standard error) of each metric per alpha, over all cases, as text."""
    lines = ["alpha  " + "  ".join(f"{m:>18s}" for m in metrics) + "   n"]
    for a in sorted({r["alpha"] for r in rows}):
        sel = [r for r in rows if r["alpha"] == a]
        cells = []
        for m in metrics:
            v = np.array([r[m] for r in sel], dtype=float)
            se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
            cells.append(f"{v.mean():9.4f} ± {se:6.4f}")
        lines.append(f"{label(a):>5s}  " + "  ".join(f"{c:>18s}" for c in cells) + f"  {len(sel)}")
    return "\n".join(lines)


def pairwise_text(rows: list[dict], metrics: tuple[str, ...]) -> str:
    out = []
    for m in metrics:
        for a, b in PAIRS:
            share = 100 * win_fraction(rows, m, a, b)
            out.append(f"{m}: {label(a)} beats {label(b)} in {share:.0f}%")
    return "\n".join(out)


def per_dataset_text(rows: list[dict], metrics: tuple[str, ...]) -> str:
    """Per data set: mean metric per alpha and the win fractions of 0.5 vs VFE vs EP."""
    out = []
    for name in sorted({r["dataset"] for r in rows}):
        sel = [r for r in rows if r["dataset"] == name]
        for m in metrics:
            means = "  ".join(f"{label(a)}={np.mean([r[m] for r in sel if r['alpha'] == a]):.4f}"
                              for a in sorted({r["alpha"] for r in sel}))
            wins = "  ".join(f"{label(a)}>{label(b)} {100 * win_fraction(sel, m, a, b):.0f}%"
                             for a, b in PAIRS)
            out.append(f"{name:10s} {m}: {means} | wins {wins}")
    return "\n".join(out)


def plot_metric_vs_alpha(rows: list[dict], metrics: tuple[str, ...], path: Path, title: str,
                         per_dataset: bool = False) -> Path:
    """Mean metric against alpha, one line per M (with standard-error bars): one panel per
    metric over all data sets, or with ``per_dataset`` one row of panels per data set."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({r["dataset"] for r in rows}) if per_dataset else [None]
    fig, axes = plt.subplots(len(groups), len(metrics), squeeze=False,
                             figsize=(4.2 * len(metrics), 3.0 * len(groups) + 0.6))
    for g, name in enumerate(groups):
        sel = [r for r in rows if name is None or r["dataset"] == name]
        for ax, m in zip(axes[g], metrics):
            for M in sorted({r["M"] for r in sel}):
                alphas = sorted({r["alpha"] for r in sel if r["M"] == M})
                vals = [np.array([r[m] for r in sel if r["M"] == M and r["alpha"] == a])
                        for a in alphas]
                se = [v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else 0.0 for v in vals]
                ax.errorbar(alphas, [v.mean() for v in vals], yerr=se, fmt="o-", ms=3,
                            capsize=2, label=f"M={M}")
            ax.set_xlabel("alpha (0 = VFE, 1 = EP)")
            ax.set_ylabel(m if name is None else f"{name}: {m}")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(title, 60 * len(metrics))), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def alpha_metrics(rows: list[dict], metrics: tuple[str, ...], alphas,
                  win_metrics: tuple[str, ...]) -> dict[str, float]:
    """The run's summary metrics: the mean of each metric per alpha (``<metric>_alpha<a>``) and
    the win fractions of ``PAIRS`` for ``win_metrics`` (``win_<metric>_<a>_vs_<b>``)."""
    summary = {f"{m}_alpha{a:g}": float(np.mean([r[m] for r in rows if r["alpha"] == a]))
               for m in metrics for a in alphas}
    summary.update({f"win_{m}_{label(a)}_vs_{label(b)}": win_fraction(rows, m, a, b)
                    for m in win_metrics for a, b in PAIRS})
    return summary


def add_run_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """The options every reproduction script has: ``--out`` (default ``outputs/<out>``),
    ``--tracking-uri``, ``--merge`` and ``--summarise``."""
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "outputs" / out)
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="rows.json files of earlier runs to include in the summary")
    parser.add_argument("--summarise", action="store_true",
                        help="no fits: summarise, plot and log the rows already in --out")


def resume(out: Path) -> tuple[Path, list[dict], set[tuple]]:
    """``out/rows.jsonl`` (one line per finished fit; ``out`` made if missing), the rows already
    in it and their ``row_key``s: a run skips those fits."""
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "rows.jsonl"
    rows = load_rows(rows_file, key=row_key)
    return rows_file, rows, {row_key(r) for r in rows}


def summary_rows(rows: list[dict], merge: list[Path], alphas) -> list[dict]:
    """``rows`` and those of the ``merge`` files (``rows.json`` of earlier runs), of the cases
    with a result for every alpha (``complete_cases``); prints how many of all are kept."""
    rows = list(rows)
    for path in merge:
        rows += json.loads(path.read_text())
    n_all, rows = len(rows), complete_cases(rows, alphas)
    print(f"summary over {len(rows)} of {n_all} fits (cases with every alpha)")
    return rows


def publish(text: str, out: Path, experiment: str, params: dict, metrics: dict,
            plots: list[Path], tracking_uri: str | None) -> str:
    """Print the summary ``text`` and write it to ``out/summary.txt``; log ``params``,
    ``metrics``, the ``plots``, ``out/rows.json`` and the summary to MLflow; returns the run id."""
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    run_id = log_to_mlflow(experiment, params, metrics,
                           [*plots, out / "rows.json", out / "summary.txt"], tracking_uri)
    print(f"MLflow run {run_id}; plot {plots[0]}")
    return run_id


def log_to_mlflow(experiment: str, params: dict, metrics: dict, artifacts: list[Path],
                  tracking_uri: str | None = None) -> str:
    """One MLflow run holding the summary metrics and the artifacts; returns its id."""
    import mlflow

    from gpinfer.experiment.tracking import resolve_tracking_uri

    mlflow.set_tracking_uri(resolve_tracking_uri(tracking_uri))
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"{experiment}-summary") as run:
        mlflow.log_params({k: str(v)[:250] for k, v in params.items()})
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if np.isfinite(v)})
        for p in artifacts:
            mlflow.log_artifact(str(p))
        return run.info.run_id


def save_rows(rows: list[dict], path: Path) -> None:
    path.write_text(json.dumps(rows, indent=1))


def load_rows(path: Path, key=None) -> list[dict]:
    """The rows of a JSON-lines file (empty if it does not exist yet); with ``key`` (a function
    of a row) the first row of each key only (two workers may have repeated a fit)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if key is None:
        return rows
    first: dict = {}
    for r in rows:
        first.setdefault(key(r), r)
    return list(first.values())


def append_row(row: dict, path: Path) -> None:
    """Append one finished result to a JSON-lines file, so an interrupted run can resume."""
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def complete_cases(rows: list[dict], alphas) -> list[dict]:
    """The rows of the (data set, split, M) cases that have a result for every alpha, so that
    means and win fractions compare the same cases (a run stopped part-way leaves some short)."""
    by_case: dict[tuple, set] = defaultdict(set)
    for r in rows:
        by_case[(r["dataset"], r["split"], r["M"])].add(float(r["alpha"]))
    want = {float(a) for a in alphas}
    return [r for r in rows if want <= by_case[(r["dataset"], r["split"], r["M"])]]


def row_key(row: dict) -> tuple:
    """What identifies one fit of a reproduction grid."""
    return (row["dataset"], int(row["split"]), int(row["M"]), float(row["alpha"]))
