"""``tap``: ADATAP (Opper & Winther) and TAPnaive (spec §2.3, pitfalls P5 and P28).

Cavities ``s2_i = 1/(1/V_ii - w_i)``, ``mu_i = [K alpha]_i - s2_i alpha_i``; fixed point
``alpha_i = d1(y_i, mu_i, s2_i)`` and ``w_i = -d2/(1 + s2_i d2)`` (the general relation, P5).
Outer loop (``TAPSites.update``, on the engine's inner site schedule
``gpinfer.training.inner.InnerSchedule``): ``V`` by the B-trick, ``s2`` fixed; inner loop:
Newton on ``F(alpha) = d1(mu(alpha)) - alpha`` (Jacobian ``Dg(d2)(K - Dg(s2)) - I``, step
halving on ``||F||``; a vectorised replacement for the spec's Gauss-Seidel sweep, same fixed
point); then ``w``. Stops at ``max|Delta w| <= tol``. The TAP fixed point is the EP fixed
point, so the evidence is ``log Z_EP`` of the sites ``tau = w``, ``nu = alpha + w m`` and
``G = 1/2(aa^T - R)``. TAPnaive (``naive: true``) fixes ``s2_i = K_ii``; it has no evidence:
``J(q)`` is reported and there is no gradient (grid search or fixed hyper-parameters only).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, Likelihood, SiteState
from gpinfer.likelihoods.bernoulli import Bernoulli, as_bernoulli
from gpinfer.options import Option, flag, integer, real
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseBinaryMethod, DenseSolution
from gpinfer.sites.ep import ep_log_evidence
from gpinfer.sites.jensen import gaussian_site_gradient, jensen_bound
from gpinfer.training.inner import InnerSchedule


def solve_alpha(K: Array, y: Array, likelihood: Bernoulli, s2: Array, alpha: Array,
                tol: float, max_steps: int = 100) -> tuple[Array, Array, Array]:
    """``alpha`` with ``alpha = d1(K alpha - s2 alpha, s2)``; returns ``alpha, mu, d2``."""
    Kc = K - np.diag(s2)

    def residual(a: Array) -> tuple[Array, Array, Array]:
        mu = Kc @ a
        mom, d2 = likelihood.tilted_and_d2(y, mu, s2)
        return mom.dlogz_dmean - a, mu, d2

    F, mu, d2 = residual(alpha)
    for step in range(max_steps):
        fnorm = float(np.max(np.abs(F)))
        if fnorm <= tol:
            return alpha, mu, d2
        J = d2[:, None] * Kc - np.eye(len(alpha))
        d = np.linalg.solve(J, -F)
        eta = 1.0
        for _ in range(40):
            Ft, mut, d2t = residual(alpha + eta * d)
            if np.max(np.abs(Ft)) < fnorm:
                break
            eta *= 0.5
        else:
            raise NumericalError("TAP: inner Newton cannot reduce the residual",
                                 iteration=step, quantity="alpha")
        alpha, F, mu, d2 = alpha + eta * d, Ft, mut, d2t
    return alpha, mu, d2


class TAPSites(SiteState):
    """TAP's outer fixed point for prior ``K [N, N]`` and labels ``y [N]`` (0/1): the sites
    ``alpha, w [N]``; one ``update`` recomputes the cavity variances ``s2`` (TAPnaive:
    ``K_ii``), solves for ``alpha`` at them (inner Newton to ``0.1 tol``) and sets ``w``,
    returning ``max|Delta w|``. TAP takes full steps: a ``damping`` below 1 mixes the new
    ``w`` with the old (the methods use 1)."""

    def __init__(self, K: Array, y: Array, likelihood: Bernoulli, tol: float, naive: bool,
                 alpha: Array, w: Array):
        self.K, self.y, self.likelihood = K, y, likelihood
        self.tol, self.naive = float(tol), bool(naive)
        self.alpha, self.w = alpha, w

    def update(self, damping: float, iteration: int) -> float:
        K, w = self.K, self.w
        if self.naive:
            s2 = np.diag(K).copy()
        else:
            v = DiagonalSiteAlgebra.from_kernel_matrix(K, w).posterior_var_diag()
            # a cavity variance lies in (0, K_ii] (the sites w >= 0 only remove variance);
            # 1/v - w cancels when w is large, so its round-off is floored at 1/K_ii
            s2 = 1.0 / np.maximum(1.0 / v - w, 1.0 / np.diag(K))
        self.alpha, _, d2 = solve_alpha(K, self.y, self.likelihood, s2, self.alpha,
                                        0.1 * self.tol)
        w_new = np.maximum(-d2 / (1.0 + s2 * d2), 0.0)
        if damping < 1.0:
            w_new = (1.0 - damping) * w + damping * w_new
        change = float(np.max(np.abs(w_new - w)))
        self.w = w_new
        return change


class TAPMethod(DenseBinaryMethod):
    """ADATAP (evidence ``log Z_EP`` at its fixed point) or TAPnaive (``J(q)``, no gradient).

    Options: ``naive`` (False), ``tol`` (``max|Delta w|`` and the inner residual),
    ``max_outer``, plus the driver's options.
    """

    name: ClassVar[str] = "tap"
    option_spec: ClassVar[dict[str, Option]] = {
        **DenseBinaryMethod.driver_options,
        "naive": flag(False, doc="TAPnaive (no gradient) instead of ADATAP"),
        "tol": real(1e-9, "(0, inf)", doc="max|Delta w| and the inner residual"),
        "max_outer": integer(200, "[1, inf)"),
    }

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        n, tol = y.shape[0], float(self.options["tol"])
        alpha0, w0 = (np.zeros(n), np.zeros(n)) if warm is None else warm
        naive = bool(self.options["naive"])
        sites = TAPSites(K, y, as_bernoulli(likelihood, self.name), tol, naive, alpha0, w0)
        # TAPnaive's s2 = K_ii does not move: one update is its fixed point
        schedule = InnerSchedule(tol=tol, max_updates=1 if naive else int(
            self.options["max_outer"]))
        run = schedule.run(sites)
        converged, n_outer = naive or run.converged, run.updates
        alpha, w = sites.alpha, sites.w
        alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
        jensen = jensen_bound(likelihood, y, alg, alpha)
        if naive:
            value, gradient = jensen, None
        else:
            value = ep_log_evidence(likelihood, y, alg, alpha + w * (K @ alpha))
            def gradient() -> Array:
                return gaussian_site_gradient(alg, alpha)
        return DenseSolution(
            log_evidence=value,
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=gradient, converged=converged, n_inner=n_outer,
            extra={"jensen_bound": jensen}, warm=(alpha.copy(), w.copy()),
            state={"alpha": alpha.copy(), "w": w.copy()},
        )
