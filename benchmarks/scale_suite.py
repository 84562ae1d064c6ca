"""Scale suite: every method that claims to scale, on large synthetic sets, next to baselines.

For each data set (``gpinfer.data.generators.scale_synthetic``: 1e5-2e5 training points, 3, 10
or 50 features, binary or three-class, balanced or unbalanced, non-linear so not linearly
separable) and each scalable method (sep, ep with mini-batches, svi, vi-jj, vi-taylor,
vi-jj-hybrid, vi-jj-full, pep; the three-class sets take sep, ep and svi), one fit with the
method's defaults (M = 100, iteration counts below) prints

* test accuracy and test NLL, next to plain logistic regression (scikit-learn, multinomial) and
  the class-frequency baseline (its NLL is the entropy of the training class frequencies);
* the fit guard's findings (``fit_warnings``: a restored best iterate, a training NLL worse than
  the class frequencies);
* the steady-state training time per reported iteration (iterations 2..n, training-only clock)
  next to the iteration's FLOP count (``benchmarks/flop_models.py``) at this machine's one-thread
  dgemm rate, measured in the same process: ``ratio = time / (FLOP / rate)``.

Targets (issue "No silent garbage at scale"): every method at least as accurate as logistic
regression, no NLL above the class-frequency baseline, no ratio above 5.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/scale_suite.py \\
        [--sets bin-d3-unbal ...] [--methods vi-taylor ...] [--out outputs/scale_suite.jsonl]

Results are appended to ``--out`` one JSON line per (set, method) as they finish; pairs already
there are skipped, so an interrupted suite resumes. ``--quick`` divides every N by 20 (a smoke
run in a minute or two). Needs nothing from ``../shared``.

``--stress`` (issue 27): the generated family ``STRESS_SETS`` (``stress_binary``: skin-like
colour features, negatives per positive 1 to 20, a curved tube or tight clusters of positives,
nearly separable, features on scales from 1e-2 to 1e3, ``n`` = 2e4 ... 5e5 points before the
80/20 split; standardised on the training part as a user would, except the ``raw-`` sets) with
vi-taylor against vi-jj-hybrid, ``M = 100``, defaults, ``max_iter = 100`` (``--max-iter``
to reduce it). vi-taylor passes a set when its test accuracy is at most 0.005 below
vi-jj-hybrid's and its test NLL at most 20 % above it, or when it refuses with an error that
names vi-jj-hybrid:

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/scale_suite.py --stress \\
        [--sets tube-1:1-2e4 ...] [--max-iter 100] [--out outputs/stress_suite.jsonl] \\
        [--stress-methods vi-taylor vi-jj-hybrid vi-taylor-unguarded]

``vi-taylor-unguarded`` (vi-taylor with ``guard=False``: the method as it was before issue 27)
adds a "before" column. ``--taylor-options '{"tol": 0}'`` runs vi-taylor for all ``max_iter``
iterations (its default stops when the objective changes by under ``tol`` twice in a row), so
that the guard is exercised over the whole run.

Issue 27, second round (2-core machine shared with other work, load average 7-11, 3-6 for
the last two vi-jj-hybrid rows: the seconds are inflated; each fit in its own process, one
after the other; ``max_iter = 100`` unless marked). vi-taylor stops by its ``tol`` rule after
8-10 iterations on every set (its Stage-2 steps are then refused by the guard, so the objective
stops changing); vi-jj-hybrid runs all 100:

| set | n train | pos | vi-taylor acc/NLL/s/its | vi-jj-hybrid acc/NLL/s/its | verdict |
|---|---|---|---|---|---|
| tube-1:1-2e4 | 16000 | 0.498 | 0.9915/0.0321/43/9 (a) | 0.9910/0.0284/176/100 | pass |
| clusters-1:5-2e4 | 16000 | 0.165 | 0.9853/0.0410/36/8 | 0.9860/0.0395/172/100 | pass |
| tube-1:20-2e4 | 16000 | 0.047 | 0.9960/0.0220/32/8 (a) | 0.9950/0.0237/196/100 | pass |
| raw-scales-clusters-1:5-2e4 | 16000 | 0.165 | 0.9853/0.0410/36/8 | 0.9860/0.0395/116/100 | pass |
| skin-like-1:3.8-2.5e5 | 196046 | 0.209 | 0.9967/0.0132/359/10 | 0.9940/0.0186/1650/100 | pass |
| tube-1:5-5e5 (c) | 400000 | 0.166 | 0.9969/0.0118/1067 (b) | 0.9920/0.0257/930/20 | pass |

(a) ``restored_best_iterate``: the run ended with a training NLL (fixed 1000-point subsample)
9-13 % above its best iterate's, which the fit guard restored. (b) The first round's row (not
rerun). (c) max_iter 20 for both. raw-scales is clusters-1:5 on the features' own scales;
``standardize="auto"`` standardises them inside the estimator, so both fits are clusters-1:5's
(test NLL equal to 1e-13). With ``tol = 0`` on tube-1:20-2e4, vi-taylor runs all 100
iterations (315 s): 0.9960 / 0.0220, the same restored iterate and kernel (length-scale 0.910,
variance 61.5), the guard refusing 97 % of the Stage-2 steps and no runaway (the issue's
unguarded failure came at iteration 37).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flop_models  # noqa: E402

import gpinfer  # noqa: E402
from gpinfer.data.generators import scale_synthetic, stress_binary  # noqa: E402
from gpinfer.data.splits import standardize, train_test_split  # noqa: E402

#: data sets: ``scale_synthetic`` options (20 % of ``n`` is held out for testing)
SETS: dict[str, dict] = {
    "bin-d3-unbal": dict(n=250_000, d=3, n_classes=2, unbalanced=True),
    "bin-d10-bal": dict(n=125_000, d=10, n_classes=2, unbalanced=False),
    "bin-d50-bal": dict(n=125_000, d=50, n_classes=2, unbalanced=False),
    "tri-d3-bal": dict(n=125_000, d=3, n_classes=3, unbalanced=False),
    "tri-d10-unbal": dict(n=125_000, d=10, n_classes=3, unbalanced=True),
}
#: methods: estimator arguments beyond ``M`` (defaults otherwise); ``binary_only`` marks the
#: methods the three-class sets skip
METHODS: dict[str, dict] = {
    "vi-jj": dict(max_iter=30),
    "vi-taylor": dict(max_iter=30),
    "vi-jj-hybrid": dict(max_iter=20),
    "vi-jj-full": dict(max_iter=60),
    "pep": dict(max_iter=8),
    "svi": dict(max_iter=50, batch_size=500),
    "sep": dict(max_iter=4, batch_size=500),
    "ep": dict(max_iter=2, batch_size=500),
}
BINARY_ONLY = {"vi-jj", "vi-taylor", "vi-jj-hybrid", "vi-jj-full", "pep"}
M_INDUCING = 100

#: the stress family of issue 27: ``stress_binary`` options; ``n`` before the 80/20 split;
#: ``standardise=False``: the features are left on their scales (1, 1e3, 1e-2)
STRESS_SETS: dict[str, dict] = {
    "tube-1:1-2e4": dict(n=20_000, ratio=1.0, layout="tube"),
    "clusters-1:5-2e4": dict(n=20_000, ratio=5.0, layout="clusters"),
    "tube-1:20-2e4": dict(n=20_000, ratio=20.0, layout="tube"),
    "raw-scales-clusters-1:5-2e4": dict(n=20_000, ratio=5.0, layout="clusters",
                                        scales=(1.0, 1e3, 1e-2), standardise=False),
    "scales-tube-1:5-1e5": dict(n=100_000, ratio=5.0, layout="tube", scales=(1e-2, 1.0, 1e3)),
    "clusters-1:20-1e5": dict(n=100_000, ratio=20.0, layout="clusters"),
    "skin-like-1:3.8-2.5e5": dict(n=245_057, ratio=3.76, layout="tube"),  # 21 % positives
    "tube-1:5-5e5": dict(n=500_000, ratio=5.0, layout="tube"),
}
#: the pair compared on the stress family
STRESS_METHODS = ("vi-taylor", "vi-jj-hybrid")
#: vi-taylor as it was before its Stage-2 guard (``guard=False``: no guard, no
#: trust region, no refusal), reported beside the pair
UNGUARDED = "vi-taylor-unguarded"
#: vi-taylor's allowance against vi-jj-hybrid: accuracy (absolute) and NLL (relative)
STRESS_ACCURACY_DROP, STRESS_NLL_RATIO = 0.005, 1.2


def load(name: str, quick: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardised ``(X_train, y_train, X_test, y_test)`` of set ``name``."""
    opts = dict(SETS[name])
    if quick:
        opts["n"] //= 20
    ds = scale_synthetic(seed=0, **opts)
    split = train_test_split(ds, test_fraction=0.2, seed=0)
    split, _ = standardize(split)
    return split.X_train, split.y_train, split.X_test, split.y_test


def load_stress(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)`` of stress set ``name`` (80/20, seed 0)."""
    opts = dict(STRESS_SETS[name])
    scale = opts.pop("standardise", True)
    split = train_test_split(stress_binary(seed=0, **opts), test_fraction=0.2, seed=0)
    if scale:
        split, _ = standardize(split)
    return split.X_train, split.y_train, split.X_test, split.y_test


def nll_and_accuracy(P: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = np.clip(P[np.arange(y.size), y], 1e-300, 1.0)
    return float(-np.mean(np.log(p))), float(np.mean(P.argmax(axis=1) == y))


def baselines(X: np.ndarray, y: np.ndarray, Xt: np.ndarray, yt: np.ndarray
              ) -> dict[str, float]:
    freq = np.bincount(y) / y.size
    lr = LogisticRegression(max_iter=1000).fit(X, y)
    lr_nll, lr_acc = nll_and_accuracy(lr.predict_proba(Xt), yt)
    return {"freq_nll": float(-np.mean(np.log(freq[yt]))), "freq_acc": float(freq.max()),
            "lr_nll": lr_nll, "lr_acc": lr_acc}


def per_iteration_extras(method: str, extras: list[dict]) -> list[dict]:
    """Each iteration's ``extra`` with cumulative counters turned into per-iteration ones
    (svi ``steps`` -> ``steps_in_iteration``, vi-jj-full ``nfev``)."""
    out: list[dict] = []
    prev: dict = {}
    for extra in extras:
        row = dict(extra)
        if method == "svi" and "steps" in extra:
            row["steps_in_iteration"] = extra["steps"] - prev.get("steps", 0.0)
        if method == "vi-jj-full" and "nfev" in extra:
            row["nfev"] = extra["nfev"] - prev.get("nfev", 0.0)
        out.append(row)
        prev = extra
    return out


def mean_iteration_flops(method: str, extras: list[dict], n: int, m: int, d: int,
                         n_latent: int, batch: int | None) -> float:
    """Mean FLOP over the iterations whose ``extras`` are given (see ``flop_models``)."""
    per = [flop_models.iteration_flops(method, e, n=n, m=m, d=d, n_latent=n_latent, batch=batch)
           for e in extras]
    return float(np.mean(per)) if per else float("nan")


def run_one(method: str, data: tuple, rate: float, args: dict | None = None) -> dict:
    """One fit of ``method`` (estimator arguments ``args``, default ``METHODS[method]``)."""
    X, y, Xt, yt = data
    args = dict(METHODS[method]) if args is None else dict(args)
    seen: list = []
    clf = gpinfer.GPClassifier(method=method, M=M_INDUCING, random_state=0, **args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        try:
            clf.fit(X, y, callback=seen.append)
            error = None
        except Exception as exc:  # a failed fit is a result too
            error = f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
    row: dict = {"method": method, "wall_s": wall, "error": error,
                 "warnings": sorted({str(w.message)[:160] for w in caught})}
    if error is not None:
        return row
    nll, acc = nll_and_accuracy(clf.predict_proba(Xt), yt)
    C = int(np.max(y)) + 1
    n_latent = 1 if C == 2 and method not in ("sep", "ep") else C
    steady = seen[1:]
    secs = ((seen[-1].elapsed - seen[0].elapsed) / len(steady)) if steady else float("nan")
    extras = per_iteration_extras(method, [dict(i.extra) for i in seen])[1:]
    flops = mean_iteration_flops(method, extras, n=X.shape[0], m=M_INDUCING, d=X.shape[1],
                                 n_latent=n_latent, batch=args.get("batch_size"))
    floor = flops / rate
    keys = sorted({k for e in extras for k in e})
    row["mean_extra"] = {k: float(np.mean([e.get(k, np.nan) for e in extras])) for k in keys}
    row.update(test_nll=nll, test_acc=acc, fit_warnings=list(clf.fit_warnings_),
               n_iter=int(clf.n_iter_), train_s=float(seen[-1].elapsed) if seen else wall,
               s_per_iter=secs, gflop_per_iter=flops / 1e9, floor_s=floor,
               ratio=secs / floor if floor > 0 else float("nan"),
               kernel=str(clf.kernel_))
    return row


def print_table(rows: list[dict]) -> None:
    head = ("set", "method", "acc", "LR acc", "NLL", "freq NLL", "LR NLL", "s/it", "GFLOP/it",
            "ratio", "warnings")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        if r.get("error"):
            print(f"| {r['set']} | {r['method']} | FAILED: {r['error'][:80]} |")
            continue
        cells = (r["set"], r["method"], f"{r['test_acc']:.4f}", f"{r['lr_acc']:.4f}",
                 f"{r['test_nll']:.4f}", f"{r['freq_nll']:.4f}", f"{r['lr_nll']:.4f}",
                 f"{r['s_per_iter']:.3f}", f"{r['gflop_per_iter']:.2f}", f"{r['ratio']:.2f}",
                 ",".join(r["fit_warnings"]) or "-")
        print("| " + " | ".join(cells) + " |")


def stress_verdict(taylor: dict, hybrid: dict) -> str:
    """``pass``/``FAIL`` of vi-taylor against vi-jj-hybrid on one stress set (module doc)."""
    if taylor.get("error"):
        return "pass (refused)" if "vi-jj-hybrid" in taylor["error"] else "FAIL (error)"
    if hybrid.get("error"):
        return "n/a (vi-jj-hybrid failed)"
    ok = (taylor["test_acc"] >= hybrid["test_acc"] - STRESS_ACCURACY_DROP
          and taylor["test_nll"] <= STRESS_NLL_RATIO * hybrid["test_nll"])
    return "pass" if ok else "FAIL"


def print_stress_table(rows: list[dict]) -> None:
    """One line per stress set: each method's accuracy, NLL, time, iterations, warnings."""
    by_set: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_set.setdefault(r["set"], {})[r["method"]] = r
    head = ["set", "n train", "pos", "max_iter"]
    for m in STRESS_METHODS:
        head += [f"{m} acc", "NLL", "s", "iters", "warnings"]
    before = any(r["method"] == UNGUARDED for r in rows)
    if before:
        head.append("unguarded acc / NLL")
    print("| " + " | ".join(head + ["verdict"]) + " |")
    print("|" + "---|" * (len(head) + 1))
    for name, pair in by_set.items():
        first = next(iter(pair.values()))
        cells = [name, str(first["n_train"]), f"{first['pos_frac']:.3f}", str(first["max_iter"])]
        for m in STRESS_METHODS:
            res = pair.get(m)
            if res is None:
                cells += ["-"] * 5
            elif res.get("error"):
                cells += [f"ERROR: {res['error'][:90]}", "-", f"{res['wall_s']:.0f}", "-", "-"]
            else:
                warn = sorted(set(res["fit_warnings"]) | {w[:40] for w in res["warnings"]})
                cells += [f"{res['test_acc']:.4f}", f"{res['test_nll']:.4f}",
                          f"{res['wall_s']:.0f}", str(res["n_iter"]), "; ".join(warn) or "-"]
        old = pair.get(UNGUARDED)
        if old is not None:  # before the guard: accuracy / NLL, or the error
            cells.append(f"ERROR: {old['error'][:60]}" if old.get("error")
                         else f"{old['test_acc']:.4f} / {old['test_nll']:.4g}")
        elif before:
            cells.append("-")
        both = all(m in pair for m in STRESS_METHODS)
        cells.append(stress_verdict(pair["vi-taylor"], pair["vi-jj-hybrid"]) if both else "-")
        print("| " + " | ".join(cells) + " |")


def run_stress(names: list[str], out: Path, max_iter: int,
               methods: tuple[str, ...] = STRESS_METHODS,
               taylor_options: dict | None = None) -> None:
    """``methods`` (of ``STRESS_METHODS`` and ``UNGUARDED``) on each stress set; rows appended
    to ``out`` (resumable). ``taylor_options``: vi-taylor's ``method_options`` (kept in its
    rows as ``options``)."""
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    rows = [r for r in rows if r.get("max_iter") == max_iter]
    done = {(r["set"], r["method"]) for r in rows}
    with threadpool_limits(limits=1):
        rate = flop_models.dgemm_rate()
        for name in names:
            data = None
            for method in methods:
                if (name, method) in done:
                    continue
                if data is None:
                    data = load_stress(name)
                args: dict = {"max_iter": max_iter}
                options = dict(taylor_options or {}) if method != "vi-jj-hybrid" else {}
                if method == UNGUARDED:
                    options["guard"] = False
                if options:
                    args["method_options"] = options
                fit = run_one("vi-taylor" if method == UNGUARDED else method, data, rate, args)
                row = {"set": name, "n_train": int(data[0].shape[0]), "max_iter": max_iter,
                       "pos_frac": float(np.mean(data[1])), **fit, "method": method,
                       "options": options}
                rows.append(row)
                with out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print_stress_table([row])
    print()
    print_stress_table(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="*", default=None,
                    help=f"of {list(SETS)} or, with --stress, of {list(STRESS_SETS)}")
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default=None,
                    help="outputs/scale_suite.jsonl (--stress: outputs/stress_suite.jsonl)")
    ap.add_argument("--quick", action="store_true", help="N / 20: a smoke run")
    ap.add_argument("--stress", action="store_true",
                    help="vi-taylor against vi-jj-hybrid on the generated stress family")
    ap.add_argument("--max-iter", type=int, default=100, help="--stress: max_iter of both")
    ap.add_argument("--stress-methods", nargs="*", default=list(STRESS_METHODS),
                    choices=list(STRESS_METHODS) + [UNGUARDED],
                    help=f"--stress: the methods; {UNGUARDED} is vi-taylor with guard=False")
    ap.add_argument("--taylor-options", type=json.loads, default=None,
                    help='--stress: vi-taylor\'s method_options as JSON, e.g. \'{"tol": 0}\' '
                         "(every iteration up to max_iter: the guard over the whole run)")
    args = ap.parse_args()
    known = STRESS_SETS if args.stress else SETS
    names = list(known) if args.sets is None else args.sets
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown sets {unknown}; known: {list(known)}")
    if args.stress:
        out = Path(args.out or "outputs/stress_suite.jsonl")
        out.parent.mkdir(parents=True, exist_ok=True)
        run_stress(names, out, args.max_iter, tuple(args.stress_methods), args.taylor_options)
        return
    args.sets = names
    out = Path(args.out or "outputs/scale_suite.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done = {(r["set"], r["method"], r.get("quick", False)) for r in rows}
    with threadpool_limits(limits=1):
        rate = flop_models.dgemm_rate()
        print(f"dgemm, one thread: {rate / 1e9:.1f} GFLOP/s", flush=True)
        for name in args.sets:
            data = None
            for method in args.methods:
                three = SETS[name]["n_classes"] > 2
                if (three and method in BINARY_ONLY) or (name, method, args.quick) in done:
                    continue
                if data is None:
                    data = load(name, args.quick)
                    base = baselines(*data)
                row = {"set": name, "quick": args.quick, "n_train": int(data[0].shape[0]),
                       "dgemm_gflops": rate / 1e9, **base, **run_one(method, data, rate)}
                rows.append(row)
                with out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print_table([row])
    print()
    print_table([r for r in rows if r.get("quick", False) == args.quick])


if __name__ == "__main__":
    main()
