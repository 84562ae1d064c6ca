"""``kl``: the best Gaussian in ``KL(q || p(f|y))`` by Newton steps on ``(alpha, lambda)`` (§2.4).

``J(alpha, lambda) = sum a_i(m_i, V_ii) - 1/2 alpha^T K alpha - sum log L_ii - 1/2||L^-1||_F^2
+ n/2`` with ``m = K alpha``, ``V = (K^-1 - 2 Dg(lambda))^-1``, ``w = -2 lambda >= 0``, and
``a = E_0``. With ``P = V o V``: ``grad_alpha = K(a_m - alpha)``,
``grad_lambda = 2P(a_v - lambda)``,
``H_aa = K D_mm K - K`` (pitfall P6), ``H_al = 2 K D_mv P``,
``H_ll = 4 P D_vv P - 2P + 8 V o (V Dg(a_v - lambda) V)``. Initialised from (loosely converged)
EP, safeguarded by ``gpinfer.sites.newton``; ``lambda <= 0`` by projection (P14).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gpinfer.interfaces import Array, Likelihood
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseBinaryMethod, DenseSolution
from gpinfer.sites.ep import EPSites
from gpinfer.sites.jensen import gaussian_site_gradient
from gpinfer.sites.newton import newton_maximize


class KLObjective:
    """``J(xi)`` with ``xi = [alpha, lambda]`` ``[2N]``, its gradient and Hessian."""

    def __init__(self, K: Array, y: Array, likelihood: Likelihood):
        self.K, self.y, self.lik = K, y, likelihood
        self.n = y.shape[0]

    def split(self, xi: Array) -> tuple[Array, Array]:
        return xi[: self.n], xi[self.n:]

    def algebra(self, xi: Array) -> DiagonalSiteAlgebra:
        return DiagonalSiteAlgebra.from_kernel_matrix(self.K, -2.0 * self.split(xi)[1])

    def __call__(self, xi: Array, derivatives: bool) -> tuple[float, Array | None, Array | None]:
        alpha, lam = self.split(xi)
        alg = self.algebra(xi)
        K = self.K
        m = K @ alpha
        V = alg.posterior_cov()
        v = np.maximum(np.diag(V), 0.0)
        E = self.lik.expected_log_prob_derivatives(self.y, m, v, order=4 if derivatives else 0)
        J = float(np.sum(E[0]) - 0.5 * alpha @ m - 0.5 * alg.log_det_B
                  - 0.5 * alg.trace_B_inv + 0.5 * self.n)
        if not derivatives:
            return J, None, None
        a_m, a_v = E[1], 0.5 * E[2]
        P = V * V
        g = np.concatenate([K @ (a_m - alpha), 2.0 * P @ (a_v - lam)])
        H_aa = (K * E[2][None, :]) @ K - K
        H_al = (K * E[3][None, :]) @ P  # 2 K Dg(E3/2) P
        H_ll = (P * E[4][None, :]) @ P - 2.0 * P + 8.0 * V * ((V * (a_v - lam)[None, :]) @ V)
        H = np.block([[H_aa, H_al], [H_al.T, H_ll]])
        return J, g, H


class KLMethod(DenseBinaryMethod):
    """Gaussian KL minimisation; evidence ``J(q_KL) <= log Z``, gradient ``1/2(aa^T - R)``.

    Options: ``tol`` (max-norm of the gradient), ``decrement_tol`` (Newton decrement, i.e. twice
    the predicted remaining ascent of ``J`` in nats; it also stops at a round-off stall, which
    ``tol`` alone misses when ``K alpha`` is large), ``max_newton``, plus the driver's options.
    """

    name: ClassVar[str] = "kl"
    default_options: ClassVar[dict[str, Any]] = {
        **DenseBinaryMethod.driver_options, "tol": 1e-8, "max_newton": 100,
        "decrement_tol": 1e-16,
    }

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        n = y.shape[0]
        objective = KLObjective(K, y, likelihood)
        if warm is None:
            ep = EPSites(K, y, likelihood, tol=1e-3, max_sweeps=20)
            ep.run()
            warm = np.concatenate([ep.alpha, -0.5 * ep.tau])
        res = newton_maximize(objective, warm, tol=self.options["tol"],
                              max_steps=self.options["max_newton"],
                              project=lambda xi: np.concatenate([xi[:n], np.minimum(xi[n:], 0)]),
                              name="KL Newton", decrement_tol=self.options["decrement_tol"])
        alg = objective.algebra(res.x)
        alpha = res.x[:n].copy()
        return DenseSolution(
            log_evidence=res.value,
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=lambda: gaussian_site_gradient(alg, alpha), converged=res.converged,
            n_inner=res.n_steps, extra={"grad_norm": res.grad_norm,
                                        "lm_shifts": float(res.n_shifted)},
            warm=res.x.copy(), state={"alpha": alpha, "w": alg.w.copy()},
        )
