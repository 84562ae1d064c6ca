"""Rank-one Power-EP sites in inducing space (spec power-ep §2.2-2.11).

Site ``n`` is ``t_n(u) ∝ exp(nu_n s_n - tau_n s_n^2 / 2)`` with ``s_n = w_n^T u``,
``w_n = Kuu^-1 k_n``; the state is two scalars per point. With ``L = chol(Kuu)``,
``A = L^-1 Kuf [M, N]`` and ``B = I + A diag(tau) A^T = L_B L_B^T``:
``q(u) = N(m, V)``, ``V = L B^-1 L^T``, ``gamma = Kuu^-1 m = L^-T B^-1 A nu``,
``beta = L^-T (I - B^-1) L^-1``; the predictive is ``mu* = k*u gamma``,
``var* = k** - ||L^-1 k_u*||^2 + ||L_B^-1 L^-1 k_u*||^2``. Nothing is inverted explicitly.

``RankOnePEPSites`` runs deletion / projection / update with power ``alpha`` (scalar or per
point, ``0`` meaning the VFE limit), in parallel (damped) or sequential order, and evaluates the
energy (§2.8) and its fixed-point gradients (§2.9) on the full data or a mini-batch (§2.10).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import (
    Array,
    Likelihood,
    MatrixGradients,
    ObjectiveValue,
    SiteState,
)
from gpinfer.kernels.base import Kernel
from gpinfer.moved import renamed
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer.posterior import Posterior
from gpinfer.sites.stacked import StackedTerms
from gpinfer.training.inner import InnerRun, InnerSchedule, SweepPolicy, Watcher
from gpinfer_pep.power_tilted import check_alpha, scaled_tilted

SCHEDULES = ("parallel", "sequential")
SITE_STEPS = ("power", "full")
#: ``OscillationCut`` (``RankOnePEPSites.run``): a sweep oscillates when its step ratio is below
#: this, and the damping is cut after ``OSCILLATION_PATIENCE`` oscillating sweeps in a row, to
#: no less than ``MIN_DAMPING_FRACTION`` of the option's
OSCILLATION_RATIO = -0.5
OSCILLATION_PATIENCE = 3
MIN_DAMPING_FRACTION = 1.0 / 64.0


def step_ratio(previous: Array, step: Array) -> float:
    """``step``'s component along ``previous`` over ``previous``'s length (two successive
    site steps ``[2N]``): the damped sweep's dominant Jacobian eigenvalue once one mode leads
    (0 for a zero ``previous``)."""
    n0 = float(previous @ previous)
    return float(previous @ step) / n0 if n0 > 0.0 else 0.0


# --------------------------------------------------------------------------------------------
# Inducing geometry and the predictive posterior
# --------------------------------------------------------------------------------------------


def matrix_geometry(Kuu: Array, Kuf: Array, kdiag: Array, jitter: float) -> StackedTerms:
    """The inducing geometry of one latent from its kernel matrices ``Kuu [M, M]``,
    ``Kuf [M, N]``, ``kdiag [N]`` (kept on it: the sequential schedule reads ``Kuf``):
    ``L = chol(Kuu + jitter I)`` (``jitter`` absolute, a constant for the gradients),
    ``A = L^-1 Kuf``, ``s = max(kdiag - colsum(A^2), 0)`` (the conditional variances
    ``Var[f_n | u]``, written ``h`` in the spec) and ``W = Kuu^-1 Kuf = L^-T A`` on first use."""
    M = Kuu.shape[0]
    L = jittered_cholesky(Kuu + jitter * np.eye(M), name="Kuu", max_jitter=0.0).L
    A = tri_solve(L, Kuf)
    h = np.maximum(kdiag - np.einsum("ij,ij->j", A, A), 0.0)
    return StackedTerms(L=L, A=A, s=h, Kuu=Kuu, Kuf=Kuf, Kff_diag=kdiag)


def kernel_geometry(kernel: Kernel, Z: Array, X: Array, rel_jitter: float) -> StackedTerms:
    """``matrix_geometry`` of the kernel matrices at ``Z [M, D]``, ``X [N, D]``; jitter
    ``rel_jitter * mean diag Kuu``."""
    Kuu = kernel.K(Z)
    jitter = rel_jitter * float(np.mean(np.diag(Kuu)))
    return matrix_geometry(Kuu, kernel.K(Z, X), kernel.K_diag(X), jitter)


#: ``InducingGeometry`` for one more release: its ``build`` and ``from_kernel``
#: (the geometry is ``gpinfer.sites.stacked.StackedTerms``)
_OLD_GEOMETRY = SimpleNamespace(build=matrix_geometry, from_kernel=kernel_geometry)


if not TYPE_CHECKING:  # at run time only: mypy keeps checking the imports from here
    __getattr__ = renamed(__name__, {"InducingGeometry": f"{__name__}:_OLD_GEOMETRY"},
                          hint=" (InducingGeometry.build is matrix_geometry, .from_kernel is "
                               "kernel_geometry, returning gpinfer.sites.stacked.StackedTerms: "
                               "h is s, kdiag is Kff_diag; the jitter is not kept)")


class WhitenedInducingPosterior(Posterior):
    """Predictive of a Gaussian ``q(u)`` stored as ``(L, L_B, gamma)`` (spec §2.11, §3.4).

    ``mu* = k*u gamma``, ``var* = k** - ||a*||^2 + ||L_B^-1 a*||^2`` with ``a* = L^-1 k_u*``.
    One latent: ``predict_f`` returns ``[N*, 1]`` arrays.
    """

    def __init__(self, likelihood: Likelihood, kernel: Kernel, Z: Array, L: Array, L_B: Array,
                 gamma: Array):
        super().__init__(likelihood)
        self.kernel, self.Z, self.L, self.L_B, self.gamma = kernel, Z, L, L_B, gamma

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        Kus = self.kernel.K(self.Z, X)
        a = tri_solve(self.L, Kus)
        c = tri_solve(self.L_B, a)
        var = self.kernel.K_diag(X) - np.sum(a * a, axis=0) + np.sum(c * c, axis=0)
        return (Kus.T @ self.gamma)[:, None], np.maximum(var, 1e-300)[:, None]

    def q_u(self) -> tuple[Array, Array]:
        """``m [M]`` and ``V [M, M]`` of ``q(u)``."""
        LLB = self.L @ tri_solve(self.L_B, np.eye(self.L.shape[0]), transpose=True)
        return self.L @ (self.L.T @ self.gamma), LLB @ LLB.T

    def state(self) -> dict[str, Array]:
        m, V = self.q_u()
        return {"Z": self.Z, "m": m, "V": V, "gamma": self.gamma}


# --------------------------------------------------------------------------------------------
# The sites
# --------------------------------------------------------------------------------------------


@dataclass
class Cavity:
    """Per-site posterior and cavity marginals for the points ``idx [B]``.

    ``sq, mq``: ``sigma^2_q, mu_q`` of ``s_n``; ``den = 1 - alpha tau sigma^2_q``; ``sbar, mbar``:
    cavity variance and mean of ``s_n``; ``vbar = sbar + h``; ``P [M, B]`` columns
    ``p_n = Kuu^-1 V w_n`` (only when asked for: the gradients need it, the updates do not).
    """

    idx: Array
    sq: Array
    mq: Array
    den: Array
    sbar: Array
    mbar: Array
    vbar: Array
    P: Array | None = None


class OscillationCut(SweepPolicy):
    """The power-EP sites' divergence policy on the inner schedule (``RankOnePEPSites.run``):
    after ``OSCILLATION_PATIENCE`` sweeps in a row whose relative site step reverses the one
    before (``step_ratio`` below ``OSCILLATION_RATIO``), the damping becomes ``rho / (1 - r)``,
    not below ``MIN_DAMPING_FRACTION`` of the run's first; ``damping_cuts`` counts the cuts."""

    def watcher(self, state: SiteState, damping: float, owner: str) -> Watcher:
        sites = cast("RankOnePEPSites", state)
        floor = damping * MIN_DAMPING_FRACTION
        before = np.concatenate([sites.tau, sites.nu])
        previous: Array | None = None
        reversals = 0

        def watch(run: InnerRun) -> None:
            nonlocal before, previous, reversals
            after = np.concatenate([sites.tau, sites.nu])
            step = (after - before) / (np.abs(after) + 1e-8)
            ratio = 0.0 if previous is None else step_ratio(previous, step)
            reversals = reversals + 1 if ratio < OSCILLATION_RATIO else 0
            if reversals >= OSCILLATION_PATIENCE and run.damping > floor:
                run.damping = max(run.damping / (1.0 - ratio), floor)
                sites.damping_cuts += 1
                reversals = 0
            before, previous = after, step

        return watch


class RankOnePEPSites(SiteState):
    """Power-EP with rank-one sites ``(tau [N], nu [N])`` over ``u`` (spec §2).

    * ``likelihood``, ``y [N]`` (targets in the likelihood's convention: class indices 0/1 or
      real values), ``alpha``: scalar or ``[N]`` in ``[0, 1]`` (0: the VFE limit).
    * ``schedule``: ``"parallel"`` (all cavities from one posterior, damped by ``damping``) or
      ``"sequential"`` (rank-one ``O(M^2)`` posterior updates, posterior rebuilt each sweep).
    * ``site_step``: ``"power"`` (the paper's ``t <- t^(1-alpha) q/q_cav``, step ``rho alpha``)
      or ``"full"`` (step ``rho``). Points with ``alpha = 0`` always take the full step.
    * ``tol``: relative site-change tolerance for ``converged``.

    Call ``set_geometry`` whenever the kernel or ``Z`` change; the sites keep ``(tau, nu)``.
    """

    def __init__(
        self,
        likelihood: Likelihood,
        y: Array,
        alpha: float | Array = 1.0,
        *,
        schedule: str = "parallel",
        damping: float = 0.5,
        site_step: str = "power",
        quadrature: str = "trapezoid",
        gh_degree: int = 20,
        tol: float = 1e-6,
        rng: np.random.Generator | None = None,
    ):
        if schedule not in SCHEDULES:
            raise InputError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
        if site_step not in SITE_STEPS:
            raise InputError(f"site_step must be one of {SITE_STEPS}; got {site_step!r}")
        if not 0.0 < float(damping) <= 1.0:
            raise InputError(f"damping must lie in (0, 1]; got {damping!r}")
        self.likelihood = likelihood
        self.y = np.asarray(y)
        n = self.y.shape[0]
        self.alpha = check_alpha(alpha, n)
        self.schedule, self.damping, self.site_step = schedule, float(damping), site_step
        self.quadrature, self.gh_degree, self.tol = quadrature, int(gh_degree), float(tol)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.tau = np.zeros(n)
        self.nu = np.zeros(n)
        self.geo: StackedTerms | None = None
        self.kernel: Kernel | None = None
        self.Z: Array | None = None
        self.last_change = np.inf
        self.skipped = 0
        self.damping_cuts = 0

    # -- geometry and posterior --------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.tau.size

    @property
    def geometry(self) -> StackedTerms:
        """The inducing geometry installed by ``set_geometry`` (one latent: ``L [M, M]``,
        ``A [M, N]``, ``s [N]``)."""
        if self.geo is None:
            raise RuntimeError("set_geometry before using the sites")
        return self.geo

    def set_geometry(self, geo: StackedTerms, kernel: Kernel | None = None,
                     Z: Array | None = None) -> None:
        """Install new kernel matrices (and, for prediction, the kernel and ``Z``)."""
        if geo.A.shape[1] != self.n:
            raise InputError(f"geometry has {geo.A.shape[1]} points, sites have {self.n}")
        self.geo = geo
        if kernel is not None:
            self.kernel, self.Z = kernel, Z
        self._rebuild()

    def _rebuild(self) -> None:
        """``B``, ``L_B``, ``A nu`` and ``c = L_B^-1 A nu`` from all sites (``O(N M^2)``)."""
        A = self.geometry.A
        self._B = np.eye(A.shape[0]) + (A * self.tau) @ A.T
        self._Anu = A @ self.nu
        self._factor()

    def _factor(self) -> None:
        self.L_B = jittered_cholesky(self._B, name="B = I + A diag(tau) A^T", max_jitter=0.0).L
        self.c = tri_solve(self.L_B, self._Anu)
        self.gamma = tri_solve(self.geometry.L, tri_solve(self.L_B, self.c, transpose=True),
                               transpose=True)

    def beta(self) -> Array:
        """``beta = Kuu^-1 - Kuu^-1 V Kuu^-1 = L^-T (I - B^-1) L^-1``, ``[M, M]``."""
        Li = tri_solve(self.geometry.L, np.eye(self.geometry.L.shape[0]))
        C = tri_solve(self.L_B, Li)
        return Li.T @ Li - C.T @ C

    def posterior(self) -> WhitenedInducingPosterior:
        if self.kernel is None or self.Z is None:
            raise RuntimeError("set_geometry(geo, kernel, Z) before asking for the posterior")
        return WhitenedInducingPosterior(self.likelihood, self.kernel, self.Z, self.geometry.L,
                                         self.L_B, self.gamma)

    def marginals(self, idx: Array | None = None) -> tuple[Array, Array]:
        """Posterior mean and variance of ``f_n`` at training points ``idx`` (``[B]`` each)."""
        cav = self.cavity(np.arange(self.n) if idx is None else np.asarray(idx))
        return cav.mq, cav.sq + self.geometry.s[cav.idx]

    # -- deletion ----------------------------------------------------------------------------
    def cavity(self, idx: Array, with_P: bool = False) -> Cavity:
        """Cavity marginals of the points ``idx`` from the current posterior (spec §2.3)."""
        geo = self.geometry
        C = tri_solve(self.L_B, geo.A[:, idx])  # L_B^-1 a_n
        sq = np.sum(C * C, axis=0)
        mq = C.T @ self.c
        a, tau, nu = self.alpha[idx], self.tau[idx], self.nu[idx]
        den = 1.0 - a * tau * sq
        with np.errstate(divide="ignore", invalid="ignore"):
            sbar = sq / den
            mbar = (mq - a * nu * sq) / den
        vbar = sbar + geo.s[idx]
        P = None
        if with_P:
            P = tri_solve(geo.L, tri_solve(self.L_B, C, transpose=True), transpose=True)
        return Cavity(idx, sq, mq, den, sbar, mbar, vbar, P)

    # -- projection and update ---------------------------------------------------------------
    def _targets(self, cav: Cavity) -> tuple[Array, Array, Array]:
        """New full sites ``lambda_frac / alpha`` (spec §2.4, no division by ``d2``) and the
        mask of proper cavities."""
        ok = (cav.den > 0) & (cav.vbar > 0) & np.isfinite(cav.mbar)
        tau_new = self.tau[cav.idx].copy()
        nu_new = self.nu[cav.idx].copy()
        if np.any(ok):
            i = cav.idx[ok]
            a = self.alpha[i]
            t = scaled_tilted(self.likelihood, self.y[i], cav.mbar[ok], cav.vbar[ok], a,
                              quadrature=self.quadrature, gh_degree=self.gh_degree)
            d2s = 2.0 * t.dv - a * t.d1**2  # d2 / alpha
            denom = 1.0 + a * d2s * cav.sbar[ok]
            tau_new[ok] = -d2s / denom
            nu_new[ok] = tau_new[ok] * cav.mbar[ok] + t.d1 / denom
        n_bad = int(np.sum(~ok))
        if n_bad:
            self.skipped += n_bad
            warnings.warn(f"power EP: skipped {n_bad} site update(s) with an improper cavity",
                          RuntimeWarning, stacklevel=3)
        return tau_new, nu_new, ok

    def _step(self, idx: Array, rho: float) -> Array:
        """Step size ``epsilon [B]`` of the site update at damping ``rho`` (spec §2.6)."""
        a = self.alpha[idx]
        if self.site_step == "full":
            return np.full(a.shape, rho)
        return np.where(a > 0, rho * a, rho)

    def update(self, damping: float | None = None, iteration: int = 0) -> float:
        """One sweep over all sites at ``damping`` (None: the sites' ``damping``); returns the
        max relative change (the ``SiteState`` update of the inner schedule)."""
        return self.sweep(None, damping)

    def sweep(self, batch: Array | None = None, damping: float | None = None) -> float:
        """One sweep over ``batch`` (all points if ``None``) at ``damping`` (None: the sites'
        ``damping``); returns the max relative change."""
        if self.geo is None:
            raise RuntimeError("set_geometry before updating the sites")
        rho = self.damping if damping is None else float(damping)
        idx = np.arange(self.n) if batch is None else np.asarray(batch, dtype=int)
        old_tau, old_nu = self.tau[idx].copy(), self.nu[idx].copy()
        if self.schedule == "parallel":
            self._parallel(idx, rho)
        else:
            self._sequential(idx, rho)
        dt = np.abs(self.tau[idx] - old_tau) / (np.abs(self.tau[idx]) + 1e-8)
        dn = np.abs(self.nu[idx] - old_nu) / (np.abs(self.nu[idx]) + 1e-8)
        self.last_change = float(max(dt.max(initial=0.0), dn.max(initial=0.0)))
        return self.last_change

    def _parallel(self, idx: Array, rho: float) -> None:
        cav = self.cavity(idx)
        tau_new, nu_new, _ = self._targets(cav)
        eps = self._step(idx, rho)
        d_tau = eps * (tau_new - self.tau[idx])
        d_nu = eps * (nu_new - self.nu[idx])
        self.tau[idx] += d_tau
        self.nu[idx] += d_nu
        A_b = self.geometry.A[:, idx]
        if idx.size == self.n:
            self._rebuild()
        else:  # incremental within a fixed geometry: O(B M^2 + M^3)
            self._B += (A_b * d_tau) @ A_b.T
            self._Anu += A_b @ d_nu
            self._factor()

    def _sequential(self, idx: Array, rho: float) -> None:
        geo = self.geometry
        Kuf = geo.Kuf
        assert Kuf is not None  # kept by ``matrix_geometry``
        beta = self.beta()
        gamma = self.gamma.copy()
        for n in self.rng.permutation(idx):
            k, w = Kuf[:, n], geo.W[:, n]
            p = w - beta @ k
            sq, mq = float(k @ p), float(k @ gamma)
            a, tau, nu = self.alpha[n], self.tau[n], self.nu[n]
            den = 1.0 - a * tau * sq
            sbar = sq / den if den > 0 else -1.0
            cav = Cavity(np.array([n]), np.array([sq]), np.array([mq]), np.array([den]),
                         np.array([sbar]), np.array([(mq - a * nu * sq) / den]),
                         np.array([sbar + geo.s[n]]), p[:, None])
            tau_new, nu_new, ok = self._targets(cav)
            if not ok[0]:
                continue
            eps = self._step(np.array([n]), rho)[0]
            d_tau, d_nu = eps * (tau_new[0] - tau), eps * (nu_new[0] - nu)
            self.tau[n] += d_tau
            self.nu[n] += d_nu
            dd = 1.0 + d_tau * sq
            gamma += (d_nu - d_tau * mq) / dd * p
            beta += (d_tau / dd) * np.outer(p, p)
        self._rebuild()  # drift-free posterior from the sites

    @property
    def converged(self) -> bool:
        return self.last_change < self.tol

    def run(self, max_sweeps: int = 1000, tol: float | None = None) -> int:
        """Sweep over all sites until the relative change is below ``tol``; returns sweeps.

        Parallel sweeps are a damped fixed-point iteration ``x <- (1 - rho) x + rho F(x)``;
        it converges only while every eigenvalue ``mu`` of ``F``'s Jacobian exceeds
        ``1 - 2 / rho`` (-3 at the default 0.5). Confident points under a large prior
        variance push ``mu`` towards that limit at ``alpha = 0`` (VFE), and ``c`` identical
        rows multiply their joint response by ``c`` (each copy reacts to the same marginal),
        so the sweep can oscillate for thousands of sweeps. When ``OSCILLATION_PATIENCE``
        successive steps each reverse the one before (``step_ratio`` ``r`` below
        ``OSCILLATION_RATIO``), the damping becomes ``rho / (1 - r)``, which puts that mode's
        eigenvalue at 0, for the rest of this run (``damping_cuts`` counts the cuts). A run
        without such a run of reversals keeps its damping and its path. The sweeps run on the
        engine's inner site schedule (``gpinfer.training.inner.InnerSchedule``: the strict test
        ``change < tol``, the cap) with that cut as its divergence policy (``OscillationCut``).
        """
        schedule = InnerSchedule(tol=self.tol if tol is None else tol, max_updates=max_sweeps,
                                 damping=self.damping, strict=True, policy=OscillationCut())
        return schedule.run(self, owner="power EP").updates

    # -- energy and gradients ----------------------------------------------------------------
    def energy(self, batch: Array | None = None, with_gradients: bool = True) -> ObjectiveValue:
        """Power-EP energy (spec §2.8) and its fixed-point gradients (§2.9).

        With ``batch`` the per-site terms (and their gradients) are scaled by ``N / B``; the
        global ``G(q) - G(p)`` term is not (§2.10). ``gradients.Kuf`` and ``Kff_diag`` then
        cover the batch's columns only (``[M, B]``, ``[B]``).
        """
        idx = np.arange(self.n) if batch is None else np.asarray(batch, dtype=int)
        scale = self.n / idx.size
        cav = self.cavity(idx, with_P=with_gradients)
        if np.any(cav.den <= 0) or np.any(cav.vbar <= 0):
            raise NumericalError("an improper cavity (den <= 0 or var <= 0) in the energy",
                                 quantity="cavity")
        a, tau, nu = self.alpha[idx], self.tau[idx], self.nu[idx]
        t = scaled_tilted(self.likelihood, self.y[idx], cav.mbar, cav.vbar, a,
                          quadrature=self.quadrature, gh_degree=self.gh_degree,
                          with_lik_grad=with_gradients)
        x = -a * tau * cav.sq
        with np.errstate(divide="ignore", invalid="ignore"):
            logdet_term = np.where(a > 0, -np.log1p(x) / (2.0 * np.where(a > 0, a, 1.0)),
                                   0.5 * tau * cav.sq)
        kappa = (t.log_z + logdet_term
                 + (tau * cav.mq**2 - 2.0 * nu * cav.mq + a * nu**2 * cav.sq) / (2.0 * cav.den))
        value = -np.sum(np.log(np.diag(self.L_B))) + 0.5 * self.c @ self.c + scale * kappa.sum()
        if not np.isfinite(value):
            raise NumericalError(f"power-EP energy is {value}", quantity="energy")
        if not with_gradients:
            return ObjectiveValue(float(value))
        W = self.geometry.W[:, idx]
        c1 = a * (tau * cav.mq - nu) / cav.den
        Xi = self.gamma[:, None] + cav.P * c1
        Zeta = cav.P / cav.den
        d1, dv = scale * t.d1, scale * t.dv
        G = -(Xi * d1) @ W.T + (W * dv) @ W.T - 2.0 * (Zeta * dv) @ W.T
        dKuu = 0.5 * (np.outer(self.gamma, self.gamma) - self.beta()) + 0.5 * (G + G.T)
        dKuf = Xi * d1 + 2.0 * (Zeta - W) * dv
        dlik = None if t.dlik is None else scale * t.dlik.sum(axis=0)
        grads = MatrixGradients(Kff_diag=dv, Kuu=dKuu, Kuf=dKuf, likelihood=dlik)
        return ObjectiveValue(float(value), grads)
