"""Dense expectation propagation with diagonal Gaussian sites (spec binary §2.2).

Sites ``t_i(f_i) ∝ exp(-1/2 tau_i f_i^2 + nu_i f_i)`` are stored as natural parameters
(``tau >= 0``); the posterior is ``Sigma = (K^-1 + Dg(tau))^-1``, ``mu = Sigma nu``. One
``update()`` is a sweep: ``"sequential"`` (rank-one update of ``Sigma`` after each site, the
paper's EP) or ``"parallel"`` (all sites from the same cavities, then one refactorisation). After
every sweep ``Sigma`` is recomputed from scratch through the B-trick. ``run`` sweeps on the
engine's inner site schedule (``gpinfer.training.inner.InnerSchedule``: ``|Delta log Z_EP| <=
tol`` after at least two sweeps, ``max_sweeps``, and the divergence policy ``Restart``: after
``DIVERGENCE_SWEEPS`` sweeps of growing ``max|Delta tau|`` the sites restart from zero with
damping 0.5).

Used by the ``ep-dense`` and ``tap`` plugins (evidence of a TAP fixed point), by the KL plugin
(initialisation) and by ``mcmc-ais`` (the Gaussian the annealing path starts from).
"""

from __future__ import annotations

from typing import cast

import numpy as np
from scipy.linalg.blas import dger as blas_ger

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Array, Likelihood, SiteState
from gpinfer.kernels.base import Kernel
from gpinfer.likelihoods.bernoulli import as_bernoulli
from gpinfer.posterior import DenseSitePosterior
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.jensen import gaussian_site_gradient
from gpinfer.training.inner import InnerSchedule, Restart

#: sweeps of growing ``max|Delta tau|`` after which EP restarts with damping 0.5
DIVERGENCE_SWEEPS = 5


def ep_log_evidence(likelihood: Likelihood, y: Array, algebra: DiagonalSiteAlgebra,
                    nu: Array) -> float:
    """``log Z_EP`` of sites ``(tau = algebra.w, nu [N])`` in the form finite at ``tau = 0``.

    ``sum log Zhat_i - sum log L_ii + 1/2 sum log(1 + tau/tau_c) + 1/2 nu^T mu
    + sum (tau nu_c^2 - 2 tau_c nu_c nu - tau_c nu^2) / (2 tau_c (tau_c + tau))`` with cavities
    recomputed from ``Sigma``, ``mu`` (spec §2.2, pitfall P16).
    """
    tau = algebra.w
    v = algebra.posterior_var_diag()
    mu = algebra.K @ algebra.posterior_solve(nu)
    tau_c = 1.0 / v - tau
    if np.any(tau_c <= 0):
        raise NumericalError("EP evidence: non-positive cavity precision", quantity="tau_c")
    nu_c = mu / v - nu
    log_zhat = likelihood.tilted(y, nu_c / tau_c, 1.0 / tau_c).log_z
    last = (tau * nu_c**2 - 2.0 * tau_c * nu_c * nu - tau_c * nu**2) / (2.0 * tau_c * (tau_c + tau))
    return float(np.sum(log_zhat) - 0.5 * algebra.log_det_B
                 + 0.5 * np.sum(np.log1p(tau / tau_c)) + 0.5 * nu @ mu + np.sum(last))


class EPSites(SiteState):
    """EP site parameters ``tau, nu [N]`` for prior ``K [N, N]`` and labels ``y [N]`` (0/1).

    * ``tol``: stop when ``|Delta log Z_EP| <= tol`` (after at least two sweeps);
    * ``max_sweeps``; ``damping`` in ``(0, 1]`` (1 = none; ``None``: 1 sequential, 0.5
      parallel); ``schedule``: ``"sequential"`` or ``"parallel"``;
    * ``tau0, nu0``: warm start (default zero sites, ``Sigma = K``).
    """

    def __init__(self, K: Array, y: Array, likelihood: Likelihood, *, tol: float = 1e-6,
                 max_sweeps: int = 200, damping: float | None = None,
                 schedule: str = "sequential", tau0: Array | None = None,
                 nu0: Array | None = None):
        if schedule not in ("sequential", "parallel"):
            raise InputError(f"EP schedule must be 'sequential' or 'parallel', got {schedule!r}")
        self.likelihood = as_bernoulli(likelihood, "EP (tilted_and_d2)")
        self.K = np.asarray(K, dtype=float)
        if not np.all(np.isfinite(self.K)):
            raise NumericalError("the kernel matrix K has non-finite entries", quantity="K")
        self.y = np.asarray(y)
        self.n = self.y.shape[0]
        self.tol, self.max_sweeps, self.schedule = float(tol), int(max_sweeps), schedule
        default = 1.0 if schedule == "sequential" else 0.5
        self.damping = float(default if damping is None else damping)
        if not 0.0 < self.damping <= 1.0:
            raise InputError(f"EP damping must be in (0, 1], got {damping}")
        self.tau = np.zeros(self.n) if tau0 is None else np.array(tau0, dtype=float)
        self.nu = np.zeros(self.n) if nu0 is None else np.array(nu0, dtype=float)
        self.n_sweeps = 0
        self.n_skipped = 0
        self.restarted = False
        self.log_z = -np.inf
        self.last_change = np.inf
        self._converged = False
        self._dtau = np.inf  # max|Delta tau| of the last sweep (the divergence measure)
        self._refresh()

    # -- state -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        self.algebra = DiagonalSiteAlgebra.from_kernel_matrix(self.K, self.tau,
                                                              iteration=self.n_sweeps)
        self.alpha = self.algebra.posterior_solve(self.nu)
        self.mu = self.K @ self.alpha

    @property
    def converged(self) -> bool:
        return self._converged

    def snapshot(self) -> tuple[Array, Array]:
        return self.tau.copy(), self.nu.copy()

    def restore(self, snapshot: object) -> None:
        tau, nu = cast(tuple[Array, Array], snapshot)
        self.tau, self.nu = tau.copy(), nu.copy()
        self._refresh()

    def move(self) -> float:
        """``max|Delta tau|`` of the last sweep."""
        return float(self._dtau)

    def restart(self) -> None:
        """Zero sites (``Sigma = K``)."""
        self.tau[:] = 0.0
        self.nu[:] = 0.0
        self._refresh()

    def _site_update(self, y: Array, tau: Array, nu: Array, var: Array, mean: Array,
                     d: float) -> tuple[Array, Array, Array]:
        """New ``(tau, nu)`` for sites with posterior marginals ``(mean, var)``, damped by
        ``d``; skip mask."""
        tau_c = 1.0 / var - tau
        ok = tau_c > 0
        tau_c = np.where(ok, tau_c, 1.0)
        nu_c = mean / var - nu
        m_c, s2_c = nu_c / tau_c, 1.0 / tau_c
        mom, d2 = self.likelihood.tilted_and_d2(y, m_c, s2_c)
        denom = 1.0 + d2 * s2_c
        tau_new = np.maximum(0.0, -d2 / denom)
        nu_new = (mom.dlogz_dmean - m_c * d2) / denom
        tau_new = np.where(ok, (1 - d) * tau + d * tau_new, tau)
        nu_new = np.where(ok, (1 - d) * nu + d * nu_new, nu)
        return tau_new, nu_new, ~ok

    def update(self, damping: float | None = None, iteration: int = 0) -> float:
        """One EP sweep damped by ``damping`` (None: the sites' ``damping``); returns
        ``|Delta log Z_EP|``."""
        d = self.damping if damping is None else float(damping)
        tau_old = self.tau.copy()
        if self.schedule == "parallel":
            v = self.algebra.posterior_var_diag()
            self.tau, self.nu, skip = self._site_update(self.y, self.tau, self.nu, v, self.mu, d)
            self.n_skipped += int(np.sum(skip))
        else:
            Sigma = self.algebra.posterior_cov()
            mu = self.mu.copy()
            for i in range(self.n):
                sl = slice(i, i + 1)
                t_new, n_new, skip = self._site_update(
                    self.y[sl], self.tau[sl], self.nu[sl], Sigma[i, i:i + 1], mu[sl], d)
                if skip[0]:
                    self.n_skipped += 1
                    continue
                dt, dnu = t_new[0] - self.tau[i], n_new[0] - self.nu[i]
                self.tau[i], self.nu[i] = t_new[0], n_new[0]
                si = Sigma[:, i].copy()
                c = dt / (1.0 + dt * si[i])
                # Sigma' = Sigma - c si si^T (in place) and mu' = Sigma' nu' in O(N), using
                # si^T nu = mu_i; both are recomputed from scratch after the sweep
                Sigma = blas_ger(-c, si, si, a=Sigma.T, overwrite_a=True).T
                mu += si * (dnu - c * (mu[i] + si[i] * dnu))
        self.n_sweeps += 1
        self._refresh()
        new = ep_log_evidence(self.likelihood, self.y, self.algebra, self.nu)
        if not np.isfinite(new):
            raise NumericalError(f"EP evidence is {new}", iteration=self.n_sweeps,
                                 quantity="log Z_EP")
        self.last_change = abs(new - self.log_z)
        self.log_z = new
        self._dtau = float(np.max(np.abs(self.tau - tau_old), initial=0.0))
        return self.last_change

    def schedule_for(self, max_sweeps: int) -> InnerSchedule:
        """The inner site schedule of these sites (see the module doc)."""
        return InnerSchedule(tol=self.tol, max_updates=max_sweeps, damping=self.damping,
                             min_updates=2, policy=Restart(DIVERGENCE_SWEEPS, 0.5))

    def run(self, max_sweeps: int | None = None) -> int:
        """Sweeps until converged or ``max_sweeps`` (default ``self.max_sweeps``) on the inner
        site schedule; returns the sweeps done."""
        if self._converged:
            return 0
        limit = self.max_sweeps if max_sweeps is None else int(max_sweeps)
        done = self.schedule_for(limit).run(self, done=self.n_sweeps, owner="EP")
        self._converged = done.converged
        self.damping = done.damping
        self.restarted = self.restarted or done.restarted
        return done.updates

    def log_evidence(self) -> float:
        return self.log_z if self.n_sweeps else ep_log_evidence(self.likelihood, self.y,
                                                                 self.algebra, self.nu)

    def gradient(self) -> Array:
        """``d log Z_EP / dK = 1/2 (alpha alpha^T - R)`` (valid at a fixed point)."""
        return gaussian_site_gradient(self.algebra, self.alpha)

    def posterior(self, kernel: Kernel | None = None, X: Array | None = None
                  ) -> DenseSitePosterior:
        if kernel is None or X is None:
            raise ValueError("EPSites.posterior needs the kernel and the training inputs X")
        return self.algebra.posterior(self.likelihood, kernel, X, self.alpha.copy())
