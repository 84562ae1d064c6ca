"""Power-EP speed targets (issue 4): prints timings, no assertions.

1. Collapsed regression energy + all gradients for N = 1e5, M = 200, D = 5 (target < 3 s):
   timed at the matrix level (``collapsed_pep``) and end to end (kernel matrices, energy,
   gradients and the kernel vector-Jacobian product for lengthscales, variance, Z and noise).
2. Classification mini-batch step, batch 200, M = 100 (target < 20 ms): posterior refresh from
   all sites, ``n_sweeps`` parallel PEP sweeps on the batch, batch energy and its gradient
   through the kernel VJP (N = 621, the australian training size).

Usage: ``python benchmarks/pep_speed.py [--threads T]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gpinfer_pep.collapsed import collapsed_pep
from gpinfer_pep.rank_one import RankOnePEPSites, kernel_geometry
from threadpoolctl import threadpool_limits
from timing import best_of

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.kernels import make_kernel
from gpinfer.likelihoods import BernoulliProbit, Gaussian


def regression(alpha: float = 0.5) -> None:
    rng = np.random.default_rng(0)
    N, M, D = 100_000, 200, 5
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=N)
    Z = X[rng.choice(N, M, replace=False)]
    kern = make_kernel("rbf", input_dim=D, ard=True)
    lik = Gaussian(0.01)
    hp = HyperParameters(kern, lik, Z)
    a = np.full(N, alpha)
    geo = kernel_geometry(kern, Z, X, 1e-8)

    def matrix_level():
        collapsed_pep(geo, y, lik.variance, a)

    def end_to_end():
        g = kernel_geometry(kern, hp.Z[0], X, 1e-8)
        res = collapsed_pep(g, y, lik.variance, a)
        parameter_gradient(hp, X, res.grads)

    print(f"regression N={N} M={M} D={D} alpha={alpha}: energy+matrix gradients "
          f"{best_of(matrix_level, 3, time.perf_counter):.2f} s; end to end incl. kernel "
          "matrices and VJP "
          f"(theta, Z, noise) {best_of(end_to_end, 3, time.perf_counter):.2f} s  [target < 3 s]")


def classification(n_sweeps: int, alpha: float = 0.5) -> None:
    rng = np.random.default_rng(0)
    N, M, D, B = 621, 100, 14, 200
    X = rng.normal(size=(N, D))
    y = (X[:, 0] + 0.5 * rng.normal(size=N) > 0).astype(int)
    kern = make_kernel("rbf", input_dim=D, ard=True)
    Z = X[rng.choice(N, M, replace=False)]
    hp = HyperParameters(kern, None, Z)
    sites = RankOnePEPSites(BernoulliProbit(), y, alpha, schedule="parallel", damping=0.5)
    sites.set_geometry(kernel_geometry(kern, Z, X, 1e-8), kern, Z)
    batches = [rng.choice(N, B, replace=False) for _ in range(20)]
    state = {"i": 0}

    def step():
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        sites.set_geometry(kernel_geometry(kern, hp.Z[0], X, 1e-8), kern, hp.Z[0])
        for _ in range(n_sweeps):
            sites.sweep(batch)
        out = sites.energy(batch)
        parameter_gradient(hp, X[batch], out.gradients)

    step()
    times = sorted(best_of(step, 1, time.perf_counter) for _ in range(20))
    print(f"classification step B={B} M={M} N={N} alpha={alpha} n_sweeps={n_sweeps}: median "
          f"{1e3 * times[10]:.1f} ms, best {1e3 * times[0]:.1f} ms  [target < 20 ms]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with threadpool_limits(args.threads):
        print(f"BLAS threads: {args.threads}")
        for sweeps in (1, 10):
            classification(sweeps)
        classification(1, alpha=1.0)
        regression()


if __name__ == "__main__":
    main()
