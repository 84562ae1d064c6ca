"""The one Cholesky (``jittered_cholesky``: jitter escalation, ``NumericalError`` naming the
matrix), the one triangular solve of host code (``tri_solve``), and what reuses the factor.

Stacked and array-API factorisations and solves are ``gpinfer.backend.ops``' (``cholesky``,
``checked_cholesky``, ``solve_triangular``); a caller that calls LAPACK ``potrf`` itself for
speed reports its failure through ``cholesky_error``.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple, cast

import numpy as np
from scipy.linalg import cho_solve
from scipy.linalg.blas import dtrsm
from scipy.linalg.lapack import dpotrf, dtrtrs

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.numerics import settings

Array = np.ndarray


class CholeskyResult(NamedTuple):
    """Lower Cholesky factor ``L [N, N]`` of ``A + jitter * I`` and the absolute jitter used."""

    L: Array
    jitter: float


def cholesky_error(name: str, *, iteration: int | None = None, nonfinite: bool = False,
                   detail: str = "") -> NumericalError:
    """The ``NumericalError`` of a failed Cholesky of the matrix ``name`` (its ``quantity``),
    with the caller's ``iteration`` when it has one: ``nonfinite`` when the matrix held NaN or
    infinite values, else not positive definite; ``detail`` (e.g. the jitter tried) is added
    to the message. The one spelling of the failure, for ``jittered_cholesky`` and for a caller
    that calls LAPACK ``potrf`` itself (it maps ``info > 0`` here)."""
    if nonfinite:
        return NumericalError(f"{name} has non-finite entries; cannot factorise",
                              iteration=iteration, quantity=name)
    return NumericalError(f"Cholesky of {name} failed{detail}; the matrix is not positive "
                          "definite", iteration=iteration, quantity=name)


def _plus_diagonal(A: Array, shift: float | Array) -> Array:
    """``A [N, N]`` with ``shift`` (a number, or a vector ``[N]``) added to its diagonal: a new
    array (the same sums as ``A + shift * I``)."""
    out = A.copy()
    out.flat[:: A.shape[0] + 1] += shift
    return out


def _potrf(A: Array) -> Array | None:
    """Lower factor of a finite float64 ``A [N, N]`` (``N > 0``), ``None`` when LAPACK's
    ``potrf`` stops (not positive definite): ``scipy.linalg.cholesky``'s own call, without its
    per-call checks (at ``[3, 3]`` 0.7 us against its 4.6 us; ``jittered_cholesky`` with its
    own checks 2.6 us)."""
    L, info = dpotrf(A, lower=1, clean=1)
    return L if info == 0 else None


def jittered_cholesky(
    A: Array,
    *,
    name: str = "matrix",
    start: float = settings.JITTER_START,
    max_jitter: float = settings.JITTER_MAX,
    factor: float = settings.JITTER_FACTOR,
    scale: float | Array | None = None,
    bare: bool = True,
    warn: bool = False,
    iteration: int | None = None,
) -> CholeskyResult:
    """Lower Cholesky of a symmetric matrix ``A [N, N]``, adding jitter only when needed: the
    one single-matrix Cholesky of the project (stacks and device arrays: ``gpinfer.backend.ops``).

    Tries ``A`` first (``bare=False``: not ``A`` itself), then ``A + r s`` on the diagonal for
    ``r = start, start * factor, ...`` up to ``max_jitter`` (``max_jitter = 0``: no jitter, the
    matrix must factorise as it is), where the unit ``s`` is ``scale``: ``None`` for the mean
    absolute diagonal of ``A`` (1 when that is 0), a number for an absolute jitter, a vector
    ``[N]`` for a shift along a diagonal (a Levenberg-Marquardt shift). Returns the factor and
    the jitter used: ``r s`` for a number ``s``, ``r`` for a vector (0 for ``A`` itself).
    Raises ``NumericalError`` (``cholesky_error``: quantity ``name``, with ``iteration`` when
    given) when it gives up or when ``A`` holds non-finite values; ``InputError`` when ``A`` is
    not square.
    """
    A = np.asarray(A, dtype=float)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise InputError(f"{name} must be square, got shape {A.shape}")
    if not np.isfinite(A).all():  # (the method: np.all's dispatch costs more than C x C work)
        raise cholesky_error(name, iteration=iteration, nonfinite=True)
    if A.shape[0] == 0:
        return CholeskyResult(np.zeros((0, 0)), 0.0)
    if bare and (L := _potrf(A)) is not None:
        return CholeskyResult(L, 0.0)
    unit: float | Array = (float(np.mean(np.abs(np.diag(A)))) or 1.0) if scale is None else scale
    along = np.ndim(unit) > 0  # a shift along a diagonal: the jitter reported is r itself
    if max_jitter > 0 and not (start > 0 and factor > 1):
        raise InputError(f"{name}: jitter escalation needs start > 0 and factor > 1, got "
                         f"start {start:g}, factor {factor:g}")
    rel = start
    while max_jitter > 0 and rel <= max_jitter * (1 + 1e-12):
        shift = rel * unit
        if (L := _potrf(_plus_diagonal(A, shift))) is None:
            rel *= factor
            continue
        jitter = rel if along else float(shift)
        if warn:
            warnings.warn(f"{name}: added jitter {jitter:.3g} for a stable Cholesky", stacklevel=2)
        return CholeskyResult(L, jitter)
    if max_jitter <= 0:
        raise cholesky_error(name, iteration=iteration)
    largest = max_jitter if along else max_jitter * float(unit)
    unit_name = "mean diagonal" if scale is None else "its unit"
    raise cholesky_error(name, iteration=iteration, detail=f" even with jitter {largest:.3g} "
                                                         f"({max_jitter:g} x {unit_name})")


def chol_solve(L: Array, B: Array) -> Array:
    """Solve ``(L L^T) X = B`` given the lower factor ``L``."""
    return cho_solve((L, True), B, check_finite=False)


def tri_solve(L: Array, B: Array, *, transpose: bool = False, right: bool = False,
              overwrite: bool = False) -> Array:
    """The one triangular solve of host code, lower-triangular ``L [M, M]``: ``L^-1 B``
    (``L^-T B`` with ``transpose``) for ``B [M, k]`` or ``[M]``; with ``right``, ``B L^-1``
    (``B L^-T``) for ``B [n, M]`` (a stack ``[..., n, M]`` with ``L [..., M, M]``).
    ``overwrite``: the caller owns ``B`` and reads it no more (``B L^-T`` of a C-ordered
    ``B [n, M]`` is then one BLAS ``trsm`` in place on its Fortran view and returns ``B``
    itself; pass ``L`` Fortran-ordered to avoid a copy of it per call).

    float64 numpy matrices: LAPACK ``trtrs``, the call ``scipy.linalg.solve_triangular`` makes
    (the same bits) without its per-call checks (at ``[4, 4]`` 1.5 us against its 7.3 us);
    ``NumericalError`` if ``L`` has a zero on its diagonal. Anything else (stacks, device
    arrays, other dtypes) goes to ``gpinfer.backend.ops.solve_triangular``, the solve of
    array-API code. No finiteness check: the factor's (``jittered_cholesky``) is the
    caller's."""
    if right:
        if (transpose and overwrite and type(B) is np.ndarray and B.ndim == 2
                and B.flags.c_contiguous):
            if B.size:
                out = dtrsm(1.0, L, B.T, side=0, lower=1, overwrite_b=1)
                if not np.shares_memory(out, B):  # the wrapper had to copy (not expected)
                    B[...] = out.T
            return B
        # B L^-1 = (L^-T B^T)^T, the last two axes swapped (stacks and device arrays too)
        return ops.mT(tri_solve(L, ops.mT(B), transpose=not transpose))
    # (shapes checked here: LAPACK reports a mismatch as info < 0 and returns B unsolved;
    # scipy's ``ValueError`` names it)
    if not (type(L) is np.ndarray and type(B) is np.ndarray and L.ndim == 2
            and L.dtype == np.float64 and B.dtype == np.float64 and B.size and B.ndim <= 2
            and L.shape[0] == L.shape[1] == B.shape[0]):
        return cast(Array, ops.solve_triangular(L, B, transpose=transpose, overwrite=overwrite))
    if L.flags.f_contiguous:
        X, info = dtrtrs(L, B, lower=1, trans=int(transpose), overwrite_b=int(overwrite))
    else:  # C order: L^T is the Fortran-ordered upper factor (scipy's dispatch)
        X, info = dtrtrs(L.T, B, lower=0, trans=int(not transpose), overwrite_b=int(overwrite))
    if info > 0:
        raise NumericalError(f"triangular solve: zero on the factor's diagonal (row {info - 1})",
                             quantity="triangular factor")
    return cast(Array, X)


def log_det_from_chol(L: Array) -> float:
    """``log det(L L^T) = 2 sum log diag L``."""
    return float(2.0 * np.sum(np.log(np.diag(L))))


def chol_inverse(L: Array) -> Array:
    """``(L L^T)^-1`` from the factor (use only where the full inverse is really needed)."""
    Linv = tri_solve(L, np.eye(L.shape[0]))
    return Linv.T @ Linv


def _rows_in_place(L: Array, B: Array) -> None:
    """The deprecated ``solve_rows(L, B)``: ``B <- B L^-T`` in place (``tri_solve``'s)."""
    tri_solve(L, B, right=True, transpose=True, overwrite=True)


def __getattr__(name: str) -> Any:
    """``solve_rows``, deprecated for ``tri_solve(L, B, right=True, transpose=True,
    overwrite=True)`` (the same in-place ``trsm``): works for one more release."""
    if name == "solve_rows":
        warnings.warn("gpinfer.numerics.cholesky.solve_rows is deprecated: use tri_solve(L, B, "
                      "right=True, transpose=True, overwrite=True); the old name works for one "
                      "more release", DeprecationWarning, stacklevel=2)
        return _rows_in_place
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
