"""``ep-dense``: expectation propagation for full-GP binary classification (spec §2.2)."""

from __future__ import annotations

from typing import Any, ClassVar

from gpinfer.interfaces import Array, Likelihood
from gpinfer.options import Option, choice, flag, integer, real
from gpinfer.sites.driver import DenseBinaryMethod, DenseSolution
from gpinfer.sites.ep import EPSites
from gpinfer.sites.jensen import jensen_bound


class DenseEP(DenseBinaryMethod):
    """EP with natural-parameter sites; evidence ``log Z_EP``, gradient ``1/2(aa^T - R)``.

    Options: ``tol`` (``|Delta log Z_EP|``), ``max_sweeps``, ``damping`` (None: 1 sequential /
    0.5 parallel), ``schedule`` (``sequential`` | ``parallel``), ``jensen`` (also report
    ``J(q_EP)``), plus the driver's ``optimizer`` / ``optimizer_options``.
    """

    name: ClassVar[str] = "ep-dense"
    option_spec: ClassVar[dict[str, Option]] = {
        **DenseBinaryMethod.driver_options,
        "tol": real(1e-6, "(0, inf)", doc="|Delta log Z_EP| between sweeps"),
        "max_sweeps": integer(200, "[1, inf)"),
        "damping": real(None, "(0, 1]", none=True, doc="None: 1 sequential / 0.5 parallel"),
        "schedule": choice("sequential", ("sequential", "parallel")),
        "jensen": flag(False, doc="also report J(q_EP)"),
    }

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        o = self.options
        tau0, nu0 = warm if warm is not None else (None, None)
        sites = EPSites(K, y, likelihood, tol=o["tol"], max_sweeps=o["max_sweeps"],
                        damping=o["damping"], schedule=o["schedule"], tau0=tau0, nu0=nu0)
        sweeps = sites.run()
        extra = {"sweeps": float(sweeps), "damping": sites.damping,
                 "skipped_sites": float(sites.n_skipped), "jitter": sites.algebra.jitter}
        if o["jensen"]:
            extra["jensen_bound"] = jensen_bound(likelihood, y, sites.algebra, sites.alpha)
        alg, alpha = sites.algebra, sites.alpha
        return DenseSolution(
            log_evidence=sites.log_evidence(),
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=sites.gradient, converged=sites.converged, n_inner=sweeps, extra=extra,
            warm=(sites.tau.copy(), sites.nu.copy()),
            state={"alpha": alpha.copy(), "tau": sites.tau.copy(), "nu": sites.nu.copy()},
        )
