"""Free-form variational ``q(u_l) = N(mu_l, L_l L_l^T)`` per latent and the uncollapsed ELBO.

Spec jj-taylor-svi §3 (Hensman et al. 2015) and ep-sep-multiclass §3.2. For ``L`` latents with
``M`` inducing points each (own kernel matrices per latent):

``ELBO = scale * sum_{i in b} E_{q(f_i)}[log p(y_i | f_i)] - sum_l KL(q(u_l) || p(u_l))``

with ``scale = N / |b|`` (unbiased for a mini-batch ``b``), ``q(f_il) = N(m_il, v_il)``,
``m_il = a_il^T mu_l``, ``v_il = K_ii - k_i^T Kuu^-1 k_i + a_il^T Sigma_l a_il`` and
``a_il = Kuu_l^-1 k_il``. Gradients: spec jj-taylor-svi §3.3 (FD-verified in the tests).
Everything is done with Cholesky factors and triangular solves; memory is
``O(L (|b| M + M^2))``, independent of ``N``. Written once against the array API
(``gpinfer.backend``): numpy (the default) or torch tensors on a CPU or GPU. The latents are
batched: every operation runs once on the stacks ``[L, M, M]`` / ``[L, M, B]`` of all latents on
a device, on cache-sized blocks of latents on numpy (its BLAS calls go matrix by matrix anyway,
and multi-MiB temporaries would page-fault at every step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from gpinfer.backend import ops
from gpinfer.interfaces import Likelihood, MatrixGradients, Scalar
from gpinfer.kernels.stacked import StackedMatrixGradients
from gpinfer.numerics import settings
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.numerics.quadrature import chunk_slices
from gpinfer.sites.stacked import symmetrize

Array = Any

#: floats of one block of latents' ``[l, M, B]`` stacks on the host (numpy): cache-sized blocks
#: reuse the allocator's memory from step to step (a fresh multi-MiB stack page-faults at every
#: step) and keep the element-wise work in cache; other backends (a GPU) take all latents at once
HOST_LATENT_BLOCK_FLOATS = settings.CACHE_BLOCK_FLOATS // 4

#: ``(mean [B, L], var [B, L]) -> (E [B], dE/dmean [B, L], dE/dvar [B, L])``
ExpectationFn = Callable[[Array, Array], tuple[Array, Array, Array]]


def likelihood_expectation(
    likelihood: Likelihood, y: Array, rng: np.random.Generator | None = None
) -> ExpectationFn:
    """The ELBO's per-point expectation: ``likelihood.variational_expectations`` for labels
    ``y [B]`` (class indices: host, or a backend int array), the rule chosen by the likelihood's
    ``expectation`` option.

    Multi-class likelihoods take ``mean, var [B, C]``; single-latent ones the one column of
    ``[B, 1]`` (their gradients come back as ``[B, 1]``). ``rng`` feeds Monte-Carlo rules.
    """
    y = np.asarray(y) if ops.is_numpy(y) or not hasattr(y, "shape") else y

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
    per latent (``Kuu``, ``Kuf`` for the batch columns, ``Kff_diag`` for the batch; on a
    device one ``StackedMatrixGradients`` ``[L, ...]``, which the stacked VJP takes as it is),
    ``expected`` the per-point expectations ``[B]`` (unscaled), ``kl`` the total KL,
    ``dSigma [L, M, M]`` (symmetric) the gradient wrt ``Sigma_l = Lq_l Lq_l^T`` (for natural
    gradients). Arrays of the inputs' namespace; ``value`` and ``kl`` host floats on numpy,
    0-d float64 arrays on a device backend (left unread: the caller reads them when it reads
    its checks, ``ops.deferred_checks``).
    """

    value: Scalar
    dmu: Array
    dLq: Array
    matrix: Sequence[MatrixGradients]
    expected: Array
    kl: Scalar
    dSigma: Array | None = None


def _stack(mats: Sequence[Array] | Array, ref: Array) -> Array:
    """``mats`` (``L`` matrices, or a stack already) as one stack ``[L, ...]`` of ``ref``'s
    namespace."""
    if isinstance(mats, list | tuple):
        if len(mats) == 1:  # a view, no copy
            return ops.like(ref, mats[0])[None, ...]
        return ops.namespace(ref).stack([ops.like(ref, m) for m in mats])
    return ops.like(ref, mats)


def _latent_blocks(ref: Array, n_lat: int, floats_per_latent: int) -> list[slice]:
    """Blocks of latents whose ``[l, M, B]`` stacks are processed together: all of them on a
    device backend, cache-sized blocks on numpy (``HOST_LATENT_BLOCK_FLOATS``)."""
    if not ops.is_numpy(ref):
        return [slice(0, n_lat)]
    return list(chunk_slices(n_lat, floats_per_latent, HOST_LATENT_BLOCK_FLOATS))


def _kl_terms(L_K: Array, mu: Array, Lq: Array) -> tuple[Array, Array, Array]:
    """KL of every latent ``[L]``, ``alpha = Kuu^-1 mu [L, M]`` and ``Kuu^-1 Lq [L, M, M]``
    (stacks: ``L_K, Lq [L, M, M]``, ``mu [L, M]``)."""
    xp = ops.namespace(mu)
    M = mu.shape[-1]
    P = ops.solve_triangular(L_K, Lq)
    alpha = ops.solve_triangular(L_K, ops.solve_triangular(L_K, mu[..., None]),
                                 transpose=True)[..., 0]
    logdet = (2.0 * xp.sum(xp.log(ops.diagonal(L_K)), axis=-1)
              - 2.0 * xp.sum(xp.log(xp.abs(ops.diagonal(Lq))), axis=-1))
    kl = 0.5 * (xp.sum(P * P, axis=(-2, -1)) + xp.sum(mu * alpha, axis=-1) - M + logdet)
    return kl, alpha, ops.solve_triangular(L_K, P, transpose=True)


def _inverse_from_factor(L: Array) -> Array:
    """``(L L^T)^-1`` for the stack of lower factors ``L``; NaN where ``L`` is singular (the
    caller's finiteness checks then catch it)."""
    inv, failed = ops.cho_inverse(L)
    if failed:
        return ops.namespace(L).full_like(L, float("nan"))
    return inv


def uncollapsed_elbo(
    Kuu: Sequence[Array] | Array,
    Kub: Sequence[Array] | Array,
    Kdiag: Array,
    mu: Array,
    Lq: Array,
    expectation: ExpectationFn,
    scale: float = 1.0,
    with_dSigma: bool = True,
) -> ELBOEstimate:
    """The ELBO (spec jj-taylor-svi §3.1, jj-taylor-svi §3.3) for ``L`` latents on ``B`` points.

    ``Kuu``: ``L`` matrices ``[M, M]`` (or their stack); ``Kub``: ``L`` matrices ``[M, B]``
    (batch columns, or their stack); ``Kdiag [L, B]``; ``mu [L, M]``; ``Lq [L, M, M]`` lower
    triangular; ``scale``: the weight of the data term (``N / B`` for an unbiased mini-batch
    estimate). Arrays of one array-API namespace (that of ``mu``). Every step runs once on the
    stacks ``[l, M, M]`` / ``[l, M, B]`` of a block of latents: all of them on a device backend,
    cache-sized blocks on numpy (``HOST_LATENT_BLOCK_FLOATS``); the expectation runs once on
    all latents. One ``Kuu`` and ``Kub`` for ``L > 1`` latents (a list of one matrix, or a
    stack ``[1, ...]``; ``Kdiag [1, B]`` or ``[B]``) is shared by every latent:
    ``shared_uncollapsed_elbo``, whose matrix gradients are the latents' sums ``[1, ...]``.
    ``with_dSigma=False``: no ``dSigma`` (``None``; only natural-gradient steps read it).
    """
    xp = ops.namespace(mu)
    n_lat, M = mu.shape
    if ops.is_numpy(Kdiag) or ops.is_numpy(mu):  # a host Kdiag moved (no no-op copy)
        Kdiag = ops.like(mu, Kdiag)
    if n_lat > 1 and len(Kuu) == 1:  # one Kuu, Kub and Kdiag shared by every latent
        return shared_uncollapsed_elbo(_stack(Kuu, mu)[0], _stack(Kub, mu)[0],
                                       xp.reshape(Kdiag, (-1,)), mu, Lq, expectation, scale,
                                       with_dSigma)
    Kdiag = xp.reshape(Kdiag, (n_lat, -1))
    blocks = _latent_blocks(mu, n_lat, M * Kdiag.shape[1])  # M * B floats per latent
    # one block of every latent (a device): the arrays themselves, no slices or copies
    part: _Part = (lambda a, sl: a) if len(blocks) == 1 else (lambda a, sl: a[sl])
    means, var, forward = _block_marginals(Kuu, Kub, Kdiag, mu, Lq, blocks, part)
    E, dm, dv = expectation(means, var)  # [B, L]
    gm, gv = scale * ops.mT(dm), scale * ops.mT(dv)  # [L, B]
    # ``dmu [L, M]``, ``kl [L]``, ``dLq``, ``dSigma [L, M, M]``: one block's results are
    # these, several blocks' are written into them
    outs = [] if len(blocks) == 1 else [ops.empty(mu, shape) for shape in (
        (n_lat, M), (n_lat,), (n_lat, M, M), (n_lat, M, M) if with_dSigma else (0,))]
    grads: list[MatrixGradients] | StackedMatrixGradients = []
    for sl, fwd in zip(blocks, forward):
        gv_b = part(gv, sl)
        G_uu, G_uf, parts = _block_gradients(fwd, part(mu, sl), part(Lq, sl), part(gm, sl),
                                             gv_b, with_dSigma)
        if len(blocks) == 1 and not ops.is_numpy(mu):  # one block of every latent: stacks
            grads = StackedMatrixGradients(Kuu=G_uu, Kuf=G_uf, Kff_diag=ops.copy(gv_b))
        else:
            assert isinstance(grads, list)
            grads.extend(MatrixGradients(Kff_diag=ops.copy(gv_b[j]), Kuu=G_uu[j], Kuf=G_uf[j])
                         for j in range(G_uu.shape[0]))
        for out, b in zip(outs, parts):  # several blocks: each written into the whole
            if b is not None:
                out[sl] = b
        outs = outs or list(parts)  # one block: its results are the whole
    dmu, kl, dLq, dSigma = outs
    return _estimate(E, kl, scale, dmu, dLq, grads, dSigma if with_dSigma else None)


#: a latent block's part of an array: ``part(a, sl)`` (``a`` itself for one block of all)
_Part = Callable[[Any, slice], Any]


def _block_marginals(Kuu: Sequence[Array] | Array, Kub: Sequence[Array] | Array, Kdiag: Array,
                     mu: Array, Lq: Array, blocks: list[slice], part: _Part
                     ) -> tuple[Array, Array, list[tuple[Array, Array, Array]]]:
    """The marginals of ``q(f)`` on the batch, ``means [B, L]`` and ``var [B, L]`` (at least
    1e-12), one latent block at a time (``uncollapsed_elbo``'s arguments), and per block
    ``(L_K [l, M, M], A = Kuu^-1 Kub [l, M, B], Lq^T A [l, M, B])`` for its gradients."""
    xp = ops.namespace(mu)
    B = Kdiag.shape[1]
    means, var = ops.empty(mu, (B, mu.shape[0])), ops.empty(mu, (B, mu.shape[0]))
    forward = []
    for sl in blocks:
        Kuu_b = part(Kuu, sl)
        # several matrices are stacked here: a new array, ours to factorise in place (formed
        # again on the rare jitter path); a caller's stack, or one matrix's view, is theirs
        ours = isinstance(Kuu_b, list | tuple) and len(Kuu_b) > 1
        L_K = jittered_cholesky(_stack(Kuu_b, mu), name="Kuu", part="latent", first=sl.start,
                                again=partial(_stack, Kuu_b, mu) if ours else None).L
        Rb = ops.solve_triangular(L_K, _stack(part(Kub, sl), mu))  # [l, M, B]
        A = ops.solve_triangular(L_K, Rb, transpose=True)  # Kuu^-1 Kub
        mu_b = part(mu, sl)
        LtA = ops.mT(part(Lq, sl)) @ A
        means[:, sl] = ops.mT((mu_b[:, None, :] @ A)[:, 0, :])
        var[:, sl] = ops.mT(part(Kdiag, sl) - ops.einsum("lmb,lmb->lb", Rb, Rb)
                            + ops.einsum("lmb,lmb->lb", LtA, LtA))
        forward.append((L_K, A, LtA))
    return means, xp.maximum(var, 1e-12), forward


def _block_gradients(forward: tuple[Array, Array, Array], mu_b: Array, Lq_b: Array,
                     gm_b: Array, gv_b: Array, with_dSigma: bool
                     ) -> tuple[Array, Array, tuple[Array, Array, Array, Array | None]]:
    """One latent block's gradients from its ``forward`` (``_block_marginals``), ``mu_b [l, M]``,
    ``Lq_b [l, M, M]`` and the expectation's scaled derivatives ``gm_b, gv_b [l, B]``:
    ``(G_uu [l, M, M], G_uf [l, M, B], (dmu [l, M], kl [l], dLq [l, M, M], dSigma [l, M, M]
    or None))``."""
    L_K, A, LtA = forward
    xp = ops.namespace(mu_b)
    kl_b, alpha, Kinv_Lq = _kl_terms(L_K, mu_b, Lq_b)
    a_col, a_row = alpha[:, :, None], alpha[:, None, :]
    Agm = (A @ gm_b[:, :, None])[..., 0]  # [l, M]
    Pv = (A * gv_b[:, None, :]) @ ops.mT(A)  # A diag(gv) A^T, [l, M, M]
    dmu_b = Agm - alpha
    dLq_b = ops.add_diagonal(xp.tril(2.0 * Pv @ Lq_b - Kinv_Lq), 1.0 / ops.diagonal(Lq_b))
    # Kuu^-1 Sigma Kuu^-1 Kub - Kuu^-1 Kub = Kuu^-1 Lq (Lq^T A) - A
    G_uf = Kinv_Lq @ LtA
    G_uf -= A
    G_uf *= 2.0 * gv_b[:, None, :]
    G_uf += a_col * gm_b[:, None, :]
    Kinv = _inverse_from_factor(L_K)
    SP = (Kinv_Lq @ ops.mT(Lq_b)) @ Pv  # Kuu^-1 Sigma Pv
    G_uu = (
        -0.5 * (Agm[:, :, None] * a_row + a_col * Agm[:, None, :])
        + Pv - SP - ops.mT(SP)
        + 0.5 * (Kinv_Lq @ ops.mT(Kinv_Lq) + a_col * a_row - Kinv)
    )
    G_uu = symmetrize(G_uu)
    # dL/dSigma = Pv - Kuu^-1 / 2 + Sigma^-1 / 2 (spec jj-taylor-svi §3.3)
    dSigma_b = Pv - 0.5 * Kinv + 0.5 * _inverse_from_factor(Lq_b) if with_dSigma else None
    return G_uu, G_uf, (dmu_b, kl_b, dLq_b, dSigma_b)


def _estimate(E: Array, kl: Array, scale: float, dmu: Array, dLq: Array,
              grads: Sequence[MatrixGradients], dSigma: Array | None) -> ELBOEstimate:
    """The ``ELBOEstimate`` of the expectations ``E [B]`` and the latents' ``kl [L]``: its
    value and KL host floats on numpy, unread 0-d float64 arrays on a device."""
    xp = ops.namespace(E)
    if ops.is_numpy(E):
        kl_total = ops.scalar(xp.sum(kl))
        value = scale * ops.scalar(xp.sum(E))
    else:  # no host read: the same float64 arithmetic on the device
        kl_total = xp.astype(xp.sum(kl), xp.float64)
        value = scale * xp.astype(xp.sum(E), xp.float64)
    return ELBOEstimate(value - kl_total, dmu, dLq, grads, E, kl_total, dSigma)


def _side_by_side(S: Array) -> Array:
    """A stack ``S [L, M, K]`` as one matrix ``[M, L K]``, its matrices side by side."""
    n, M, K = S.shape
    return ops.namespace(S).reshape(ops.namespace(S).permute_dims(S, (1, 0, 2)), (M, n * K))


def _stacked(W: Array, n: int) -> Array:
    """``_side_by_side``'s inverse: ``W [M, n K]`` as the stack ``[n, M, K]`` (a view)."""
    xp = ops.namespace(W)
    return xp.permute_dims(xp.reshape(W, (W.shape[0], n, -1)), (1, 0, 2))


def shared_uncollapsed_elbo(Kuu: Array, Kub: Array, Kdiag: Array, mu: Array, Lq: Array,
                            expectation: ExpectationFn, scale: float = 1.0,
                            with_dSigma: bool = True) -> ELBOEstimate:
    """``uncollapsed_elbo`` for ``L`` latents sharing one ``Kuu [M, M]``, ``Kub [M, B]`` and
    ``Kdiag [B]`` (one kernel and one ``Z``: GPflow SVGP's model); ``mu [L, M]``,
    ``Lq [L, M, M]``. The same ELBO and ``q(u)`` gradients as the per-latent algebra on the
    broadcast matrices (to round-off), with the shared work done once: one Cholesky of
    ``Kuu``, one ``A = Kuu^-1 Kub``, one ``Kuu^-1``, and the sums over the latents as single
    products of the latents' matrices laid side by side (``[M, L M]``). ``matrix``: one
    ``StackedMatrixGradients`` ``[1, ...]``, the latents' gradients summed (the shared
    kernel's and ``Z``'s, by the chain rule through the broadcast).
    """
    xp = ops.namespace(mu)
    n_lat, M = mu.shape
    L_K = jittered_cholesky(Kuu, name="Kuu").L
    # its six solves: by L_K^-1 formed once and products on numpy (ops.prefers_tri_inverse)
    L_inv = ops.tri_inverse(L_K) if ops.prefers_tri_inverse(L_K) else None

    def solve(X: Array, transpose: bool = False) -> Array:  # L_K^-1 X (L_K^-T X)
        if L_inv is None:
            return ops.solve_triangular(L_K, X, transpose=transpose)
        return ops.tri_matmul(L_inv, X, transpose=transpose)

    Rb = solve(Kub)  # [M, B]
    A = solve(Rb, transpose=True)  # Kuu^-1 Kub
    # Lq_l^T A [L, M, B]: a triangular product (numpy: trmm on a copy of A per latent)
    LtA = ops.tri_matmul(Lq, xp.broadcast_to(A, (n_lat, M, A.shape[-1])), transpose=True)
    var = ((Kdiag - ops.einsum("mb,mb->b", Rb, Rb))[:, None]
           + ops.mT(ops.einsum("lmb,lmb->lb", LtA, LtA)))
    E, dm, dv = expectation(ops.mT(mu @ A), xp.maximum(var, 1e-12))  # [B, L]
    gm, gv = scale * ops.mT(dm), scale * ops.mT(dv)  # [L, B]
    Kinv_Lq, alpha, kl = _shared_kl(solve, L_K, Lq, mu)
    Agm = gm @ ops.mT(A)  # [L, M]: A gm_l per latent
    LtA *= gv[:, None, :]  # read no more: W_l = Lq_l^T A diag(gv_l), in place
    W = xp.reshape(LtA, (n_lat * M, -1))  # stacked [L M, B]
    PvLq = A @ ops.mT(W)  # Pv_l Lq_l side by side, Pv_l = A diag(gv_l) A^T
    # the latents' sums of the per-latent G_uf and G_uu (uncollapsed_elbo's algebra); the
    # [M, L M] arrays updated in place (fresh MiB-sized temporaries page-fault)
    # G_uu is symmetrised at the end, so -SP - SP^T + (Kuu^-1 Lq)(Kuu^-1 Lq)^T / 2 (SP the
    # sum of Kuu^-1 Sigma_l Pv_l) is one product: Kuu^-1 Lq (Kuu^-1 Lq - 4 Pv Lq)^T / 2
    PvLq *= -4.0
    PvLq += Kinv_Lq
    SP = Kinv_Lq @ ops.mT(PvLq)
    SP *= 0.5
    PvLq += Kinv_Lq  # dLq's 2 Pv Lq - Kuu^-1 Lq = -(Kuu^-1 Lq - 4 Pv Lq + Kuu^-1 Lq) / 2
    PvLq *= -0.5
    dLq = ops.add_diagonal(xp.tril(_stacked(PvLq, n_lat)), 1.0 / ops.diagonal(Lq))
    grads, Kinv = _shared_kernel_gradients(L_K, A, W, Kinv_Lq, alpha, gm, gv, Agm, SP)
    # dL/dSigma = Pv - Kuu^-1 / 2 + Sigma^-1 / 2 per latent (spec jj-taylor-svi §3.3)
    dSigma = None if not with_dSigma else (
        (A * gv[:, None, :]) @ ops.mT(A) - 0.5 * Kinv + 0.5 * _inverse_from_factor(Lq))
    return _estimate(E, kl, scale, Agm - ops.mT(alpha), dLq, grads, dSigma)


def _shared_kl(solve: Callable[..., Array], L_K: Array, Lq: Array,
               mu: Array) -> tuple[Array, Array, Array]:
    """The KL terms of ``shared_uncollapsed_elbo``, every latent in one solve: ``Kuu^-1 Lq``
    ``[M, L M]`` (side by side), ``alpha = Kuu^-1 mu`` ``[M, L]`` and ``KL(q(u_l) || p(u))``
    ``[L]``; ``solve(X, transpose)`` is ``L_K^-1 X`` (``L_K^-T X``), ``Lq [L, M, M]``,
    ``mu [L, M]``."""
    xp = ops.namespace(mu)
    n_lat, M = mu.shape
    P = solve(_side_by_side(Lq))  # L_K^-1 Lq [M, L M]
    Kinv_Lq = solve(P, transpose=True)
    alpha = solve(solve(ops.mT(mu)), transpose=True)
    logdet = (2.0 * xp.sum(xp.log(ops.diagonal(L_K)))
              - 2.0 * xp.sum(xp.log(xp.abs(ops.diagonal(Lq))), axis=-1))
    kl = 0.5 * (xp.sum(xp.reshape(P * P, (M, n_lat, M)), axis=(0, 2))
                + xp.sum(mu * ops.mT(alpha), axis=-1) - M + logdet)
    return Kinv_Lq, alpha, kl


def _shared_kernel_gradients(L_K: Array, A: Array, W: Array, Kinv_Lq: Array, alpha: Array,
                             gm: Array, gv: Array, Agm: Array,
                             SP: Array) -> tuple[StackedMatrixGradients, Array]:
    """The latents' summed ``G_uf [M, B]``, ``G_uu [M, M]`` and ``Kff_diag`` gradient ``[B]`` of
    ``shared_uncollapsed_elbo`` (each ``[1, ...]``), and ``Kuu^-1 [M, M]``: ``A = Kuu^-1 Kub``,
    ``W [L M, B]`` the stacked ``Lq_l^T A diag(gv_l)``, ``gm``, ``gv [L, B]``, ``Agm [L, M]``,
    ``SP [M, M]`` the symmetrised-later sum of ``Kuu^-1 Sigma_l Pv_l`` terms."""
    xp = ops.namespace(A)
    gv_sum = xp.sum(gv, axis=0)
    G_uf = Kinv_Lq @ W
    G_uf -= A * gv_sum
    G_uf *= 2.0
    G_uf += alpha @ gm
    Kinv = _inverse_from_factor(L_K)
    Pv_sum = (A * gv_sum) @ ops.mT(A)
    Ga = ops.mT(Agm) @ ops.mT(alpha)  # sum of A gm_l alpha_l^T
    G_uu = SP - Ga + Pv_sum + 0.5 * (alpha @ ops.mT(alpha) - gv.shape[0] * Kinv)
    G_uu = symmetrize(G_uu)
    return StackedMatrixGradients(Kuu=G_uu[None, ...], Kuf=G_uf[None, ...],
                                  Kff_diag=gv_sum[None, ...]), Kinv


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
    ``mu' [M]`` and the Cholesky factor ``Lq' [M, M]`` of ``Sigma' = Lambda'^-1``. Arrays of
    any array-API namespace.
    """
    Lam = _inverse_from_factor(Lq)
    G = 0.5 * (dSigma + ops.mT(dSigma))
    for _ in range(NATURAL_STEP_HALVINGS + 1):
        Lam_new = Lam - 2.0 * step * G
        L_lam, failed = ops.cholesky(0.5 * (Lam_new + ops.mT(Lam_new)))
        if not bool(np.any(failed)):
            break
        step *= 0.5  # not log-concave (robust-max): shorten the step
    else:
        return ops.copy(mu), ops.copy(Lq)
    theta1 = Lam @ mu + step * (dmu - 2.0 * G @ mu)
    mu_new = ops.solve_triangular(L_lam, ops.solve_triangular(L_lam, theta1[:, None]),
                                  transpose=True)[:, 0]
    # Sigma' = Lambda'^-1 = L_lam^-T L_lam^-1; its lower Cholesky factor
    Lq_new = jittered_cholesky(_inverse_from_factor(L_lam), name="natural-gradient Sigma").L
    return mu_new, Lq_new
