"""Free-form variational ``q(u_l) = N(mu_l, L_l L_l^T)`` per latent and the uncollapsed ELBO.

Spec jj-taylor-svi §3 (Hensman et al. 2015) and ep-sep-multiclass §3.2. For ``L`` latents with
``M`` inducing points each (own kernel matrices per latent):

``ELBO = scale * sum_{i in b} E_{q(f_i)}[log p(y_i | f_i)] - sum_l KL(q(u_l) || p(u_l))``

with ``scale = N / |b|`` (unbiased for a mini-batch ``b``), ``q(f_il) = N(m_il, v_il)``,
``m_il = a_il^T mu_l``, ``v_il = K_ii - k_i^T Kuu^-1 k_i + a_il^T Sigma_l a_il`` and
``a_il = Kuu_l^-1 k_il``. Gradients follow §3.3 (FD-verified in the tests). Everything is done with
Cholesky factors and triangular solves; memory is ``O(L (|b| M + M^2))``, independent of ``N``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, log_expit, log_ndtr

from gpinfer.interfaces import Array, Likelihood, MatrixGradients
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, tri_solve
from gpinfer.numerics.quadrature import gauss_hermite

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)

#: ``(mean [B, L], var [B, L]) -> (E [B], dE/dmean [B, L], dE/dvar [B, L])``
ExpectationFn = Callable[[Array, Array], tuple[Array, Array, Array]]

#: default number of Gauss-Hermite nodes for binary expected log-likelihoods (spec §3.2)
SVI_GAUSS_HERMITE_POINTS = 100


def binary_expectation(link, s: Array, n_nodes: int = SVI_GAUSS_HERMITE_POINTS) -> ExpectationFn:
    """Gauss-Hermite ``E[log sig(s f)]`` for a Bernoulli link and signs ``s [B]`` (spec §3.2).

    ``dE/dmean = E[l']``, ``dE/dvar = E[l'']/2`` with the same nodes (Bonnet/Price), so the
    derivatives are exact for the discretised value.
    """
    x, w = gauss_hermite(int(n_nodes))
    s = np.asarray(s, dtype=float)

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        f = mean[:, 0:1] + np.sqrt(var[:, 0:1]) * x  # [B, K]
        psi, d1, d2 = link.derivatives(s[:, None] * f, 2)
        E = psi @ w
        return E, (s * (d1 @ w))[:, None], (0.5 * (d2 @ w))[:, None]

    return fn


def logistic_expectation(s: Array, n_nodes: int = SVI_GAUSS_HERMITE_POINTS) -> ExpectationFn:
    """``binary_expectation`` for the logistic link with two transcendentals per node.

    ``l = log sig(t)``, ``l' = sig(-t)``, ``l'' = -sig(t) sig(-t)`` at ``t = s f`` from one
    ``expit`` and one ``log_expit``; same nodes and values as ``binary_expectation``.
    """
    x, w = gauss_hermite(int(n_nodes))
    s = np.asarray(s, dtype=float)

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        t = s[:, None] * mean[:, 0:1] + (s[:, None] * np.sqrt(var[:, 0:1])) * x  # [B, K]
        q = expit(-t)
        E = log_expit(t) @ w
        d1 = q @ w
        q *= 1.0 - q  # sig(-t) sig(t)
        return E, (s * d1)[:, None], (-0.5 * (q @ w))[:, None]

    return fn


#: Gauss-Hermite nodes of the fast robust-max expectation (``robustmax_expectation``)
ROBUSTMAX_GAUSS_HERMITE_POINTS = 20


def robustmax_expectation(epsilon: float, y: Array,
                          n_nodes: int = ROBUSTMAX_GAUSS_HERMITE_POINTS) -> ExpectationFn:
    """``E[log p(y | f)]`` of ``RobustMax(epsilon)`` by ``n_nodes``-point Gauss-Hermite in ``f_y``.

    ``E = b + (a - b) P`` with ``a = log(1 - eps + eps/C)``, ``b = log(eps/C)`` (as
    ``RobustMax``) and ``P = E_t[prod_{c != y} Phi(z_c)]``, ``z_c = (m_y + s_y t - m_c) / s_c``.
    Derivatives of the same discretised ``P`` (exact for it): with ``r = phi/Phi (z)``,
    ``dP/dm_c = -E[prod r_c] / s_c``, ``dP/dv_c = -E[prod r_c z_c] / (2 s_c^2)``,
    ``dP/dm_y = E[prod sum_c r_c / s_c]``, ``dP/dv_y = E[prod t sum_c r_c / s_c] / (2 s_y)``.
    A fast alternative to the likelihood's adaptive rule for stochastic gradients.
    """
    x, w = gauss_hermite(int(n_nodes))
    y = np.asarray(y, dtype=np.int64)

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        B, C = mean.shape
        a = np.log(1.0 - epsilon + epsilon / C)
        b = np.log(epsilon / C)
        rows = np.arange(B)
        sd = np.sqrt(var)
        m_y, sd_y = mean[rows, y], sd[rows, y]
        fy = m_y[:, None] + sd_y[:, None] * x  # [B, K]
        z = (fy[:, :, None] - mean[:, None, :]) / sd[:, None, :]  # [B, K, C]
        z[rows, :, y] = 40.0  # own class: Phi = 1 and r = 0 to double precision
        log_Phi = log_ndtr(z)
        wprod = np.exp(log_Phi.sum(axis=2)) * w  # [B, K]
        r = np.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_Phi)  # phi/Phi, 0 at z = inf
        r /= sd[:, None, :]
        P = wprod.sum(axis=1)
        dmean = -np.einsum("bk,bkc->bc", wprod, r)
        dvar = -np.einsum("bk,bkc->bc", wprod, r * z) / (2.0 * sd)
        sum_r = r.sum(axis=2)  # [B, K]
        dmean[rows, y] = np.einsum("bk,bk->b", wprod, sum_r)
        dvar[rows, y] = np.einsum("bk,bk->b", wprod * x, sum_r) / (2.0 * sd_y)
        return b + (a - b) * P, (a - b) * dmean, (a - b) * dvar

    return fn


def softmax_expectation(y: Array, n_samples: int, rng: np.random.Generator) -> ExpectationFn:
    """Unbiased Monte-Carlo ``E[log softmax_y(f)]`` with ``n_samples`` reparameterised draws.

    ``f = m + sqrt(v) eps``: ``dE/dm = E[d l/df]``, ``dE/dv = E[(d l/df) eps] / (2 sqrt(v))``
    with ``d l/df = onehot(y) - softmax(f)``; fresh draws at every call (a stochastic but
    unbiased estimate of the value and of both gradients, for svi). ``[B]``, ``[B, C]``, ``[B, C]``.
    """
    y = np.asarray(y, dtype=np.int64)

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        B, C = mean.shape
        rows = np.arange(B)
        sd = np.sqrt(var)
        eps = rng.standard_normal((B, int(n_samples), C))
        F = mean[:, None, :] + sd[:, None, :] * eps
        top = F.max(axis=2, keepdims=True)
        e = np.exp(F - top)
        total = e.sum(axis=2, keepdims=True)
        ll = F[rows, :, y] - (top + np.log(total))[:, :, 0]  # [B, S]
        g = -(e / total)
        g[rows, :, y] += 1.0
        return ll.mean(axis=1), g.mean(axis=1), (g * eps).mean(axis=1) / (2.0 * sd)

    return fn


def likelihood_expectation(likelihood: Likelihood, y: Array) -> ExpectationFn:
    """``likelihood.expected_log_prob`` for class indices ``y [B]`` (multi-class likelihoods)."""

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        out = likelihood.expected_log_prob(y, mean, var)
        return out.value, out.dmean, out.dvar

    return fn


@dataclass
class ELBOEstimate:
    """Value and gradients of the (mini-batch) ELBO.

    ``dmu [L, M]``, ``dLq [L, M, M]`` (lower triangular), ``matrix [L]`` one ``MatrixGradients``
    per latent (``Kuu``, ``Kuf`` for the batch columns, ``Kff_diag`` for the batch),
    ``expected`` the per-point expectations ``[B]`` (unscaled), ``kl`` the total KL,
    ``dSigma [L, M, M]`` (symmetric) the gradient wrt ``Sigma_l = Lq_l Lq_l^T`` (for natural
    gradients).
    """

    value: float
    dmu: Array
    dLq: Array
    matrix: list[MatrixGradients]
    expected: Array
    kl: float
    dSigma: Array | None = None


def _kl_terms(L_K: Array, mu: Array, Lq: Array) -> tuple[float, Array, Array]:
    """KL of one latent, ``alpha = Kuu^-1 mu [M]`` and ``Kuu^-1 Lq [M, M]``."""
    M = mu.shape[0]
    P = tri_solve(L_K, Lq)
    alpha = chol_solve(L_K, mu)
    logdet = 2.0 * np.sum(np.log(np.diag(L_K))) - 2.0 * np.sum(np.log(np.abs(np.diag(Lq))))
    kl = 0.5 * (np.sum(P * P) + mu @ alpha - M + logdet)
    return float(kl), alpha, tri_solve(L_K, P, transpose=True)


def uncollapsed_elbo(
    Kuu: Sequence[Array],
    Kub: Sequence[Array],
    Kdiag: Array,
    mu: Array,
    Lq: Array,
    expectation: ExpectationFn,
    scale: float = 1.0,
) -> ELBOEstimate:
    """The ELBO (spec §3.1, §3.3) for ``L`` latents on a batch of ``B`` points.

    ``Kuu``: ``L`` matrices ``[M, M]``; ``Kub``: ``L`` matrices ``[M, B]`` (batch columns);
    ``Kdiag [L, B]``; ``mu [L, M]``; ``Lq [L, M, M]`` lower triangular; ``scale``: the weight of
    the data term (``N / B`` for an unbiased mini-batch estimate).
    """
    n_lat, M = mu.shape
    Kdiag = np.asarray(Kdiag, dtype=float).reshape(n_lat, -1)
    B = Kdiag.shape[1]
    L_K, A, means, var = [], [], np.empty((B, n_lat)), np.empty((B, n_lat))
    LtAs: list[Array] = []
    for l in range(n_lat):
        Lk = jittered_cholesky(Kuu[l], name=f"Kuu (latent {l})").L
        Rb = tri_solve(Lk, Kub[l])
        Al = tri_solve(Lk, Rb, transpose=True)  # Kuu^-1 Kub
        LtA = Lq[l].T @ Al
        LtAs.append(LtA)
        means[:, l] = Al.T @ mu[l]
        var[:, l] = Kdiag[l] - np.einsum("mb,mb->b", Rb, Rb) + np.einsum("mb,mb->b", LtA, LtA)
        L_K.append(Lk)
        A.append(Al)
    var = np.maximum(var, 1e-12)
    E, dm, dv = expectation(means, var)
    gm, gv = scale * dm, scale * dv
    value = scale * float(np.sum(E))
    dmu = np.empty_like(mu)
    dLq = np.empty_like(Lq)
    grads: list[MatrixGradients] = []
    kl_total = 0.0
    eye = np.eye(M)
    dSigma = np.empty_like(Lq)
    for l in range(n_lat):
        kl, alpha, Kinv_Lq = _kl_terms(L_K[l], mu[l], Lq[l])
        kl_total += kl
        Al, Lql = A[l], Lq[l]
        Agm = Al @ gm[:, l]
        Pv = (Al * gv[:, l]) @ Al.T
        dmu[l] = Agm - alpha
        dLq[l] = np.tril(2.0 * Pv @ Lql - Kinv_Lq)
        dLq[l][np.diag_indices(M)] += 1.0 / np.diag(Lql)
        Kinv_S = Kinv_Lq @ Lql.T  # Kuu^-1 Sigma
        Lk_inv = tri_solve(L_K[l], eye)
        Kinv = Lk_inv.T @ Lk_inv
        # Kuu^-1 Sigma Kuu^-1 Kub - Kuu^-1 Kub = Kuu^-1 Lq (Lq^T A) - A
        G_uf = Kinv_Lq @ LtAs[l]
        G_uf -= Al
        G_uf *= 2.0 * gv[:, l]
        G_uf += np.outer(alpha, gm[:, l])
        SP = Kinv_S @ Pv
        G_uu = (
            -0.5 * (np.outer(Agm, alpha) + np.outer(alpha, Agm))
            + Pv - SP - SP.T
            + 0.5 * (Kinv_Lq @ Kinv_Lq.T + np.outer(alpha, alpha) - Kinv)
        )
        grads.append(MatrixGradients(Kff_diag=gv[:, l].copy(), Kuu=0.5 * (G_uu + G_uu.T),
                                     Kuf=G_uf))
        # dL/dSigma = Pv - Kuu^-1 / 2 + Sigma^-1 / 2 (spec §3.3)
        Lq_inv = tri_solve(Lql, eye)
        dSigma[l] = Pv - 0.5 * Kinv + 0.5 * (Lq_inv.T @ Lq_inv)
    return ELBOEstimate(value - kl_total, dmu, dLq, grads, E, kl_total, dSigma)


#: halvings of a natural-gradient step whose new precision is not positive definite
NATURAL_STEP_HALVINGS = 20


def natural_gradient_step(mu: Array, Lq: Array, dmu: Array, dSigma: Array, step: float
                          ) -> tuple[Array, Array]:
    """One natural-gradient ascent step on ``q(u) = N(mu, Lq Lq^T)`` of one latent.

    ``mu [M]``, ``Lq [M, M]``, ``dmu [M]`` and ``dSigma [M, M]`` the ELBO gradients. In the
    natural parameters ``(Lambda mu, -Lambda / 2)``, ``Lambda = Sigma^-1``, the natural gradient
    is the gradient wrt the expectation parameters ``(mu, Sigma + mu mu^T)``, so
    ``Lambda' = Lambda - 2 step dSigma`` and
    ``Lambda' mu' = Lambda mu + step (dmu - 2 dSigma mu)``. With ``step = 1`` and a likelihood
    term quadratic in ``f`` (Gaussian likelihood, fixed JJ/Taylor sites) one step lands on the
    optimal ``q(u)``; for log-concave likelihoods ``Lambda'`` stays positive definite for
    ``0 < step <= 1``; otherwise (robust-max) the step is halved until ``Lambda'`` is positive
    definite (at most ``NATURAL_STEP_HALVINGS`` times, then ``q(u)`` is kept). Returns
    ``mu' [M]`` and the Cholesky factor ``Lq' [M, M]`` of ``Sigma' = Lambda'^-1``.
    """
    M = mu.shape[0]
    eye = np.eye(M)
    Lq_inv = tri_solve(Lq, eye)
    Lam = Lq_inv.T @ Lq_inv
    G = 0.5 * (dSigma + dSigma.T)
    for _ in range(NATURAL_STEP_HALVINGS + 1):
        Lam_new = Lam - 2.0 * step * G
        try:
            L_lam = np.linalg.cholesky(0.5 * (Lam_new + Lam_new.T))
            break
        except np.linalg.LinAlgError:  # not log-concave (robust-max): shorten the step
            step *= 0.5
    else:
        return mu.copy(), Lq.copy()
    theta1 = Lam @ mu + step * (dmu - 2.0 * G @ mu)
    mu_new = chol_solve(L_lam, theta1)
    # Sigma' = Lambda'^-1 = L_lam^-T L_lam^-1; its lower Cholesky factor via the flipped factor
    W = tri_solve(L_lam, eye)  # L_lam^-1, Sigma' = W^T W
    Lq_new = jittered_cholesky(W.T @ W, name="natural-gradient Sigma").L
    return mu_new, Lq_new
