"""What fused element-wise kernels would take off the CPU SEP step (issue 25, a measurement).

RESULT_PLACEHOLDER

Parts (``--parts``, comma-separated):

1. ``phases``: the SEP step at MNIST size (``engine_step.py`` item 2: D 784, C 10, M 200, B
   200, synthetic MNIST-like pixels, N 4000, Adam) on numpy, torch-CPU float64 eager and
   torch-CPU float64 ``compile="default"`` (inductor: fused element-wise C++), process-CPU ms
   per step of the phases of ``engine_step.py --parts sep`` (its ``PhaseClock``) and of the
   kernel side's two compiled regions (``kernels.stacked._forward`` and ``_vjp``), over
   epochs 2..E; ``--rounds`` rounds, the three in turn in one process (the compiled
   functions are compiled in the first round's warm-up epoch, whose CPU and wall time are
   reported apart: inductor compiles in worker processes, which the process clock misses).
2. ``calls``: the step's dense calls on numpy (OpenBLAS, scipy's LAPACK) against torch-CPU
   (MKL), the same ``gpinfer.backend.ops`` calls on the same ``[C, M, M]``/``[C, M, B]``
   stand-ins: least process-CPU ms of interleaved repeats.
3. ``fused``: numba prototypes (``@njit``, one thread) of the kernel side of the stacked RBF
   path: the forward (shift, scale, ``Kuu``, ``Kuf``, ``exp``) and the VJP's element-wise
   parts around the same BLAS products, checked against the library's numpy path
   (``StackedCovariances`` and its ``vjp``) to 1e-12 relative, then both timed on one thread,
   interleaved (process CPU, medians), with the BLAS products alone (the kernel side's floor
   of calls). Skipped, with a note, where numba cannot be imported: install it outside the
   project (``.venv/bin/python -m pip install --target /tmp/numba-site --no-deps numba
   llvmlite``) and put that folder on ``PYTHONPATH`` for the run.

    PYTHONPATH=/tmp/numba-site OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/fused_step.py [--parts phases,calls,fused] [--epochs 3]
        [--rounds 2]
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
    """``engine_step.sep_mnist_size``'s phases, and the kernel side's compiled regions."""
    from gpinfer_ep.method import SparseSites

    import gpinfer.kernels.stacked as stacked
    from gpinfer.hyper import HyperParameters
    from gpinfer.optim.adam import Adam
    from gpinfer.training.loop import TrainingLoop

    return {"kernel terms (Kuu, Kuf, chol, A)": (SparseSites, "prepare"),
            "  its kernel forward (stacked._forward)": (stacked, "_forward"),
            "site update": (SparseSites, "update"),
            "log Z_q + matrix gradients": (SparseSites, "objective"),
            "kernel VJPs (hp.gradient)": (HyperParameters, "gradient"),
            "  its stacked VJP (stacked._vjp)": (stacked, "_vjp"),
            "Adam step": (Adam, "step_into"),
            "optimiser coordinates, pack/unpack": (TrainingLoop, "_ascend"),
            "one step, all of it": (TrainingLoop, "_step")}


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
    split = {k: v / n_steps for k, v in clock.spent.items()}
    split["optimiser coordinates, pack/unpack"] -= split["Adam step"]
    inner = ("kernel terms (Kuu, Kuf, chol, A)", "site update", "log Z_q + matrix gradients",
             "kernel VJPs (hp.gradient)")
    split["rest of the step (Python, checks)"] = (split.pop("one step, all of it")
                                                  - sum(split[k] for k in inner))
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



# ---------------------------------------------------------------------------------------------
# 3. numba prototypes of the kernel side's element-wise work (the stacked RBF path)


def _numba_kernels() -> dict[str, Callable[..., Any]] | None:
    """The fused element-wise kernels (``@njit``, one thread, no fastmath: IEEE roundings),
    or ``None`` where numba cannot be imported. Each reads and writes its ``[C, M, D]``,
    ``[C, M, M]`` or ``[C, M, B]`` arrays once."""
    try:
        from numba import njit
    except ImportError:
        return None

    @njit(cache=False)
    def scale(Z, shift, ell, A, As):  # pragma: no cover - compiled
        """``A = (Z - shift) / ell``, ``As = A / ell`` ``[C, M, D]``: one read of ``Z``."""
        C_, M_, D_ = Z.shape
        for c in range(C_):
            for m in range(M_):
                for d in range(D_):
                    a = (Z[c, m, d] - shift[d]) / ell[c, d]
                    A[c, m, d] = a
                    As[c, m, d] = a / ell[c, d]

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
    def square(G, a2, var):  # pragma: no cover - compiled
        """``Kuu = var exp(-r2 / 2)``, ``r2 = max(a2_m + a2_n - 2 G, 0)``, in place on the
        Gram ``G [C, M, M]``: one triangle's ``exp``, mirrored; the diagonal ``var``."""
        C_, M_, _ = G.shape
        for c in range(C_):
            v = var[c]
            for m in range(M_):
                G[c, m, m] = v
                for n in range(m + 1, M_):
                    r2 = (-2.0 * G[c, m, n] + a2[c, m]) + a2[c, n]
                    k = v * np.exp(-0.5 * max(r2, 0.0))
                    G[c, m, n] = k
                    G[c, n, m] = k

    @njit(cache=False)
    def cross(R, a2, b2, var, K):  # pragma: no cover - compiled
        """``Kuf [C, M, B] = var exp(-r2 / 2)``, ``r2 = max(a2_m + b2_b - 2 R, 0)`` from
        ``R = As Xs^T`` ``[C M, B]`` (any strides: the transposed product's view), in tiles
        of 32 x 32 (the transposing read in cache)."""
        C_, M_, B_ = K.shape
        T = 32
        for c in range(C_):
            v = var[c]
            for m0 in range(0, M_, T):
                for b0 in range(0, B_, T):
                    for m in range(m0, min(m0 + T, M_)):
                        row = c * M_ + m
                        for b in range(b0, min(b0 + T, B_)):
                            r2 = (-2.0 * R[row, b] + a2[c, m]) + b2[c, b]
                            K[c, m, b] = v * np.exp(-0.5 * max(r2, 0.0))

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
    def weights_square(K, dK, per_g, r_uf, H, total):  # pragma: no cover - compiled
        """``H = diag(rA) - 2 G`` ``[C, M, M]``, ``G`` the symmetric part of
        ``per_g K dK``, ``rA = 2 r_uu + r_uf`` (``r_uu`` its row sums); adds ``G``'s sum to
        ``total [C]``. One triangle read with its mirror."""
        C_, M_, _ = K.shape
        row = np.empty(M_)
        for c in range(C_):
            for m in range(M_):
                row[m] = 0.0
            for m in range(M_):
                g = per_g * K[c, m, m] * dK[c, m, m]
                row[m] += g
                H[c, m, m] = -2.0 * g
                for n in range(m + 1, M_):
                    g = 0.5 * (per_g * K[c, m, n] * dK[c, m, n]
                               + per_g * K[c, n, m] * dK[c, n, m])
                    row[m] += g
                    row[n] += g
                    H[c, m, n] = -2.0 * g
                    H[c, n, m] = -2.0 * g
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

    return {"scale": scale, "batch": batch, "square": square, "cross": cross,
            "weights_cross": weights_cross, "weights_square": weights_square,
            "inputs": inputs}


class FusedRBF:
    """The stacked RBF path's forward and VJP (ARD, inputs' gradients) with the fused
    kernels of ``_numba_kernels`` between the library's BLAS products (the same products as
    ``gpinfer.kernels.stacked`` on numpy: the Gram ``A A^T``, the cross product in
    ``transposed_cross``'s layout, ``H A`` and ``G_uf Xs``). ``ell [C, D]``, ``var [C]``."""

    def __init__(self, k: dict[str, Callable[..., Any]], ell: np.ndarray, var: np.ndarray):
        self.k, self.ell, self.var = k, ell, var
        self.inv_ell2 = 1.0 / (ell * ell)

    def forward(self, Z: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(Kuu [C, M, M], Kuf [C, M, B])`` at ``Z [C, M, D]``, ``X [B, D]``; keeps ``A``,
        ``Xs``, ``Xs2`` for the VJP."""
        from gpinfer.kernels.stacked import transposed_cross

        k = self.k
        C_, M_, D_ = Z.shape
        B_ = X.shape[0]
        shift = np.mean(np.reshape(Z, (-1, D_)), axis=0)
        A, As = np.empty_like(Z), np.empty_like(Z)
        k["scale"](Z, shift, self.ell, A, As)
        Xs, Xs2 = np.empty_like(X), np.empty_like(X)
        k["batch"](X, shift, Xs, Xs2)
        Kuu = A @ np.swapaxes(A, 1, 2)  # the Gram (syrk), Kuu in place
        a2 = np.diagonal(Kuu, axis1=1, axis2=2).copy()
        Ar = np.reshape(As, (C_ * M_, D_))
        R = (Xs @ Ar.T).T if transposed_cross(B_, D_) else Ar @ Xs.T  # [C M, B], any strides
        b2 = self.inv_ell2 @ Xs2.T  # [C, B]
        k["square"](Kuu, a2, self.var)
        Kuf = np.empty((C_, M_, B_))
        k["cross"](R, a2, b2, self.var, Kuf)
        self.A, self.Xs, self.Xs2 = A, Xs, Xs2
        return Kuu, Kuf

    def vjp(self, Kuu: np.ndarray, Kuf: np.ndarray, dKuu: np.ndarray, dKuf: np.ndarray,
            dKff_diag: np.ndarray, out_Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(g_params [C, D + 1], g_Z [C, M, D])`` (``d/dlog ell``, ``d/dlog var``; ``g_Z``
        written into ``out_Z``), the library's ``StackedCovariances.vjp`` for an RBF."""
        k = self.k
        C_, M_, B_ = Kuf.shape
        per_g = -0.5  # RBF: dg/dr2 = -g / 2
        G_uf = np.empty_like(Kuf)
        r_uf, c_uf, total = np.empty((C_, M_)), np.empty((C_, B_)), np.empty(C_)
        k["weights_cross"](Kuf, dKuf, per_g, G_uf, r_uf, c_uf, total)
        H = np.empty_like(Kuu)
        k["weights_square"](Kuu, dKuu, per_g, r_uf, H, total)
        P1 = np.matmul(H, self.A, out=out_Z)
        P2 = np.reshape(np.reshape(G_uf, (C_ * M_, B_)) @ self.Xs, P1.shape)
        acc = np.empty((C_, self.ell.shape[1]))
        k["inputs"](P1, P2, self.A, self.ell, out_Z, acc)
        d_ell = acc
        d_ell += c_uf @ self.Xs2
        d_ell /= self.ell * self.ell
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
    return {"max_rel_error_vs_library": {k_: f"{v:.1e}" for k_, v in errors.items()},
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
    ap.add_argument("--parts", default="phases,calls,fused")
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
        if "fused" in parts:
            report["fused_kernel_side"] = fused(a.repeats)
        report["load_average_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
