"""``kl``: the best Gaussian in ``KL(q || p(f|y))`` by Newton steps on ``(alpha, lambda)`` (§2.4).

``J(alpha, lambda) = sum a_i(m_i, V_ii) - 1/2 alpha^T K alpha - sum log L_ii - 1/2||L^-1||_F^2
+ n/2`` with ``m = K alpha``, ``V = (K^-1 - 2 Dg(lambda))^-1``, ``w = -2 lambda >= 0``, and
``a = E_0``. With ``P = V o V``: ``grad_alpha = K(a_m - alpha)``,
``grad_lambda = 2P(a_v - lambda)``,
``H_aa = K D_mm K - K`` (pitfall P6), ``H_al = 2 K D_mv P``,
``H_ll = 4 P D_vv P - 2P + 8 V o (V Dg(a_v - lambda) V)``. Initialised from (loosely converged)
EP or the previous solution, whichever is better (``KLMethod``), safeguarded by
``gpinfer_binary.newton``; ``lambda <= 0`` by projection (P14).

The step preferred to ``-H^-1 g`` is Newton's method on the stationarity equations in fixed-point
form, ``F = [a_m - alpha, a_v - lambda] = 0`` (``g = [K F_alpha, 2 P F_lambda]``), with Jacobian
``[[D_mm K - I, D_mv 2P], [D_vm K, D_vv 2P - I]]`` (``D_mv = E_3/2``, ``D_vv = E_4/4``): the large
left factors ``K`` and ``P`` (``sigma_f^2`` and ``sigma_f^4``) are gone, so it converges
quadratically where ``H`` is indefinite at round-off level (long length-scales and large
``sigma_f``, where the Hessian step crawls). It agrees with the Newton step at the optimum, but
far from it it is no ascent method (it can drive many ``lambda`` to the bound and stall there), so
it replaces the Hessian step only where ``-H`` is not numerically positive definite and
``max|F| <= FIXED_POINT_SWITCH``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpinfer.interfaces import Array, Likelihood
from gpinfer.likelihoods.bernoulli import Bernoulli, as_bernoulli
from gpinfer.options import Option, real
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseSolution
from gpinfer.sites.ep import EPSites
from gpinfer.sites.jensen import gaussian_site_gradient
from gpinfer_binary.bound_method import NewtonBoundMethod
from gpinfer_binary.newton import newton_maximize

#: ``max|F|`` below which the fixed-point Newton step may replace a shifted Hessian step
FIXED_POINT_SWITCH = 0.1


class KLObjective:
    """``J(xi)`` with ``xi = [alpha, lambda]`` ``[2N]``, its gradient and Hessian."""

    def __init__(self, K: Array, y: Array, likelihood: Bernoulli):
        self.K, self.y, self.lik = K, y, likelihood
        self.n = y.shape[0]
        self._last: tuple[Array, tuple[Array, ...], Array, Array] | None = None

    def split(self, xi: Array) -> tuple[Array, Array]:
        return xi[: self.n], xi[self.n:]

    def algebra(self, xi: Array) -> DiagonalSiteAlgebra:
        return DiagonalSiteAlgebra.from_kernel_matrix(self.K, -2.0 * self.split(xi)[1])

    def __call__(self, xi: Array, derivatives: bool) -> tuple[float, Array | None, Array | None]:
        """``J``; with ``derivatives`` also the gradient ``[2N]`` and the Hessian ``[2N, 2N]``."""
        alpha, lam = self.split(xi)
        alg = self.algebra(xi)
        K = self.K
        m = K @ alpha
        if not derivatives:  # the value needs diag(V) only
            return self._value(alg, alpha, m, np.maximum(alg.posterior_var_diag(), 0.0))[0], \
                None, None
        V = alg.posterior_cov()
        J, E = self._value(alg, alpha, m, np.maximum(np.diag(V), 0.0), order=4)
        a_m, a_v = E[1], 0.5 * E[2]
        P = V * V
        residual = np.concatenate([a_m - alpha, a_v - lam])
        g = np.concatenate([K @ residual[: self.n], 2.0 * P @ residual[self.n:]])
        self._last = (xi.copy(), E, P, residual)
        H_aa = (K * E[2][None, :]) @ K - K
        H_al = (K * E[3][None, :]) @ P  # 2 K Dg(E3/2) P
        H_ll = (P * E[4][None, :]) @ P - 2.0 * P + 8.0 * V * ((V * (a_v - lam)[None, :]) @ V)
        return J, g, np.block([[H_aa, H_al], [H_al.T, H_ll]])

    def _value(self, alg: DiagonalSiteAlgebra, alpha: Array, m: Array, v: Array,
               order: int = 0) -> tuple[float, tuple[Array, ...]]:
        """``J`` and ``E_0..E_order [N]`` at ``m = K alpha``, ``v = diag V`` (``[N]`` each)."""
        E = self.lik.expected_log_prob_derivatives(self.y, m, v, order=order)
        J = float(np.sum(E[0]) - 0.5 * alpha @ m - 0.5 * alg.log_det_B
                  - 0.5 * alg.trace_B_inv + 0.5 * self.n)
        return J, E

    def warm_start(self, sites: tuple[Array, Array]) -> Array:
        """``xi [2N]`` of the Gaussian sites ``(nu~, lambda)`` (``[N]`` each) under this ``K``.

        The sites ``exp(lambda f^2 + nu~ f)`` of a solution for another ``K`` (``nu~ = alpha +
        w m``, ``w = -2 lambda``) change little with the hyper-parameters, unlike ``alpha``:
        keeping them gives ``alpha = K^-1 (K^-1 + W)^-1 nu~``, the posterior of those sites
        under the new prior.
        """
        nu, lam = sites
        return np.concatenate([self.algebra(np.concatenate([nu, lam])).posterior_solve(nu), lam])

    def sites(self, xi: Array) -> tuple[Array, Array]:
        """The Gaussian sites ``(nu~, lambda)`` of ``xi`` (``warm_start``'s inverse)."""
        alpha, lam = self.split(xi)
        return alpha - 2.0 * lam * (self.K @ alpha), lam.copy()

    def residual_norm(self, xi: Array) -> float:
        """``max|F(xi)|`` (``fixed_point_residual``) from ``E_1, E_2`` at ``diag V``: the cost of
        a value, no Hessian."""
        alpha, lam = self.split(xi)
        v = np.maximum(self.algebra(xi).posterior_var_diag(), 0.0)
        E = self.lik.expected_log_prob_derivatives(self.y, self.K @ alpha, v, order=2)
        return float(max(np.max(np.abs(E[1] - alpha)), np.max(np.abs(0.5 * E[2] - lam))))

    def fixed_point_residual(self, xi: Array) -> Array:
        """``F(xi) = [a_m - alpha, a_v - lambda]`` ``[2N]``, zero at the optimum."""
        self(xi, True)
        last = self._evaluated_at(xi)
        assert last is not None
        return last[3].copy()

    def _evaluated_at(self, xi: Array) -> tuple[Array, tuple[Array, ...], Array, Array] | None:
        """``(xi, E, P, F)`` of the last derivative evaluation if it was at ``xi``, else None."""
        if self._last is None or not np.array_equal(self._last[0], xi):
            return None
        return self._last

    def fixed_point_step(self, xi: Array) -> Array | None:
        """``-J_F^-1 F`` ``[2N]`` at ``xi`` (module docstring); None unless ``xi`` is the point of
        the last derivative evaluation (or ``J_F`` is singular)."""
        last = self._evaluated_at(xi)
        if last is None:
            return None
        _, E, P, residual = last
        n, K = self.n, self.K
        eye = np.eye(n)
        jac = np.block([[E[2][:, None] * K - eye, E[3][:, None] * P],
                        [0.5 * E[3][:, None] * K, 0.5 * E[4][:, None] * P - eye]])
        try:
            return -np.linalg.solve(jac, residual)
        except np.linalg.LinAlgError:
            return None

    def preferred_step(self, xi: Array, g: Array) -> Array | None:
        """``fixed_point_step`` where ``max|F| <= FIXED_POINT_SWITCH`` (module docstring)."""
        last = self._evaluated_at(xi)
        if last is None or np.max(np.abs(last[3])) > FIXED_POINT_SWITCH:
            return None
        return self.fixed_point_step(xi)

    def at_bound(self, xi: Array, g: Array) -> Array:
        """Mask ``[2N]`` of the ``lambda_i = 0`` (the bound ``w_i >= 0``, P14) that the gradient
        pushes outwards: held by the projected Newton step."""
        lam = self.split(xi)[1]
        return np.concatenate([np.zeros(self.n, dtype=bool), (lam >= 0.0) & (g[self.n:] > 0.0)])

    def residual_below(self, tol: float) -> Callable[[Array], bool]:
        """Stopping test ``max|F(xi)| <= tol`` at the point of the last derivative evaluation."""

        def test(xi: Array) -> bool:
            last = self._evaluated_at(xi)
            return last is not None and bool(np.max(np.abs(last[3])) <= tol)

        return test


class KLMethod(NewtonBoundMethod):
    """Gaussian KL minimisation; evidence ``J(q_KL) <= log Z``, gradient ``1/2(aa^T - R)``.

    Options: ``tol`` (max-norm of the gradient), ``decrement_tol`` and ``decrement_rtol`` (Newton
    decrement, i.e. twice the predicted remaining ascent of ``J``, at most
    ``max(decrement_tol, decrement_rtol |J|)`` nats; it also stops at a round-off stall, which
    ``tol`` alone misses when ``K alpha`` is large), ``fixed_point_tol`` (max-norm of
    ``F = [a_m - alpha, a_v - lambda]``, free of the scale of ``K``), ``max_newton``, plus the
    driver's options. Any of the three tests stops the iteration.

    The default ``decrement_rtol = 1e-9``: the Newton step whose decrement passes is still taken
    (``newton_maximize``), and in Newton's quadratic phase it leaves about the square of that,
    far below the ``2.2e-9 |J|`` that the outer L-BFGS-B resolves (its ``ftol``); asking for
    ``1e-16`` nats (the old default, kept by the paper-grid protocol) costs one or two more
    ``O(N^3)`` Hessian factorisations of size ``2N`` per solve and changes ``J`` below its
    round-off.
    Start of each solve (``_start``): the previous solution's Gaussian sites
    (``KLObjective.warm_start``) where their fixed-point residual ``max|F|`` is at most
    ``FIXED_POINT_SWITCH`` (after a short hyper-parameter step: 1-3 Newton steps, no EP run);
    else loosely converged EP (``tol = 1e-3``, warm-started from the last EP sites
    ``(tau, nu)``) or the previous sites, whichever has the larger ``J`` under the new ``K``.
    The previous sites alone are a bad start after a long step: on moons-1000 at the first
    L-BFGS-B trial they put ``J`` 6.5 nats below the EP start, the projected Newton step drove
    hundreds of ``lambda`` onto the bound, and 100 steps (79 s of CPU) ended unconverged where
    the EP start converges in 2. KL's optimum is unique, so the start changes the cost, not the
    answer.
    """

    name: ClassVar[str] = "kl"
    option_spec: ClassVar[dict[str, Option]] = {
        **NewtonBoundMethod.newton_options("gradient"),
        "decrement_tol": real(1e-16, "(0, inf)", doc="Newton decrement (nats)"),
        "decrement_rtol": real(1e-9, "[0, inf)", doc="Newton decrement relative to |J|"),
        "fixed_point_tol": real(1e-9, "(0, inf)", doc="max-norm of the fixed-point residual"),
    }

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        n = y.shape[0]
        objective = KLObjective(K, y, as_bernoulli(likelihood, self.name))
        ep_sites, kl_sites = (None, None) if warm is None else warm
        start, ep_sites = self._start(objective, K, y, likelihood, ep_sites, kl_sites)
        res = newton_maximize(objective, start, tol=self.options["tol"],
                              max_steps=self.options["max_newton"],
                              project=lambda xi: np.concatenate([xi[:n], np.minimum(xi[n:], 0)]),
                              name=f"{self.name} Newton",
                              decrement_tol=self.options["decrement_tol"],
                              decrement_rtol=self.options["decrement_rtol"],
                              direction=objective.preferred_step,
                              converged=objective.residual_below(self.options["fixed_point_tol"]),
                              fixed=objective.at_bound)
        alg = objective.algebra(res.x)
        alpha = res.x[:n].copy()
        return DenseSolution(
            log_evidence=res.value,
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=lambda: gaussian_site_gradient(alg, alpha), converged=res.converged,
            n_inner=res.n_steps, extra={"grad_norm": res.grad_norm,
                                        "lm_shifts": float(res.n_shifted)},
            warm=(ep_sites, objective.sites(res.x)),
            state={"alpha": alpha, "w": alg.w.copy(), "xi": res.x.copy()},
        )

    @staticmethod
    def _start(objective: KLObjective, K: Array, y: Array, likelihood: Likelihood,
               ep_sites: tuple[Array, Array] | None, kl_sites: tuple[Array, Array] | None,
               ) -> tuple[Array, tuple[Array, Array] | None]:
        """The Newton start ``xi [2N]`` and the EP sites to warm-start the next EP with
        (class docstring).

        The previous solution's ``kl_sites = (nu~, lambda)`` (``[N]`` each) alone where their
        ``max|F| <= FIXED_POINT_SWITCH`` (Newton's quadratic region: ``ep_sites`` passed on);
        else EP (``tol = 1e-3``) warm-started from ``ep_sites = (tau, nu)`` (None: zero sites),
        and the previous sites compete with it: the start with the larger ``J`` under this ``K``
        is taken (EP on a tie).
        """
        previous = None if kl_sites is None else objective.warm_start(kl_sites)
        if previous is not None and objective.residual_norm(previous) <= FIXED_POINT_SWITCH:
            return previous, ep_sites
        tau0, nu0 = (None, None) if ep_sites is None else ep_sites
        ep = EPSites(K, y, likelihood, tol=1e-3, max_sweeps=20, tau0=tau0, nu0=nu0)
        ep.run()
        start = np.concatenate([ep.alpha, -0.5 * ep.tau])
        if previous is not None and objective(previous, False)[0] > objective(start, False)[0]:
            start = previous
        return start, (ep.tau.copy(), ep.nu.copy())
