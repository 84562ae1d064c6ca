"""Time one batch EP / SEP iteration at Satellite size (N = 6435, D = 36, C = 6, M = 10% N).

Spec ep-sep, issue target: under 1 s per iteration. One iteration = kernel quantities, one
parallel site sweep, log Z_q and its gradient, the kernel VJP (what ``fit`` does per step).
Synthetic inputs of that shape (the timing does not depend on the values).

    .venv/bin/python benchmarks/sep_satellite_iteration.py [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gpinfer_ep.model import all_terms
from gpinfer_ep.state import RankOneSites, TiedSites
from threadpoolctl import threadpool_limits

from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Sum


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6435)
    ap.add_argument("--d", type=int, default=36)
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--m", type=int, default=644)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", default="sep,ep")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, args.d))
    y = rng.integers(0, args.classes, args.n)
    kernels = [Sum([RBF(lengthscale=np.full(args.d, 6.0)), White(1.0)])
               for _ in range(args.classes)]
    Zs = [X[rng.choice(args.n, args.m, replace=False)] for _ in range(args.classes)]
    hp = HyperParameters(kernels, Z=Zs)
    idx = np.arange(args.n)
    with threadpool_limits(limits=args.threads):
        states = {"sep": TiedSites, "ep": RankOneSites}
        for name in args.methods.split(","):
            state = states[name](y, args.classes, args.m)
            times, cpu = [], []
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                terms = all_terms(kernels, hp.Z, X)
                state.update(terms, idx, 0.5)
                _, grads = state.evaluate(terms, idx)
                hp.gradient(X, grads)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            print(f"{name}: one batch iteration N={args.n} D={args.d} C={args.classes} "
                  f"M={args.m}: wall min {min(times):.2f} s, all {[round(t, 2) for t in times]}, "
                  f"CPU {min(cpu):.2f} s ({args.threads} BLAS threads)")


if __name__ == "__main__":
    main()
