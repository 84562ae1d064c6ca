"""Robustness over a fixed-hyper-parameter grid: every registered method of this project at every
node of a G x G grid of (log length-scale, log amplitude) in [-3, 5]^2 (issue 16).

Each node fits ``GPClassifier(method, kernel=RBF(exp(log_ell), exp(2 log_sf)),
optimize=False)`` (with ``lengthscale_init="kernel"`` for the methods with a median
heuristic, whose default ``"auto"`` now keeps such a kernel too: ``node_options``) on
overlapping Gaussian blobs (``gpinfer.testing.make_suite_data``: N points in 2-D, two classes
for every method and three for the multi-class ones) and classifies the outcome:

* ``ok``: finite evidence, predictive probabilities finite, in [0, 1] and summing to one;
* ``numerical``: a ``gpinfer.errors.NumericalError`` (the one acceptable failure: clear, named);
* ``raised``: any other exception;
* ``nonfinite``: the fit returned a non-finite evidence or probability;
* ``invalid``: probabilities (as the posterior returns them, before the estimator's
  normalisation) outside [0, 1] or rows not summing to one (tolerance 1e-6).

The per-method counts go to stdout as a Markdown table and to ``--out`` (``grid_robustness.json``
with every failing node and its message). ``--grid 8`` runs a coarser grid over the same box;
``--methods`` picks methods; ``--jobs`` shares the (method, classes) cells between processes.
Slow methods run with a reduced budget (``BUDGETS``), stated in the output.

    .venv/bin/python benchmarks/grid_robustness.py --out outputs/grid_robustness
    .venv/bin/python benchmarks/grid_robustness.py --grid 8 --methods ivm,mcmc-ais --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # small matrices: threaded BLAS only adds contention

import numpy as np  # noqa: E402

from gpinfer import registry  # noqa: E402
from gpinfer.errors import NumericalError  # noqa: E402

#: the box of the grid (both axes): log length-scale and log amplitude (log sigma_f)
LOW, HIGH = -3.0, 5.0
#: options that bound the cost of the slow methods at one node (everything else: defaults)
BUDGETS: dict[str, dict] = {"mcmc-ais": {"budget": "tiny"}}
#: iterations per fit (sweeps at fixed hyper-parameters)
MAX_ITER = 20
OUTCOMES = ("ok", "numerical", "raised", "nonfinite", "invalid")


def classify(est, X: np.ndarray) -> str:
    """The outcome of a fitted estimator (see the module docstring)."""
    if not np.isfinite(est.log_evidence_):
        return "nonfinite"
    P = np.asarray(est.posterior_.predict_proba(X), dtype=float)
    if P.ndim == 2 and P.shape[1] == 1:
        P = np.concatenate([1.0 - P, P], axis=1)
    if P.ndim == 1:
        P = np.stack([1.0 - P, P], axis=1)
    if not np.all(np.isfinite(P)):
        return "nonfinite"
    if np.any(P < -1e-12) or np.any(P > 1 + 1e-12) or np.max(np.abs(P.sum(axis=1) - 1)) > 1e-6:
        return "invalid"
    return "ok"


def node_options(method: str) -> dict:
    """The method options of every node: ``BUDGETS``' and, for the methods with a median
    heuristic, ``lengthscale_init="kernel"`` so that the node's length-scale is the one
    fitted whatever the default (``"median"`` until s40-median, whose ``"auto"`` keeps a
    ``Kernel`` object held fixed: without it, the grid's length-scale axis was void)."""
    options = dict(BUDGETS.get(method, {}))
    if "lengthscale_init" in registry.load_method(method).default_options:
        options["lengthscale_init"] = "kernel"
    return options


def run_cell(method: str, n_classes: int, grid: int, n: int, seed: int) -> dict:
    """Every grid node for one method and number of classes; counts and the failing nodes."""
    from gpinfer.estimator import GPClassifier
    from gpinfer.kernels import RBF
    from gpinfer.testing.method_suite import make_suite_data

    X, y = make_suite_data(n_classes, n=n, seed=seed)
    options = node_options(method)
    axis = np.linspace(LOW, HIGH, grid)
    counts = dict.fromkeys(OUTCOMES, 0)
    failures = []
    start = time.perf_counter()
    for log_ell in axis:
        for log_sf in axis:
            kernel = RBF(lengthscale=float(np.exp(log_ell)), variance=float(np.exp(2 * log_sf)))
            est = GPClassifier(method=method, kernel=kernel, optimize=False, max_iter=MAX_ITER,
                               random_state=seed, method_options=options or None)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(X, y)
                    outcome = classify(est, X)
                message = ""
            except NumericalError as err:
                outcome, message = "numerical", str(err)
            except Exception as err:  # noqa: BLE001 - counted and reported, never hidden
                outcome, message = "raised", f"{type(err).__name__}: {err}"
            counts[outcome] += 1
            if outcome != "ok":
                failures.append({"log_ell": float(log_ell), "log_sf": float(log_sf),
                                 "outcome": outcome, "message": message[:300]})
    return {"method": method, "classes": n_classes, "fits": grid * grid, **counts,
            "seconds": time.perf_counter() - start, "failures": failures}


def cells(methods: list[str]) -> list[tuple[str, int]]:
    """(method, classes) pairs: two classes for every method, three for multi-class ones."""
    out = []
    for name in methods:
        cls = registry.load_method(name)
        if "classification" not in cls.tasks:
            continue
        out.append((name, 2))
        if cls.multiclass:
            out.append((name, 3))
    return out


def table(rows: list[dict]) -> str:
    """The Markdown table of the counts (one row per method and number of classes)."""
    head = "| method | C | fits | ok | NumericalError | other raise | non-finite | invalid P | s |"
    lines = [head, "|" + "---|" * 9]
    for r in sorted(rows, key=lambda r: (r["method"], r["classes"])):
        lines.append(f"| {r['method']} | {r['classes']} | {r['fits']} | {r['ok']} | "
                     f"{r['numerical']} | {r['raised']} | {r['nonfinite']} | {r['invalid']} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=int, default=16, help="nodes per axis (default 16)")
    parser.add_argument("--n", type=int, default=40, help="training points (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=None, help="comma-separated (default: all own)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--out", default=None, help="folder for grid_robustness.json")
    args = parser.parse_args(argv)
    if args.grid < 2 or args.n < 6 or args.jobs < 1:
        parser.error("need --grid >= 2, --n >= 6 and --jobs >= 1")
    own = [e.name for e in registry.entries(registry.METHODS)
           if e.dist in registry.OWN_DISTRIBUTIONS]
    methods = own if args.methods is None else args.methods.split(",")
    todo = cells(methods)
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_cell, m, c, args.grid, args.n, args.seed) for m, c in todo]
        rows = []
        for fut in futures:
            rows.append(fut.result())
            r = rows[-1]
            print(f"{r['method']} C={r['classes']}: " + ", ".join(
                f"{k} {r[k]}" for k in OUTCOMES) + f" ({r['seconds']:.0f} s)", flush=True)
    print(f"\ngrid {args.grid} x {args.grid} over [{LOW:g}, {HIGH:g}]^2, N = {args.n}, "
          f"optimize=False, max_iter={MAX_ITER}, budgets {BUDGETS}\n")
    print(table(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "grid_robustness.json").write_text(json.dumps(
            {"grid": args.grid, "n": args.n, "seed": args.seed, "box": [LOW, HIGH],
             "max_iter": MAX_ITER, "budgets": BUDGETS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
