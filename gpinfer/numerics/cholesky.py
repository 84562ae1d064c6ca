"""Cholesky factorisation with jitter escalation, and solves that reuse the factor."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from scipy.linalg import LinAlgError, cho_solve, cholesky, solve_triangular
from scipy.linalg.blas import dtrsm

from gpinfer.errors import NumericalError
from gpinfer.numerics import settings

Array = np.ndarray


class CholeskyResult(NamedTuple):
    """Lower Cholesky factor ``L [N, N]`` of ``A + jitter * I`` and the absolute jitter used."""

    L: Array
    jitter: float


def jittered_cholesky(
    A: Array,
    *,
    name: str = "matrix",
    start: float = settings.JITTER_START,
    max_jitter: float = settings.JITTER_MAX,
    warn: bool = False,
) -> CholeskyResult:
    """Lower Cholesky of a symmetric matrix ``A [N, N]``, adding jitter only when needed.

    Tries ``A`` first, then ``A + j I`` with ``j = start * mean(diag A)`` growing tenfold up to
    ``max_jitter * mean(diag A)``. Raises ``NumericalError`` naming ``name`` when it gives up or
    when ``A`` holds non-finite values.
    """
    A = np.asarray(A, dtype=float)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{name} must be square, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise NumericalError(f"{name} has non-finite entries; cannot factorise", quantity=name)
    try:
        return CholeskyResult(cholesky(A, lower=True, check_finite=False), 0.0)
    except LinAlgError:
        pass
    scale = float(np.mean(np.abs(np.diag(A)))) or 1.0
    rel = start
    eye = np.eye(A.shape[0])
    while rel <= max_jitter * (1 + 1e-12):
        jitter = rel * scale
        try:
            L = cholesky(A + jitter * eye, lower=True, check_finite=False)
        except LinAlgError:
            rel *= settings.JITTER_FACTOR
            continue
        if warn:
            warnings.warn(f"{name}: added jitter {jitter:.3g} for a stable Cholesky", stacklevel=2)
        return CholeskyResult(L, jitter)
    raise NumericalError(
        f"Cholesky of {name} failed even with jitter {max_jitter * scale:.3g} "
        f"({max_jitter:g} x mean diagonal); the matrix is not positive definite",
        quantity=name,
    )


def chol_solve(L: Array, B: Array) -> Array:
    """Solve ``(L L^T) X = B`` given the lower factor ``L``."""
    return cho_solve((L, True), B, check_finite=False)


def tri_solve(L: Array, B: Array, *, transpose: bool = False) -> Array:
    """Solve ``L X = B`` (or ``L^T X = B`` with ``transpose``) for lower-triangular ``L``."""
    return solve_triangular(L, B, lower=True, trans=1 if transpose else 0, check_finite=False)


def log_det_from_chol(L: Array) -> float:
    """``log det(L L^T) = 2 sum log diag L``."""
    return float(2.0 * np.sum(np.log(np.diag(L))))


def chol_inverse(L: Array) -> Array:
    """``(L L^T)^-1`` from the factor (use only where the full inverse is really needed)."""
    Linv = tri_solve(L, np.eye(L.shape[0]))
    return Linv.T @ Linv


def solve_rows(L: Array, B: Array) -> None:
    """``B <- B L^-T`` in place for lower-triangular ``L [M, M]`` and C-contiguous ``B [n, M]``:
    each row ``b`` becomes ``L^-1 b`` (one BLAS ``trsm`` on the ``[M, n]`` Fortran view; pass
    ``L`` Fortran-ordered to avoid a copy per call)."""
    if B.size == 0:
        return
    out = dtrsm(1.0, L, B.T, side=0, lower=1, overwrite_b=1)
    if not np.shares_memory(out, B):  # the wrapper had to copy (not expected): write back
        B[...] = out.T
