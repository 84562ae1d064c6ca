"""Annealed importance sampling with HMC transitions, vectorised over ``R`` runs (spec §3.2-3.5).

Path ``pi_t(f) ∝ p(y|f)^tau_t q~(f)^(1 - tau_t) N(f | 0, K)`` from a Gaussian
``q = N(m0, V) ∝ q~ N(0, K)`` with ``q~(f) = exp(-1/2 f^T W f + nu^T f)`` (the prior start is
``W = 0, nu = 0``). In whitened coordinates ``f = m0 + L_q u`` (``V = L_q L_q^T``) the log target
is ``tau h(f) - 1/2 ||u||^2`` with ``h(f) = log p(y|f) + 1/2 f^T W f - nu^T f``, and
``log Z_r = log Z_0 + sum_t (tau_t - tau_{t-1}) h(f_t)`` (Neal's order: weight with the sample
of ``pi_{t-1}``, then move under ``pi_t``). Step sizes per temperature block come from a
discarded pilot run (Robbins-Monro towards acceptance 0.75) and are frozen in production.
``split_rhat`` and ``effective_sample_size`` are the posterior-sampling diagnostics of §3.5;
``gold_checks`` evaluates the §3.6 acceptance criteria that one run can check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from gpinfer.interfaces import Array
from gpinfer.numerics.cholesky import tri_solve

#: ``loglik(F [N, R]) -> (log p(y|F) [R], d/dF [N, R])``
LogLik = Callable[[Array], tuple[Array, Array]]
TARGET_ACCEPTANCE = 0.75


@dataclass
class GaussianStart:
    """``q = N(m0, L L^T)`` with effective likelihood ``(W, nu)``; ``log_z0 = log ∫ q~ N(0,K)``;
    ``V``: ``L L^T`` if already known (else formed by ``covariance``)."""

    m0: Array
    L: Array
    W: Array
    nu: Array
    log_z0: float
    V: Array | None = field(default=None, repr=False)

    def covariance(self) -> Array:
        """``V = L L^T [N, N]``, formed once and kept (symmetric to round-off)."""
        if self.V is None:
            self.V = self.L @ self.L.T
        return self.V


@dataclass
class AISResult:
    """``log_z`` (log-mean-exp over runs), its delta-method standard error ``se``, per-run
    ``log_z_runs [R]``, acceptance per block ``[B]``, final states ``F [N, R]``, step sizes."""

    log_z: float
    se: float
    log_z_runs: Array
    acceptance: Array
    F: Array
    step_sizes: Array
    weight_ess: float = field(default=np.nan)


@dataclass
class ChainState:
    """HMC states of ``R`` runs: whitened ``U [N, R]``, latents ``F = m0 + L U [N, R]``, ``h [R]``,
    its f-gradient ``G = dh/df [N, R]`` and ``VG = V G [N, R]`` (``V = L L^T``) at ``F``."""

    U: Array
    F: Array
    h: Array
    G: Array
    VG: Array

    def select(self, keep: Array, other: ChainState) -> ChainState:
        """Columns of ``other`` where ``keep [R]`` is true, else of ``self``."""
        k = keep[None, :]
        return ChainState(np.where(k, other.U, self.U), np.where(k, other.F, self.F),
                          np.where(keep, other.h, self.h), np.where(k, other.G, self.G),
                          np.where(k, other.VG, self.VG))


class HMC:
    """Leapfrog HMC in whitened coordinates ``u`` (``f = m0 + L u``) for the tempered target.

    The leapfrog of ``u`` and ``p`` is carried in latent space: with ``Q = L P``,
    ``F <- F + eps Q`` and ``Q <- Q + s (tau V g - (F - m0))`` (``g = dh/df``), so that a
    gradient costs one product with ``V = L L^T [N, N]`` instead of two with ``L`` (``L U`` and
    ``L^T g``). The whitened ``U`` and ``P`` that the Hamiltonian needs are kept as
    ``explicit + L^T (accumulated f-space terms)`` and formed once per trajectory, by one product
    of ``L^T`` with ``[N, 2R]``; with ``L P`` for the initial momentum, a trajectory of ``n``
    leapfrog steps costs ``n + 3`` products of ``[N, N]`` with ``[N, R]`` instead of ``2n``.
    The dynamics, the random draws and the acceptance rule are those of whitened leapfrog
    HMC; ``step`` returns the state it ends in with ``h`` and its gradients there, so that a
    chain never evaluates the same state twice.
    """

    def __init__(self, loglik: LogLik, start: GaussianStart, n_leapfrog: int,
                 rng: np.random.Generator):
        self.loglik, self.s, self.n_leapfrog, self.rng = loglik, start, n_leapfrog, rng
        self.V = start.covariance()

    def apply_L(self, A: Array, trans: bool = False) -> Array:
        """``L A`` (``L^T A`` with ``trans``) for ``A [N, R]``."""
        return (self.s.L.T if trans else self.s.L) @ A

    def gradient(self, F: Array) -> tuple[Array, Array]:
        """``log p(y|F) [R]`` and ``dh/df [N, R]`` at latents ``F [N, R]``."""
        lp, g = self.loglik(F)
        return lp, g + self.s.W[:, None] * F - self.s.nu[:, None]

    def value(self, F: Array, lp: Array) -> Array:
        """``h(f) [R]`` at ``F [N, R]`` from ``lp = log p(y|F) [R]``."""
        return lp + 0.5 * np.sum(self.s.W[:, None] * F * F, axis=0) - self.s.nu @ F

    def h_f(self, F: Array) -> tuple[Array, Array]:
        """``h(f) [R]`` and ``dh/df [N, R]`` at latents ``F [N, R]``."""
        lp, G = self.gradient(F)
        return self.value(F, lp), G

    def state(self, U: Array, F: Array | None = None) -> ChainState:
        """The chain state at whitened ``U [N, R]`` (``F = m0 + L U`` if not given)."""
        if F is None:
            F = self.s.m0[:, None] + self.apply_L(U)
        h, G = self.h_f(F)
        return ChainState(U, F, h, G, self.V @ G)

    def step(self, x: ChainState, tau: float, eps: float) -> tuple[ChainState, Array]:
        """One trajectory per run from ``x``; returns the new state and acceptance ``[R]``.

        Positions ``Z = [Ux; A; F - m0]`` and momenta ``M = [Px; B; Q]`` are stacked ``[3N, R]``
        (``U = Ux + L^T A``, ``P = Px + L^T B``, ``F - m0 = L U``, ``Q = L P``), so that a leapfrog
        step is ``Z += eps M``, ``M += s (tau [0; G; V G] - Z)``; ``h`` itself is evaluated
        only where the trajectory ends.
        """
        n, R = x.U.shape
        eps_r = eps * self.rng.uniform(0.9, 1.1, size=R)
        P = self.rng.standard_normal(x.U.shape)
        H0 = -(tau * x.h - 0.5 * np.sum(x.U * x.U, axis=0)) + 0.5 * np.sum(P * P, axis=0)
        m0 = self.s.m0[:, None]
        zeros = np.zeros_like(P)
        Z = np.concatenate([x.U, zeros, x.F - m0])
        force = np.concatenate([zeros, x.G, x.VG])  # [0; G; V G]
        M = np.concatenate([P, zeros, self.apply_L(P)])
        half = 0.5 * eps_r
        M += half * (tau * force - Z)
        with np.errstate(over="ignore", invalid="ignore"):
            for k in range(self.n_leapfrog):
                Z += eps_r * M
                F = m0 + Z[2 * n:]
                lp, G1 = self.gradient(F)
                force[n:2 * n] = G1
                np.matmul(self.V, G1, out=force[2 * n:])
                M += (eps_r if k < self.n_leapfrog - 1 else half) * (tau * force - Z)
            h1 = self.value(F, lp)
            LtAB = self.apply_L(np.concatenate([Z[n:2 * n], M[n:2 * n]], axis=1), trans=True)
            Un, Pn = Z[:n] + LtAB[:, :R], M[:n] + LtAB[:, R:]
            H1 = -(tau * h1 - 0.5 * np.sum(Un * Un, axis=0)) + 0.5 * np.sum(Pn * Pn, axis=0)
            log_acc = np.where(np.isfinite(H1), H0 - H1, -np.inf)
        accept = np.log(self.rng.uniform(size=R)) < np.minimum(log_acc, 0.0)
        return x.select(accept, ChainState(Un, F, h1, G1, force[2 * n:].copy())), accept


def schedule(T: int, power: float = 4.0) -> Array:
    """``tau_t = (t/T)^power``, ``t = 0..T`` (``[T + 1]``)."""
    return (np.arange(T + 1) / T) ** power


def run_ais(loglik: LogLik, start: GaussianStart, T: int, R: int, rng: np.random.Generator,
            *, n_leapfrog: int = 20, n_blocks: int = 40, step_sizes: Array | None = None,
            adapt: bool = False, progress: Callable[[int, float], None] | None = None
            ) -> AISResult:
    """One AIS pass of ``T`` temperatures for ``R`` independent runs.

    With ``adapt`` the per-block step sizes move by Robbins-Monro (pilot use only).
    ``step_sizes`` of another length than the number of blocks (a pilot with ``T < n_blocks``)
    are mapped onto the blocks by relative position in ``t / T``.
    ``progress(block, partial_log_z)`` is called once per temperature block.
    """
    n = start.m0.shape[0]
    n_blocks = max(1, min(n_blocks, T))
    if step_sizes is None:
        eps = np.full(n_blocks, 0.3)
    else:  # blocks cover equal fractions of t/T: map a pilot's blocks by relative position
        given = np.asarray(step_sizes, dtype=float).reshape(-1)
        eps = given[(np.arange(n_blocks) * given.size) // n_blocks].copy()
    taus = schedule(T)
    block_of = np.minimum((np.arange(1, T + 1) * n_blocks) // (T + 1), n_blocks - 1)
    acc_sum, acc_n = np.zeros(n_blocks), np.zeros(n_blocks)
    hmc = HMC(loglik, start, n_leapfrog, rng)
    x = hmc.state(rng.standard_normal((n, R)))
    lw = np.full(R, start.log_z0)
    for t in range(1, T + 1):
        b = block_of[t - 1]
        lw += (taus[t] - taus[t - 1]) * x.h
        x, accept = hmc.step(x, taus[t], eps[b])
        rate = float(np.mean(accept))
        acc_sum[b] += rate
        acc_n[b] += 1
        if adapt:
            eps[b] *= np.exp(0.5 * (rate - TARGET_ACCEPTANCE) / np.sqrt(acc_n[b]))
        if progress is not None and (t == T or block_of[t] != b):
            progress(int(b) + 1, float(logsumexp(lw) - np.log(R)))
    log_z = float(logsumexp(lw) - np.log(R))
    wts = np.exp(lw - lw.max())
    se = float(np.std(wts, ddof=1) / np.sqrt(R) / np.mean(wts)) if R > 1 else np.inf
    return AISResult(log_z, se, lw.copy(), acc_sum / np.maximum(acc_n, 1), x.F, eps,
                     float(wts.sum() ** 2 / np.sum(wts**2)))


def sample_posterior(loglik: LogLik, start: GaussianStart, F0: Array, n_samples: int,
                     eps: float, rng: np.random.Generator, *, n_leapfrog: int = 20,
                     thin: int = 1) -> tuple[Array, float]:
    """HMC at ``tau = 1`` from states ``F0 [N, R]``; ``n_samples`` per chain ``[N, R*S]``."""
    hmc = HMC(loglik, start, n_leapfrog, rng)
    x = hmc.state(tri_solve(start.L, F0 - start.m0[:, None]), F0)
    kept, acc = [], []
    for i in range(n_samples * thin):
        x, a = hmc.step(x, 1.0, eps)
        acc.append(np.mean(a))
        if (i + 1) % thin == 0:
            kept.append(x.F)
    return np.concatenate(kept, axis=1), float(np.mean(acc))


def split_rhat(chains: Array) -> Array:
    """Split-``R-hat`` per coordinate for ``chains [N, C, S]`` (``C >= 1`` chains, ``S >= 4``).

    Each chain is cut into halves (``2C`` chains of ``h = S // 2``); with ``W`` the mean
    within-chain variance and ``B/h`` the variance of the chain means,
    ``R-hat = sqrt(((h - 1)/h W + B/h) / W)``. Near 1 for mixed chains; ``[N]``.
    """
    chains = np.asarray(chains, dtype=float)
    h = chains.shape[2] // 2
    if h < 2:
        raise ValueError(f"split R-hat needs at least 4 draws per chain, got {chains.shape[2]}")
    x = np.concatenate([chains[:, :, :h], chains[:, :, h:2 * h]], axis=1)
    W = x.var(axis=2, ddof=1).mean(axis=1)
    b_over_h = x.mean(axis=2).var(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(((h - 1) / h * W + b_over_h) / W)


def effective_sample_size(chains: Array) -> Array:
    """Effective sample size per coordinate for ``chains [N, C, S]``, ``[N]``.

    Multi-chain autocorrelation ``rho_k = 1 - (W - mean_c acov_c(k)) / var+`` (FFT
    autocovariances; ``var+ = (S-1)/S W + var(chain means)``), summed with Geyer's initial
    positive and monotone sequence: ``ESS = C S / (-1 + 2 sum_k P_k)``,
    ``P_k = rho_2k + rho_2k+1`` up to the first non-positive ``P_k``.
    """
    chains = np.asarray(chains, dtype=float)
    N, C, S = chains.shape
    x = chains - chains.mean(axis=2, keepdims=True)
    nfft = 1 << int(np.ceil(np.log2(2 * S)))
    f = np.fft.rfft(x, n=nfft, axis=2)
    acov = np.fft.irfft(f * np.conj(f), n=nfft, axis=2)[:, :, :S] / S  # [N, C, S]
    W = acov[:, :, 0].mean(axis=1) * S / (S - 1)
    between = chains.mean(axis=2).var(axis=1, ddof=1) if C > 1 else np.zeros(N)
    var_plus = (S - 1) / S * W + between
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (W[:, None] - acov.mean(axis=1)) / var_plus[:, None]  # [N, S]
    K = S // 2
    P = rho[:, 0:2 * K:2] + rho[:, 1:2 * K:2]  # [N, K]
    keep = np.cumprod(P > 0, axis=1).astype(bool)
    P = np.minimum.accumulate(np.where(keep, P, np.inf), axis=1)
    tau = -1.0 + 2.0 * np.sum(np.where(keep, P, 0.0), axis=1)
    tau = np.maximum(tau, 1.0 / np.log10(max(C * S, 10)))  # Stan's cap: ESS <= CS log10(CS)
    return C * S / tau


#: §3.5-3.6 limits for a trustworthy gold standard
GOLD_LIMITS: dict[str, float] = {"sd_log_z_runs": 0.2, "rhat": 1.01, "ess": 400.0}
#: the acceptance rate per block of a trustworthy run (§3.6 criterion 4)
GOLD_ACCEPTANCE: tuple[float, float] = (0.5, 0.95)


def gold_checks(log_z_runs: Array, weight_ess: float, acceptance: Array, rhat: float,
                ess: float) -> dict[str, bool]:
    """The single-run §3.6 criteria (1: run spread and weight ESS, 4: acceptance per block in
    ``[0.5, 0.95]``) and the §3.5 sampling requirements (``R-hat < 1.01``, ``ESS >= 400``)."""
    lo, hi = GOLD_ACCEPTANCE
    R = len(log_z_runs)
    return {
        "sd_log_z_runs": bool(R > 1 and np.std(log_z_runs, ddof=1) <= GOLD_LIMITS["sd_log_z_runs"]),
        "weight_ess": bool(weight_ess >= R / 2),
        "acceptance": bool(np.all((acceptance >= lo) & (acceptance <= hi))),
        "rhat": bool(rhat < GOLD_LIMITS["rhat"]),
        "ess": bool(ess >= GOLD_LIMITS["ess"]),
    }
