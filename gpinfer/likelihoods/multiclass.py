"""Multi-class likelihoods: argmax with Gaussian noise, multinomial probit, robust-max, softmax.

Latent values ``F``, ``mean``, ``var`` are ``[N, C]`` (an independent Gaussian per class for the
tilted and expected quantities); labels are class indices ``0..C-1``.

* ``ArgmaxNoise(noise_variance=0)`` (spec ep-sep §1.2): ``y = argmax_c (f_c + eps_c)``,
  ``eps_c ~ N(0, noise_variance_c)``. Default 0: the noise lives in the kernel (the spec's default),
  the likelihood is the Heaviside product ``prod_{k != y} Theta(f_y - f_k)``.
* ``MultinomialProbit()``: the same with unit noise, ``noise_variance = 1``.
* ``RobustMax(epsilon=1e-3)`` (spec ep-sep §3.2): ``(1 - eps) [y = argmax f] + eps / C``.
* ``Softmax()``: ``exp(f_y) / sum_c exp(f_c)``.

Gaussian integrals:

* ``argmax_probability``: ``P(f_y > f_k for all k != y)`` for independent Gaussians, by the 1-D
  integral of spec ep-sep §2.10 in log space: trapezoid rule with step ``ARGMAX_BASE_STEP / 2^j``
  (``j`` from the largest standard-deviation ratio, at most ``ARGMAX_MAX_REFINEMENTS``) on a window
  of ``+-ARGMAX_WINDOW`` around the integrand's mode (rounded to the grid, so nodes are piecewise
  constant in the parameters and the derivatives are exact derivatives of the discretised sum).
  Centring on the mode keeps ``log P`` accurate far in the tails. This serves the argmax tilted
  moments (power one), predictions, the robust-max expectations and the argmax ``log_prob``.
* Other expectations (softmax; argmax with noise at power != 1 and its expected log-likelihood):
  product Gauss-Hermite on the ``C - 1`` dimensional subspace orthogonal to the ones vector
  (``gpinfer.numerics.quadrature.shift_invariant_rule``), with Price/Stein derivatives.
  Softmax with ``C = 2`` uses the exact 1-D engine of the logistic instead.
* ``argmax_factor_tilted``: the closed-form tilted moments of one pairwise probit factor of the
  EP/SEP approximation (spec ep-sep §2.4).
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, NamedTuple

import array_api_compat
import numpy as np
from scipy.special import logsumexp

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.interfaces import (
    EVERY_BACKEND,
    NUMPY_ONLY,
    ExpectedLogProb,
    Likelihood,
    TiltedMoments,
)
from gpinfer.likelihoods.base import (
    check_labels,
    check_latent,
    check_mean_var,
    check_power,
    require_rule_backend,
)
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.numerics import settings
from gpinfer.numerics.normal import (
    inv_mills,
    log_phi,
    log_Phi_curvature,
    log_Phi_derivatives,
)
from gpinfer.numerics.quadrature import (
    chunk_slices,
    multiclass_gh_order,
    row_logsumexp,
    shift_invariant_rule,
    sigmoid_expectations,
    sigmoid_tilted,
)

Array = np.ndarray

#: lower clip of the pairwise factor's scaled curvature ``gamma z`` (spec ep-sep §2.4)
_GAMMA_FLOOR = 1e-300
#: upper clip of ``gamma z`` (strictly below one)
_GAMMA_CEIL = 1.0 - 1e-12


# --------------------------------------------------------------------------------------------
# Pairwise probit factor of the EP/SEP approximation (spec ep-sep §2.4)
# --------------------------------------------------------------------------------------------


class PairwiseProbitTilted(NamedTuple):
    """Tilted quantities of one factor ``Phi((t_y - t_k) / sqrt(s_y + s_k))``, each ``[...]``.

    * ``log_z``: ``log Phi(alpha)``, ``alpha = (a_y - a_k) / sqrt(z)``, ``z = b_y + b_k``.
    * ``dlogz_da``: derivative wrt the winner's mean ``a_y`` (the loser's is ``-dlogz_da``).
    * ``dlogz_db``: derivative wrt either variance ``b_y`` or ``b_k`` (the same for both);
      ``None`` when not asked for.
    * ``gamma``: ``-d^2 log Z / da^2 = beta (beta + alpha) / z`` in ``(0, 1/z)``, computed without
      cancellation (use it rather than ``dlogz_da**2 - 2 dlogz_db``); ``None`` when not asked
      for.
    """

    log_z: Array
    dlogz_da: Array
    dlogz_db: Array | None
    gamma: Array | None


def argmax_factor_tilted(a_y: Array, a_k: Array, b_y: Array, b_k: Array, *,
                         curvature: bool = True, slope_b: bool = True) -> PairwiseProbitTilted:
    """Closed-form tilted moments of the pairwise factor (spec ep-sep §2.4); inputs broadcast
    (host values, or arrays of one array-API namespace: ``gpinfer.backend``).

    ``a_y``, ``a_k``: cavity means of the winner's and loser's projections; ``b_y``, ``b_k``: their
    variances with the FITC/noise variances ``s`` already added by the caller.
    ``curvature=False``: ``gamma`` is ``None`` (``log Z`` and its gradient alone need none);
    ``slope_b=False``: ``dlogz_db`` is ``None`` (a site update reads none: three operators
    fewer on a device).
    """
    a_y, a_k, b_y, b_k = (ops.as_array(v) for v in (a_y, a_k, b_y, b_k))  # outputs broadcast
    xp = ops.namespace(a_y, a_k, b_y, b_k)
    z = b_y + b_k
    ops.require_positive(z, lambda: InputError(  # finite and > 0: one check, no sync when deferred
        "argmax_factor_tilted needs finite positive total variance b_y + b_k"))
    sqrt_z = xp.sqrt(z)
    alpha = (a_y - a_k) / sqrt_z
    # log Phi, r = phi / Phi and -r' = gamma(alpha) from one evaluation of log Phi
    gamma = None
    if curvature:
        log_z, beta, curv = log_Phi_curvature(alpha)
        gamma = xp.clip(curv, _GAMMA_FLOOR, _GAMMA_CEIL) / z
    else:
        log_z, beta = log_Phi_derivatives(alpha, 1)
    return PairwiseProbitTilted(
        log_z=log_z,
        dlogz_da=beta / sqrt_z,
        dlogz_db=-0.5 * beta * alpha / z if slope_b else None,
        gamma=gamma,
    )


# --------------------------------------------------------------------------------------------
# P(f_y > f_k for all k != y) by a mode-centred 1-D trapezoid rule (spec ep-sep §2.10, §3.2)
# --------------------------------------------------------------------------------------------


class ArgmaxProbability(NamedTuple):
    """``log P`` ``[B]`` and its derivatives wrt the means and variances, ``[B, C]`` each."""

    log_p: Array
    dmean: Array
    dvar: Array


def _argmax_mode(d: Array, rho: Array) -> Array:
    """Mode of ``h(t) = -t^2/2 + sum_k log Phi(d_k + rho_k t)``, ``d, rho [B, K]`` -> ``[B]``.

    ``h`` is concave with ``h'' <= -1``; ``h'(0) > 0`` and ``h'(h'(0)) <= 0`` bracket a
    safeguarded Newton iteration. On numpy a row stops at its own convergence (the iteration
    goes on over the rows still moving only: most converge in about five steps, a few take
    thirty); on a device every row steps until all have converged (no data-dependent shapes).
    """
    xp = ops.namespace(d)
    lo = ops.zeros(d, (d.shape[0],))
    hi = xp.sum(rho * inv_mills(d), axis=1)
    t = xp.zeros_like(lo)
    return ops.converge_rows(_mode_step, (d, rho), (t, lo, hi),
                             settings.ENGINE_MODE_ITERATIONS)[0]


def _mode_step(d: Array, rho: Array, t: Array, lo: Array, hi: Array
               ) -> tuple[Array, Array, Array, Array]:
    """One safeguarded Newton step of ``_argmax_mode`` on rows ``d, rho [b, K]`` at ``t [b]``
    in the bracket ``(lo, hi) [b]``: the new ``t``, ``lo``, ``hi`` and whether each row has
    converged ``[b]``."""
    xp = ops.namespace(d)
    z = d + rho * t[:, None]
    # r = inv_mills(z) and -r' = probit_curvature(z) from one log Phi (the same values)
    _, r, r1 = log_Phi_derivatives(z, 2)
    grad = -t + xp.sum(rho * r, axis=1)
    curv = 1.0 + xp.sum(rho * rho * -r1, axis=1)
    lo = xp.where(grad > 0, t, lo)
    hi = xp.where(grad > 0, hi, t)
    new = t + grad / curv
    new = xp.where((new <= lo) | (new >= hi), 0.5 * (lo + hi), new)
    done = xp.abs(new - t) <= 1e-8 * (1.0 + xp.abs(t))
    return new, lo, hi, done


def _argmax_nodes(d: Array, rho: Array, center: Array, step: float
                  ) -> tuple[Array, Array, Array, Array]:
    """Trapezoid nodes ``t [b, n]``, ``z = d + rho t [b, n, K]`` and log integrand ``lam
    [b, n]`` for rows sharing one ``step``, and ``log P [b]``."""
    half = int(round(settings.ARGMAX_WINDOW / step))
    offsets_host = step * np.arange(-half, half + 1)  # [n]
    log_w_host = np.full(offsets_host.shape, math.log(step))
    log_w_host[[0, -1]] += math.log(0.5)
    offsets, log_w = ops.like(d, offsets_host), ops.like(d, log_w_host)
    t = center[:, None] + offsets  # [b, n]
    z, log_gauss, log_cdfs = _log_integrand(d, rho, t)
    lam = log_w + log_gauss + log_cdfs  # [b, n]
    return t, z, lam, ops.logsumexp(lam, 1)


def _log_integrand(d: Array, rho: Array, t: Array) -> tuple[Array, Array, Array]:
    """The argmax integrand at nodes ``t [b, n]``: ``z = d + rho t [b, n, K]``, ``log N(t)``
    and ``sum_k log Phi(z_k)`` ``[b, n]`` (its log is their sum: concave in ``t``)."""
    xp = ops.namespace(d)
    z = d[:, None, :] + rho[:, None, :] * t[:, :, None]  # [b, n, K]
    return z, log_phi(t), xp.sum(ops.log_ndtr(z), axis=2)


def _reach(step: float) -> tuple[int, int]:
    """First and last node (indices into ``_argmax_nodes``' grid of this ``step``) that can
    weigh: ``h'' <= -1`` puts the log integrand ``h`` more than ``ARGMAX_NEGLIGIBLE_NATS``
    below its maximum at ``sqrt(2 ARGMAX_NEGLIGIBLE_NATS)`` (10) from the mode and beyond, and
    the centre lies within ``step / 2`` of the mode (83 of the 97 base-level nodes)."""
    half = int(round(settings.ARGMAX_WINDOW / step))
    reach = math.ceil((math.sqrt(2.0 * settings.ARGMAX_NEGLIGIBLE_NATS) + 0.5 * step) / step)
    return max(0, half - reach), min(2 * half, half + reach)


def _bound_spacing(step: float) -> int:
    """Fine nodes per interval of ``_kept_nodes``' bound grid for rows of this ``step``: a
    spacing ``s`` costs ``2 R / s`` evaluations over the reach ``R`` (10) and keeps up to about
    ``s / step`` nodes too many each side, least near ``s = sqrt(2 R step)``; taken as
    ``ARGMAX_BASE_STEP`` times the nearest power of two, at least one."""
    reach = math.sqrt(2.0 * settings.ARGMAX_NEGLIGIBLE_NATS)
    best = math.sqrt(2.0 * reach * step) / settings.ARGMAX_BASE_STEP
    spacing = settings.ARGMAX_BASE_STEP * 2.0 ** max(0, round(math.log2(best)))
    return int(round(spacing / step))


def _kept_nodes(d: Array, rho: Array, center: Array, step: float) -> tuple[Array, Array]:
    """First and last node ``[b]`` (indices into ``_argmax_nodes``' grid) of the range outside
    which every node's log integrand lies more than ``ARGMAX_NEGLIGIBLE_NATS`` below the row's
    peak (numpy rows of one fine ``step``), within ``_reach``.

    The log integrand ``h`` is concave, so on each interval of the bound grid (every
    ``_bound_spacing`` fine nodes) it lies below the extensions of the neighbouring chords; an
    interval whose bound is that far below the largest bound-grid value is dropped. What is
    dropped weighs less than ``n exp(-ARGMAX_NEGLIGIBLE_NATS)`` of the integral (``n`` nodes):
    below round-off."""
    half = int(round(settings.ARGMAX_WINDOW / step))
    ratio = _bound_spacing(step)  # fine nodes per bound interval
    lo, hi = _reach(step)
    base = np.arange(0, 2 * half + 1, ratio)  # both ends of the window included
    base = base[(base > lo - ratio) & (base < hi + ratio)]  # [J + 1], the intervals over reach
    t = center[:, None] + step * (base - half)[None, :].astype(float)
    _, log_gauss, log_cdfs = _log_integrand(d, rho, t)
    g = log_gauss + log_cdfs  # [b, J + 1]
    inner = g[:, 1:-1]
    bound = np.full((g.shape[0], base.size - 1), np.inf)  # per base interval [b, J]
    bound[:, :-1] = np.maximum(inner, 2.0 * inner - g[:, 2:])  # chord on its right, extended
    bound[:, 1:] = np.minimum(bound[:, 1:], np.maximum(inner, 2.0 * inner - g[:, :-2]))
    peak = np.max(g, axis=1, keepdims=True)
    keep = ~(bound < peak - settings.ARGMAX_NEGLIGIBLE_NATS)  # NaN keeps everything
    first = np.argmax(keep, axis=1)
    last = keep.shape[1] - 1 - np.argmax(keep[:, ::-1], axis=1)
    return np.maximum(base[first], lo), np.minimum(base[last + 1], hi)


def _argmax_log_p_pruned(d: Array, rho: Array, center: Array, step: float) -> Array:
    """``log P [b]`` of ``_argmax_nodes`` on numpy rows of one ``step``, summed over the nodes
    ``_kept_nodes`` keeps only (refined levels) or those within ``_reach`` (the base level):
    the same nodes, weights and integrand; the rest weighs less than round-off. Rows are
    taken in order of their kept width, in blocks of ``QUADRATURE_CHUNK_FLOATS``."""
    half = int(round(settings.ARGMAX_WINDOW / step))
    offsets = step * np.arange(-half, half + 1)  # the grid of _argmax_nodes
    log_w = np.full(offsets.shape, math.log(step))
    log_w[[0, -1]] += math.log(0.5)
    if step < settings.ARGMAX_BASE_STEP:
        first, last = _kept_nodes(d, rho, center, step)
    else:  # the base grid: no coarser one to bound it from, the nodes within reach
        lo, hi = _reach(step)
        first, last = np.full(d.shape[0], lo), np.full(d.shape[0], hi)
    width = last - first + 1
    order = np.argsort(width, kind="stable")
    log_p = np.empty(d.shape[0])
    start = 0
    while start < order.size:
        n_eff = int(width[order[start]])
        rows = max(1, settings.QUADRATURE_CHUNK_FLOATS // (6 * n_eff * d.shape[1]))
        block = order[start:start + rows]
        n_eff = int(width[block[-1]])  # the widest of the block (sorted)
        k = first[block][:, None] + np.arange(n_eff)[None, :]
        valid = k <= last[block][:, None]
        k = np.minimum(k, offsets.size - 1)
        t = center[block][:, None] + offsets[k]
        _, log_gauss, log_cdfs = _log_integrand(d[block], rho[block], t)
        lam = np.where(valid, log_w[k] + log_gauss + log_cdfs, -np.inf)
        log_p[block] = row_logsumexp(lam)
        start += block.size
    return log_p


def _argmax_block(
    d: Array, rho: Array, sd_y: Array, sd_o: Array, center: Array, step: float
) -> tuple[Array, Array, Array, Array, Array]:
    """Trapezoid sums for rows sharing one ``step``; returns log P and derivative pieces."""
    xp = ops.namespace(d)
    t, z, lam, log_p = _argmax_nodes(d, rho, center, step)
    pi = xp.exp(lam - log_p[:, None])
    A = inv_mills(z) / sd_o[:, None, :]  # r_k / sd_k, [b, n, K]
    dmean_o = -(pi[:, None, :] @ A)[:, 0]
    dvar_o = -(pi[:, None, :] @ (A * z))[:, 0] / (2.0 * sd_o)
    sumA = xp.sum(A, axis=2)  # [b, n]
    dmean_y = xp.sum(pi * sumA, axis=1)
    dvar_y = xp.sum(pi * t * sumA, axis=1) / (2.0 * sd_y)
    return log_p, dmean_o, dvar_o, dmean_y, dvar_y


class LabelContrasts(NamedTuple):
    """The label's latent against the others, ``f_y = m_y + sd_y t``: ``others [B, C]`` (False
    at the label), ``sd_y [B]``, and per other class ``[B, C - 1]``: ``sd_o``,
    ``d = (m_y - m_k) / sd_k`` and ``rho = sd_y / sd_k`` (so ``P(f_y > f_k | t) =
    Phi(d + rho t)``)."""

    others: Array
    sd_y: Array
    sd_o: Array
    d: Array
    rho: Array


def label_contrasts(mean: Array, var: Array, y: Array) -> LabelContrasts:
    """``LabelContrasts`` of independent Gaussian latents ``N(mean, var)`` ``[B, C]`` (any
    array-API namespace; host labels ``y`` are moved to ``mean``'s device)."""
    xp = ops.namespace(mean)
    B, C = mean.shape
    rows = ops.index_like(mean, np.arange(B))
    y = ops.index_like(mean, y)
    sd = xp.sqrt(var)
    others = xp.ones((B, C), dtype=xp.bool, device=array_api_compat.device(mean))
    others[rows, y] = False
    m_y, sd_y = mean[rows, y], sd[rows, y]
    sd_o = xp.reshape(sd[others], (B, C - 1))
    d = (m_y[:, None] - xp.reshape(mean[others], (B, C - 1))) / sd_o
    return LabelContrasts(others, sd_y, sd_o, d, sd_y[:, None] / sd_o)


def _argmax_plan(mean: Array, var: Array, y: Array
                 ) -> tuple[Array, LabelContrasts, Array, list[tuple[Array, Array, float, Array]]]:
    """The quadrature plan shared by ``argmax_probability`` and ``argmax_log_probability``:
    the row indices, the label contrasts, and per refinement level (its rows on the host, on
    ``mean``'s device, its step and the rows' node centres)."""
    mean, var = ops.as_array(mean), ops.as_array(var)
    xp = ops.namespace(mean, var)
    y = ops.index_like(mean, y)
    rows = ops.index_like(mean, np.arange(mean.shape[0]))
    contrasts = label_contrasts(mean, var, y)
    with np.errstate(divide="ignore"):  # the refinement level of each row, on the host
        j = np.ceil(np.log2(ops.to_host(xp.max(contrasts.rho, axis=1))))
    j = np.clip(j, 0, settings.ARGMAX_MAX_REFINEMENTS).astype(int)
    mode = _argmax_mode(contrasts.d, contrasts.rho)
    levels = []
    for level in np.unique(j):
        step = settings.ARGMAX_BASE_STEP * 2.0 ** (-int(level))
        idx_host = np.flatnonzero(j == level)
        idx = ops.index_like(mean, idx_host)
        levels.append((idx_host, idx, step, xp.round(mode[idx] / step) * step))
    return rows, contrasts, y, levels


def _chunks(idx_host: Array, step: float, C: int) -> list[slice]:
    n_nodes = 2 * int(round(settings.ARGMAX_WINDOW / step)) + 1
    return list(chunk_slices(idx_host.size, 6 * n_nodes * (C - 1)))


def argmax_log_probability(mean: Array, var: Array, y: Array, prune: bool = False) -> Array:
    """``log P(f_y > f_k, all k != y)`` ``[B]`` alone: ``argmax_probability``'s rule without
    its derivatives (prediction needs none; half the work).

    ``prune`` (numpy; predictions): skip the nodes whose share of the integral is below
    round-off (``_kept_nodes`` on the refined levels, ``_reach`` on the base level): the same
    value to round-off at a fraction of the cost where unequal variances force a fine step
    over the whole window."""
    rows, c, y, levels = _argmax_plan(mean, var, y)
    xp = ops.namespace(c.d)
    log_p = ops.zeros(c.d, (c.d.shape[0],))
    for idx_host, idx, step, center in levels:
        if prune and ops.is_numpy(c.d):
            log_p[idx] = _argmax_log_p_pruned(c.d[idx], c.rho[idx], center, step)
            continue
        for sl in _chunks(idx_host, step, c.d.shape[1] + 1):
            ii = idx[sl]
            log_p[ii] = _argmax_nodes(c.d[ii], c.rho[ii], center[sl], step)[3]
    return xp.clip(log_p, max=0.0)


def argmax_class_probabilities(mean: Array, var: Array) -> Array:
    """``P(f_c > f_k, all k != c)`` ``[B, C]`` for every class ``c``: one
    ``argmax_log_probability`` call (pruned nodes) on the ``B C`` (point, class) rows."""
    xp = ops.namespace(mean, var)
    B, C = mean.shape
    labels = np.repeat(np.arange(C), B)  # row c B + i: point i, label c
    log_p = argmax_log_probability(xp.concat([mean] * C), xp.concat([var] * C), labels,
                                   prune=True)
    return ops.copy(ops.mT(xp.exp(xp.reshape(log_p, (C, B)))))


def argmax_probability(mean: Array, var: Array, y: Array) -> ArgmaxProbability:
    """``log P(f_y > f_k, all k != y)``, ``f_c ~ N(mean_c, var_c)`` independent, and derivatives.

    ``mean``, ``var`` (``> 0``): ``[B, C]``; ``y``: ``[B]`` class indices. With
    ``f_y = m_y + sd_y t``:
    ``P = int N(t) prod_{k != y} Phi((m_y + sd_y t - m_k) / sd_k) dt``, trapezoid rule of step
    ``ARGMAX_BASE_STEP * 2^-j``, ``j = ceil(log2 max_k sd_y / sd_k)`` clipped to
    ``[0, ARGMAX_MAX_REFINEMENTS]``, on ``+-ARGMAX_WINDOW`` around the integrand's mode (rounded
    to a multiple of the step). Accuracy ~1e-13 for standard-deviation ratios up to ``2^8`` and
    variance ratios up to ~1e6 (spec ep-sep §2.10); beyond, it degrades gracefully.
    """
    rows, c, y, levels = _argmax_plan(mean, var, y)
    xp = ops.namespace(c.d)
    B, C = c.others.shape
    log_p = ops.zeros(c.d, (B,))
    dmean_o = ops.zeros(c.d, (B, C - 1))
    dvar_o = ops.zeros(c.d, (B, C - 1))
    dmean_y = ops.zeros(c.d, (B,))
    dvar_y = ops.zeros(c.d, (B,))
    for idx_host, idx, step, center in levels:
        for sl in _chunks(idx_host, step, C):
            ii = idx[sl]
            out = _argmax_block(c.d[ii], c.rho[ii], c.sd_y[ii], c.sd_o[ii], center[sl], step)
            log_p[ii], dmean_o[ii], dvar_o[ii], dmean_y[ii], dvar_y[ii] = out

    log_p = xp.clip(log_p, max=0.0)  # a probability: remove rounding above one
    dmean = ops.zeros(c.d, (B, C))
    dvar = ops.zeros(c.d, (B, C))
    dmean[c.others] = xp.reshape(dmean_o, (-1,))
    dvar[c.others] = xp.reshape(dvar_o, (-1,))
    dmean[rows, y] = dmean_y
    dvar[rows, y] = dvar_y
    return ArgmaxProbability(log_p, dmean, dvar)


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class MulticlassLikelihood(Likelihood):
    """Base of the ``C``-latent likelihoods: validation, then a private strategy per method.

    The generic strategies integrate with ``shift_invariant_rule`` (product Gauss-Hermite on the
    subspace orthogonal to ``1``) using ``_log_prob_grad_hess`` at the nodes; ``gh_order`` nodes
    per dimension (``None``: ``multiclass_gh_order(C, gh_budget)``).
    """

    multiclass = True
    gh_order: int | None = None
    gh_budget: ClassVar[int] = settings.MULTICLASS_GH_NODE_BUDGET

    # -- validation --------------------------------------------------------------------------
    @staticmethod
    def _check_inputs(y: Array, mean: Array, var: Array) -> tuple[Array, Array, Array]:
        mean, var = check_mean_var(mean, var, 2)
        if mean.shape[1] < 2:
            raise InputError(
                f"a multi-class likelihood needs at least 2 latent columns, got {mean.shape}"
            )
        return check_labels(y, mean.shape[1], mean.shape[0]), mean, var

    # -- hooks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def _log_prob(self, y: Array, F: Array) -> Array:
        """``log p(y_n | F_n)`` ``[N]`` for validated labels ``y [N]`` and ``F [N, C]``."""

    def _log_prob_grad_hess(self, y: Array, F: Array) -> tuple[Array, Array, Array]:
        """``log p``, gradient and Hessian diagonal wrt ``F`` at ``F [B, Q, C]`` (``y [B]``)."""
        raise NotImplementedError(f"{type(self).__name__} has no pointwise derivatives")

    def _order(self, C: int) -> int:
        return (
            self.gh_order if self.gh_order is not None else multiclass_gh_order(C, self.gh_budget)
        )

    def _gh_tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        """Product Gauss-Hermite on the complement of ``1``; Stein forms for the derivatives.

        ``d log Z / d mean_c = E~[a g_c]``, ``d log Z / d var_c = E~[a h_cc + (a g_c)^2] / 2`` under
        the tilted weights (``g``, ``h``: gradient and Hessian diagonal of ``log p``).
        """
        N, C = mean.shape
        order = self._order(C)
        log_z, dmean, dvar = np.empty(N), np.empty((N, C)), np.empty((N, C))
        for sl in chunk_slices(N, 4 * C * order ** (C - 1)):
            F, w = shift_invariant_rule(mean[sl], var[sl], order)
            lp, g, h = self._log_prob_grad_hess(y[sl], F)
            with np.errstate(divide="ignore"):
                lam = np.log(w) + power * lp
            log_z[sl] = logsumexp(lam, axis=1)
            pi = np.exp(lam - log_z[sl, None])[:, None, :]  # [b, 1, Q]
            dmean[sl] = power * (pi @ g)[:, 0]
            dvar[sl] = 0.5 * (pi @ (power * h + (power * g) ** 2))[:, 0]
        return TiltedMoments(log_z, dmean, dvar)

    def _gh_expected(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        """Product Gauss-Hermite; ``dmean = E[g]``, ``dvar = E[h] / 2`` (Price/Bonnet)."""
        N, C = mean.shape
        order = self._order(C)
        xp, dev = ops.namespace(mean), array_api_compat.device(mean)
        value = xp.empty((N,), dtype=mean.dtype, device=dev)
        dmean = xp.empty((N, C), dtype=mean.dtype, device=dev)
        dvar = xp.empty((N, C), dtype=mean.dtype, device=dev)
        for sl in chunk_slices(N, 4 * C * order ** (C - 1)):
            F, w = shift_invariant_rule(mean[sl], var[sl], order)
            lp, g, h = self._log_prob_grad_hess(y[sl], F)
            value[sl] = lp @ w
            dmean[sl] = w @ g
            dvar[sl] = 0.5 * (w @ h)
        return ExpectedLogProb(value, dmean, dvar)

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        return self._gh_tilted(y, mean, var, power)

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        return self._gh_expected(y, mean, var)

    def _variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None
    ) -> ExpectedLogProb:
        """Default: the ``expected_log_prob`` rule (override to offer other ``expectation``s)."""
        return self._expected_log_prob(y, mean, var)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        N, C = mean.shape
        return np.stack(
            [np.exp(self._tilted(np.full(N, c), mean, var, 1.0).log_z) for c in range(C)], axis=1
        )

    def _log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        return self._tilted(y, mean, var, 1.0).log_z

    # -- public API ----------------------------------------------------------------------------
    def log_prob(self, y: Array, F: Array) -> Array:
        """``log p(y_n | F_n)``, ``[N]``; ``F`` is ``[N, C]``."""
        F = check_latent(F, "F", 2)
        if F.shape[1] < 2:
            raise InputError(
                f"a multi-class likelihood needs at least 2 latent columns, got {F.shape}"
            )
        return self._log_prob(check_labels(y, F.shape[1], F.shape[0]), F)

    def tilted(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> TiltedMoments:
        """``log Z`` ``[N]``, its ``mean``/``var`` derivatives ``[N, C]`` (tilt ``p^power``)."""
        y, mean, var = self._check_inputs(y, mean, var)
        return self._tilted(y, mean, var, check_power(power))

    def expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        """``E[log p(y|f)]`` ``[N]`` under ``N(mean, diag var)`` and its derivatives ``[N, C]``."""
        y, mean, var = self._check_inputs(y, mean, var)
        return self._expected_log_prob(y, mean, var)

    def variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None = None
    ) -> ExpectedLogProb:
        """``expected_log_prob`` by this likelihood's ``expectation`` rule (``[N]``, ``[N, C]``)."""
        y, mean, var = self._check_inputs(y, mean, var)
        require_rule_backend(self, mean, mean.shape[1])
        return self._variational_expectations(y, mean, var, rng)

    def predict_proba(self, mean: Array, var: Array) -> Array:
        """``p(y = c)`` ``[N, C]`` under ``f ~ N(mean, diag var)``; rows sum to one."""
        mean, var = check_mean_var(mean, var, 2)
        if mean.shape[1] < 2:
            raise InputError(
                f"a multi-class likelihood needs at least 2 latent columns, got {mean.shape}"
            )
        return self._predict_proba(mean, var)

    def log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        """``log int p(y_n | f) N(f | mean_n, diag var_n) df``, ``[N]``, computed in log space."""
        y, mean, var = self._check_inputs(y, mean, var)
        return self._log_predictive(y, mean, var)


# --------------------------------------------------------------------------------------------
# Argmax with Gaussian noise, multinomial probit
# --------------------------------------------------------------------------------------------


class ArgmaxNoise(MulticlassLikelihood):
    """``p(y | f) = P(f_y + eps_y > f_k + eps_k, all k != y)``, ``eps_c ~ N(0, noise_variance_c)``.

    ``noise_variance``: a scalar or one value per class, all zero or all positive. Zero (the
    default) means the noise lives in the kernel, as in the EP/SEP spec: the likelihood is the
    Heaviside product, ``log_prob`` is 0 or ``-inf``, ``expected_log_prob`` is undefined (use
    ``RobustMax``), and the tilted/predictive quantities are those of the latent Gaussians.
    The noise is fixed (no unconstrained parameters); its gradient equals ``dlogz_dvar``.

    Power one (and any power without noise): ``argmax_probability`` on ``var + noise``. Power
    != 1 with noise, and the expected log-likelihood: product Gauss-Hermite over ``f`` of
    ``log p(y|f)`` (itself ``argmax_probability`` with variances ``noise``); derivatives
    ``grad = dlogP/dmean`` and Hessian diagonal ``2 dlogP/dvar - grad^2`` (heat equation).
    That nested route uses ``MULTICLASS_NESTED_GH_NODE_BUDGET`` outer nodes (32 per dimension at
    ``C = 3``); measured at ``C = 3``, unit noise, against 100 nodes per dimension: errors ~1e-10
    for latent variances ~1, ~3e-7 at ~3, ~1e-3 at ~10; cost ~15 ms per point and call.
    """

    name = "argmax"
    gh_budget = settings.MULTICLASS_NESTED_GH_NODE_BUDGET
    #: ``predict_proba`` and ``log_predictive`` (the 1-D quadrature) run on any array-API
    #: namespace: a posterior predicting on a GPU keeps its latent moments there
    device_predictions: ClassVar[bool] = True

    def __init__(self, noise_variance: float | Array = 0.0, gh_order: int | None = None):
        noise = np.asarray(noise_variance, dtype=float)
        if noise.ndim > 1 or not np.all(np.isfinite(noise)) or np.any(noise < 0):
            raise InputError(
                "noise_variance must be a non-negative scalar or [C] vector, "
                f"got {noise_variance!r}"
            )
        if noise.ndim == 1 and np.any(noise == 0) and np.any(noise > 0):
            raise InputError(
                "noise_variance must be zero for all classes or positive for all classes"
            )
        self.noise_variance = noise
        self.gh_order = gh_order

    def __repr__(self) -> str:
        return f"{type(self).__name__}(noise_variance={self.noise_variance.tolist()})"

    def _noise(self, C: int) -> Array:
        noise = (
            np.broadcast_to(self.noise_variance, (C,))
            if self.noise_variance.ndim == 0
            else self.noise_variance
        )
        if noise.shape != (C,):
            raise InputError(
                f"noise_variance has {noise.shape[0]} entries but the data have {C} classes"
            )
        return noise

    def _noisy(self, C: int) -> bool:
        return bool(np.all(self._noise(C) > 0))

    def _log_prob(self, y: Array, F: Array) -> Array:
        N, C = F.shape
        if self._noisy(C):
            return argmax_log_probability(F, np.broadcast_to(self._noise(C), F.shape), y)
        others = F.copy()
        others[np.arange(N), y] = -np.inf
        return np.where(F[np.arange(N), y] > others.max(axis=1), 0.0, -np.inf)

    def _log_prob_grad_hess(self, y: Array, F: Array) -> tuple[Array, Array, Array]:
        B, Q, C = F.shape
        flat = F.reshape(B * Q, C)
        out = argmax_probability(flat, np.broadcast_to(self._noise(C), flat.shape), np.repeat(y, Q))
        grad = out.dmean.reshape(B, Q, C)
        hess = 2.0 * out.dvar.reshape(B, Q, C) - grad**2
        return out.log_p.reshape(B, Q), grad, hess

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        C = mean.shape[1]
        if power == 1.0 or not self._noisy(C):
            out = argmax_probability(mean, var + ops.like(var, self._noise(C)), y)
            return TiltedMoments(out.log_p, out.dmean, out.dvar)
        return self._gh_tilted(y, mean, var, power)

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        if not self._noisy(mean.shape[1]):
            raise InputError(
                "the expected log-likelihood of a noise-free argmax likelihood is -inf; "
                "use RobustMax (variational methods) or a positive noise_variance"
            )
        return self._gh_expected(y, mean, var)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        return argmax_class_probabilities(mean, var + ops.like(var, self._noise(mean.shape[1])))

    def _log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        # the power-one tilted log Z without its derivatives, on the pruned nodes
        total = var + ops.like(var, self._noise(mean.shape[1]))
        return argmax_log_probability(mean, total, y, prune=True)


class MultinomialProbit(ArgmaxNoise):
    """Multinomial probit: ``ArgmaxNoise`` with unit noise, ``y = argmax_c (f_c + eps_c)``."""

    name = "multinomial_probit"

    def __init__(self, noise_variance: float | Array = 1.0, gh_order: int | None = None):
        super().__init__(noise_variance, gh_order)
        if not np.all(self.noise_variance > 0):
            raise InputError(
                "MultinomialProbit needs a positive noise_variance (use ArgmaxNoise for 0)"
            )


# --------------------------------------------------------------------------------------------
# Robust-max
# --------------------------------------------------------------------------------------------


class RobustMax(MulticlassLikelihood):
    """``p(y | f) = (1 - epsilon) [y = argmax f] + epsilon / C`` (spec ep-sep §3.2), fixed epsilon.

    All Gaussian integrals reduce to ``P = P(f_y > f_k, all k != y)`` (``argmax_probability``):
    ``E[log p] = b + P (a - b)`` with ``a = log(1 - eps + eps/C)``, ``b = log(eps/C)``;
    ``Z(power) = (1 - P) e^{power b} + P e^{power a}`` exactly for any power;
    ``p(y = c) = (1 - eps) P_c + eps / C``.
    """

    name = "robustmax"
    expectation_rules = ("trapezoid", "log_space", "gauss_hermite")
    #: ``log_space`` (``argmax_probability``'s log-space rule) runs on numpy only
    expectation_backends = {"trapezoid": EVERY_BACKEND, "gauss_hermite": EVERY_BACKEND}
    expectation_settings = ("quadrature_points",)
    quadrature_points: int = settings.ROBUSTMAX_GAUSS_HERMITE_POINTS

    def __init__(self, epsilon: float = 1e-3, expectation: str = "trapezoid",
                 quadrature_points: int = settings.ROBUSTMAX_GAUSS_HERMITE_POINTS):
        epsilon = float(epsilon)
        if not 0.0 < epsilon < 1.0:
            raise InputError(f"RobustMax epsilon must be in (0, 1), got {epsilon!r}")
        self.epsilon = epsilon
        self.set_expectation(expectation, quadrature_points=quadrature_points)

    def __repr__(self) -> str:
        return f"RobustMax(epsilon={self.epsilon:g}, expectation={self.expectation!r})"

    def _variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None
    ) -> ExpectedLogProb:
        """``expectation``: ``"trapezoid"`` (default: the fast absolute-accuracy rule of
        ``robustmax_rules.argmax_probability_abs``), ``"log_space"`` (``expected_log_prob``,
        tail-accurate, ~7x slower at ``C = 10``) or ``"gauss_hermite"`` (``quadrature_points``
        nodes in ``f_y``; inaccurate for many classes or unequal variances).

        ``"trapezoid"`` and ``"gauss_hermite"`` take arrays of any array-API namespace (torch
        tensors: ``gpinfer.backend``); ``"log_space"`` runs on numpy only."""
        if self.expectation == "log_space":
            return self._expected_log_prob(y, mean, var)
        from gpinfer.likelihoods import robustmax_rules  # the module imports this one

        a, b = self._levels(mean.shape[1])
        if self.expectation == "gauss_hermite":
            P, dP_dm, dP_dv = robustmax_rules.argmax_probability_gh(
                mean, var, y, self.quadrature_points)
        else:
            P, dP_dm, dP_dv = robustmax_rules.argmax_probability_abs(mean, var, y)
        return ExpectedLogProb(b + (a - b) * P, (a - b) * dP_dm, (a - b) * dP_dv)

    def _levels(self, C: int) -> tuple[float, float]:
        return math.log(1.0 - self.epsilon + self.epsilon / C), math.log(self.epsilon / C)

    def _log_prob(self, y: Array, F: Array) -> Array:
        N, C = F.shape
        a, b = self._levels(C)
        others = F.copy()
        others[np.arange(N), y] = -np.inf
        return np.where(F[np.arange(N), y] > others.max(axis=1), a, b)

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        a, b = self._levels(mean.shape[1])
        P = argmax_probability(mean, var, y)
        with np.errstate(divide="ignore"):
            log_1mP = np.log1p(-np.exp(P.log_p))
        log_z = np.logaddexp(power * b + log_1mP, power * a + P.log_p)
        # dZ = (e^{pa} - e^{pb}) dP  =>  dlogZ = (1 - e^{p(b-a)}) e^{pa + log P - log Z} dlogP
        scale = (-np.expm1(power * (b - a)) * np.exp(power * a + P.log_p - log_z))[:, None]
        return TiltedMoments(log_z, scale * P.dmean, scale * P.dvar)

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        a, b = self._levels(mean.shape[1])
        P = argmax_probability(mean, var, y)
        p = np.exp(P.log_p)
        scale = ((a - b) * p)[:, None]
        return ExpectedLogProb(b + (a - b) * p, scale * P.dmean, scale * P.dvar)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        P = argmax_class_probabilities(mean, var)
        return (1.0 - self.epsilon) * P + self.epsilon / mean.shape[1]


# --------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------


def _softmax(F: Array) -> tuple[Array, Array]:
    """Softmax over the last axis of ``F [..., C]`` and the log-sum-exp ``[...]`` (any
    array-API namespace)."""
    xp = ops.namespace(F)
    top = xp.max(F, axis=-1, keepdims=True)
    e = xp.exp(F - top)
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / total, (top + xp.log(total))[..., 0]


class Softmax(MulticlassLikelihood):
    """``p(y | f) = exp(f_y) / sum_c exp(f_c)``; no parameters.

    ``C = 2``: the logistic of ``f_y - f_k`` through the exact 1-D engine (any power).
    ``C > 2``: product Gauss-Hermite on the complement of ``1`` (``gh_order`` nodes per
    dimension, default ``multiclass_gh_order(C)``: 90 for ``C = 3``, 20 for ``C = 4``).
    Deterministic; measured at ``C = 3`` against a 300-node rule, largest error of ``log Z``,
    its derivatives and the expected log-likelihood: ~1e-14 for latent variances ~1, ~2e-8 at
    ~3, ~6e-5 at ~10 (errors grow with the variance: raise ``gh_order`` for wide marginals).
    """

    name = "softmax"
    expectation_rules = ("gauss_hermite", "monte_carlo")
    #: two classes: Gauss-Hermite is the logistic's 1-D engine (numpy only)
    expectation_backends = {"gauss_hermite": EVERY_BACKEND, ("gauss_hermite", 2): NUMPY_ONLY,
                            "monte_carlo": EVERY_BACKEND}
    expectation_settings = ("mc_samples",)
    mc_samples: int = settings.SOFTMAX_MC_SAMPLES

    def __init__(self, gh_order: int | None = None, expectation: str = "gauss_hermite",
                 mc_samples: int = settings.SOFTMAX_MC_SAMPLES, seed: int | None = None):
        self.gh_order = gh_order
        self.set_expectation(expectation, mc_samples=mc_samples)
        self._rng = np.random.default_rng(seed)

    def _variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None
    ) -> ExpectedLogProb:
        """``expectation``: ``"gauss_hermite"`` (default: ``expected_log_prob``) or
        ``"monte_carlo"``: unbiased ``mc_samples`` reparameterised draws per point from ``rng``
        (else the likelihood's own generator, seeded by ``seed``), fresh at every call.

        ``f = m + sqrt(v) eps``: ``dE/dm = E[d l/df]``, ``dE/dv = E[(d l/df) eps] / (2 sqrt(v))``
        with ``d l/df = onehot(y) - softmax(f)``.

        Both take arrays of any array-API namespace (torch: ``gpinfer.backend``; the Monte-Carlo
        draws come from the host generator, so numpy and torch see the same numbers), except
        ``"gauss_hermite"`` with two classes (the logistic's 1-D engine, numpy only).
        """
        if self.expectation != "monte_carlo":
            return self._expected_log_prob(y, mean, var)
        rng = self._rng if rng is None else rng
        xp = ops.namespace(mean)
        B, C = mean.shape
        rows = ops.index_like(mean, np.arange(B))
        y = ops.index_like(mean, y)
        sd = xp.sqrt(var)
        eps = ops.like(mean, rng.standard_normal((B, int(self.mc_samples), C)))
        F = mean[:, None, :] + sd[:, None, :] * eps
        top = xp.max(F, axis=2, keepdims=True)
        e = xp.exp(F - top)
        total = xp.sum(e, axis=2, keepdims=True)
        ll = F[rows, :, y] - (top + xp.log(total))[:, :, 0]  # [B, S]
        g = -(e / total)
        g[rows, :, y] += 1.0
        return ExpectedLogProb(xp.mean(ll, axis=1), xp.mean(g, axis=1),
                               xp.mean(g * eps, axis=1) / (2.0 * sd))

    def _log_prob(self, y: Array, F: Array) -> Array:
        return F[np.arange(F.shape[0]), y] - logsumexp(F, axis=1)

    def _log_prob_grad_hess(self, y: Array, F: Array) -> tuple[Array, Array, Array]:
        """Any array-API namespace (``F [B, Q, C]``; host or backend labels ``y [B]``)."""
        B, Q, C = F.shape
        p, lse = _softmax(F)
        rows = ops.index_like(F, np.arange(B))
        y = ops.index_like(F, y)
        onehot = ops.zeros(F, (B, 1, C))
        onehot[rows, 0, y] = 1.0
        log_p = F[rows, :, y]  # [B, Q]
        return log_p - lse, onehot - p, -p * (1.0 - p)

    @staticmethod
    def _pair(y: Array, mean: Array, var: Array) -> tuple[Array, Array, Array]:
        rows = np.arange(mean.shape[0])
        sign = np.where(np.arange(2)[None, :] == y[:, None], 1.0, -1.0)  # +1 winner, -1 other
        return sign, mean[rows, y] - mean[rows, 1 - y], var.sum(axis=1)

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        if mean.shape[1] != 2:
            return self._gh_tilted(y, mean, var, power)
        sign, m, v = self._pair(y, mean, var)
        out = sigmoid_tilted(LOGISTIC, m, v, power)
        dvar = 0.5 * (out.d2 + out.d1**2)
        return TiltedMoments(out.log_z, sign * out.d1[:, None], np.repeat(dvar[:, None], 2, axis=1))

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        if mean.shape[1] != 2:
            return self._gh_expected(y, mean, var)
        sign, m, v = self._pair(y, mean, var)
        E0, E1, E2 = sigmoid_expectations(LOGISTIC, m, v, 2)
        return ExpectedLogProb(E0, sign * E1[:, None], np.repeat(0.5 * E2[:, None], 2, axis=1))

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        N, C = mean.shape
        if C == 2:
            P = super()._predict_proba(mean, var)
            return P / P.sum(axis=1, keepdims=True)
        order = self._order(C)
        out = np.empty((N, C))
        for sl in chunk_slices(N, 3 * C * order ** (C - 1)):
            F, w = shift_invariant_rule(mean[sl], var[sl], order)
            out[sl] = w @ _softmax(F)[0]
        return out
