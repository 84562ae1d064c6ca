"""Restricted sites and the restricted ADF projection (spec ivm §1.3, §2.6).

A site has precision ``Pi = diag(pi) - pi pi^T / alpha`` (``alpha = 1^T pi``, ``pi > 0``), so
``Pi 1 = 0``, and linear term ``b [C]``. Given a Gaussian ``N(h, A)`` (marginal or cavity) and the
tilted moments ``(g, h_hat, A_hat)``, the projection minimises over ``t = log pi``

    ``f(t) = -log|I + A Pi| + tr(A_hat Pi)``

(direct L-BFGS-B, default) or through the paper's double loop over the convex majoriser
``f_q(t) = -log|I + A Pi| + c_q^T pi``. The mean is matched exactly: ``b = g + Pi h_hat``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np
from scipy.linalg import solve_triangular
from scipy.optimize import minimize

from gpinfer.errors import NumericalError
from gpinfer.numerics.cholesky import jittered_cholesky

#: the two ways of solving the restricted projection (module docstring)
ProjectionAlgorithm = Literal["direct", "double_loop"]

Array = np.ndarray

#: lower bound on each site component ``pi_c`` (spec §2.6 ``epsilon``)
PI_FLOOR = 1e-8
#: upper bound on each ``pi_c`` (keeps ``exp(t)`` finite for extreme hyper-parameters)
PI_CEIL = 1e10
#: mixing weight of the label in the initial ``pi`` (spec §2.6 ``tau_mix``)
TAU_MIX = 0.5
#: direct projection: scipy L-BFGS-B settings (spec §2.6 named settings)
DIRECT_GTOL, DIRECT_FTOL, DIRECT_MAXITER = 1e-9, 1e-12, 200
#: double loop: outer steps and stopping tolerance on the change of ``f``
OUTER_MAX, OUTER_TOL = 50, 1e-9


def site_precision(pi: Array) -> Array:
    """``Pi = diag(pi) - pi pi^T / alpha`` for ``pi [..., C]`` -> ``[..., C, C]``."""
    pi = np.asarray(pi, dtype=float)
    alpha = pi.sum(axis=-1)[..., None, None]
    return pi[..., :, None] * np.eye(pi.shape[-1]) - pi[..., :, None] * pi[..., None, :] / alpha


def site_sqrt(pi: Array) -> Array:
    """Square-root factor ``V [..., C, C]`` with ``V V^T = Pi`` (not symmetric; spec §1.3)."""
    pi = np.asarray(pi, dtype=float)
    xt = np.sqrt(pi / pi.sum(axis=-1, keepdims=True))
    eye = np.eye(pi.shape[-1])
    return np.sqrt(pi)[..., :, None] * (eye - xt[..., :, None] * xt[..., None, :])


class _Terms(NamedTuple):
    logdet: float  # -log|I + A Pi|
    pi: Array
    x: Array
    alpha: float
    diag_term: Array  # the t-gradient of -log|I + A Pi| divided by pi, without c


def _lse(t: Array) -> float:
    """``log sum exp t`` for a small vector (plain numpy: scipy's version dominates the cost)."""
    top = float(t.max())
    return top + float(np.log(np.sum(np.exp(t - top))))


def _terms(t: Array, A: Array) -> _Terms:
    """Stable pieces of ``-log|I + A Pi|`` and its gradient (spec §2.6, App. C)."""
    kappa = _lse(t)
    alpha = float(np.exp(kappa))
    x = np.exp(t - kappa)
    pi = np.exp(t)
    S = np.sqrt(pi)
    Ls = jittered_cholesky(np.eye(t.size) + S[:, None] * A * S[None, :], name="I + S A S").L
    R = solve_triangular(Ls, S[:, None] * A, lower=True, check_finite=False)
    Qbar = A - R.T @ R
    v = Qbar @ x
    mu = float(x @ v)
    # s = 1 - alpha mu = x~^T E^-1 x~ (x~ = sqrt(pi / alpha), E = I + S A S): no cancellation
    e = solve_triangular(Ls, np.sqrt(x), lower=True, check_finite=False)
    s = float(e @ e)
    logdet = -2.0 * float(np.sum(np.log(np.diag(Ls)))) - np.log(s)
    diag_term = -np.diag(Qbar) - (alpha / s) * v * v - (mu / s) + (2.0 / s) * v
    return _Terms(logdet, pi, x, alpha, diag_term)


def objective(t: Array, A: Array, A_hat: Array) -> tuple[float, Array]:
    """``f(t)`` and ``grad_t f`` (the majoriser's gradient at its contact point)."""
    T = _terms(t, A)
    q = A_hat @ T.x
    c = np.diag(A_hat) - 2.0 * q + (q @ T.x)
    f = T.logdet + float(np.diag(A_hat) @ T.pi) - T.alpha * float(T.x @ q)
    return f, (T.diag_term + c) * T.pi


def majoriser(t: Array, A: Array, c_q: Array) -> tuple[float, Array]:
    """The convex majoriser ``f_q(t)`` for a fixed ``c_q [C]`` and its gradient."""
    T = _terms(t, A)
    return T.logdet + float(c_q @ T.pi), (T.diag_term + c_q) * T.pi


def _lbfgs(fun: Callable[[Array], tuple[float, Array]], t0: Array,
           maxiter: int = DIRECT_MAXITER) -> Array:
    bounds = [(np.log(PI_FLOOR), np.log(PI_CEIL))] * t0.size
    res = minimize(
        fun, t0, jac=True, method="L-BFGS-B", bounds=bounds,
        options={"gtol": DIRECT_GTOL, "ftol": DIRECT_FTOL, "maxiter": maxiter},
    )  # fmt: skip
    return np.asarray(res.x, dtype=float)


def project_direct(A: Array, A_hat: Array, t0: Array) -> Array:
    """``argmin_t f(t)`` by L-BFGS-B from ``t0`` (spec §2.6, recommended)."""
    return _lbfgs(lambda t: objective(t, A, A_hat), np.asarray(t0, dtype=float))


def project_double_loop(A: Array, A_hat: Array, t0: Array) -> tuple[Array, list[float]]:
    """The paper's double loop; returns ``t`` and the outer-step values of ``f``."""
    t = np.clip(np.asarray(t0, dtype=float), np.log(PI_FLOOR), np.log(PI_CEIL))
    history = [objective(t, A, A_hat)[0]]
    for _ in range(OUTER_MAX):
        x = np.exp(t - _lse(t))
        q = A_hat @ x
        c_q = np.diag(A_hat) - 2.0 * q + (q @ x)
        t = _lbfgs(functools.partial(majoriser, A=A, c_q=c_q), t)
        history.append(objective(t, A, A_hat)[0])
        if abs(history[-2] - history[-1]) < OUTER_TOL:
            break
    return t, history


def initial_t(y: int, p_bar: Array) -> Array:
    """``log pi0``, ``pi0 = tau_mix delta_y + (1 - tau_mix) p_bar`` floored (spec §2.6)."""
    pi0 = (1.0 - TAU_MIX) * np.asarray(p_bar, dtype=float)
    pi0[y] += TAU_MIX
    return np.log(np.maximum(pi0, PI_FLOOR))


def restricted_projection(
    A: Array,
    g: Array,
    h_hat: Array,
    A_hat: Array,
    t0: Array,
    algorithm: ProjectionAlgorithm = "direct",
) -> tuple[Array, Array]:
    """Site ``(pi [C], b [C])`` of the restricted ADF projection; ``b = g + Pi h_hat``."""
    t0 = np.clip(np.asarray(t0, dtype=float), np.log(PI_FLOOR), np.log(PI_CEIL))
    try:
        with np.errstate(all="ignore"):
            if algorithm == "direct":
                t = project_direct(A, A_hat, t0)
            else:
                t = project_double_loop(A, A_hat, t0)[0]
    except (np.linalg.LinAlgError, ValueError) as exc:
        msg = f"restricted ADF projection failed: {exc}"
        raise NumericalError(msg, quantity="projection") from exc
    pi = np.exp(t)
    b = g + site_precision(pi) @ h_hat
    if not (np.all(np.isfinite(pi)) and np.all(np.isfinite(b))):
        raise NumericalError(
            "restricted ADF projection gave a non-finite site", quantity="projection"
        )
    return pi, b
