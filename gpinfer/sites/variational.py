"""Free-form variational ``q(u_l) = N(mu_l, L_l L_l^T)`` per latent and the uncollapsed ELBO.

Spec jj-taylor-svi §3 (Hensman et al. 2015) and ep-sep-multiclass §3.2. For ``L`` latents with
``M`` inducing points each (own kernel matrices per latent):

``ELBO = scale * sum_{i in b} E_{q(f_i)}[log p(y_i | f_i)] - sum_l KL(q(u_l) || p(u_l))``

with ``scale = N / |b|`` (unbiased for a mini-batch ``b``), ``q(f_il) = N(m_il, v_il)``,
``m_il = a_il^T mu_l``, ``v_il = K_ii - k_i^T Kuu^-1 k_i + a_il^T Sigma_l a_il`` and
``a_il = Kuu_l^-1 k_il``. Gradients: spec jj-taylor-svi §3.3 (FD-verified in the tests).
Everything is done with Cholesky factors and triangular solves; memory is
``O(L (|b| M + M^2))``, independent of ``N``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpinfer.interfaces import Array, Likelihood, MatrixGradients
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, tri_solve

#: ``(mean [B, L], var [B, L]) -> (E [B], dE/dmean [B, L], dE/dvar [B, L])``
ExpectationFn = Callable[[Array, Array], tuple[Array, Array, Array]]


def likelihood_expectation(
    likelihood: Likelihood, y: Array, rng: np.random.Generator | None = None
) -> ExpectationFn:
    """The ELBO's per-point expectation: ``likelihood.variational_expectations`` for labels
    ``y [B]`` (class indices), the rule chosen by the likelihood's ``expectation`` option.

    Multi-class likelihoods take ``mean, var [B, C]``; single-latent ones the one column of
    ``[B, 1]`` (their gradients come back as ``[B, 1]``). ``rng`` feeds Monte-Carlo rules.
    """
    y = np.asarray(y)

    def fn(mean: Array, var: Array) -> tuple[Array, Array, Array]:
        if likelihood.multiclass:
            out = likelihood.variational_expectations(y, mean, var, rng=rng)
            return out.value, out.dmean, out.dvar
        out = likelihood.variational_expectations(y, mean[:, 0], var[:, 0], rng=rng)
        return out.value, out.dmean[:, None], out.dvar[:, None]

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
    """The ELBO (spec jj-taylor-svi §3.1, jj-taylor-svi §3.3) for ``L`` latents on ``B`` points.

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
        # dL/dSigma = Pv - Kuu^-1 / 2 + Sigma^-1 / 2 (spec jj-taylor-svi §3.3)
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
