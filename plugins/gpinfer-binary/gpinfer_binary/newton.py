"""Safeguarded Newton ascent shared by the KL and VB methods (spec binary §2.4, §2.5).

``newton_maximize`` maximises ``f(x)`` given a callable returning value, gradient and Hessian:
a Levenberg-Marquardt shift makes ``H - mu D`` negative definite (Cholesky of its negative;
``D = |diag H|``, so the shift is blind to the scale of each coordinate), the step
``d = -(H - mu D)^-1 g`` is backtracked (``eta = 1, 1/2, ...``) until the value does not
decrease, and an optional projection keeps iterates feasible (e.g. ``lambda <= 0``).

Bounds (with ``project``): ``fixed(x, g)`` names the coordinates at a bound whose gradient
points out of the feasible set; they are held for that step and the Newton system is solved on
the others (projected Newton). Without it, a step into the bound is cut by the projection, is no
longer an ascent direction, and the line search creeps at round-off level (kl on separable
data). The gradient test then applies to the free coordinates (the KKT conditions).

An objective may also offer a preferred step (``direction``) for where ``-H`` is not positive
definite, e.g. Newton's method on its stationarity equations written without the large factors
that make ``H`` indefinite at round-off level. It is taken when it ascends (``g^T d > 0``) and a
step of at least ``2^-PREFERRED_HALVINGS`` of it does not decrease the value; otherwise the
shifted Hessian step is used. ``g^T d`` of a preferred step is not a Newton decrement (far from
the optimum ``d`` can be nearly orthogonal to ``g``), so such an objective should say when it is
converged (``converged``, e.g. a small residual of its stationarity equations); the decrement
test applies to Hessian steps only.

Stopping: ``max|g| <= tol``, or (optional ``decrement_tol``) the Newton decrement
``g^T (-H)^-1 g`` (twice the predicted ascent to the optimum; invariant to the scaling of ``x``)
is below ``max(decrement_tol, decrement_rtol * max(1, |f|))`` or has stalled at round-off level
(below ``DECREMENT_FLOOR`` and not shrinking by ``DECREMENT_STALL`` in one step). Use it where
the gradient carries a large scale (KL: ``K alpha`` with ``K ~ sigma_f^2``) so that ``tol``
alone is below round-off. The Newton step whose decrement passed the test is still taken (with
the usual line search, which also gives the returned value): near the optimum Newton converges
quadratically, so the point returned is accurate to about the square of the decrement, and no
further derivative evaluation (the expensive part) is spent to confirm it. The returned
``grad_norm`` is that of the last derivative evaluation, one step earlier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky

#: ``fun(x, derivatives)``: value, and with ``derivatives`` also gradient ``[P]`` and Hessian
NewtonFunction = Callable[[Array, bool], tuple[float, Array | None, Array | None]]
#: ``direction(x, g)``: a preferred step ``[P]`` at the point of the last ``fun(x, True)``
DirectionFunction = Callable[[Array, Array], Array | None]
#: ``converged(x)``: the objective's own stopping test at the point of the last ``fun(x, True)``
ConvergedFunction = Callable[[Array], bool]
#: ``fixed(x, g)``: boolean mask ``[P]`` of the coordinates held at their bound for this step
FixedFunction = Callable[[Array, Array], Array]

MAX_HALVINGS = 30
#: relative value decrease accepted as round-off in the line search
ROUNDOFF = 1e-12
#: a Newton decrement below this that shrinks by less than ``DECREMENT_STALL`` is round-off
DECREMENT_FLOOR = 1e-10
DECREMENT_STALL = 0.1
#: halvings tried on a preferred direction before falling back to the Hessian step
PREFERRED_HALVINGS = 1


@dataclass
class NewtonResult:
    """Final point, value, gradient max-norm, Newton steps, convergence flag, LM shifts used."""

    x: Array
    value: float
    grad_norm: float
    n_steps: int
    converged: bool
    n_shifted: int = 0


def newton_maximize(
    fun: NewtonFunction,
    x0: Array,
    *,
    tol: float = 1e-8,
    max_steps: int = 100,
    project: Callable[[Array], Array] | None = None,
    name: str = "newton",
    decrement_tol: float | None = None,
    decrement_rtol: float = 0.0,
    direction: DirectionFunction | None = None,
    converged: ConvergedFunction | None = None,
    fixed: FixedFunction | None = None,
) -> NewtonResult:
    """Maximise ``fun`` from ``x0 [P]`` until ``max|g| <= tol`` (or ``max_steps``).

    With ``decrement_tol`` also stop (converged) once the Newton decrement ``g^T d`` of an
    unshifted Hessian step is ``<= max(decrement_tol, decrement_rtol * max(1, |f|))`` or has
    stalled at round-off, after taking that step (module docstring). ``direction``: optional
    preferred step; ``converged``: optional extra stopping test; ``fixed``: coordinates held at
    their bound (module docstring).
    """
    proj = project or (lambda z: z)
    x = proj(np.array(x0, dtype=float))
    shifted = 0
    value = -np.inf
    gnorm = np.inf
    last_dec = np.inf
    for step in range(max_steps + 1):
        value, g, H, free, gnorm = _evaluate(fun, x, fixed, name, step)
        done = gnorm <= tol or (converged is not None and converged(x))
        if done or step == max_steps:
            return NewtonResult(x, float(value), gnorm, step, done, shifted)
        d, mu = _free_newton_step(H, g, free, step, name)
        preferred = _preferred_step(direction, x, g, value, fun, proj) if mu > 0 else None
        if preferred is not None:
            d, x_try = preferred
        else:
            shifted += mu > 0
        if decrement_tol is not None and mu == 0.0 and preferred is None:
            dec = float(g @ d)
            limit = max(decrement_tol, decrement_rtol * max(1.0, abs(value)))
            if dec <= limit or (dec <= DECREMENT_FLOOR and dec > DECREMENT_STALL * last_dec):
                return _final_step(fun, proj, x, d, value, gnorm, step, shifted)
            last_dec = dec
        if preferred is None:
            backtracked = _backtrack(fun, proj, x, d, value, MAX_HALVINGS)
            if backtracked is None:  # no ascent possible: at the optimum to working precision
                return NewtonResult(x, float(value), gnorm, step, gnorm <= 1e3 * tol, shifted)
            x_try = backtracked[0]
        x = x_try
    return NewtonResult(x, float(value), gnorm, max_steps, False, shifted)


def _evaluate(fun: NewtonFunction, x: Array, fixed: FixedFunction | None, name: str,
              step: int) -> tuple[float, Array, Array, Array, float]:
    """``fun`` at ``x [P]`` with its gradient ``g [P]`` and Hessian ``H [P, P]``, checked
    finite (``NumericalError`` naming the step otherwise); the free coordinates ``[P]`` (bool,
    not held at a bound by ``fixed``) and the largest free gradient entry."""
    value, g, H = fun(x, True)
    assert g is not None and H is not None
    if not np.isfinite(value) or not np.all(np.isfinite(g)):
        raise NumericalError(f"{name}: non-finite objective or gradient", iteration=step,
                             quantity="objective")
    free = np.ones(g.shape, dtype=bool) if fixed is None else ~np.asarray(fixed(x, g))
    return value, g, H, free, float(np.max(np.abs(g[free]), initial=0.0))


def _free_newton_step(H: Array, g: Array, free: Array, step: int, name: str
                      ) -> tuple[Array, float]:
    """The (shifted) Newton step ``d [P]`` on the free coordinates (zero on the fixed ones) and
    its shift ``mu`` (``_shifted_newton_step``; its ``NumericalError`` starts with ``name``,
    the solver's, as every error of ``newton_maximize`` does)."""
    try:
        if free.all():
            return _shifted_newton_step(H, g, step)
        d = np.zeros_like(g)
        d[free], mu = _shifted_newton_step(H[np.ix_(free, free)], g[free], step)
    except NumericalError as exc:
        named = NumericalError(f"{name}: {exc}")  # exc's text ends with its iteration, quantity
        named.iteration, named.quantity = exc.iteration, exc.quantity
        raise named from exc
    return d, mu


def _final_step(fun: NewtonFunction, proj: Callable[[Array], Array], x: Array, d: Array,
                value: float, gnorm: float, step: int, shifted: int) -> NewtonResult:
    """The converged result after the last Newton step ``d`` from ``x`` (line-searched; ``x``
    itself when no step size keeps the value)."""
    found = _backtrack(fun, proj, x, d, value, MAX_HALVINGS)
    if found is None:
        return NewtonResult(x, float(value), gnorm, step, True, shifted)
    return NewtonResult(found[0], found[1], gnorm, step + 1, True, shifted)


def _shifted_newton_step(H: Array, g: Array, step: int) -> tuple[Array, float]:
    """``d = -(H - mu D)^-1 g`` with the smallest ``mu`` in ``0, 1e-8, 4e-8, ..., 1e12`` that
    works (``NumericalError``, quantity ``"Hessian"``, at Newton step ``step`` when none does)."""
    H = 0.5 * (H + H.T)
    diag = np.abs(np.diag(H))
    diag = np.maximum(diag, 1e-12 * max(float(np.max(diag)), 1e-12))
    L, mu = jittered_cholesky(-H, name="Hessian", start=1e-8, factor=4.0, max_jitter=1e12,
                              scale=diag, iteration=step)  # -(H - mu D), mu = 0 first
    return chol_solve(L, g), mu


def _backtrack(
    fun: NewtonFunction, proj: Callable[[Array], Array], x: Array, d: Array, value: float,
    halvings: int,
) -> tuple[Array, float] | None:
    """``proj(x + eta d)`` and its value for the first ``eta = 1, 1/2, ...`` that does not lower
    the value (beyond round-off); None when none does."""
    eta = 1.0
    slack = ROUNDOFF * max(1.0, abs(value))
    for _ in range(halvings):
        x_try = proj(x + eta * d)
        v_try = fun(x_try, False)[0]
        if np.isfinite(v_try) and v_try >= value - slack:
            return x_try, float(v_try)
        eta *= 0.5
    return None


def _preferred_step(
    direction: DirectionFunction | None, x: Array, g: Array, value: float,
    fun: NewtonFunction, proj: Callable[[Array], Array],
) -> tuple[Array, Array] | None:
    """The preferred step and the accepted point, or None when it does not ascend."""
    if direction is None:
        return None
    d = direction(x, g)
    if d is None or not np.all(np.isfinite(d)) or not float(g @ d) > 0.0:
        return None
    found = _backtrack(fun, proj, x, d, value, PREFERRED_HALVINGS + 1)
    return None if found is None else (d, found[0])
