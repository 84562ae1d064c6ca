"""``vb``: individual variational lower bounds on each likelihood term (spec §2.5, App. B.4-B.5).

``sig(y f) >= exp(a f^2 + b y f + c)`` with coefficients in ``varsigma``: the Jaakkola-Jordan
bound (logit) and the paper's probit bound (``a = -1/2``: ``W = I`` is fixed). Then
``log Z_VB = sum c + 1/2 b~^T V b~ - sum log L_ii`` (``b~ = y o b``, ``W = -2 Dg(a)``),
maximised over ``varsigma`` by EM steps followed by safeguarded Newton steps.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np
from scipy.special import expit, log_expit

from gpinfer.errors import InputError
from gpinfer.interfaces import Array, Likelihood
from gpinfer.numerics.normal import log_Phi_derivatives
from gpinfer.options import Option
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseSolution
from gpinfer.sites.jensen import gaussian_site_gradient, jensen_bound
from gpinfer_binary.bound_method import NewtonBoundMethod
from gpinfer_binary.newton import newton_maximize

#: EM steps before Newton takes over
EM_STEPS = 5


class BoundCoefficients(NamedTuple):
    """``a, b, c [N]`` and their first / second ``varsigma``-derivatives."""

    a: Array
    b: Array
    c: Array
    da: Array
    db: Array
    dc: Array
    d2a: Array
    d2b: Array
    d2c: Array


def _jj_lambda(s: Array) -> tuple[Array, Array, Array]:
    """``lambda(s) = tanh(s/2)/(4s)`` and its first two derivatives (series near 0)."""
    small = np.abs(s) < 1e-4
    ss = np.where(small, 1.0, s)
    sig = expit(ss)
    lam = np.where(small, 0.125 - s**2 / 96.0, (sig - 0.5) / (2.0 * ss))
    q = sig * (1.0 - sig)
    d1 = np.where(small, -s / 48.0, (0.5 * q - lam) / ss)
    d2 = np.where(small, -1.0 / 48.0, (0.5 * q * (1.0 - 2.0 * sig) - 2.0 * d1) / ss)
    return lam, d1, d2


def bound_coefficients(link: str, s: Array) -> BoundCoefficients:
    """Coefficients of the logit (Jaakkola-Jordan) or probit (paper) quadratic bound."""
    z = np.zeros_like(s)
    if link == "logit":
        lam, l1, l2 = _jj_lambda(s)
        c = lam * s**2 - 0.5 * s + log_expit(s)
        return BoundCoefficients(-lam, z + 0.5, c, -l1, z, l1 * s**2, -l2, z,
                                 l2 * s**2 + 2.0 * l1 * s)
    if link == "probit":
        psi, r, psi2, psi3 = log_Phi_derivatives(s, 3)
        db = 1.0 + psi2
        return BoundCoefficients(z - 0.5, s + r, psi - 0.5 * s**2 - s * r, z, db, -s * db, z,
                                 psi3, -db - s * psi3)
    raise InputError(f"vb has bounds for the logit and probit likelihoods, not {link!r}")


class VBObjective:
    """``log Z_VB(varsigma)``, its gradient and Hessian (spec §2.5) for labels ``y`` (0/1)."""

    def __init__(self, K: Array, y: Array, link: str):
        self.K, self.link = K, link
        self.sign = 2.0 * y - 1.0

    def parts(self, s: Array) -> tuple[BoundCoefficients, DiagonalSiteAlgebra, Array, Array]:
        co = bound_coefficients(self.link, s)
        alg = DiagonalSiteAlgebra.from_kernel_matrix(self.K, -2.0 * co.a)
        alpha = alg.posterior_solve(self.sign * co.b)
        return co, alg, alpha, self.K @ alpha

    def __call__(self, s: Array, derivatives: bool) -> tuple[float, Array | None, Array | None]:
        co, alg, alpha, m = self.parts(s)
        value = float(np.sum(co.c) + 0.5 * (self.sign * co.b) @ m - 0.5 * alg.log_det_B)
        if not derivatives:
            return value, None, None
        V = alg.posterior_cov()
        second = np.diag(V) + m**2
        g = co.da * second + co.db * self.sign * m + co.dc
        u = 2.0 * co.da * m + self.sign * co.db
        H = (np.diag(co.d2a * second + co.d2b * self.sign * m + co.d2c)
             + 2.0 * np.outer(co.da, co.da) * V * V + u[:, None] * V * u[None, :])
        return value, g, H

    def em_step(self, s: Array) -> Array:
        """Closed-form coordinate ascent: logit ``sqrt(V_ii + m_i^2)``, probit ``y_i m_i``."""
        _, alg, _, m = self.parts(s)
        if self.link == "logit":
            return np.sqrt(np.maximum(alg.posterior_var_diag(), 0.0) + m**2)
        return self.sign * m


class VBMethod(NewtonBoundMethod):
    """Variational bounds; evidence ``log Z_VB`` (``J(q_VB)`` in ``extra``), ``G = 1/2(aa^T-R)``.

    Options: ``tol`` (max-norm of the ``varsigma``-gradient), ``max_newton``, driver options.
    """

    name: ClassVar[str] = "vb"
    option_spec: ClassVar[dict[str, Option]] = NewtonBoundMethod.newton_options("varsigma-gradient")

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        link = likelihood.name or type(likelihood).__name__  # the bounds exist per likelihood
        objective = VBObjective(K, y, link)
        if warm is None:
            warm = np.full(y.shape[0], 1.0 if link == "logit" else 0.0)
            for _ in range(EM_STEPS):
                warm = objective.em_step(warm)
        project = (lambda s: np.abs(s)) if link == "logit" else None
        res = newton_maximize(objective, warm, tol=self.options["tol"],
                              max_steps=self.options["max_newton"], project=project,
                              name=f"{self.name} Newton")
        _, alg, alpha, _ = objective.parts(res.x)
        jensen = jensen_bound(likelihood, y, alg, alpha)
        return DenseSolution(
            log_evidence=res.value,
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=lambda: gaussian_site_gradient(alg, alpha), converged=res.converged,
            n_inner=res.n_steps,
            extra={"jensen_bound": jensen, "grad_norm": res.grad_norm},
            warm=res.x.copy(), state={"alpha": alpha.copy(), "varsigma": res.x.copy()},
        )
