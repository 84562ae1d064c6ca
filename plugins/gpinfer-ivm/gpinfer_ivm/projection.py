"""Restricted sites and the restricted ADF projection (spec ivm §1.3, §2.6).

A site has precision ``Pi = diag(pi) - pi pi^T / alpha`` (``alpha = 1^T pi``, ``pi > 0``), so
``Pi 1 = 0``, and linear term ``b [C]``. Given a Gaussian ``N(h, A)`` (marginal or cavity) and the
tilted moments ``(g, h_hat, A_hat)``, the projection minimises over ``t = log pi``

    ``f(t) = -log|I + A Pi| + tr(A_hat Pi)``

by a projected Newton method with the exact Hessian (``newton``, default), by scipy's L-BFGS-B
(``direct``, the spec's recommendation) or through the paper's double loop over the convex
majoriser ``f_q(t) = -log|I + A Pi| + c_q^T pi``. The mean is matched exactly:
``b = g + Pi h_hat``.

Newton's derivatives. ``dPi / dpi_c = u_c u_c^T`` with ``u_c = e_c - x`` (``x = pi / alpha``),
so with ``Sigma = (A^-1 + Pi)^-1``, ``W = A_hat - Sigma`` and ``U = I - x 1^T``:
``grad_pi f = diag(U^T W U)`` and
``hess_pi f = (U^T Sigma U) o (U^T Sigma U) - (2 / alpha) U^T W U`` (``o``: elementwise);
in ``t = log pi``: ``hess_t f = pi pi^T o hess_pi f + diag(pi o grad_pi f)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np
from scipy.linalg.lapack import dgesv, dpotrf, dsyevd
from scipy.optimize import minimize

from gpinfer.errors import NumericalError
from gpinfer.numerics.cholesky import cholesky_error, jittered_cholesky, tri_solve

#: the two ways of solving the restricted projection (module docstring)
ProjectionAlgorithm = Literal["newton", "direct", "double_loop"]
#: the algorithm names, in the order the options list them
PROJECTION_ALGORITHMS: tuple[str, ...] = ("newton", "direct", "double_loop")

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
#: Newton: largest projected gradient component at convergence, iteration cap, Armijo constant,
#: step halvings per line search, smallest modified Hessian eigenvalue (relative to the largest),
#: longest step in ``t`` (a factor ``e^2`` per component: ``f`` flattens towards ``pi_c -> inf``,
#: where its round-off grows with ``pi``, so a full step far out can stall on a plateau)
NEWTON_GTOL, NEWTON_MAXITER, NEWTON_ARMIJO, NEWTON_HALVINGS = 1e-9, 100, 1e-4, 30
NEWTON_EIG_FLOOR, NEWTON_MAX_STEP = 1e-10, 2.0
#: Newton: stop once the predicted decrease ``-grad^T step``, or the decrease a step achieved, is
#: below this times ``1 + |f|`` (what is left is round-off)
NEWTON_FTOL = 1e-14


def site_precision(pi: Array) -> Array:
    """``Pi = diag(pi) - pi pi^T / alpha`` for ``pi [..., C]`` -> ``[..., C, C]``."""
    pi = np.asarray(pi, dtype=float)
    alpha = pi.sum(axis=-1)[..., None, None]
    out = -(pi[..., :, None] * pi[..., None, :] / alpha)
    diag = np.arange(pi.shape[-1])
    out[..., diag, diag] += pi  # the same sums as diag(pi) - pi pi^T / alpha, without np.eye
    return out


def site_sqrt(pi: Array) -> Array:
    """Square-root factor ``V [..., C, C]`` with ``V V^T = Pi`` (not symmetric; spec §1.3)."""
    pi = np.asarray(pi, dtype=float)
    xt = np.sqrt(pi / pi.sum(axis=-1, keepdims=True))
    centred = -(xt[..., :, None] * xt[..., None, :])
    diag = np.arange(pi.shape[-1])
    centred[..., diag, diag] += 1.0  # I - xt xt^T: the same sums, without np.eye
    return np.sqrt(pi)[..., :, None] * centred


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
    R = tri_solve(Ls, S[:, None] * A)
    Qbar = A - R.T @ R
    v = Qbar @ x
    mu = float(x @ v)
    # s = 1 - alpha mu = x~^T E^-1 x~ (x~ = sqrt(pi / alpha), E = I + S A S): no cancellation
    e = tri_solve(Ls, np.sqrt(x))
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


class _Local(NamedTuple):
    f: float
    grad: Array  # [C] d f / d t
    hess: Array  # [C, C] d^2 f / d t d t^T


def _local(t: Array, A: Array, A_hat: Array) -> _Local:
    """``f``, its gradient and Hessian in ``t`` (module docstring); ``O(C^3)``, plain numpy."""
    C = t.size
    pi = np.exp(t)
    alpha = float(pi.sum())
    x = pi / alpha
    S = np.sqrt(pi)
    SA = S[:, None] * A
    E = SA * S[None, :]
    E.flat[:: C + 1] += 1.0  # I + S A S, eigenvalues >= 1 (the same sums as np.eye(C) + S A S)
    # LAPACK directly (potrf, gesv: what numpy.linalg's cholesky and solve call), without
    # numpy.linalg's per-call wrapping (its failure reported as jittered_cholesky's, no
    # jitter: E's eigenvalues are >= 1); the solve stays LU (more accurate here than the
    # Cholesky factor's, which Newton's stopping tests at pi ~ 1e5 notice)
    L, info = dpotrf(E, lower=1, clean=1)
    if info != 0:
        raise cholesky_error("I + S A S", detail=f" (potrf info {info})",
                             nonfinite=not np.all(np.isfinite(E)))
    rhs = np.concatenate([SA, np.sqrt(x)[:, None]], axis=1)
    Z, info = dgesv(E, rhs)[2:]
    if info != 0:
        raise np.linalg.LinAlgError(f"I + S A S is singular (gesv info {info})")
    Qbar = A - SA.T @ Z[:, :C]  # (A^-1 + S^2)^-1
    s = float(np.sqrt(x) @ Z[:, C])  # 1 - alpha x^T Qbar x, without cancellation
    v = Qbar @ x
    Sigma = Qbar + (alpha / s) * (v[:, None] * v[None, :])  # (A^-1 + Pi)^-1 (Sherman-Morrison)
    Ax = A_hat @ x
    f = (-2.0 * float(np.log(L.diagonal()).sum()) - np.log(s)
         + float(A_hat.diagonal() @ pi) - alpha * float(x @ Ax))  # fmt: skip

    def around(M: Array, Mx: Array) -> Array:  # U^T M U
        return M - Mx[:, None] - Mx[None, :] + float(x @ Mx)

    Su = around(Sigma, v / s)  # Sigma x = v / s
    Wu = around(A_hat, Ax) - Su
    grad = pi * Wu.diagonal()
    hess = (pi[:, None] * pi[None, :]) * (Su * Su - (2.0 / alpha) * Wu)
    hess = 0.5 * (hess + hess.T)
    hess.flat[:: C + 1] += grad
    return _Local(f, grad, hess)


def _binary_minimiser(A: Array, A_hat: Array, t0: Array) -> Array | None:
    """``C = 2``: ``f`` depends on ``pi`` only through ``tau = pi_1 pi_2 / (pi_1 + pi_2)``
    (``Pi = tau d d^T``, ``d = e_1 - e_2``) and is least at ``tau = 1/(d^T A_hat d) -
    1/(d^T A d)``, the binary ADF update (spec §2.6). The minimiser keeps ``t0``'s ratio
    ``pi_1 / pi_2`` (the flat direction); ``None`` if ``tau <= 0`` or it leaves the box (then
    the iterations decide)."""
    a_z = A[0, 0] + A[1, 1] - 2.0 * A[0, 1]
    a_hat_z = A_hat[0, 0] + A_hat[1, 1] - 2.0 * A_hat[0, 1]
    if not (a_z > 0.0 and a_hat_z > 0.0):
        return None
    tau = 1.0 / a_hat_z - 1.0 / a_z
    x = np.exp(t0 - np.logaddexp(t0[0], t0[1]))  # pi / alpha
    if not tau > 0.0:
        return None
    t = np.log(tau / (x[0] * x[1])) + np.log(x)
    if np.any(t < np.log(PI_FLOOR)) or np.any(t > np.log(PI_CEIL)):
        return None
    return t


def project_newton(A: Array, A_hat: Array, t0: Array) -> Array:
    """``argmin_t f(t)`` on ``[log PI_FLOOR, log PI_CEIL]^C`` by projected Newton from ``t0``
    (``C = 2``: in closed form, ``_binary_minimiser``, unless that leaves the box).

    Components at a bound whose gradient points outwards are held there; on the others the
    Hessian's eigenvalues are replaced by their absolute values (floored), so every step is a
    descent direction of the non-convex ``f``; an Armijo backtracking line search on the
    projected step. Stops when the projected gradient is below ``NEWTON_GTOL`` (scipy's
    L-BFGS-B ``gtol`` of the direct projection), the predicted or achieved decrease is at
    round-off level (``NEWTON_FTOL``) or no step decreases ``f``.
    """
    lo, hi = np.log(PI_FLOOR), np.log(PI_CEIL)
    t = np.clip(np.asarray(t0, dtype=float), lo, hi)
    if t.size == 2:
        exact = _binary_minimiser(A, A_hat, t)
        if exact is not None:
            return exact
    # ndarray methods and LAPACK's syevd directly (what np.linalg.eigh calls), without their
    # per-call wrapping (digits default fit, cProfile: 2.3e4 projections, 7.4e4 Newton steps);
    # scipy's LAPACK build moves t by round-off only (<= 1.1e-14 on 3000 digits projections)
    cur = _local(t, A, A_hat)
    for _ in range(NEWTON_MAXITER):
        held = ((t <= lo) & (cur.grad > 0)) | ((t >= hi) & (cur.grad < 0))
        if held.any():
            free = ~held
            if not free.any():
                break
            g_free, H = cur.grad[free], cur.hess[np.ix_(free, free)]
        else:
            free, g_free, H = None, cur.grad, cur.hess
        if float(np.abs(g_free).max()) <= NEWTON_GTOL:
            break
        lam, Q, info = dsyevd(H, compute_v=1, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"Newton's Hessian: syevd did not converge (info {info})")
        lam = np.abs(lam)
        lam = np.maximum(lam, NEWTON_EIG_FLOOR * max(float(lam.max()), 1e-300))
        step_free = -(Q @ ((Q.T @ g_free) / lam))
        if free is None:
            step = step_free
        else:
            step = np.zeros_like(t)
            step[free] = step_free
        if -float(cur.grad @ step) <= NEWTON_FTOL * (1.0 + abs(cur.f)):
            break
        size, nxt = min(1.0, NEWTON_MAX_STEP / float(np.abs(step).max())), None
        for _ in range(NEWTON_HALVINGS):
            trial = (t + size * step).clip(lo, hi)
            cand = _local(trial, A, A_hat)
            if cand.f <= cur.f + NEWTON_ARMIJO * float(cur.grad @ (trial - t)):
                nxt = (trial, cand)
                break
            size *= 0.5
        if nxt is None or not (nxt[0] != t).any():
            break
        gain = cur.f - nxt[1].f
        t, cur = nxt
        if gain <= NEWTON_FTOL * (1.0 + abs(cur.f)):
            break  # a round-off-level decrease (f flat towards pi_c -> inf): no further progress
    return t


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
    algorithm: ProjectionAlgorithm = "newton",
) -> tuple[Array, Array]:
    """Site ``(pi [C], b [C])`` of the restricted ADF projection; ``b = g + Pi h_hat``."""
    t0 = np.clip(np.asarray(t0, dtype=float), np.log(PI_FLOOR), np.log(PI_CEIL))
    try:
        with np.errstate(all="ignore"):
            if algorithm == "newton":
                t = project_newton(A, A_hat, t0)
            elif algorithm == "direct":
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
