"""Cost of ``ivm`` and ``ivm-baseline`` at their defaults on scikit-learn's data sets (issue 27).

    OMP_NUM_THREADS=1 python benchmarks/ivm_cost.py [--sets iris,digits] [--methods ivm]
        [--profile] [--option key=value ...] [--no-optimize]
    OMP_NUM_THREADS=1 python benchmarks/ivm_cost.py --rules

One line per fit (the battery's data: ``gpinfer.testing.default_battery.sklearn_case``, every
default, multi-class): the quadrature rule in use, CPU seconds (``time.process_time``, less
affected by other processes than the wall clock), wall seconds, the 1-minute load average at
the end, held-out accuracy and NLL. ``--profile`` adds the CPU share of each phase under
cProfile (which inflates the total): quadrature (``softmax_tilted``, ``diagonal_softmax_*``,
``softmax_predictive``, ``softmax_expected_log_prob``), the restricted projection, the liquid
set's rebuilds and site updates, and the learning criterion.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from timing import best_of  # noqa: E402

from gpinfer.testing.default_battery import SKLEARN_SETS, sklearn_case  # noqa: E402

#: phase name -> function names whose cumulative time it is (not nested in one another)
PHASES = {
    "quadrature": ("softmax_tilted", "diagonal_softmax_tilted", "softmax_predictive",
                   "diagonal_softmax_predictive", "softmax_expected_log_prob",
                   "diagonal_softmax_expected_log_prob"),
    "projection": ("restricted_projection",),
    "liquid": ("rebuild", "set_site"),
    "criterion": ("criterion",),
}


def _phases(prof: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out = dict.fromkeys(PHASES, 0.0)
    for (path, _, name), (_, _, _, cum, _) in stats.items():
        if "gpinfer" not in path:
            continue
        for phase, names in PHASES.items():
            if name in names:
                out[phase] += cum
    return out


def run(method: str, data: str, options: dict[str, object], optimize: bool | None,
        profile: bool) -> str:
    from gpinfer.estimator import GPClassifier

    X, y, Xt, yt = sklearn_case(data, True)
    kw: dict[str, object] = {"random_state": 0}
    if options:
        kw["method_options"] = options
    if optimize is not None:
        kw["optimize"] = optimize
    prof = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if prof is not None:
            prof.enable()
        est = GPClassifier(method=method, **kw).fit(X, y)
        P = est.predict_proba(Xt)
        if prof is not None:
            prof.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    cols = np.searchsorted(est.classes_, yt)
    nll = -np.mean(np.log(np.clip(P[np.arange(len(yt)), cols], 1e-300, None)))
    acc = np.mean(est.classes_[P.argmax(axis=1)] == yt)
    rule = est.fit_result_.posterior.quadrature
    line = (f"{method:13s} {data:14s} C={len(est.classes_):2d} rule={rule[0]:8s} "
            f"cpu={cpu:7.1f}s wall={wall:7.1f}s load={os.getloadavg()[0]:4.1f} "
            f"acc={acc:.3f} nll={nll:.4f}")
    if prof is not None:
        line += " | " + " ".join(f"{k}={v:.1f}s" for k, v in _phases(prof).items())
    return line


def rules(C: int = 10, n: int = 350, repeat: int = 3) -> None:
    """CPU seconds of one tilted-moment call: ``ivm``'s (one point, full covariance: former
    default reduced GH-3 product against the Sobol rule) and ``ivm-baseline``'s scoring step
    (``n`` points, diagonal covariances: former default GH-3 product against the exact 1-D
    reduction), interleaved, with the worst error of the tilted means against a fine rule."""
    from gpinfer_ivm.diagonal_softmax import diagonal_softmax_tilted
    from gpinfer_ivm.gaussian_cubature import softmax_tilted

    rng = np.random.default_rng(0)
    h = rng.normal(size=(n, C))
    a = rng.uniform(0.05, 1.0, size=(n, C))
    y = rng.integers(C, size=n)
    A = np.zeros((n, C, C))
    A[:, np.arange(C), np.arange(C)] = a
    W = rng.normal(size=(C, C)) / np.sqrt(C)
    S = W @ W.T + 0.1 * np.eye(C)  # a full covariance for ivm

    def clock(f) -> float:
        return best_of(f, repeat)

    cases = {
        "ivm 1 point, product GH-3 on 1^perp": lambda: softmax_tilted(
            y[:1], h[:1], S[None], None, 3, True, "product"),
        "ivm 1 point, sobol 1024": lambda: softmax_tilted(
            y[:1], h[:1], S[None], None, None, True, "sobol"),
        f"baseline {n} points, product GH-3": lambda: softmax_tilted(
            y, h, A, None, 3, False, "product"),
        f"baseline {n} points, diagonal 1-D": lambda: diagonal_softmax_tilted(y, h, a),
    }
    for name, f in cases.items():
        print(f"C={C} {name:40s} cpu={clock(f):.4f}s load={os.getloadavg()[0]:.1f}", flush=True)
    ref = diagonal_softmax_tilted(y, h, a, step=0.25, inner=64)
    gh3 = softmax_tilted(y, h, A, None, 3, False, "product")
    sob = softmax_tilted(y, h, A, None, None, False, "sobol")
    for name, T in (("GH-3", gh3.h_hat), ("sobol", sob.h_hat),
                    ("diagonal", diagonal_softmax_tilted(y, h, a).h_hat)):
        print(f"C={C} diagonal marginals, worst |h_hat error| {name:8s} "
              f"{np.max(np.abs(T - ref.h_hat)):.2e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SKLEARN_SETS))
    ap.add_argument("--methods", default="ivm,ivm-baseline")
    ap.add_argument("--option", action="append", default=[], help="method option key=value")
    ap.add_argument("--no-optimize", action="store_true", help="optimize=False (one inference)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rules", action="store_true",
                    help="only time the quadrature rules at C = 10 (before/after)")
    args = ap.parse_args(argv)
    if args.rules:
        rules()
        return 0
    options: dict[str, object] = {}
    for kv in args.option:
        key, value = kv.split("=", 1)
        options[key] = int(value) if value.isdigit() else value
    for method in args.methods.split(","):
        for data in args.sets.split(","):
            print(run(method, data, options, False if args.no_optimize else None,
                      args.profile), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
