"""The solves with a site factor ``L_B`` on numpy, one thread (issue 25): which way to get
``B^-1 A`` (``B = L_B L_B^T``, ``A [C, M, n]``) costs least.

* ``two_trsm``: ``R = L_B^-1 A``, then ``L_B^-T R`` (what sep's ``evaluate`` does: ``R`` gives
  the variances, ``B^-1 A`` the gradient), one BLAS ``trsm`` per class each;
* ``potri_gemm``: ``B^-1`` by LAPACK ``potri``, then one product (the variances would come from
  ``sum(A * B^-1 A)``);
* ``trtri_gemm``: ``L_B^-1`` by ``trtri``, then two products;
* ``gemm``: one ``[M, M] x [M, n]`` product per class, the unit the others are measured in (and
  what replacing the Lam update's two ``M x M`` products by ``U = L^-T A`` and
  ``U diag(tau) U^T`` would cost: two such products, the same at ``n = M``).

Process-CPU milliseconds, best of ``--repeats``; the load average is printed with them.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/site_solves.py [--C 10 --M 200 --n 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from gpinfer.backend import ops


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The least process-CPU time of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--C", type=int, default=10)
    ap.add_argument("--M", type=int, default=200)
    ap.add_argument("--n", type=int, default=200, help="batch size")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    A = rng.normal(size=(args.C, args.M, args.n)) / np.sqrt(args.n)
    LB = np.linalg.cholesky(A @ np.swapaxes(A, 1, 2) + np.eye(args.M))

    def two_trsm() -> np.ndarray:
        return ops.solve_triangular(LB, ops.solve_triangular(LB, A), transpose=True)

    def potri_gemm() -> np.ndarray:
        return ops.cho_inverse(LB)[0] @ A

    def trtri_gemm() -> np.ndarray:
        T = ops.tri_inverse(LB)
        return np.swapaxes(T, 1, 2) @ (T @ A)

    ref = two_trsm()
    for other in (potri_gemm, trtri_gemm):  # the same numbers, to round-off
        np.testing.assert_allclose(other(), ref, rtol=1e-8, atol=1e-12)
    with threadpool_limits(1):
        ms = {name: best_ms(fn, args.repeats) for name, fn in
              (("two_trsm", two_trsm), ("potri_gemm", potri_gemm),
               ("trtri_gemm", trtri_gemm), ("gemm", lambda: LB @ A))}
    print(json.dumps({"C": args.C, "M": args.M, "n": args.n, "ms": ms,
                      "load_average": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
