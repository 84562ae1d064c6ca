"""Time of one svi mini-batch step (ELBO value + gradient + AdaDelta step), spec targets:
binary, batch 500, m = 100: < 10 ms; multi-class C = 10 (robust-max): < 50 ms (the likelihood's
default expectation rules: the robust-max trapezoid; also its log-space rule and 20-node
Gauss-Hermite, which is inaccurate at C = 10).

    .venv/bin/python benchmarks/svi_step_time.py [--threads 1] [--repeats 30]

Synthetic standardised data with D = 22 (ijcnn1's width), N = 50 000; inducing inputs fixed;
kernel RBF + White. Prints the median over repeated steps of the fast path (cached distances,
fused kernel VJP, two-transcendental logistic quadrature) and of the generic path (kernel.K and
the kernel VJPs at every step), interleaved in one process so that machine load affects both;
wall and process CPU time (the latter is less sensitive to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gpinfer_svi.method import VariationalState
from threadpoolctl import threadpool_limits

from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit, RobustMax, Softmax
from gpinfer.optim import AdaDelta


def make_state(lik, C, n=50000, d=22, M=100):
    """``lik`` carries its expectation rule (``expectation=...``)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    y = rng.integers(0, max(C, 2), n)
    y = y.astype(float) if C == 1 else y.astype(np.int64)
    kernels = [RBF(lengthscale=np.sqrt(d), variance=1.0) + White(0.01) for _ in range(C)]
    Z = X[rng.choice(n, M, replace=False)]
    hp = HyperParameters(kernels, Z=[Z] * C, optimize_inducing=False)
    return VariationalState(X, y, lik, hp, C, M)


def step_times(states: dict, repeats: int, B: int = 500) -> dict[str, float]:
    """Median step time of each state, the states stepped in turn on the same batches."""
    rng = np.random.default_rng(1)
    xs, opts, times = {}, {}, {k: [] for k in states}
    cpu = {k: [] for k in states}
    for k, st in states.items():
        C, M = st.L, st.M
        xs[k] = st.pack(np.zeros((C, M)), np.repeat(np.eye(M)[None], C, axis=0))
        opts[k] = AdaDelta(learning_rate=0.5)
        opts[k].reset(xs[k])
    n = next(iter(states.values())).X.shape[0]
    for _ in range(repeats):
        batch = rng.choice(n, B, replace=False)
        for k, st in states.items():
            t0, c0 = time.perf_counter(), time.process_time()
            _, g = st.elbo(xs[k], batch)
            xs[k] = opts[k].step(xs[k], (B / n) * g)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: (float(np.median(times[k])), float(np.median(cpu[k]))) for k in states}


def generic(st: VariationalState) -> VariationalState:
    st._fast = False
    return st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--parts", default="binary,robustmax,softmax")
    args = ap.parse_args()
    print(f"BLAS threads: {args.threads}; load average: {os.getloadavg()}")
    with threadpool_limits(args.threads):
        parts = args.parts.split(",")
        if "binary" in parts:
            t = step_times({"fast": make_state(BernoulliLogit(), 1),
                            "fast-20GH": make_state(BernoulliLogit(quadrature_points=20), 1),
                            "generic": generic(make_state(BernoulliLogit(), 1))}, args.repeats)
            print("binary logit, batch 500, m 100 (target < 10 ms): "
                  + ", ".join(f"{k} {1e3 * v[0]:.2f} ms (cpu {1e3 * v[1]:.2f})"
                              for k, v in t.items()))
        if "robustmax" in parts:
            t = step_times({"default(trapezoid)": make_state(RobustMax(1e-3), 10),
                            "likelihood-rule": make_state(
                                RobustMax(1e-3, expectation="log_space"), 10),
                            "GH20(inaccurate)": make_state(
                                RobustMax(1e-3, expectation="gauss_hermite"), 10),
                            "generic-default": generic(make_state(RobustMax(1e-3), 10))},
                           max(3, args.repeats // 3))
            print("robust-max C=10, batch 500, m 100 (target < 50 ms): "
                  + ", ".join(f"{k} {1e3 * v[0]:.1f} ms (cpu {1e3 * v[1]:.1f})"
                              for k, v in t.items()))
        if "softmax" in parts:
            t = step_times({"MC-32": make_state(Softmax(expectation="monte_carlo"), 10),
                            "product-GH": make_state(Softmax(), 10)}, 3)
            print("softmax C=10, batch 500, m 100: "
                  + ", ".join(f"{k} {1e3 * v[0]:.1f} ms (cpu {1e3 * v[1]:.1f})"
                              for k, v in t.items()))


if __name__ == "__main__":
    main()
