"""Test oracle: the per-class EP matrix gradients (spec ep-sep §2.7.1-2.7.3), one class at a
time with dense per-class products. The library runs the class-batched form
(``gpinfer.sites.stacked.stacked_matrix_gradients``, ``shared_matrix_gradients``); this is the
spec's algebra written out once per class, which ``tests/sites/test_stacked.py`` checks the
stacked form against (issue 23 item 2: per-class algebra that no longer runs is a test oracle).
"""

from __future__ import annotations

import numpy as np

from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.numerics.cholesky import tri_solve
from gpinfer.sites.inducing import WhitenedGaussian
from gpinfer.sites.stacked import StackedTerms


def inducing_matrix_gradients(
    terms: StackedTerms,
    q: WhitenedGaussian,
    lik: WhitenedGaussian,
    R: Array,
    a_sum: Array,
    b_sum: Array,
    e_sum: Array | None = None,
) -> MatrixGradients:
    """``dlogZ_q / d(Kuu, Kuf, diag Kff)`` of one class (``terms``: one
    latent, ``L [M, M]``, ``A [M, n]``)
    from aggregated likelihood terms.

    ``q``: the posterior (prior term, §2.7.1); ``lik``: the Gaussian whose mean and covariance
    are held fixed in the likelihood term (EP: ``q``; SEP: the shared cavity) and
    ``R = lik.project(terms.A).R`` (``L_B^-1 A``, reused); ``a_sum``,
    ``b_sum``, ``e_sum`` ``[n]``: per-point sums ``A_i``, ``B_i`` and ``E_i`` (EP §2.7.2;
    SEP uses ``E = 2 B``, which ``e_sum=None`` stands for), already multiplied by any
    mini-batch scale. In whitened form ``G_uf = L^-T X`` with
    ``X = w_g A_sum^T + B_g^-1 A diag(E) - 2 A diag(B)`` and
    ``G_K = L^-T [-(I - B^-1 - w w^T)/2 - sym(A X^T) - A diag(B) A^T] L^-1``, where
    ``A X^T = (A A_sum) w_g^T + S_E B_g^-1 - 2 S_B`` with ``S_B = A diag(B) A^T`` and
    ``S_E = A diag(E) A^T`` (so only symmetric ``O(M^2 n)`` products are formed).
    """
    L, A = terms.L, terms.A
    M = L.shape[0]
    e_vec = 2.0 * b_sum if e_sum is None else e_sum
    BgA_E = tri_solve(lik.LB, R * e_vec, transpose=True)  # B_g^-1 A diag(E), [M, n]
    X = np.outer(lik.w, a_sum) + BgA_E - 2.0 * A * b_sum
    S_B = (A * b_sum) @ A.T  # A diag(B) A^T, the plain product
    S_E = 2.0 * S_B if e_sum is None else (A * e_sum) @ A.T
    AX = np.outer(A @ a_sum, lik.w) + lik.B_inv(S_E).T - 2.0 * S_B  # A X^T, [M, M]
    prior = -0.5 * (np.eye(M) - q.B_inv(np.eye(M)) - np.outer(q.w, q.w))
    inner = prior - 0.5 * (AX + AX.T) - S_B
    G_K = tri_solve(L, tri_solve(L, inner, transpose=True).T, transpose=True)
    G_uf = tri_solve(L, X, transpose=True)
    return MatrixGradients(Kuu=0.5 * (G_K + G_K.T), Kuf=G_uf, Kff_diag=np.array(b_sum, float))
