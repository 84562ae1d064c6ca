"""Safeguarded Newton ascent shared by the KL and VB methods (spec binary §2.4, §2.5).

``newton_maximize`` maximises ``f(x)`` given a callable returning value, gradient and Hessian:
a Levenberg-Marquardt shift makes ``H - mu I`` negative definite (Cholesky of its negative), the
step ``d = -(H - mu I)^-1 g`` is backtracked (``eta = 1, 1/2, ...``) until the value does not
decrease, and an optional projection keeps iterates feasible (e.g. ``lambda <= 0``).

Stopping: ``max|g| <= tol``, or (optional ``decrement_tol``) the Newton decrement
``g^T (-H)^-1 g`` (twice the predicted ascent to the optimum; invariant to the scaling of ``x``)
is below ``decrement_tol`` or has stalled at round-off level (below ``DECREMENT_FLOOR`` and not
shrinking by ``DECREMENT_STALL`` in one step). Use it where the gradient carries a large scale
(KL: ``K alpha`` with ``K ~ sigma_f^2``) so that ``tol`` alone is below round-off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array

#: ``fun(x, derivatives)``: value, and with ``derivatives`` also gradient ``[P]`` and Hessian
NewtonFunction = Callable[[Array, bool], tuple[float, Array | None, Array | None]]

MAX_HALVINGS = 30
#: relative value decrease accepted as round-off in the line search
ROUNDOFF = 1e-12
#: a Newton decrement below this that shrinks by less than ``DECREMENT_STALL`` is round-off
DECREMENT_FLOOR = 1e-10
DECREMENT_STALL = 0.1


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
) -> NewtonResult:
    """Maximise ``fun`` from ``x0 [P]`` until ``max|g| <= tol`` (or ``max_steps``).

    With ``decrement_tol`` also stop (converged) once the Newton decrement of an unshifted step
    is ``<= decrement_tol`` or has stalled at round-off (module docstring).
    """
    proj = project or (lambda z: z)
    x = proj(np.array(x0, dtype=float))
    shifted = 0
    value = -np.inf
    gnorm = np.inf
    last_dec = np.inf
    for step in range(max_steps + 1):
        value, g, H = fun(x, True)
        assert g is not None and H is not None
        if not np.isfinite(value) or not np.all(np.isfinite(g)):
            raise NumericalError(f"{name}: non-finite objective or gradient", iteration=step,
                                 quantity="objective")
        gnorm = float(np.max(np.abs(g)))
        if gnorm <= tol or step == max_steps:
            return NewtonResult(x, float(value), gnorm, step, gnorm <= tol, shifted)
        H = 0.5 * (H + H.T)
        mu, scale = 0.0, max(float(np.max(np.abs(np.diag(H)))), 1e-12)
        eye = np.eye(H.shape[0])
        while True:
            try:
                factor = cho_factor(-(H - mu * eye), lower=True, check_finite=False)
                break
            except LinAlgError:
                mu = max(2.0 * mu, 1e-8 * scale)
                if mu > 1e12 * scale:
                    raise NumericalError(f"{name}: Hessian could not be regularised",
                                         iteration=step, quantity="Hessian") from None
        shifted += mu > 0
        d = cho_solve(factor, g, check_finite=False)
        if decrement_tol is not None and mu == 0.0:
            dec = float(g @ d)
            if dec <= decrement_tol or (dec <= DECREMENT_FLOOR
                                        and dec > DECREMENT_STALL * last_dec):
                return NewtonResult(x, float(value), gnorm, step, True, shifted)
            last_dec = dec
        eta = 1.0
        slack = ROUNDOFF * max(1.0, abs(value))
        for _ in range(MAX_HALVINGS):
            x_try = proj(x + eta * d)
            v_try = fun(x_try, False)[0]
            if np.isfinite(v_try) and v_try >= value - slack:
                break
            eta *= 0.5
        else:  # no ascent possible: at the optimum to working precision
            return NewtonResult(x, float(value), gnorm, step, gnorm <= 1e3 * tol, shifted)
        x = x_try
    return NewtonResult(x, float(value), gnorm, max_steps, False, shifted)
