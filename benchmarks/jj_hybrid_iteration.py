"""Seconds per outer iteration of ``vi-jj-hybrid`` at skin size against its FLOP floor.

Measures, in one process on one BLAS thread:

* the dgemm rate (best of ``--gemm-repeats`` products ``[g, g] @ [g, g]``, ``2 g^3`` FLOP each);
* the training time per outer iteration of ``GPClassifier(method="vi-jj-hybrid", M=100,
  likelihood="logit")`` (default options ``n_upd=3``, ``max_fun=5``) on the skin-shaped
  ``scale_synthetic`` set (``N = --n`` training points, ``D = 3``, 1:4 classes), from the
  callback's ``elapsed`` (training-only clock). Iteration 1 is reported apart and left out of
  the mean: it starts from ``q(u) = N(0, I)`` and computes the first kernel factors;
* the FLOP count of each outer iteration, counted from the algorithm as evaluations x the
  matrix products they need (each ``N M^2``-sized; ``M^3`` and ``O(N M)`` work is not counted;
  a triangular solve or ``syrk`` with ``N`` right-hand sides is ``N M^2``, a general product
  ``[M, M] x [M, N]`` or ``[M, N] x [N, M]`` is ``2 N M^2``):

  - Stage 1, ``n_upd`` closed-form rounds at fixed ``theta``, each ``C = I + 2 R Gamma R^T``
    (``syrk``: ``N M^2``) and the marginal variances ``||L_C^-1 r_i||^2`` (``N M^2``). The
    marginals of the carried ``q(u)`` are those of the previous Stage 2 end point (no product);
  - Stage 2, ``nfev`` evaluations of the bound and its gradient in ``(theta, xi)`` (``nfev``
    from the iteration's ``extra``). The first is at the Stage-1 end point, where ``R``, ``C``
    and the marginals are known: only the ``Kuf`` part of the kernel gradient,
    ``sum(dF/dKuf * dKuf/dtheta)`` (``2 N M^2``). Each further one: ``R = L_K^-1 Kuf``
    (``N M^2``), ``C`` (``N M^2``), the marginal variances (``N M^2``) and the ``Kuf``
    gradient contraction (``2 N M^2``): ``5 N M^2``;
  - ``q(u)`` at the end point of Stage 2 (the last evaluation): nothing new.

  So ``(2 n_upd + 2 + 5 (nfev - 1)) N M^2`` (``flop_models.collapsed_iteration_flops``);
  floor = FLOP / dgemm rate; the script prints
  time / floor, and (``--split``) how much of the time the L-BFGS-B driver itself takes (its
  bound handling is ``O(N)`` Python per call with ``N`` bounded ``xi``).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/jj_hybrid_iteration.py [--n 200000]
        [--iters 4] [--split] [--profile out.prof]

``--profile`` writes a cProfile of the fit (iteration 1 included) and prints its top entries.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flop_models  # noqa: E402

import gpinfer  # noqa: E402
from gpinfer.data.generators import scale_synthetic  # noqa: E402


def time_lbfgs_driver() -> dict[str, float]:
    """Wrap ``LBFGSB.maximize`` and the objective to accumulate the driver's own time."""
    from gpinfer_jj.bound import CollapsedObjective

    from gpinfer.optim.lbfgs import LBFGSB

    acc = {"maximize": 0.0, "objective": 0.0}

    def timed(fn, key: str):
        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                acc[key] += time.perf_counter() - t0

        return wrapper

    LBFGSB.maximize = timed(LBFGSB.maximize, "maximize")
    CollapsedObjective.value_and_grad = timed(CollapsedObjective.value_and_grad, "objective")
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200000, help="training points")
    ap.add_argument("--m", type=int, default=100, help="inducing points")
    ap.add_argument("--iters", type=int, default=4, help="outer iterations (max_iter)")
    ap.add_argument("--gemm", type=int, default=2000, help="dgemm size g")
    ap.add_argument("--gemm-repeats", type=int, default=5)
    ap.add_argument("--profile", default=None, help="write a cProfile of the fit here")
    ap.add_argument("--split", action="store_true",
                    help="also time the L-BFGS-B driver apart from the objective")
    args = ap.parse_args()

    ds = scale_synthetic(args.n, d=3, n_classes=2, unbalanced=True, seed=0)
    X, y = (ds.X - ds.X.mean(axis=0)) / ds.X.std(axis=0), ds.y
    with threadpool_limits(limits=1):
        rate = flop_models.dgemm_rate(args.gemm, args.gemm_repeats)
        print(f"dgemm {args.gemm}x{args.gemm} @ {args.gemm}x{args.gemm}, 1 thread: "
              f"{rate / 1e9:.1f} GFLOP/s")
        seen = []
        driver = time_lbfgs_driver() if args.split else None
        snapshots: list[float] = []

        def callback(info) -> None:
            seen.append(info)
            if driver is not None:
                snapshots.append(driver["maximize"] - driver["objective"])

        clf = gpinfer.GPClassifier(method="vi-jj-hybrid", M=args.m, max_iter=args.iters,
                                   likelihood="logit", random_state=0)
        t0 = time.perf_counter()
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(clf.fit, X, y, callback=callback)
            prof.dump_stats(args.profile)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        else:
            clf.fit(X, y, callback=callback)
        wall = time.perf_counter() - t0
        rate_after = flop_models.dgemm_rate(args.gemm, args.gemm_repeats)
    m = clf.fit_result_.state["Z"].shape[0]  # K-means may drop duplicate centres
    print(f"N = {args.n}, D = {X.shape[1]}, M = {m}, positives {y.mean():.3f}; "
          f"fit wall {wall:.2f} s (set-up included); dgemm after the fit "
          f"{rate_after / 1e9:.1f} GFLOP/s")
    prev = 0.0
    for info in seen:
        nfev = info.extra.get("nfev", float("nan"))
        flops = flop_models.collapsed_iteration_flops("vi-jj-hybrid", args.n, m, nfev)
        dt = info.elapsed - prev
        prev = info.elapsed
        print(f"  iteration {info.iteration}: {dt:6.2f} s, nfev {nfev:.0f}, "
              f"F = {info.objective:.6f}, {flops / 1e9:.1f} GFLOP, "
              f"floor {flops / rate:.2f} s, ratio {dt * rate / flops:.2f}")
    if len(seen) < 2:
        print("need at least 2 iterations for the steady-state numbers")
        return
    rest = seen[1:]
    secs = (seen[-1].elapsed - seen[0].elapsed) / len(rest)
    flops = np.mean([flop_models.collapsed_iteration_flops("vi-jj-hybrid", args.n, m,
                                                         i.extra["nfev"]) for i in rest])
    floor = flops / rate
    print(f"dgemm rate          {rate / 1e9:8.1f} GFLOP/s (1 thread)")
    print(f"FLOP / iteration    {flops / 1e9:8.1f} GFLOP "
          f"({flops / (args.n * m * m):.1f} N M^2, iterations 2..{seen[-1].iteration})")
    print(f"FLOP floor          {floor:8.3f} s / iteration")
    print(f"measured            {secs:8.3f} s / iteration (iteration 1: {seen[0].elapsed:.3f} s)")
    print(f"ratio time / floor  {secs / floor:8.2f}")
    if snapshots:
        over = (snapshots[-1] - snapshots[0]) / len(rest)
        print(f"L-BFGS-B driver     {over:8.3f} s / iteration (outside the objective); "
              f"without it: {secs - over:.3f} s, ratio {(secs - over) / floor:.2f}")


if __name__ == "__main__":
    main()
