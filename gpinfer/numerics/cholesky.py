"""The one Cholesky with jitter escalation (``jittered_cholesky``: one matrix or a stack, of
any backend, ``NumericalError`` naming the matrix), the one triangular solve (``tri_solve``:
``gpinfer.backend.ops.solve_triangular`` itself), and what reuses the factor.

The factorisation underneath, with its per-matrix failure report and its deferred checks on a
device, is ``gpinfer.backend.ops.cholesky``; a caller that factorises itself reports its
failure through ``cholesky_error``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from scipy.linalg import cho_solve

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.numerics import settings

Array = Any

#: the one triangular solve (``L^-1 B``, ``L^-T B``, from the right, stacks, in place):
#: ``gpinfer.backend.ops.solve_triangular`` under the name host code has always called
tri_solve = ops.solve_triangular


class CholeskyResult(NamedTuple):
    """Lower Cholesky factor ``L [N, N]`` of ``A + jitter * I`` and the absolute jitter used."""

    L: Array
    jitter: float


def cholesky_error(name: str, *, iteration: int | None = None, nonfinite: bool = False,
                   detail: str = "", quantity: str | None = None) -> NumericalError:
    """The ``NumericalError`` of a failed Cholesky of the matrix ``name`` (its ``quantity``
    unless one is given), with the caller's ``iteration`` when it has one: ``nonfinite`` when
    the matrix held NaN or infinite values, else not positive definite; ``detail`` (e.g. the
    jitter tried) is added to the message. The one spelling of the failure, for
    ``jittered_cholesky`` and for a caller that factorises itself (it maps its failure
    here)."""
    quantity = name if quantity is None else quantity
    if nonfinite:
        return NumericalError(f"{name} has non-finite entries; cannot factorise",
                              iteration=iteration, quantity=quantity)
    return NumericalError(f"Cholesky of {name} failed{detail}; the matrix is not positive "
                          "definite", iteration=iteration, quantity=quantity)


def _plus_diagonal(A: np.ndarray, shift: float | np.ndarray) -> np.ndarray:
    """``A [N, N]`` with ``shift`` (a number, or a vector ``[N]``) added to its diagonal: a new
    array (the same sums as ``A + shift * I``)."""
    out = A.copy()
    out.flat[:: A.shape[0] + 1] += shift
    return out


class Jitter(NamedTuple):
    """How ``jittered_cholesky`` escalates (its arguments of the same names)."""

    start: float
    max_jitter: float
    factor: float
    scale: float | np.ndarray | None
    warn: bool


def jittered_cholesky(
    A: Array, *also_finite: Array, name: str = "matrix",
    start: float = settings.JITTER_START, max_jitter: float = settings.JITTER_MAX,
    factor: float = settings.JITTER_FACTOR, scale: float | np.ndarray | None = None,
    bare: bool = True, warn: bool = False, iteration: int | None = None,
    part: str = "class", first: int = 0, again: Callable[[], Array] | None = None,
    finite: bool = False, inputs: str | None = None, detail: str = "",
) -> CholeskyResult:
    """Lower Cholesky factor of a symmetric matrix ``A [N, N]``, or of each matrix of a stack
    ``A [..., N, N]`` (numpy or torch), adding jitter only when needed: the one Cholesky of the
    project (``gpinfer.backend.ops.cholesky`` underneath).

    Tries ``A`` first (``bare=False``: not ``A`` itself), then ``A + r s`` on the diagonal for
    ``r = start, start * factor, ...`` up to ``max_jitter`` (``max_jitter = 0``: no jitter, the
    matrix must factorise as it is), where the unit ``s`` is ``scale``: ``None`` for the mean
    absolute diagonal of ``A`` (1 when that is 0), a number for an absolute jitter, a vector
    ``[N]`` for a shift along a diagonal (a Levenberg-Marquardt shift). Returns the factor and
    the jitter used: ``r s`` for a number ``s``, ``r`` for a vector (0 for ``A`` itself; a
    stack's largest). ``NumericalError`` (``cholesky_error``: quantity ``name``, with
    ``iteration``, ``detail`` added to the message) when it gives up or when ``A`` holds
    non-finite values; ``InputError`` when ``A`` is not square.

    Stacks: one factorisation of them all (one check on a device); a matrix that fails gets the
    escalation on its own, on the host (a rare path), named ``"<name> (<part> <first + c>)"``.
    ``also_finite``: arrays checked finite with ``A`` (``inputs``: what they are, for the
    message ``"<inputs> are not finite"``); ``finite``: the caller checked them and ``A``.
    ``again``: the caller owns ``A``, reads it no more and can form it again: numpy then
    factorises ``A`` in place (``A`` is undefined after) and the rare path works on
    ``again()``. On a device inside ``ops.deferred_checks`` nothing is read where the error is
    known without the host: with ``max_jitter = 0`` a failure raises at the step's read;
    inside ``deferred_checks(redo=True)`` as ``ops.RedoStep``, and the loop redoes the step
    without ``redo``, which takes the escalation.
    """
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise InputError(f"{name} must be square, got shape {tuple(A.shape)}")
    if A.shape[-1] == 0:
        return CholeskyResult(ops.zeros(A, tuple(A.shape)), 0.0)
    if bare:  # (``error`` is read only by a device's deferred check: numpy checks at once)
        error = _deferred(A, also_finite, max_jitter, lambda: _Named(
            name, part, first, inputs, detail, iteration))
        L, failed = ops.cholesky(A, *also_finite, check=not finite, overwrite=again is not None,
                                 error=error)
        if not (failed if not finite else np.any(failed)):  # (checked: one bool)
            return CholeskyResult(L, 0.0)
        if again is not None:  # A may be overwritten: its values formed again
            A = again()
    named = _Named(name, part, first, inputs, detail, iteration)
    if (err := named.failure(A, also_finite, locate=True)) is not None or max_jitter <= 0:
        raise err or cholesky_error(name, iteration=iteration, detail=detail)
    if not (start > 0 and factor > 1):
        raise InputError(f"{name}: jitter escalation needs start > 0 and factor > 1, got "
                         f"start {start:g}, factor {factor:g}")
    # a float64 numpy matrix failed as it is on the host's own factorisation: not tried again
    tried = ops.potrf_matrix(A)
    return _escalated(A, named, Jitter(start, max_jitter, factor, scale, warn), bare and not tried)


class _Named(NamedTuple):
    """How ``jittered_cholesky`` names a failure (its arguments of the same names)."""

    name: str
    part: str
    first: int
    inputs: str | None
    detail: str
    iteration: int | None

    def label(self, A: Array, c: int) -> str:
        """The name of matrix ``c`` (flat index) of ``A``: ``name`` for one matrix,
        ``"<name> (<part> <first + c>)"`` in a stack."""
        return self.name if A.ndim == 2 else f"{self.name} ({self.part} {self.first + c})"

    def failure(self, A: Array, also_finite: tuple[Array, ...], locate: bool = False
                ) -> NumericalError | None:
        """The error for a non-finite ``A`` or ``also_finite`` (``None`` where all is
        finite); ``locate``: a non-finite matrix of a stack named (one read per matrix)."""
        if ops.all_finite(*also_finite, A):
            return None
        flat = ops.namespace(A).reshape(A, (-1, *A.shape[-2:]))
        bad = [c for c in range(flat.shape[0]) if not ops.all_finite(flat[c])] if locate else []
        if self.inputs is not None or not bad:
            return NumericalError(f"{self.inputs or self.name + ' inputs'} are not finite",
                                  iteration=self.iteration, quantity=self.name)
        return cholesky_error(self.label(A, bad[0]), iteration=self.iteration, nonfinite=True,
                              quantity=self.name)



def _deferred(A: Array, also_finite: tuple[Array, ...], max_jitter: float,
              named: Callable[[], _Named]) -> Callable[[], Exception] | None:
    """The error of ``jittered_cholesky``'s first factorisation where a device may defer its
    check (``ops.cholesky``'s ``error``; ``named()`` its naming): without jitter the
    failure's (diagnosed when read); with jitter, inside ``deferred_checks(redo=True)``,
    ``RedoStep``; else ``None`` (read at once: the escalation needs the answer)."""
    if max_jitter <= 0:
        def failure() -> Exception:
            how = named()
            return how.failure(A, also_finite) or cholesky_error(
                how.name, iteration=how.iteration, detail=how.detail)
        return failure
    checks = ops.pending_checks()
    if checks is None or not checks.redo:
        return None
    return lambda: ops.RedoStep(f"{named().name}: Cholesky failed or non-finite (iteration "
                                f"{named().iteration}); redo the step with jitter escalation")


def _escalated(A: Array, named: _Named, jitter: Jitter, bare: bool) -> CholeskyResult:
    """``jittered_cholesky``'s escalation for a finite ``A`` that did not factorise as it is
    (or ``bare=False``): a stack's failed matrices one by one, on the host, each named (its
    ``NumericalError`` with the iteration and quantity ``name``)."""
    if A.ndim > 2:
        L, mask = ops.cholesky(A)
        failed = np.asarray(mask)
        if not bare:
            failed = np.ones(failed.shape, dtype=bool)
        largest = 0.0
        for c in np.flatnonzero(failed).tolist():
            idx = tuple(int(i) for i in np.unravel_index(c, failed.shape))
            one = named._replace(name=named.label(A, c), iteration=None)
            try:
                Lc, used = _escalated(ops.to_host(A[idx]).astype(float), one, jitter, bare)
            except NumericalError as err:
                raise NumericalError(str(err), iteration=named.iteration,
                                     quantity=named.name) from err
            L[idx] = ops.like(A, Lc)
            largest = max(largest, used)
        return CholeskyResult(L, largest)
    H = np.asarray(ops.to_host(A), dtype=float)
    if bare:  # (a stack's matrix, a device's or another dtype's: not tried on the host yet)
        L, stopped = ops.cholesky(H)
        if not stopped:
            return CholeskyResult(ops.like(A, L), 0.0)
    unit = (float(np.mean(np.abs(np.diag(H)))) or 1.0) if jitter.scale is None else jitter.scale
    along = np.ndim(unit) > 0  # a shift along a diagonal: the jitter reported is r itself
    rel = jitter.start
    while rel <= jitter.max_jitter * (1 + 1e-12):
        shift = rel * unit
        L, stopped = ops.cholesky(_plus_diagonal(H, shift))
        if stopped:
            rel *= jitter.factor
            continue
        used = rel if along else float(shift)
        if jitter.warn:
            warnings.warn(f"{named.name}: added jitter {used:.3g} for a stable Cholesky",
                          stacklevel=3)
        return CholeskyResult(ops.like(A, L), used)
    largest = jitter.max_jitter if along else jitter.max_jitter * float(unit)
    unit_name = "mean diagonal" if jitter.scale is None else "its unit"
    raise cholesky_error(named.name, iteration=named.iteration, detail=f" even with jitter "
                         f"{largest:.3g} ({jitter.max_jitter:g} x {unit_name})")


def chol_solve(L: Array, B: Array) -> Array:
    """Solve ``(L L^T) X = B`` given the lower factor ``L``."""
    return cho_solve((L, True), B, check_finite=False)


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
