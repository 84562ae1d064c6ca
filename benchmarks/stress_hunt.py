"""Stress hunt: a randomized sweep of every registered classification method over generated data
along the axes the fixed-seed suites cover thinly (session s40).

The suites (``tests/test_default_battery.py``, ``tests/test_method_defaults.py``, the plugins'
``MethodTestSuite`` subclasses, ``benchmarks/default_battery.py``, ``scale_suite.py`` and
``grid_robustness.py``) fit fixed problems: 40 points in 2-D with 2-3 balanced classes
(``make_suite_data``), one 3-D binary blob set under seven feature transforms (x1e-6, x1e2,
x1e6, one column x1e6, a constant column, every row duplicated), the 2-D GP argmax set, the
waveform set (D = 21, C = 3), scikit-learn's sets as shipped, the large ``scale_synthetic``
sets (D 3-50, 1:4 and 6:3:1 classes) and the skin-like ``stress_binary`` set (binary,
1:1-20:1). Thin or absent there: more than 3 classes, 95/5 and 99/1 imbalance with several
classes, fully separable classes, D up to 200, N from 20 to 5000 in one sweep, offsets of 1e6
(and 1e7 on a 1e-3 spread: seven digits left), per-column scales spread over 1e-4..1e4, rows
duplicated exactly or to 1e-9, quantised (tied) inputs, mini-batches that miss a class, float32
on the torch backend (for the methods that declare ``float32``; the others refuse it, rightly).

Each case is drawn from its own seed (``draw_case(seed)``: replay one case with
``--seeds S``); every eligible method is fitted with a small budget (``--max-iter``, default 8;
inducing methods ``M = min(30, N)``; AIS at its ``tiny`` budget; training sets subsampled to
``N_CAP`` for the methods whose cost grows as N^2 or N^3) and judged on a held-out
split against scikit-learn's logistic regression on the same (standardised) split and the
majority class. Findings per (case, method), one JSON line each in ``--out``:

* ``crash``: an exception that is not a gpinfer error (type and message kept);
* ``input`` / ``numerical``: an ``InputError`` / ``NumericalError`` (recorded, triaged by hand:
  truly bad input is right; ``vague`` is added when the message names no number);
* ``fit-failed``: the fit guard's ``FitFailedError`` (no better than the class frequencies);
  ``fit-failed!`` when logistic regression beats the majority rule by 0.05 on the same split
  (the data carried signal the method missed);
* ``nonfinite``: NaN or inf in ``predict_proba`` or in the posterior's probabilities;
* ``unnormalised``: the estimator's rows do not sum to 1 (tolerance 1e-6) or leave ``[0, 1]``;
  ``raw-sum``: the posterior's own rows (before the estimator normalises them) do;
* ``poor``: test error above the reference's + 0.15 and above the midpoint of the reference's
  and the majority rule's (``is_poor``);
* ``storm``: more than ``STORM`` warnings (not counting deprecations) from one fit.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stress_hunt.py \\
        --cases 40 --first-seed 4000 --out outputs/stress_hunt.jsonl
    .venv/bin/python benchmarks/stress_hunt.py --seeds 4017 --methods svi  # replay one case

Session s40 (``--first-seed 5000 --cpu-budget 1150``: 39 cases x 22 methods = 858 fits, 1180
CPU s, load 3-6 on the shared 2-core machine): no crash, non-finite or unnormalised
probability, vague ``NumericalError`` or warning storm; every failure a ``FitFailedError``
naming its cause (most on 95/5 and 99/1 sets where logistic regression does not beat the
majority rule either), one IVM-baseline fit over ``FIT_TIMEOUT`` (26 CPU s at load 5). Found
and triaged (the report of s40): vi-robustmax's mini-batch refusal named svi (fixed); ivm with
``M = 30`` on D >= 100 collapses to the constant model (s40-ivmflat: the criterion's own
optimum at that M, shown in ``tests/test_stress_findings.py``; ivm now warns with the way out);
``grid_robustness``'s length-scale axis was void
for the methods with a median heuristic (fixed); the argmax predictive's rows sum to one only
to ~1e-4 where one class's latent variance is ~1e10 times another's (seed 4001, gfitc;
beyond spec O15's 1e6, the estimator normalises).

Shapes: ``X [N, D]``, ``y [N]`` (integer labels ``0..C-1``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from gpinfer import registry  # noqa: E402
from gpinfer.errors import (  # noqa: E402
    FitFailedError,
    GPInferError,
    InputError,
    NumericalError,
)

Array = np.ndarray

#: more warnings than this from one fit is a storm
STORM = 20
#: seconds after which one fit is abandoned (SIGALRM; checked between BLAS calls)
FIT_TIMEOUT = 90
#: the largest training set per cost class of method (dense O(N^3) methods stay small)
N_CAP = {"dense": 600, "ais": 250, "inducing": 5000}  # "ais": AIS and the IVM baseline
DENSE_INDUCING = {"ivm"}  # inducing methods whose cost still grows with N^2
IMBALANCE = ("balanced", "95/5", "99/1")
SEPARATION = ("overlap", "near", "separable")
LAYOUTS = ("blobs", "rings")
TRANSFORMS = ("none", "scale-spread", "scale-global", "offset-1e6", "offset-1e7-narrow",
              "duplicated", "near-duplicated", "quantised", "constant-col")


@dataclass
class Case:
    """One generated problem, fully determined by ``seed``."""

    seed: int
    n: int
    d: int
    c: int
    imbalance: str
    separation: str
    layout: str
    transform: str
    minibatch: bool
    float32: bool

    def label(self) -> str:
        return (f"s{self.seed} N{self.n} D{self.d} C{self.c} {self.imbalance} {self.separation} "
                f"{self.layout} {self.transform}{' mb' if self.minibatch else ''}"
                f"{' f32' if self.float32 else ''}")


def draw_case(seed: int) -> Case:
    """The case of ``seed``: N log-uniform in 20..5000, D in 1..200 (log-uniform), C in 2..10
    (40 % of the cases binary), and one setting of each other axis."""
    rng = np.random.default_rng([seed, 7331])
    n = int(round(np.exp(rng.uniform(np.log(20), np.log(5000)))))
    d = int(round(np.exp(rng.uniform(0.0, np.log(200)))))
    c = 2 if rng.random() < 0.4 else int(rng.integers(3, 11))
    return Case(seed=seed, n=n, d=d, c=c,
                imbalance=str(rng.choice(IMBALANCE, p=[0.3, 0.35, 0.35])),
                separation=str(rng.choice(SEPARATION)),
                layout=str(rng.choice(LAYOUTS, p=[0.7, 0.3])),
                transform=str(rng.choice(TRANSFORMS)),
                minibatch=bool(rng.random() < 0.5),
                float32=bool(rng.random() < 0.5))


def _fractions(case: Case) -> Array:
    """Class fractions ``[C]``: balanced, or one majority class with 95 % / 99 % of the points
    and the rest shared equally."""
    if case.imbalance == "balanced":
        return np.full(case.c, 1.0 / case.c)
    major = 0.95 if case.imbalance == "95/5" else 0.99
    return np.concatenate([[major], np.full(case.c - 1, (1.0 - major) / (case.c - 1))])


def _labels(case: Case, m: int, rng: np.random.Generator) -> Array:
    """``y [m]`` drawn from the class fractions, every class at least twice."""
    y = rng.choice(case.c, size=m, p=_fractions(case))
    for k in range(case.c):  # top up absent classes by relabelling majority points
        short = 2 - int(np.sum(y == k))
        if short > 0:
            idx = rng.choice(np.flatnonzero(y == np.argmax(np.bincount(y, minlength=case.c))),
                             short, replace=False)
            y[idx] = k
    return y


def make_data(case: Case) -> tuple[Array, Array, Array, Array]:
    """``(X_train [N, D'], y_train [N], X_test [N*, D'], y_test [N*])`` of ``case``
    (``N* = max(200, N // 2)``; ``D' = D + 1`` for ``constant-col``)."""
    rng = np.random.default_rng([case.seed, 1])
    n_test = max(200, case.n // 2)
    m = case.n + n_test
    y = np.concatenate([_labels(case, case.n, rng), _labels(case, n_test, rng)])
    spread = {"overlap": 1.0, "near": 3.0, "separable": 12.0}[case.separation]
    k = min(case.d, 5)  # informative dimensions
    X = rng.standard_normal((m, case.d))
    if case.layout == "blobs":
        centres = rng.standard_normal((case.c, k))
        centres *= spread / np.maximum(np.linalg.norm(centres, axis=1, keepdims=True), 1e-12)
        X[:, :k] += centres[y]
    else:  # rings: class k at radius (k + 1) * spread / 3 in the informative dimensions
        direction = X[:, :k] / np.maximum(np.linalg.norm(X[:, :k], axis=1, keepdims=True), 1e-12)
        radius = (y + 1.0) * spread / 3.0 + 0.3 * rng.standard_normal(m)
        X[:, :k] = direction * radius[:, None]
    X, Xt, y, yt = X[: case.n], X[case.n:], y[: case.n], y[case.n:]
    if case.transform == "scale-spread":
        s = 10.0 ** rng.uniform(-4.0, 4.0, case.d)
        X, Xt = X * s, Xt * s
    elif case.transform == "scale-global":
        s = 10.0 ** rng.choice([-4.0, 4.0])
        X, Xt = X * s, Xt * s
    elif case.transform == "offset-1e6":
        X, Xt = X + 1e6, Xt + 1e6
    elif case.transform == "offset-1e7-narrow":  # 1e-3 spread on 1e7: ~7 digits left
        X, Xt = X * 1e-3 + 1e7, Xt * 1e-3 + 1e7
    elif case.transform in ("duplicated", "near-duplicated"):  # half the rows appear twice
        dup = rng.choice(case.n, case.n // 2, replace=False)
        jitter = 1e-9 * rng.standard_normal((len(dup), X.shape[1]))
        X = np.vstack([X, X[dup] + (jitter if case.transform == "near-duplicated" else 0.0)])
        y = np.concatenate([y, y[dup]])
    elif case.transform == "quantised":  # integer-valued features: many tied rows
        X, Xt = np.round(X), np.round(Xt)
    elif case.transform == "constant-col":
        X = np.hstack([X, np.full((len(X), 1), 7.0)])
        Xt = np.hstack([Xt, np.full((len(Xt), 1), 7.0)])
    return X, y.astype(np.int64), Xt, yt.astype(np.int64)


def reference_error(X: Array, y: Array, Xt: Array, yt: Array) -> float:
    """Test error of scikit-learn's logistic regression on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)).fit(X, y)
    return float(np.mean(model.predict(Xt) != yt))


def method_info(name: str) -> dict[str, Any]:
    cls = registry.load_method(name)
    cost = ("ais" if name in ("mcmc-ais", "ivm-baseline") else
            "inducing" if cls.uses_inducing_points and name not in DENSE_INDUCING else "dense")
    return {"multiclass": bool(cls.multiclass), "inducing": bool(cls.uses_inducing_points),
            "minibatch": bool(cls.supports_minibatch), "cost": cost,
            "torch": "torch" in getattr(cls, "backends", ()),
            "float32": bool(getattr(cls, "float32", False))}


def subsample(X: Array, y: Array, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
    """At most ``n`` rows of ``X``, ``y`` (stratified enough to keep every class twice)."""
    if len(y) <= n:
        return X, y
    keep = [rng.choice(np.flatnonzero(y == k), 2, replace=False) for k in np.unique(y)]
    rest = np.setdiff1d(np.arange(len(y)), np.concatenate(keep))
    idx = np.concatenate(keep + [rng.choice(rest, n - 2 * len(keep), replace=False)])
    return X[idx], y[idx]


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout(f"fit exceeded {FIT_TIMEOUT} s")


def run_method(name: str, info: dict[str, Any], case: Case, data: tuple[Array, ...],
               max_iter: int) -> dict[str, Any]:
    """Fit ``name`` on ``case``'s data (binarised for binary-only methods: class 0 against the
    rest; subsampled to the method's ``N_CAP``) and classify what happened."""
    from gpinfer.estimator import GPClassifier

    X, y, Xt, yt = data
    if not info["multiclass"]:
        y, yt = (y != 0).astype(np.int64), (yt != 0).astype(np.int64)
    X, y = subsample(X, y, N_CAP[info["cost"]], np.random.default_rng([case.seed, 2]))
    params: dict[str, Any] = {"method": name, "max_iter": max_iter, "random_state": case.seed}
    if info["inducing"]:
        params["M"] = min(30, len(y))
    if name == "mcmc-ais":
        params["method_options"] = {"budget": "tiny"}
    if case.minibatch and info["minibatch"]:
        params["batch_size"] = max(8, min(64, len(y) // 4))
        if name == "vi-robustmax":  # its L-BFGS-B is full-batch only (refused, rightly)
            params["method_options"] = {"optimizer": "adadelta"}
    if case.float32 and info["torch"] and info["float32"]:  # others refuse it, rightly
        params.update(backend="torch", dtype="float32")
    row: dict[str, Any] = {"seed": case.seed, "case": case.label(), "method": name,
                           "n_fit": len(y), "n_classes_fit": int(y.max()) + 1,
                           "params": {k: v for k, v in params.items() if k != "method"},
                           "kinds": [], "error": None}
    row["ref_err"] = reference_error(X, y, Xt, yt)
    row["maj_err"] = float(np.mean(yt != np.argmax(np.bincount(y))))
    cpu = time.process_time()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(FIT_TIMEOUT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            est = GPClassifier(**params).fit(X, y)
            P = np.asarray(est.predict_proba(Xt), dtype=float)
            raw = np.asarray(est.posterior_.predict_proba(np.asarray(Xt, dtype=float)),
                             dtype=float)
        except Exception as exc:  # noqa: BLE001 - a crash is a finding too
            row["kinds"] += error_kinds(exc, informative=row["ref_err"] < row["maj_err"] - 0.05)
            row["error"] = (str(exc) if isinstance(exc, _Timeout) else
                            f"{type(exc).__name__}: {str(exc)[:400]}")
        else:
            judge(row, est, P, raw, yt)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    row["cpu_s"] = round(time.process_time() - cpu, 3)
    noisy = [w for w in caught if not issubclass(w.category, DeprecationWarning)]
    row["n_warnings"] = len(noisy)
    row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in noisy})[:5]
    if len(noisy) > STORM:
        row["kinds"].append("storm")
    return row


def error_kinds(exc: Exception, informative: bool) -> list[str]:
    """The findings of a fit that raised ``exc`` (module docstring); ``informative``: logistic
    regression beat the majority rule by 0.05 on the same split (``fit-failed!``)."""
    if isinstance(exc, _Timeout):
        return ["timeout"]
    if isinstance(exc, InputError):
        return ["input"]
    if isinstance(exc, FitFailedError):  # the fit guard: no better than the class frequencies
        return ["fit-failed" + ("!" if informative else "")]
    if isinstance(exc, NumericalError):
        return ["numerical"] + ([] if any(ch.isdigit() for ch in str(exc)) else ["vague"])
    if isinstance(exc, GPInferError):
        return ["gpinfer-error"]
    return ["crash"]


def judge(row: dict[str, Any], est: Any, P: Array, raw: Array, yt: Array) -> None:
    """Add the findings on a fitted estimator's test probabilities ``P [N*, C]`` and the
    posterior's own ``raw`` (``[N*]``, ``[N*, 1]`` or ``[N*, C]``) to ``row``."""
    if raw.ndim == 1 or raw.shape[1] == 1:
        raw = raw.reshape(-1, 1)
        raw = np.hstack([1.0 - raw, raw])
    if not (np.all(np.isfinite(P)) and np.all(np.isfinite(raw))):
        row["kinds"].append("nonfinite")
        return
    row["raw_sum_dev"] = float(np.max(np.abs(raw.sum(axis=1) - 1.0)))
    if np.max(np.abs(P.sum(axis=1) - 1.0)) > 1e-6 or P.min() < 0.0 or P.max() > 1.0:
        row["kinds"].append("unnormalised")
    elif row["raw_sum_dev"] > 1e-6 or raw.min() < -1e-12 or raw.max() > 1 + 1e-12:
        row["kinds"].append("raw-sum")  # the posterior's own rows (the estimator normalises)
    pred = est.classes_[np.argmax(P, axis=1)]
    err = float(np.mean(pred != yt))
    seen = np.isin(yt, est.classes_)  # test rows of the classes the fit saw
    cols = np.searchsorted(est.classes_, yt[seen])
    row["err"] = err
    row["nll"] = float(-np.mean(np.log(np.clip(P[np.flatnonzero(seen), cols], 1e-300, None))))
    if is_poor(row):
        row["kinds"].append("poor")


def is_poor(row: dict[str, Any]) -> bool:
    """Test error 0.15 above the reference's and above the midpoint of the reference's and the
    majority rule's (the fit recovered less than half of what logistic regression gains)."""
    err, ref, maj = row["err"], row["ref_err"], row["maj_err"]
    return bool(err > ref + 0.15 and err > 0.5 * (ref + maj))


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per method, fits and the count of each finding."""
    kinds = ["crash", "input", "fit-failed", "fit-failed!", "numerical", "vague",
             "gpinfer-error", "timeout", "nonfinite", "unnormalised", "raw-sum", "poor", "storm"]
    lines = ["| method | fits | ok | " + " | ".join(kinds) + " | cpu s |",
             "|" + "---|" * (len(kinds) + 4)]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    for name in sorted(by):
        rs = by[name]
        count = Counter(k for r in rs for k in r["kinds"])
        ok = sum(1 for r in rs if not r["kinds"])
        cpu = sum(r["cpu_s"] for r in rs)
        lines.append(f"| {name} | {len(rs)} | {ok} | "
                     + " | ".join(str(count.get(k, 0)) for k in kinds) + f" | {cpu:.0f} |")
    return "\n".join(lines)


def load_rows(path: str) -> list[dict[str, Any]]:
    """The rows of an ``--out`` file, ``poor`` judged again by this version (``is_poor`` reads
    the row's errors); the other findings as recorded (the probabilities they were judged on
    are not kept: ``unnormalised`` and ``raw-sum`` cannot be told apart again)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    for r in rows:
        r["kinds"] = [k for k in r["kinds"] if k != "poor"]
        if "err" in r and is_poor(r):
            r["kinds"].append("poor")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=4000)
    parser.add_argument("--seeds", default=None, help="comma-separated case seeds (replay)")
    parser.add_argument("--methods", default=None, help="comma-separated (default: all)")
    parser.add_argument("--max-iter", type=int, default=8)
    parser.add_argument("--cpu-budget", type=float, default=1200.0,
                        help="stop starting cases after this many CPU seconds")
    parser.add_argument("--out", default=None, help="JSON lines, one per (case, method)")
    parser.add_argument("--summarise", default=None,
                        help="print the table of an earlier --out file and stop")
    args = parser.parse_args(argv)
    if args.summarise:
        print(table(load_rows(args.summarise)))
        return
    seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds
             else list(range(args.first_seed, args.first_seed + args.cases)))
    names = args.methods.split(",") if args.methods else registry.names(registry.METHODS)
    infos = {n: method_info(n) for n in names
             if "classification" in registry.load_method(n).tasks}
    out = open(args.out, "a") if args.out else None  # noqa: SIM115 - lines as they finish
    rows: list[dict[str, Any]] = []
    start = time.process_time()
    for seed in seeds:
        if time.process_time() - start > args.cpu_budget:
            print(f"CPU budget spent; stopped before case seed {seed}", file=sys.stderr)
            break
        case = draw_case(seed)
        data = make_data(case)
        print(f"# {case.label()}", flush=True)
        for name, info in infos.items():
            row = run_method(name, info, case, data, args.max_iter)
            rows.append(row)
            if row["kinds"]:
                print(f"  {name:13s} {','.join(row['kinds']):20s} err {row.get('err', '-')} "
                      f"ref {row['ref_err']:.3f} maj {row['maj_err']:.3f} "
                      f"{row['cpu_s']:.1f}s {(row['error'] or '; '.join(row['warnings']))[:200]}",
                      flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    print(table(rows))
    if out:
        out.close()
    print(f"{len(rows)} fits, {time.process_time() - start:.0f} CPU s, load "
          f"{os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
