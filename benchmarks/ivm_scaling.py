"""Time per inclusion of the multi-class IVM against n and C (issue 5 target: exponents <= 1.15).

Synthetic Gaussian blobs in 10 dimensions; shared RBF; fixed d_final; liquid set L = 5 with one
EP sweep; fixed candidate pool |J| = 32 (so the scoring cost does not grow with n). Quadrature:
``--rule sobol`` (default; symmetric Sobol rule with ``--points`` nodes for every C, cost linear
in the nodes) or ``--rule product`` (reduced GH-3, 3^(C-1) nodes: exponential in C). Stub scheme
``--stub lazy`` (default, O(nCd) per inclusion), ``drag`` (O(nC^2 d)) or ``resolve``.
Times are CPU seconds (``time.process_time``; the machine is shared, wall time is inflated).
Reported per configuration: CPU time per inclusion, the part spent in the solid
representation's updates (``SolidRepresentation.include``) and the rest (candidate marginals,
scoring quadratures, projections, EP), and the log-log least-squares exponents in n (at fixed
C) and in C (at fixed n).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_scaling.py [--n 1000,4000,16000]
        [--C 3,5,10] [--d 40] [--stub lazy|drag|resolve] [--rule sobol|product] [--points 1024]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gpinfer_ivm import solid as solid_module
from gpinfer_ivm.inference import IVMSettings, run_inference

from gpinfer.kernels.stationary import RBF


def blobs(n: int, C: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.6, (C, 10))
    y = np.arange(n) % C
    return means[y] + rng.standard_normal((n, 10)), y


def time_run(n: int, C: int, d: int, stub: str, rule: str, points: int) -> tuple[float, float]:
    """CPU seconds per inclusion: total, and in the solid representation's ``include``."""
    X, y = blobs(n, C)
    spent = [0.0]
    original = solid_module.SolidRepresentation.include

    def timed(self, i, pi, b):
        t0 = time.process_time()
        original(self, i, pi, b)
        spent[0] += time.process_time() - t0

    solid_module.SolidRepresentation.include = timed
    try:
        s = IVMSettings(d_final=d, L=5, ep_sweeps=1, pool_size=32, reduced=True, rule=rule,
                        gh_order=points if rule == "sobol" else 3, stub_update=stub)  # fmt: skip
        t0 = time.process_time()
        run_inference([RBF(lengthscale=np.sqrt(10.0), variance=2.0)] * C, X, y, np.zeros(C), s,
                      np.random.default_rng(0))  # fmt: skip
        total = time.process_time() - t0
    finally:
        solid_module.SolidRepresentation.include = original
    return total / d, spent[0] / d


def exponent(x, t) -> float:
    return float(np.polyfit(np.log(x), np.log(t), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1000,4000,16000")
    ap.add_argument("--C", default="3,5,10")
    ap.add_argument("--d", type=int, default=40)
    ap.add_argument("--stub", default="lazy")
    ap.add_argument("--rule", default="sobol")
    ap.add_argument("--points", type=int, default=1024)
    a = ap.parse_args()
    ns = [int(v) for v in a.n.split(",")]
    Cs = [int(v) for v in a.C.split(",")]
    T = np.zeros((len(ns), len(Cs)))
    S = np.zeros_like(T)
    quad = f"sobol rule, {a.points} nodes" if a.rule == "sobol" else "reduced GH-3 product"
    print(f"d_final={a.d}, L=5, 1 sweep, |J|=32, {quad}, stub update {a.stub}; CPU seconds")
    print("     n   C | s/inclusion  representation  rest")
    for i, n in enumerate(ns):
        for j, C in enumerate(Cs):
            T[i, j], S[i, j] = time_run(n, C, a.d, a.stub, a.rule, a.points)
            print(f"{n:6d} {C:3d} | {T[i, j]:10.4f}  {S[i, j]:14.4f}  {T[i, j] - S[i, j]:.4f}",
                  flush=True)  # fmt: skip
    for j, C in enumerate(Cs):
        print(f"exponent in n at C={C}: total {exponent(ns, T[:, j]):.2f}, "
              f"representation {exponent(ns, S[:, j]):.2f}")  # fmt: skip
    for i, n in enumerate(ns):
        print(f"exponent in C at n={n}: total {exponent(Cs, T[i]):.2f}, "
              f"representation {exponent(Cs, S[i]):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
