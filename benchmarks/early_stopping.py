"""Early stopping against over-fitting with iterations (issue "One training engine").

sep and vi-robustmax on wine, breast_cancer and digits, M = 10 % of the training points, the
random 90/10 splits of ``benchmarks/sep_table2.py`` (seed ``s``: ``train_test_split(ds, 0.1,
s)``, standardised on the training part), ``ITERS`` iterations. Each (dataset, method, seed)
runs twice:

* without early stopping, with the test NLL computed after every iteration (the *path*);
* with ``validation_fraction=0.2`` (``validation_interval=1``, ``n_iter_no_change=PATIENCE``)
  and the estimator's defaults otherwise: the number of iterations chosen on one hold-out, or by
  5-fold cross-validation where the hold-out would have fewer than 200 points (wine,
  breast_cancer; the earliest iteration within one standard error of the fold-averaged
  minimum), then a refit on all the training data for that many iterations
  (``gpinfer.training.early_stopping``). ``--folds 1`` forces the hold-out, ``--no-refit`` keeps
  the best iterate of the fit on the reduced data (the behaviour before the refit).

Printed per row: the best test NLL along the path, the final test NLL without early stopping,
the final test NLL with it (the iterations it chose, the folds), ``final_ES / best_path``
(target: at most 1.05). With the refit, the early-stopped model is the path's model at the
chosen iteration (the same deterministic steps on the same data), which the last column
checks.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/early_stopping.py [--seeds 1-3]
        [--iterations 250] [--patience 10] [--folds N] [--no-refit]
        [--out outputs/early_stopping.jsonl]
    .venv/bin/python benchmarks/early_stopping.py --summary outputs/early_stopping.jsonl

Each row also keeps every test point's log predictive density along the path
(``path_points``); ``--summary`` prints per (dataset, method) the mean and worst ratio over the
seeds and, per seed, the path's iterations within 5 % of its best and the 90 % bootstrap
interval of the ratio over resamples of the test points (``bootstrap_ratio``).

Seed 1 (issue 27, first round; test NLL, final with early stopping / best on the path). Before:
the best iterate of the fit on 80 % of the data. After: 5 folds on wine and breast_cancer, one
hold-out on digits, refit on all the data:

| dataset | method | best on path (iteration) | before: final, ratio | after: final (iter.), ratio |
|---|---|---|---|---|
| wine | sep | 0.1561 (152) | 0.2199, 1.409 | 0.1613 (179), 1.033 |
| wine | vi-robustmax | 0.0836 (8) | 0.1696, 2.028 | 0.1121 (6), 1.340 |
| bc | sep | 0.1192 (103) | 0.1252, 1.050 |
| bc | vi-robustmax | 0.1379 (15) | 0.1609, 1.167 |
| digits | sep | 0.1060 (250) | 0.1313, 1.238 | 0.1060 (250), 0.999 |
| digits | vi-robustmax | 0.0791 (250) | 0.0982, 1.241 | 0.0961 (28), 1.215 |

Seeds 1-3 (issue 27, second round; the defaults, patience 10): the one-standard-error rule of
the K folds before (the folds' spread at the minimum) and after (their paired differences,
``ValidationChoice.excess_se``); ratio (chosen iteration) [90 % bootstrap over the test
points]; bc = breast_cancer (57 test points), wine 18. wine sep "before" is replayed from full
fold curves (``--patience 250``, each fold's stop re-applied at patience 10); every other
number is a run.

| dataset | method | seed | best on path (it.) | its within 5 % | before | after |
|---|---|---|---|---|---|---|
| wine | sep | 1 | 0.1561 (152) | 84 | 1.020 (179) [1.00-1.15] | 1.292 (250) [1.00-1.68] |
| wine | sep | 2 | 0.1677 (78) | 57 | 1.140 (135) [1.00-1.37] | 1.863 (250) [1.01-2.50] |
| wine | sep | 3 | 0.0655 (250) | 10 | 1.881 (69) [1.17-7.23] | 1.098 (232) [1.05-1.25] |
| wine | vi-robustmax | 1 | 0.0836 (8) | 4 | 1.340 (6) [1.00-4.28] | 1.364 (13) [1.35-3.00] |
| wine | vi-robustmax | 2 | 0.1452 (2) | 3 | 1.068 (7) [1.02-2.83] | 1.323 (12) [1.16-2.69] |
| wine | vi-robustmax | 3 | 0.0011 (246) | 74 | 88.80 (3) [26.6-178] | 65.51 (4) [17.3-132] |
| bc | sep | 1 | 0.1192 (103) | 65 | 1.002 (102) [1.00-1.39] | 1.062 (151) [1.01-1.22] |
| bc | sep | 2 | 0.0199 (198) | 39 | 1.887 (87) [1.43-10.4] | 1.054 (178) [1.01-2.78] |
| bc | sep | 3 | 0.0816 (141) | 76 | 1.161 (69) [1.00-1.73] | 1.043 (113) [1.01-1.38] |
| bc | vi-robustmax | 1 | 0.1379 (15) | 20 | 1.092 (10) [1.04-5.65] | 1.063 (13) [1.03-3.33] |
| bc | vi-robustmax | 2 | 0.0028 (96) | 8 | 23.45 (7) [17.5-110] | 11.25 (8) [7.95-47.6] |
| bc | vi-robustmax | 3 | 0.1260 (6) | 2 | 1.378 (5) [1.25-3.66] | 1.000 (6) [1.00-3.16] |

Mean / worst over the seeds, before -> after: wine sep 1.347 / 1.881 -> 1.418 / 1.863; wine
vi-robustmax 30.40 / 88.80 -> 22.73 / 65.51; breast_cancer sep 1.350 / 1.887 -> 1.053 / 1.062;
breast_cancer vi-robustmax 8.640 / 23.45 -> 4.437 / 11.25. digits takes one hold-out (323
points), which the rule does not touch: vi-robustmax 1.215 (28) [1.14-1.61], 1.079 (50)
[1.04-1.28], 1.139 (38) [1.07-1.35] for seeds 1-3 (180 test points; mean 1.144, worst 1.215);
digits sep was not rerun (seed 1: 0.999, the first round).

Why vi-robustmax misses: the test sets hold 18 (wine) and 57 (breast_cancer) points, and its
path is within 5 % of its best at 2-20 of 250 iterations (wine seed 3 and breast_cancer seed 2
excepted, where the best test NLL is 0.001-0.003 and any early iteration is many times it).
The fold-averaged validation curve, which scores every training point once, disagrees with the
test path (wine seed 3: the folds' NLL rises from 0.087 at iteration 6 to 0.183 at 250 while
the test NLL falls from 0.031 to 0.001; seed 2: the folds' minimum at 12, the test's at 2 and
3 times higher by 250), and patience 10 or none (``--patience 250``) chooses the same
iterations. The bootstrap intervals show the ratio at a fixed iteration spanning 1.0-3 or more
over resamples of the test points: a 5 % target on these test sets is below their own noise.
The path itself: within 10 iterations of its best, 7 of vi-robustmax's 17 steps on wine seed 1
and 6 of 15 on breast_cancer seed 3 move the test NLL by more than 10 % (L-BFGS-B steps q(u),
Z and the kernel together), and in those steps one test point carries 44-55 % (median) of the
change; sep's path has no such step on any of the six.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from gpinfer import registry
from gpinfer.data import Standardizer, load_dataset, train_test_split
from gpinfer.estimator import GPClassifier
from gpinfer.kernels import make_kernel

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ["wine", "breast_cancer", "digits"]
METHODS = ["sep", "vi-robustmax"]


def _method(name: str) -> tuple[str, str | None, dict]:
    """(registered method, likelihood, options); the paper's VI baseline through svi when
    ``vi-robustmax`` is not a registered name."""
    if name == "vi-robustmax" and name not in registry.names(registry.METHODS):
        from sep_table2 import VI_LIKELIHOOD, VI_OPTIONS

        return "svi", VI_LIKELIHOOD, dict(VI_OPTIONS)
    return name, None, {}


def one(dataset: str, method: str, seed: int, iterations: int, patience: int,
        folds: int | None = None, refit: bool = True) -> dict[str, float]:
    ds = load_dataset(dataset)
    split = train_test_split(ds, 0.1, seed)
    st = Standardizer().fit(split.X_train)
    Xtr, Xte = st.transform(split.X_train), st.transform(split.X_test)
    classes, ytr = np.unique(split.y_train, return_inverse=True)
    yte = np.searchsorted(classes, split.y_test)
    M = max(1, round(0.1 * Xtr.shape[0]))
    name, likelihood, options = _method(method)
    kernel = make_kernel("rbf", Xtr.shape[1], ard=True)
    path: list[float] = []
    points: list[list[float]] = []  # [iteration][test point] log predictive density

    def test_nll(info) -> None:
        post = info.posterior()
        lp = np.asarray(post.log_predictive(Xte, yte), dtype=float)
        points.append(np.round(lp, 6).tolist())
        path.append(-float(np.mean(lp)))

    common = dict(method=name, M=M, kernel=kernel, likelihood=likelihood, max_iter=iterations,
                  random_state=seed, method_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = GPClassifier(**common).fit(Xtr, ytr, callback=test_nll)
        early = GPClassifier(**common, validation_fraction=0.2, validation_interval=1,
                             n_iter_no_change=patience, refit=refit,
                             validation_folds=folds).fit(Xtr, ytr)
    final = -float(np.mean(np.log(np.clip(full.predict_proba(Xte)[np.arange(len(yte)), yte],
                                          1e-300, None))))
    final_es = -float(np.mean(np.log(np.clip(
        early.predict_proba(Xte)[np.arange(len(yte)), yte], 1e-300, None))))
    diag = early.fit_result_.diagnostics
    k_best = int(diag.get("best_iteration", 0)) or len(path)
    # the path's model after the chosen number of iterations: what the refit must reproduce
    at_k = path[min(k_best, len(path)) - 1]
    return {"dataset": dataset, "method": method, "seed": seed, "M": M, "refit": refit,
            "folds": int(diag.get("validation_folds", 1)), "path_at_es_iteration": at_k,
            "ratio_path_at_es_to_best": at_k / min(path), "path": path,
            "best_path_nll": min(path), "best_path_iteration": int(np.argmin(path)) + 1,
            "final_nll": final, "final_nll_es": final_es, "es_iterations": early.n_iter_,
            "es_best_iteration": k_best, "val_nll": early.fit_result_.state["val_nll"].tolist(),
            "val_nll_folds": early.fit_result_.state["val_nll_folds"].tolist(),
            "ratio_es_to_best": final_es / min(path), "ratio_final_to_best": final / min(path),
            "n_test": int(len(yte)), "path_points": points}


def bootstrap_ratio(row: dict, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 5 % and 95 % points of ``path[k] / min(path)`` (``k``: the chosen iteration) over
    ``draws`` resamples of the test points with replacement: how much of the ratio is the test
    set's own noise. ``(nan, nan)`` for a row without ``path_points``."""
    if "path_points" not in row:
        return float("nan"), float("nan")
    lp = np.asarray(row["path_points"])  # [iterations, n_test]
    k = min(int(row["es_best_iteration"]), lp.shape[0]) - 1
    rng = np.random.default_rng(seed)
    ratios = np.empty(draws)
    for b in range(draws):
        path = -lp[:, rng.integers(0, lp.shape[1], lp.shape[1])].mean(axis=1)
        ratios[b] = path[k] / path.min()
    lo, hi = np.quantile(ratios, [0.05, 0.95])
    return float(lo), float(hi)


def summary(files: list[str]) -> None:
    """Per (dataset, method) over the seeds in ``files``: the mean and worst ratio of the
    early-stopped model's test NLL to the best on the path (target <= 1.05), and per seed the
    number of the path's iterations within 5 % of its best, the test points, and the
    bootstrap interval of the ratio (``bootstrap_ratio``)."""
    rows = [json.loads(line) for f in files for line in Path(f).read_text().splitlines()]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"]), []).append(r)
    print("| dataset | method | seeds | mean ratio | worst ratio | per seed: ratio (chosen "
          "iteration; best on path at; iterations within 5 %; 90 % bootstrap over the "
          "test points) | test points |")
    print("|---|---|---|---|---|---|---|")
    for (dataset, method), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        ratios = np.array([r["ratio_es_to_best"] for r in rs])
        cells = []
        for r in rs:
            path = np.asarray(r["path"])
            within = int(np.sum(path <= 1.05 * path.min()))
            lo, hi = bootstrap_ratio(r)
            cells.append(f"s{r['seed']}: {r['ratio_es_to_best']:.3f} ({r['es_best_iteration']}; "
                         f"{r['best_path_iteration']}; {within}; {lo:.2f}-{hi:.2f})")
        print(f"| {dataset} | {method} | {len(rs)} | {ratios.mean():.3f} | {ratios.max():.3f} | "
              f"{'; '.join(cells)} | {rs[0].get('n_test', '-')} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--iterations", type=int, default=250)
    ap.add_argument("--patience", type=int, default=10)
    ap.add_argument("--folds", type=int, default=None,
                    help="validation_folds (default: the estimator's choice)")
    ap.add_argument("--no-refit", dest="refit", action="store_false",
                    help="keep the best iterate of the fit on the reduced data")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default=str(ROOT / "outputs" / "early_stopping.jsonl"))
    ap.add_argument("--summary", nargs="+", default=None, metavar="JSONL",
                    help="print the per-(dataset, method) summary of these result files and exit")
    a = ap.parse_args()
    if a.summary:
        summary(a.summary)
        return
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    print("| dataset | method | seed | best NLL on the path (iteration) | final, no ES | "
          "final, ES (chosen iteration, folds) | ES / best | path at the chosen iteration |")
    print("|---|---|---|---|---|---|---|---|")
    with threadpool_limits(limits=1), open(a.out, "a") as fh:
        for dataset in a.datasets.split(","):
            for method in a.methods.split(","):
                for seed in seeds:
                    r = one(dataset, method, seed, a.iterations, a.patience, a.folds, a.refit)
                    fh.write(json.dumps(r) + "\n")
                    fh.flush()
                    print(f"| {dataset} | {method} | {seed} | {r['best_path_nll']:.4f} "
                          f"({r['best_path_iteration']}) | {r['final_nll']:.4f} | "
                          f"{r['final_nll_es']:.4f} ({r['es_best_iteration']}, {r['folds']}) | "
                          f"{r['ratio_es_to_best']:.3f} | {r['path_at_es_iteration']:.4f} |",
                          flush=True)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    main()
