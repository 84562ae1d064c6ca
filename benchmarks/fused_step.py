"""What fused element-wise kernels would take off the CPU SEP step (issue 25, a measurement).

Result (s40-fused, 2026-12-05, one thread, process CPU; dgemm 76.2 GFLOP/s, dgemm floor
54.4 ms). The step in three rounds of ``--parts phases --epochs 3 --rounds 3`` (load 4.0-5.9),
medians of the rounds, ms per step; the last column is numpy's with the numba prototypes'
savings below (measured alone, two runs) taken off:

    phase                          numpy   torch eager   torch compiled   numpy + numba
    step                           128.1      172.8          140.5         ~118-120
    kernel terms                    38.9       40.7           34.2          ~33.6-34.5
      its forward (_forward)        30.0       33.4           26.9          ~24.7-25.6
    site update                     20.5       21.6           20.0          (20.5)
    log Z_q + matrix gradients      29.8       39.1           36.5          (29.8)
    kernel VJPs                     28.2       53.7           34.1          ~27.3-28.1
      its stacked VJP (_vjp)        27.9       51.9           32.1          ~27-27.8
    Adam                             9.3        9.5            6.9          ~5.0-5.3
    coordinates, rest                1.6        8.6            9.0          (1.6)

Compiling cost 14.4 s CPU and 90 s wall in the warm-up epoch with an empty inductor cache
(its C++ builds run in worker processes), 8.1 s / 19 s with a warm one. Inductor's fusion
shrinks what eager torch spends on element-wise operators: the VJP -20 ms (eager issues 242
aten operators per call; ``mul`` ~20 % and ``copy_`` 16-19 % of its profile), the forward
-6.5, Adam -2.6; but the compiled kernel side is no cheaper than numpy's (forward -3, VJP
+4; in ``--parts profile``, whose wall times run long under load, the fused C++ graph is
31-32 % of the compiled forward and 36-41 % of the compiled VJP, where numpy's element-wise
part is 42-44 % and 22-25 % of its two). Where torch loses to numpy is not MKL's rate: per
call (``--parts calls``, load 3.8-4, torch / numpy ms) MKL is equal or faster on ``potrf``
(2.5 / 2.5), ``potri``-like ``cho_inverse`` (4.3 / 4.1), ``trsm`` (2.1 / 4.0), ``trtri``
(2.1 / 3.2), the site gemms (2.4 / 3.3-3.5) and the cross product (8.8 / 11.9), slower on
the Gram (9.0 / 7.0: no ``syrk``) and the in-place VJP products (12.2 / 10.2 and 10.6 / 9.2:
``add_(X @ Y)``). It is the device path's formulation in log Z_q (+6.7 ms compiled): six
``linalg_solve_triangular`` (24-36 % of that phase's profile; the device's ``cho_inverse``
solves against the identity where numpy runs ``potri``), ``tril`` copies and
norms; and 7-7.5 ms more Python and host bookkeeping per step (coordinates, rest).

The numba prototype (``--parts fused``; ``@njit``, one thread, 2.1 s to compile; equal to
the library's numpy path within 2.9e-16 (``Kuu``), 4.7e-16 (``Kuf``), 7.2e-16 (parameter
gradients), 2.0e-15 (``g_Z``), relative in the max norm; two runs, load 4.0-4.3, medians
of 15): the forward 29.4 / 30.8 -> 25.0 / 25.5 ms (its element-wise part, the time above
its two BLAS products' 17.0-17.2 ms, 12.4 / 13.6 -> 8.0 / 8.4), the VJP 28.9 / 30.3 ->
28.7 / 29.4 (element-wise 6.4 / 7.6 -> 6.2 / 6.8: no gain), Adam in one pass 10.6 / 10.2 ->
6.6 / 5.8 ms (the same bits); the prototype's intermediates in buffers kept across calls
or fresh each call: the same (forward 25.55 / 25.6, VJP 28.96 / 28.94 ms, load 5.6). Each
fused kernel alone runs at the one-thread memory rate
(a copy of ``[C, M, D]`` 13.7 GB/s): ``Z -> A, As`` 4.0 ms at 9.4 GB/s, the VJP's last pass
over ``H A``, ``G_uf Xs``, ``A`` into ``g_Z`` 4.3 ms at 11.7 GB/s, the mean of ``Z``'s rows
1.1-1.5 ms; the ``[C, M, M]`` / ``[C, M, B]`` passes with their ``exp`` (a vectorisable
polynomial, 2x numpy's SIMD ``exp``: numba's own is a scalar libm call, 6x) 0.8-1.6 ms
each. So fusion takes ~5 ms off the forward (the passes between the products: ``Zs``,
``A``, ``As``, distances, ``exp``), nothing off the VJP (its element-wise work is already
its ``[C, M, D]`` traffic: three arrays read, one written) and ~4 ms off Adam: the step
these numbers imply is 128.1 - 4.4..5.3 - 0.1..0.9 - 4.0..4.3 = ~118-120 ms (2.16-2.20x;
the kernel side alone ~122-124 ms, 2.24-2.27x), not the 15-20 ms less the last closing note
expected. What is left of the kernel side's element-wise time (~14-15 ms fused) is
memory traffic over ``[C, M, D]`` (12.5 MB per array: ~1 ms per array moved). Measured
and not taken: the cross product per class as ``A_c (Xs / ell_c)^T`` (no ``As`` written:
13.4-14.5 ms against 12.3 for ``As`` and the one transposed product, load 5.4); a shift
from the batch's mean instead of ``Z``'s rows would save the 1.1-1.5 ms read of ``Z``
(the distances do not depend on it; roundings would move).

The gap to 1.3x is LAPACK at order 200, not element-wise work. The floor of the necessary
calls (``engine_step.py --parts necessary``, the same session, load 2.7-3.4) is 101.0 ms =
1.86x: its LAPACK and triangular calls (four ``potrf``, ``trtri``, two ``potri``, seven
``trmm``, one ``trsm``) take 40.9 ms where their FLOP at the dgemm rate take 11.4; the
D-sized and site gemms 46.3 ms (34.6 at the dgemm rate); the memory-bound moves 13.8 (Adam
9.5). Without any element-wise pass and with a free Adam the calls alone are 87 ms = 1.6x,
above 1.3x (70.7 ms) by more than fusion could take; with the fused kernels and Adam the
step would sit ~18 ms above that floor (Python ~1.6 ms, the kernel side's remaining
``[C, M, D]`` passes, the site side's copies and symmetrisations).

Parts (``--parts``, comma-separated):

1. ``phases``: the SEP step at MNIST size (``engine_step.py`` item 2: D 784, C 10, M 200, B
   200, synthetic MNIST-like pixels, N 4000, Adam) on numpy, torch-CPU float64 eager and
   torch-CPU float64 ``compile="default"`` (inductor: fused element-wise C++), process-CPU ms
   per step of the phases of ``engine_step.py --parts sep`` (its ``PhaseClock``) and of the
   kernel side's two compiled regions (``kernels.stacked._forward`` and ``_vjp``), over
   epochs 2..E; ``--rounds`` rounds, the three in turn in one process (the compiled
   functions are compiled in the first round's warm-up epoch, whose CPU and wall time are
   reported apart: inductor compiles in worker processes, which the process clock misses).
2. ``profile``: ``torch.profiler`` of the kernel side's two regions and of the site update
   and log Z_q phases on torch-CPU float64, eager and compiled (a fit of N 1000, three calls
   each in epoch 2): the operators by self time (the profiler's wall clock) and their count.
3. ``calls``: the step's dense calls on numpy (OpenBLAS, scipy's LAPACK) against torch-CPU
   (MKL), the same ``gpinfer.backend.ops`` calls on the same ``[C, M, M]``/``[C, M, B]``
   stand-ins: least process-CPU ms of interleaved repeats.
4. ``fused``: numba prototypes (``@njit``, one thread) of the kernel side of the stacked RBF
   path: the forward (shift, scale, ``Kuu``, ``Kuf``, ``exp``) and the VJP's element-wise
   parts around the same BLAS products, checked against the library's numpy path
   (``StackedCovariances`` and its ``vjp``) to 1e-12 relative, then both timed on one thread,
   interleaved (process CPU, medians), with the BLAS products alone (the kernel side's floor
   of calls); each fused kernel alone with the bytes it moves; Adam's update in one pass
   against the library's (the same bits, asserted). Skipped, with a note, where numba
   cannot be imported: install it outside the project (``.venv/bin/python -m pip install
   --target /tmp/numba-site --no-deps numba llvmlite``) and put that folder on
   ``PYTHONPATH`` for the run.

    PYTHONPATH=/tmp/numba-site OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/fused_step.py [--parts phases,profile,calls,fused]
        [--epochs 3] [--rounds 2] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_step import (  # noqa: E402 - the benchmark folder on the path first
    TORCH_CPU64,
    B,
    C,
    D,
    M,
    N,
    PhaseClock,
    fit_steps,
    mnist_like,
    sep_step_phases,
    sep_step_split,
    step_flops,
)

# ---------------------------------------------------------------------------------------------
# 1. the step's phases on numpy, torch eager and torch compiled

CONFIGS: dict[str, dict[str, Any]] = {
    "numpy": {"settings": None, "compile": None},
    "torch eager": {"settings": TORCH_CPU64, "compile": "none"},
    "torch compiled": {"settings": TORCH_CPU64, "compile": "default"},
}


def _phase_targets() -> dict[str, tuple[object, str]]:
    """``engine_step.sep_step_phases``, with the kernel side's compiled regions after their
    phases."""
    import gpinfer.kernels.stacked as stacked

    regions = {"kernel terms (Kuu, Kuf, chol, A)":
               ("  its kernel forward (stacked._forward)", (stacked, "_forward")),
               "kernel VJPs (hp.gradient)": ("  its stacked VJP (stacked._vjp)", (stacked, "_vjp"))}
    out: dict[str, tuple[object, str]] = {}
    for name, target in sep_step_phases().items():
        out[name] = target
        if name in regions:
            sub, where = regions[name]
            out[sub] = where
    return out


def step_phases(config: str, epochs: int, X: np.ndarray, y: np.ndarray) -> dict[str, object]:
    """Process-CPU ms per step of the step and its phases (epochs 2..) for one configuration,
    and the warm-up epoch's CPU and wall seconds (where a compiled fit compiles)."""
    from gpinfer.kernels import make_kernel

    cfg = CONFIGS[config]
    options: dict[str, object] = {"adam_learning_rate": 1e-3}
    if cfg["compile"] is not None:
        options["compile"] = cfg["compile"]
    warm: dict[str, float] = {}
    clock_box: list[PhaseClock] = []

    def after_warm_up() -> None:
        warm["cpu"], warm["wall"] = time.process_time(), time.perf_counter()
        clock_box[0].spent.clear()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    with PhaseClock(_phase_targets()) as clock:
        clock_box.append(clock)
        out = fit_steps(X, y, "sep", M, B, epochs, options,
                        kernel=make_kernel("rbf", D, ard=True), settings=cfg["settings"],
                        after_warm_up=after_warm_up)
    n_steps = (epochs - 1) * -(-X.shape[0] // B)
    split = sep_step_split(clock.spent, n_steps)
    step = float(out["step_cpu_s"])
    return {"step_cpu_ms": round(1e3 * step, 1),
            "warm_up_epoch_cpu_s": round(warm["cpu"] - cpu0, 2),
            "warm_up_epoch_wall_s": round(warm["wall"] - wall0, 2),
            "phases_ms_per_step (epochs 2..)": {k: round(1e3 * v, 1) for k, v in split.items()},
            "load_average": os.getloadavg()}


def phases(epochs: int, rounds: int, rate: float) -> dict[str, object]:
    """``step_phases`` of the three configurations in turn, ``rounds`` times, one process."""
    import torch

    torch.set_num_threads(1)
    X, y = mnist_like(n=N)
    out: dict[str, object] = {"dgemm_floor_ms": round(1e3 * step_flops() / rate, 1)}
    for r in range(rounds):
        for config in CONFIGS:
            out[f"round {r + 1}: {config}"] = step_phases(config, epochs, X, y)
            print(f"# round {r + 1}: {config} done", file=sys.stderr, flush=True)
    return out



def region_profiles(n: int = 1000, calls: int = 3, top: int = 10) -> dict[str, object]:
    """The aten operators of the kernel side's two compiled regions (``stacked._forward``,
    ``stacked._vjp``) and of the site phases (``SparseSites.update``, ``.objective``) on
    torch-CPU float64, eager and compiled: ``torch.profiler`` over ``calls`` calls of each
    in epoch 2 of a fit (``n`` points), the ``top`` operators by self time (ms per call:
    the profiler's wall clock, its own cost and the machine's load included: read the
    shares) and the operator count."""
    import torch
    from gpinfer_ep.method import SparseSites
    from torch.profiler import ProfilerActivity, profile

    import gpinfer.kernels.stacked as stacked
    from gpinfer.kernels import make_kernel

    torch.set_num_threads(1)
    X, y = mnist_like(n=n)
    first = -(-n // B) + 1  # the first call of epoch 2
    out: dict[str, object] = {}
    for config in ("torch eager", "torch compiled"):
        cfg = CONFIGS[config]
        for owner, region in ((stacked, "_forward"), (stacked, "_vjp"), (SparseSites, "update"),
                              (SparseSites, "objective")):
            original = getattr(owner, region)
            seen = {"calls": 0}
            totals: dict[str, list[float]] = {}

            def profiled(*args: Any, _f: Callable[..., Any] = original,
                         _totals: dict[str, list[float]] = totals,
                         _seen: dict[str, int] = seen, **kwargs: Any) -> Any:
                _seen["calls"] += 1
                if not first <= _seen["calls"] < first + calls:
                    return _f(*args, **kwargs)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    result = _f(*args, **kwargs)
                for e in prof.key_averages():
                    row = _totals.setdefault(e.key, [0.0, 0.0])
                    row[0] += e.self_cpu_time_total / 1e3
                    row[1] += e.count
                return result

            setattr(owner, region, profiled)
            try:
                fit_steps(X, y, "sep", M, B, 2,
                          {"adam_learning_rate": 1e-3, "compile": cfg["compile"]},
                          kernel=make_kernel("rbf", D, ard=True), settings=cfg["settings"])
            finally:
                setattr(owner, region, original)
            ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
            out[f"{config}: {region}"] = {
                "self_cpu_ms_per_call": round(sum(v[0] for v in totals.values()) / calls, 2),
                "aten_ops_per_call": sum(v[1] for k, v in totals.items()
                                         if k.startswith("aten::")) / calls,
                "top": {k: f"{v[0] / calls:.2f} ms, {v[1] / calls:g}x" for k, v in ranked[:top]}}
    return out


# ---------------------------------------------------------------------------------------------
# 2. the dense calls on numpy (OpenBLAS, scipy's LAPACK) and on torch-CPU (MKL)


def _call_thunks(a: dict[str, Any]) -> dict[str, Callable[[], object]]:
    """The step's dense calls through ``gpinfer.backend.ops`` (numpy or torch by the arrays
    of ``a``: ``engine_step._stand_ins``' names), and the kernel side's products."""
    from gpinfer.backend import ops

    Z, X, K, L, Linv, Kuf, G, W = (a[k] for k in ("Z", "X", "K", "L", "L_inv", "Kuf", "G",
                                                   "W"))
    Zr = Z.reshape(C * M, D)
    return {
        "cholesky [C,M,M] (x4 per step)": lambda: ops.cholesky(K),
        "tri_inverse [C,M,M] (x1)": lambda: ops.tri_inverse(L),
        "cho_inverse [C,M,M] (x2)": lambda: ops.cho_inverse(L),
        "tri_matmul [C,M,M]x[C,M,M] (x5)": lambda: ops.tri_matmul(L, K, right=True),
        "solve_triangular [C,M,M]\\[C,M,B] (x1)": lambda: ops.solve_triangular(L, Kuf),
        "tri_matmul [C,M,M]x[C,M,B] (x2)": lambda: ops.tri_matmul(Linv, Kuf),
        "gemm [C,M,M]x[C,M,B] (x1)": lambda: K @ Kuf,
        "gemm [C,M,B]x[C,B,M] (x2)": lambda: Kuf @ ops.mT(G),
        "Gram A A^T [C,M,D] (x1)": lambda: Z @ ops.mT(Z),
        "cross [CM,D]x[D,B] (x1)": lambda: Zr @ X.T,
        "VJP G_uu Zs, in place (x1)": lambda: ops.matmul_add_(W, K, Z, -2.0),
        "VJP G_uf Xs, in place (x1)": lambda: ops.matmul_add_(W, G, X, -1.0),
    }


def dense_calls(repeats: int) -> dict[str, object]:
    """Least process-CPU ms of ``repeats`` interleaved calls of ``_call_thunks`` on numpy and
    on torch-CPU float64 (one thread each), the same stand-ins."""
    import torch
    from engine_step import _stand_ins

    torch.set_num_threads(1)
    a = _stand_ins()
    ways = {"numpy": _call_thunks(a),
            "torch": _call_thunks({k: torch.from_numpy(v.copy()) for k, v in a.items()})}
    best = {way: {name: np.inf for name in thunks} for way, thunks in ways.items()}
    for _ in range(repeats):
        for name in ways["numpy"]:
            for way in ways:
                t0 = time.process_time()
                ways[way][name]()
                best[way][name] = min(best[way][name], time.process_time() - t0)
    return {name: {"numpy_ms": round(1e3 * best["numpy"][name], 2),
                   "torch_ms": round(1e3 * best["torch"][name], 2)}
            for name in ways["numpy"]} | {"load_average": os.getloadavg()}


# ---------------------------------------------------------------------------------------------
# 3. numba prototypes of the kernel side's element-wise work (the stacked RBF path)


#: ``exp`` by Cody-Waite reduction ``x = n ln2 + r`` (``|r| <= ln2 / 2``, ``ln2`` in two parts)
#: and Taylor to degree 13 (truncation below 1e-17), scaled by ``2^n`` from the exponent's
#: bits: vectorisable by LLVM, where numba's ``np.exp`` is a scalar libm call per element
#: (numba's SVML path needs an llvmlite built with it; the pip wheel is not)
LOG2E, LN2_HI, LN2_LO = 1.4426950408889634, 6.93145751953125e-1, 1.42860682030941723212e-6
TAYLOR = tuple(1.0 / float(np.prod(np.arange(1, k + 1))) for k in range(13, -1, -1))


def _numba_kernels() -> dict[str, Callable[..., Any]] | None:
    """The fused element-wise kernels (``@njit``, one thread; ``fastmath`` only to contract
    the ``exp`` polynomial's products and sums into FMA), or ``None`` where numba cannot be
    imported. Each reads and writes its ``[C, M, D]``, ``[C, M, M]`` or ``[C, M, B]`` arrays
    once; a row's ``exp`` runs on the row while it is in cache."""
    try:
        from numba import njit
    except ImportError:
        return None
    c13, c12, c11, c10, c9, c8, c7, c6, c5, c4, c3, c2, c1, c0 = TAYLOR

    @njit(cache=False, fastmath={"contract"})
    def exp_row(x, scale, bits):  # pragma: no cover - compiled
        """``x = scale exp(x)`` in place on a row ``x [L]`` (``bits [>= L]`` int64 scratch);
        arguments below -708 give ``exp(-708) scale`` (the library's ``exp`` gives 0 or a
        subnormal there: within 1e-307 of it)."""
        L = x.shape[0]
        f = bits.view(np.float64)
        for j in range(L):
            v = max(x[j], -708.0)
            n = np.floor(v * LOG2E + 0.5)
            r = (v - n * LN2_HI) - n * LN2_LO
            p = c13 * r + c12
            p = p * r + c11
            p = p * r + c10
            p = p * r + c9
            p = p * r + c8
            p = p * r + c7
            p = p * r + c6
            p = p * r + c5
            p = p * r + c4
            p = p * r + c3
            p = p * r + c2
            p = p * r + c1
            x[j] = p * r + c0
            bits[j] = (np.int64(n) + 1023) << 52
        for j in range(L):
            x[j] = (x[j] * f[j]) * scale

    @njit(cache=False)
    def scale(Z, shift, inv_ell, A, As):  # pragma: no cover - compiled
        """``A = (Z - shift) / ell``, ``As = A / ell`` ``[C, M, D]`` (products with
        ``inv_ell = 1 / ell`` ``[C, D]``): one read of ``Z``."""
        C_, M_, D_ = Z.shape
        for c in range(C_):
            for m in range(M_):
                for d in range(D_):
                    a = (Z[c, m, d] - shift[d]) * inv_ell[c, d]
                    A[c, m, d] = a
                    As[c, m, d] = a * inv_ell[c, d]

    @njit(cache=False)
    def batch(X, shift, Xs, Xs2):  # pragma: no cover - compiled
        """``Xs = X - shift`` and ``Xs2 = Xs^2`` ``[B, D]`` in one pass."""
        B_, D_ = X.shape
        for b in range(B_):
            for d in range(D_):
                x = X[b, d] - shift[d]
                Xs[b, d] = x
                Xs2[b, d] = x * x

    @njit(cache=False)
    def square(G, a2, var, bits):  # pragma: no cover - compiled
        """``Kuu = var exp(-r2 / 2)``, ``r2 = max(a2_m + a2_n - 2 G, 0)`` (0 on the
        diagonal), in place on the Gram ``G [C, M, M]``, row by row."""
        C_, M_, _ = G.shape
        for c in range(C_):
            for m in range(M_):
                row = G[c, m]
                am = a2[c, m]
                for n in range(M_):
                    row[n] = -0.5 * max((-2.0 * row[n] + am) + a2[c, n], 0.0)
                row[m] = 0.0
                exp_row(row, var[c], bits)

    @njit(cache=False)
    def cross(R, a2, b2, var, K, bits):  # pragma: no cover - compiled
        """``Kuf [C, M, B] = var exp(-r2 / 2)``, ``r2 = max(a2_m + b2_b - 2 R, 0)`` from
        ``R = As Xs^T`` ``[C M, B]`` (any strides: the transposed product's view; one
        class's columns of it stay in cache), row by row."""
        C_, M_, B_ = K.shape
        for c in range(C_):
            for m in range(M_):
                row = K[c, m]
                Rrow = R[c * M_ + m]
                am = a2[c, m]
                for b in range(B_):
                    row[b] = -0.5 * max((-2.0 * Rrow[b] + am) + b2[c, b], 0.0)
                exp_row(row, var[c], bits)

    @njit(cache=False)
    def weights_cross(K, dK, per_g, G, r, col, total):  # pragma: no cover - compiled
        """``G = per_g K dK`` ``[C, M, B]`` (= ``dK var dg/dr2`` of an RBF) with its row
        sums ``r [C, M]``, column sums ``col [C, B]`` and totals ``total [C]``."""
        C_, M_, B_ = K.shape
        for c in range(C_):
            t = 0.0
            for b in range(B_):
                col[c, b] = 0.0
            for m in range(M_):
                s = 0.0
                for b in range(B_):
                    g = per_g * K[c, m, b] * dK[c, m, b]
                    G[c, m, b] = g
                    s += g
                    col[c, b] += g
                r[c, m] = s
                t += s
            total[c] = t

    @njit(cache=False)
    def weights_square(K, dK, per_g, r_uf, H, total, row):  # pragma: no cover - compiled
        """``H = diag(rA) - 2 G`` ``[C, M, M]``, ``G`` the symmetric part of
        ``per_g K dK``, ``rA = 2 r_uu + r_uf`` (``r_uu`` its row sums); adds ``G``'s sum to
        ``total [C]`` (``row [M]`` scratch). In tiles of 32 x 32, each entry with its mirror's
        tile in cache (both orders give the same sum: ``H`` exactly symmetric)."""
        C_, M_, _ = K.shape
        T = 32
        for c in range(C_):
            for m in range(M_):
                row[m] = 0.0
            for m0 in range(0, M_, T):
                for n0 in range(0, M_, T):
                    for m in range(m0, min(m0 + T, M_)):
                        s = 0.0
                        for n in range(n0, min(n0 + T, M_)):
                            g = (0.5 * per_g) * (K[c, m, n] * dK[c, m, n]
                                                 + K[c, n, m] * dK[c, n, m])
                            H[c, m, n] = -2.0 * g
                            s += g
                        row[m] += s
            t = 0.0
            for m in range(M_):
                H[c, m, m] += 2.0 * row[m] + r_uf[c, m]
                t += row[m]
            total[c] += t

    @njit(cache=False)
    def inputs(P1, P2, A, ell, gZ, acc):  # pragma: no cover - compiled
        """From ``P1 = H A`` and ``P2 = G_uf Xs`` ``[C, M, D]``: ``W = P1 ell - P2`` (the
        library's ``H Zs - G_uf Xs``), ``acc [C, D] = sum_m Zs (W - P2)`` and
        ``g_Z = (2 / ell^2) W`` (``gZ`` may be ``P1``): one pass."""
        C_, M_, D_ = A.shape
        for c in range(C_):
            for d in range(D_):
                acc[c, d] = 0.0
            for m in range(M_):
                for d in range(D_):
                    e = ell[c, d]
                    w = P1[c, m, d] * e - P2[c, m, d]
                    acc[c, d] += A[c, m, d] * e * (w - P2[c, m, d])
                    gZ[c, m, d] = w * (2.0 / (e * e))

    @njit(cache=False)
    def adam(x, grad, m, v, beta1, beta2, eps, inv_bias2, step):  # pragma: no cover
        """Adam's update of ``x``, ``m``, ``v`` ``[P]`` in place: the operations of
        ``gpinfer.optim.adam._host_update`` in its order, in one pass."""
        c1, c2 = 1.0 - beta1, 1.0 - beta2
        for i in range(x.shape[0]):
            g = grad[i]
            mi = m[i] * beta1 + g * c1
            vi = v[i] * beta2 + (g * g) * c2
            m[i], v[i] = mi, vi
            x[i] += (mi * step) / (np.sqrt(vi) * inv_bias2 + eps)

    return {"exp_row": exp_row, "adam": adam, "scale": scale, "batch": batch, "square": square,
            "cross": cross, "weights_cross": weights_cross, "weights_square": weights_square,
            "inputs": inputs}


class FusedRBF:
    """The stacked RBF path's forward and VJP (ARD, inputs' gradients) with the fused
    kernels of ``_numba_kernels`` between the library's BLAS products (the same products as
    ``gpinfer.kernels.stacked`` on numpy: the Gram ``A A^T``, the cross product in
    ``transposed_cross``'s layout, ``H A`` and ``G_uf Xs``). ``ell [C, D]``, ``var [C]``.

    The outputs (``Kuu``, ``Kuf``, and the ``A`` the VJP reads) are new arrays per call, as
    the library's; the intermediates (``As``, the cross product, the weights, ``G_uf Xs``)
    live in buffers kept across calls (``workspace=False``: new arrays each call)."""

    def __init__(self, k: dict[str, Callable[..., Any]], ell: np.ndarray, var: np.ndarray,
                 workspace: bool = True):
        self.k, self.ell, self.var = k, ell, var
        self.inv_ell = 1.0 / ell
        self.inv_ell2 = self.inv_ell * self.inv_ell
        self.bits = np.empty(1024, dtype=np.int64)
        self.workspace = workspace
        self._buffers: dict[str, np.ndarray] = {}

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A kept ``[shape]`` buffer (``workspace``) or a new array."""
        if not self.workspace:
            return np.empty(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self._buffers[name] = np.empty(shape)
        return buf

    def forward(self, Z: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(Kuu [C, M, M], Kuf [C, M, B])`` at ``Z [C, M, D]``, ``X [B, D]``; keeps ``A``,
        ``Xs``, ``Xs2`` for the VJP."""
        from gpinfer.kernels.stacked import transposed_cross

        k = self.k
        C_, M_, D_ = Z.shape
        B_ = X.shape[0]
        shift = np.mean(np.reshape(Z, (-1, D_)), axis=0)
        A, As = np.empty_like(Z), self._buffer("As", Z.shape)
        k["scale"](Z, shift, self.inv_ell, A, As)
        Xs, Xs2 = np.empty_like(X), np.empty_like(X)
        k["batch"](X, shift, Xs, Xs2)
        Kuu = A @ np.swapaxes(A, 1, 2)  # the Gram (syrk), Kuu in place
        a2 = np.diagonal(Kuu, axis1=1, axis2=2).copy()
        Ar = np.reshape(As, (C_ * M_, D_))
        if transposed_cross(B_, D_):
            R = np.matmul(Xs, Ar.T, out=self._buffer("R", (B_, C_ * M_))).T  # [C M, B] view
        else:
            R = np.matmul(Ar, Xs.T, out=self._buffer("R", (C_ * M_, B_)))
        b2 = self.inv_ell2 @ Xs2.T  # [C, B]
        k["square"](Kuu, a2, self.var, self.bits)
        Kuf = np.empty((C_, M_, B_))
        k["cross"](R, a2, b2, self.var, Kuf, self.bits)
        self.A, self.Xs, self.Xs2 = A, Xs, Xs2
        return Kuu, Kuf

    def vjp(self, Kuu: np.ndarray, Kuf: np.ndarray, dKuu: np.ndarray, dKuf: np.ndarray,
            dKff_diag: np.ndarray, out_Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(g_params [C, D + 1], g_Z [C, M, D])`` (``d/dlog ell``, ``d/dlog var``; ``g_Z``
        written into ``out_Z``), the library's ``StackedCovariances.vjp`` for an RBF."""
        k = self.k
        C_, M_, B_ = Kuf.shape
        per_g = -0.5  # RBF: dg/dr2 = -g / 2
        G_uf = self._buffer("G_uf", Kuf.shape)
        r_uf, c_uf, total = np.empty((C_, M_)), np.empty((C_, B_)), np.empty(C_)
        k["weights_cross"](Kuf, dKuf, per_g, G_uf, r_uf, c_uf, total)
        H = self._buffer("H", Kuu.shape)
        k["weights_square"](Kuu, dKuu, per_g, r_uf, H, total, np.empty(M_))
        P1 = np.matmul(H, self.A, out=out_Z)
        P2 = np.matmul(np.reshape(G_uf, (C_ * M_, B_)), self.Xs,
                       out=self._buffer("P2", (C_ * M_, self.Xs.shape[1])))
        acc = np.empty((C_, self.ell.shape[1]))
        k["inputs"](P1, np.reshape(P2, P1.shape), self.A, self.ell, out_Z, acc)
        d_ell = acc
        d_ell += c_uf @ self.Xs2
        d_ell *= self.inv_ell2
        d_ell *= -2.0
        d_var = self.var * dKff_diag.sum(axis=1) + total / per_g
        return np.concatenate([d_ell, d_var[:, None]], axis=1), out_Z


def _kernel_problem(seed: int = 3) -> dict[str, Any]:
    """The library's stacked RBF family at MNIST size (ARD lengthscales per class ``[C, D]``
    in 2..8, variances in 0.5..2), ``Z [C, M, D]`` (batch rows plus noise), ``X [B, D]`` and
    random matrix gradients ``dKuu [C, M, M]``, ``dKuf [C, M, B]``, ``dKff_diag [C, B]``."""
    from gpinfer.kernels import make_kernel
    from gpinfer.kernels.stacked import StackedKernels

    rng = np.random.default_rng(seed)
    Xall, _ = mnist_like(n=2000)
    X = Xall[:B]
    Z = Xall[rng.integers(0, 2000, (C, M))] + 0.05 * rng.normal(size=(C, M, D))
    kernels = []
    for _ in range(C):
        kern = make_kernel("rbf", D, ard=True)
        theta = np.concatenate([np.log(rng.uniform(2.0, 8.0, D)), [np.log(rng.uniform(0.5, 2))]])
        kern.set_unconstrained(theta)
        kernels.append(kern)
    family = StackedKernels.of(kernels)
    assert family is not None
    natural = np.exp(family.theta())
    return {"family": family, "Z": np.ascontiguousarray(Z), "X": np.ascontiguousarray(X),
            "natural": natural, "ell": np.ascontiguousarray(natural[:, :D]),
            "var": np.ascontiguousarray(natural[:, D]),
            "dKuu": rng.normal(size=(C, M, M)), "dKuf": rng.normal(size=(C, M, B)),
            "dKff_diag": rng.normal(size=(C, B))}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """``max |a - b| / max |b|``."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _fused_adam(k: dict[str, Callable[..., Any]], repeats: int) -> dict[str, object]:
    """The library's host Adam (``Adam.step_into``, 13 operations in cache-sized pieces)
    against the numba one-pass update over the step's ``P`` parameters: equal bits (checked
    after 3 updates from the same state) and medians of ``repeats`` interleaved CPU times."""
    from gpinfer.optim.adam import Adam

    P = C * M * D + C * (D + 1)
    rng = np.random.default_rng(4)
    x0, grads = rng.normal(size=P), rng.normal(size=(3, P))
    lib, x_lib, x_fused = Adam(1e-3), x0.copy(), x0.copy()
    lib.reset(x0)
    m, v = np.zeros(P), np.zeros(P)

    def fused_step(x: np.ndarray, g: np.ndarray, t: int) -> None:
        inv_bias2 = 1.0 / np.sqrt(1.0 - lib.beta2**t)
        k["adam"](x, g, m, v, lib.beta1, lib.beta2, lib.eps, inv_bias2,
                  lib.learning_rate / (1.0 - lib.beta1**t))

    for t, g in enumerate(grads, start=1):
        lib.step_into(x_lib, g)
        fused_step(x_fused, g, t)
    assert np.array_equal(x_lib, x_fused) and np.array_equal(lib.m, m), "fused Adam differs"
    times: dict[str, list[float]] = {"library": [], "fused": []}
    for r in range(repeats):
        for name in (("library", "fused") if r % 2 == 0 else ("fused", "library")):
            t0 = time.process_time()
            if name == "library":
                lib.step_into(x_lib, grads[0])
            else:
                fused_step(x_fused, grads[0], 10)
            times[name].append(time.process_time() - t0)
    return {"equal_bits": True,
            **{f"{n}_median_ms": round(1e3 * float(np.median(v_)), 2) for n, v_ in times.items()}}


def _kernel_pieces(k: dict[str, Callable[..., Any]], p: dict[str, Any], proto: FusedRBF,
                   repeats: int) -> dict[str, object]:
    """Each fused kernel alone (median process-CPU ms of ``repeats``, interleaved, 32 MB
    written between calls) with the bytes it must move (each array read or written once) and
    the rate that implies, next to a plain copy of one ``[C, M, D]`` array (the one-thread
    memory rate)."""
    from gpinfer.kernels.stacked import transposed_cross

    Z, X, ell, var = p["Z"], p["X"], p["ell"], p["var"]
    Kuu, Kuf = proto.forward(Z, X)
    shift = np.mean(np.reshape(Z, (-1, D)), axis=0)
    A, As, Xs, Xs2 = np.empty_like(Z), np.empty_like(Z), np.empty_like(X), np.empty_like(X)
    k["scale"](Z, shift, proto.inv_ell, A, As)
    k["batch"](X, shift, Xs, Xs2)
    Gram = A @ np.swapaxes(A, 1, 2)
    a2 = np.diagonal(Gram, axis1=1, axis2=2).copy()
    Ar = np.reshape(As, (C * M, D))
    R = (Xs @ Ar.T).T if transposed_cross(B, D) else Ar @ Xs.T
    b2 = proto.inv_ell2 @ Xs2.T
    G, Kf, H = Gram.copy(), np.empty_like(Kuf), np.empty_like(Kuu)
    r, col, total = np.empty((C, M)), np.empty((C, B)), np.zeros(C)
    P1, P2, gZ, acc = np.matmul(Kuu, A), np.matmul(Kuf, np.broadcast_to(Xs, (C, B, D))), \
        np.empty_like(Z), np.empty((C, D))
    copy_dst, Wf = np.empty_like(Z), np.empty_like(Kuf)
    CMD, CMM, CMB = 8 * C * M * D, 8 * C * M * M, 8 * C * M * B
    pieces: dict[str, tuple[Callable[[], object], int]] = {
        "copy [C,M,D] (memory rate)": (lambda: np.copyto(copy_dst, Z), 2 * CMD),
        "mean of Z's rows (numpy)": (lambda: np.mean(np.reshape(Z, (-1, D)), axis=0), CMD),
        "scale: Z -> A, As": (lambda: k["scale"](Z, shift, proto.inv_ell, A, As), 3 * CMD),
        # in place on its previous output (the same work on other values: no copy timed)
        "square: Gram -> Kuu (exp)": (lambda: k["square"](G, a2, var, proto.bits), 2 * CMM),
        "cross: R -> Kuf (exp)": (lambda: k["cross"](R, a2, b2, var, Kf, proto.bits), 2 * CMB),
        "weights_cross": (lambda: k["weights_cross"](Kuf, p["dKuf"], -0.5, Wf, r, col, total),
                          3 * CMB),
        "weights_square": (lambda: k["weights_square"](Kuu, p["dKuu"], -0.5, r, H, total,
                                                       np.empty(M)), 3 * CMM),
        "inputs: P1, P2, A -> g_Z": (lambda: k["inputs"](P1, P2, A, ell, gZ, acc), 4 * CMD),
    }
    evict = np.empty(4_000_000)
    times: dict[str, list[float]] = {name: [] for name in pieces}
    for _ in range(repeats):
        for name, (f, _) in pieces.items():
            evict.fill(1.0)
            t0 = time.process_time()
            f()
            times[name].append(time.process_time() - t0)
    out: dict[str, object] = {}
    for name, (_, nbytes) in pieces.items():
        t = float(np.median(times[name]))
        out[name] = f"{1e3 * t:.2f} ms, {nbytes / 1e6:.1f} MB, {nbytes / t / 1e9:.1f} GB/s"
    return out


def fused(repeats: int) -> dict[str, object]:
    """The numba prototype against the library's numpy path: equality (max-norm relative
    error of ``Kuu``, ``Kuf``, the parameter and input gradients; asserted below 1e-12),
    compile time, and medians of ``repeats`` interleaved process-CPU times of the forward and
    the VJP (library, fused, and the BLAS products alone), 32 MB written between calls."""
    k = _numba_kernels()
    if k is None:
        return {"skipped": "numba not importable (see the module docstring)"}
    import gpinfer.kernels.stacked as stacked
    from gpinfer.kernels.stacked import StackedCovariances, transposed_cross

    p = _kernel_problem()
    family, Z, X = p["family"], p["Z"], p["X"]
    proto = FusedRBF(k, p["ell"], p["var"])
    out_lib, out_fused = np.empty_like(Z), np.empty_like(Z)

    def lib_forward() -> StackedCovariances:
        return StackedCovariances(family, Z, X)

    def lib_vjp(cov: StackedCovariances) -> tuple[Any, Any]:
        return stacked._vjp(cov, p["dKuu"], p["dKuf"], p["dKff_diag"], True, out_lib)

    t0 = time.process_time()
    Kuu, Kuf = proto.forward(Z, X)
    g_params, g_Z = proto.vjp(Kuu, Kuf, p["dKuu"], p["dKuf"], p["dKff_diag"], out_fused)
    compile_s = time.process_time() - t0

    cov = lib_forward()
    lib_params, lib_Z = lib_vjp(cov)
    errors = {"Kuu": _rel(Kuu, cov.Kuu), "Kuf": _rel(Kuf, cov.Kuf),
              "g_params": _rel(g_params, lib_params), "g_Z": _rel(g_Z, lib_Z)}
    for name, err in errors.items():
        assert err < 1e-12, f"fused {name} differs from the library's by {err:.2e}"

    # the BLAS products alone, at the same shapes and layouts (the kernel side's call floor)
    A = proto.A
    Ar = np.reshape(A, (C * M, D))
    H, G_uf = np.array(cov.Kuu), np.array(cov.Kuf)
    tc = transposed_cross(B, D)

    def blas_forward() -> None:
        A @ np.swapaxes(A, 1, 2)
        (proto.Xs @ Ar.T) if tc else (Ar @ proto.Xs.T)

    def blas_vjp() -> None:
        np.matmul(H, A, out=out_fused)
        np.reshape(G_uf, (C * M, B)) @ proto.Xs

    state: dict[str, Any] = {}

    def fused_forward() -> None:
        state["K"] = proto.forward(Z, X)

    def fused_vjp() -> None:
        proto.vjp(*state["K"], p["dKuu"], p["dKuf"], p["dKff_diag"], out_fused)

    def lib_fwd() -> None:
        state["cov"] = lib_forward()

    def lib_bwd() -> None:
        lib_vjp(state["cov"])

    variants: list[tuple[str, Callable[[], object]]] = [
        ("library forward", lib_fwd), ("fused forward", fused_forward),
        ("BLAS of the forward", blas_forward), ("library VJP", lib_bwd),
        ("fused VJP", fused_vjp), ("BLAS of the VJP", blas_vjp)]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    evict = np.empty(4_000_000)
    for r in range(repeats):
        for name, f in (variants if r % 2 == 0 else variants[::-1][3:] + variants[::-1][:3]):
            evict.fill(1.0)
            t = time.process_time()
            f()
            times[name].append(time.process_time() - t)
    med = {name: round(1e3 * float(np.median(v)), 2) for name, v in times.items()}
    return {"adam (P = C M D + C (D + 1))": _fused_adam(k, repeats),
            "fused kernels alone": _kernel_pieces(k, p, proto, repeats),
            "max_rel_error_vs_library": {k_: f"{v:.1e}" for k_, v in errors.items()},
            "numba_compile_s (first call, process CPU)": round(compile_s, 2),
            "median_cpu_ms": med,
            "element-wise part (variant - BLAS)": {
                "library forward": round(med["library forward"] - med["BLAS of the forward"], 2),
                "fused forward": round(med["fused forward"] - med["BLAS of the forward"], 2),
                "library VJP": round(med["library VJP"] - med["BLAS of the VJP"], 2),
                "fused VJP": round(med["fused VJP"] - med["BLAS of the VJP"], 2)},
            "load_average": os.getloadavg()}


# ---------------------------------------------------------------------------------------------


def main() -> None:
    from flop_models import dgemm_rate

    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="phases,profile,calls,fused",
                    help="comma-separated: phases, profile, calls, fused (see the docstring)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per variant (fused)")
    a = ap.parse_args()
    parts = a.parts.split(",")
    with threadpool_limits(limits=1):
        rate = dgemm_rate(repeats=10, clock=time.process_time)
        report: dict[str, object] = {"dgemm_gflops_one_thread": round(rate / 1e9, 1),
                                     "load_average": os.getloadavg()}
        if "phases" in parts:
            report["sep_mnist_size_phases"] = phases(a.epochs, a.rounds, rate)
        if "profile" in parts:
            report["kernel_regions_torch_profile"] = region_profiles()
        if "calls" in parts:
            report["dense_calls_numpy_vs_torch"] = dense_calls(a.repeats)
        if "fused" in parts:
            report["fused_kernel_side"] = fused(a.repeats)
        report["load_average_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
