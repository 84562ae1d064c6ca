"""Absolute-accuracy rules for ``P(f_y > f_k, all k != y)``: the robust-max ``expectation`` rules.

``RobustMax.variational_expectations`` (svi's ELBO) uses ``argmax_probability_abs`` (rule
``"trapezoid"``, the default) or ``argmax_probability_gh`` (rule ``"gauss_hermite"``); the
log-space reference is ``multiclass.argmax_probability``.

The trapezoid: a plain 1-D trapezoid in the label's latent.

``E[log p(y | f)] = b + (a - b) P`` with ``P = P(f_y > f_k, all k != y)`` (spec ep-sep §3.2).
The ELBO needs ``P`` and its derivatives to an *absolute* accuracy only (never ``log P``), so
the mode-centred log-space rule of ``gpinfer.likelihoods.multiclass.argmax_probability`` (built
for tail-accurate ``log P`` in predictions and EP) is not needed here. With ``f_y = m_y + s_y t``:

``P = int N(t) prod_{k != y} Phi(d_k + rho_k t) dt``, ``d_k = (m_y - m_k) / s_k``,
``rho_k = s_y / s_k``,

integrated by the trapezoid rule on the fixed window ``|t| <= window`` (the mass outside is
``2 Phi(-window)``, 2.6e-12 at 7). Step: the trapezoid error for this entire integrand behaves
like ``exp(-2 pi^2 / (h^2 kappa))`` with ``kappa = 1 + sum_k rho_k^2`` (its growth off the real
axis), so ``h = constant / sqrt(kappa)``, rounded down to ``constant / (q / 4)`` with an integer
``q`` so that the nodes are piecewise constant in the parameters. Many classes (``kappa ~ C``)
or a much smaller variance of another class (a sharp ``Phi`` factor) get finer nodes; a plain
Gauss-Hermite rule in ``t`` ignores both and fails (20 nodes at ``C = 10``: errors ~1e-4 with
equal variances, O(1) in the derivatives with unequal ones; spec ep-sep §2.10). The derivatives
are exact derivatives of the discretised ``P`` (spec ep-sep §3.2):

``dP/dm_k = -sum W r_k / s_k``, ``dP/dv_k = -sum W r_k z_k / (2 s_k^2)``,
``dP/dm_y = sum W sum_k r_k / s_k``, ``dP/dv_y = sum W t sum_k r_k / s_k / (2 s_y)``,

with ``W_q = w_q prod_k Phi(z_qk)``, ``z_qk = d_k + rho_k t_q`` and ``r = phi / Phi``; ``W r_k``
is formed as ``w prod_{j != k} Phi_j phi_k`` (prefix/suffix products), so it never divides by an
underflowed ``Phi``. One ``ndtr`` and one ``exp`` per node and class: ~7x cheaper than the
likelihood's rule at ``C = 10``, with absolute errors ~1e-9 against it (tests
``tests/likelihoods/test_robustmax_rules.py``).

Both rules take arrays of any array-API namespace (numpy, torch on a CPU or GPU:
``gpinfer.backend``) and return arrays of it. The trapezoid reads its rows' step levels on the
host (one device sync per call) and runs rows of nearby levels together on one padded node array
(``padded_groups``): every row of a group on the nodes ``h_b k``, ``|k| <= `` the group's largest
half-count, with weight exactly 0 beyond the row's own grid (``_padded_grids``), so a group equals
its rows evaluated alone to round-off. The grouping trades the padded nodes against a group's
fixed cost (``GROUP_COST_NODES``): a digits svi batch (7..14 levels after 3 epochs) runs in
3-4 groups, 1.1x faster than one per level; one padded group would cost 1.4x. It reuses its
``[K, b, n]`` buffers through ``out=`` (outside the array API standard, but numpy's and torch's
``multiply`` and ``exp`` both take it): fresh arrays of that size cost page faults at every call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpinfer.backend import ops
from gpinfer.likelihoods.multiclass import label_contrasts
from gpinfer.numerics.quadrature import chunk_slices, gauss_hermite

Array = Any

#: trapezoid step times ``sqrt(kappa)``, ``kappa = 1 + sum_k rho_k^2`` (see ``step_levels``)
ROBUSTMAX_STEP_CONSTANT = 0.8
#: half-width of the integration window in standard deviations of ``f_y``
ROBUSTMAX_WINDOW = 7.0
#: the step is ``constant / (STEP_QUANTUM q)`` with ``q = ceil(sqrt(kappa) / STEP_QUANTUM)``
STEP_QUANTUM = 0.25
#: cap of ``sqrt(kappa)`` (standard-deviation ratios beyond ~256 get no finer nodes)
ROBUSTMAX_MAX_SQRT_KAPPA = 256.0

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _grid(step: float, window: float) -> tuple[Array, Array]:
    """Trapezoid nodes ``t [n]`` on ``[-window, window]``, weights ``step N(t)`` (ends halved)."""
    half = int(math.ceil(window / step))
    t = step * np.arange(-half, half + 1)
    w = step * _INV_SQRT_2PI * np.exp(-0.5 * t * t)
    w[[0, -1]] *= 0.5
    return t, w


#: the fixed cost of one padded group of rows in row-nodes (its ~20 operators per class slab
#: cost about as much as this many nodes of one row: digits svi batches, numpy on one core,
#: 300..600 equally fast, 0 (a group per level) 1.2x and 1 group 1.4x slower than 400)
GROUP_COST_NODES = 400


def padded_groups(halves: np.ndarray, group_cost: int | None = None
                  ) -> list[tuple[np.ndarray, int]]:
    """Rows grouped by their node half-counts ``halves [B]`` (host ints): ``(rows, half)`` per
    group, each group run on ``2 half + 1`` nodes (its largest row's), the grouping of
    consecutive levels that minimises ``sum (group_cost + rows (2 half + 1))`` (dynamic
    programme over the distinct levels; one group when the levels are close, one per level
    when each holds many rows)."""
    group_cost = GROUP_COST_NODES if group_cost is None else group_cost
    levels, counts = np.unique(halves, return_counts=True)
    L = levels.size
    best, cut = [0.0] + [math.inf] * L, [0] * (L + 1)  # best[j]: levels[:j] grouped
    for j in range(1, L + 1):
        n = 2 * int(levels[j - 1]) + 1
        count = 0
        for i in range(j - 1, -1, -1):  # group levels[i:j]
            count += int(counts[i])
            cost = best[i] + group_cost + count * n
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds: list[tuple[int, int]] = []
    j = L
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    groups: list[tuple[np.ndarray, int]] = []
    for i, j in reversed(bounds):
        rows = np.flatnonzero((halves >= levels[i]) & (halves <= levels[j - 1]))
        groups.append((rows, int(levels[j - 1])))
    return groups


def _padded_grids(ref: Array, steps: Array, window: float, half_max: int
                  ) -> tuple[Array, Array]:
    """Every row's trapezoid nodes on one array: ``t [B, n]`` ``= steps[:, None] * k`` for
    ``k = -half_max .. half_max`` (``n = 2 half_max + 1``), weights ``w [B, n]`` those of
    ``_grid(steps[b], window)`` at a row's own nodes ``|k| <= ceil(window / steps[b])`` and
    exactly 0 beyond them; in ``ref``'s namespace and dtype, from ``steps [B]`` of any dtype
    (formed in float64 as ``_grid`` does, no host read)."""
    xp = ops.namespace(steps)
    k = ops.constant(ref, tuple(range(-half_max, half_max + 1)))
    h = xp.astype(steps, xp.float64)
    k64 = xp.astype(k, h.dtype)
    t = h[:, None] * k64
    w = (h * _INV_SQRT_2PI)[:, None] * xp.exp(-0.5 * t * t)
    span = xp.abs(k64) - xp.ceil(window / h)[:, None]  # <= 0 on a row's own grid, 0 at its ends
    w = xp.where(span < 0.0, w, xp.where(span == 0.0, 0.5 * w, xp.zeros_like(w)))
    return xp.astype(t, ref.dtype), xp.astype(w, ref.dtype)


def _exclusive_products(Phi: Array) -> Array:
    """``prod_{j != k} Phi[j]`` for every ``k`` along axis 0 of ``Phi [K, ...]`` (prefix times
    suffix products, no division)."""
    xp = ops.namespace(Phi)
    K = Phi.shape[0]
    out = xp.empty_like(Phi)
    out[0] = 1.0
    for k in range(1, K):
        xp.multiply(out[k - 1], Phi[k - 1], out=out[k])
    suffix = ops.copy(Phi[-1])  # prod_{j > k} Phi_j, from k = K - 2 down
    for k in range(K - 2, -1, -1):
        if k < K - 2:
            suffix *= Phi[k + 1]
        out[k] *= suffix
    return out


def step_levels(rho: Array, constant: float = ROBUSTMAX_STEP_CONSTANT) -> tuple[Array, Array]:
    """Per-row level ``q [B]`` (integer) and its step ``constant / (STEP_QUANTUM q)`` ``[B]``.

    The trapezoid error of ``int N(t) prod_k Phi(d_k + rho_k t) dt`` with step ``h`` behaves like
    ``exp(-2 pi^2 / (h^2 kappa))``, ``kappa = 1 + sum_k rho_k^2`` (the integrand's growth off the
    real axis), so the step scales as ``1 / sqrt(kappa)``; quantised so that the nodes are
    piecewise constant in the parameters.
    """
    xp = ops.namespace(rho)
    root = xp.minimum(xp.sqrt(1.0 + xp.sum(rho * rho, axis=1)), ROBUSTMAX_MAX_SQRT_KAPPA)
    q = xp.astype(xp.ceil(root / STEP_QUANTUM), xp.int64)
    return q, constant / (STEP_QUANTUM * q)


def argmax_probability_abs(
    mean: Array, var: Array, y: Array, constant: float = ROBUSTMAX_STEP_CONSTANT,
    window: float = ROBUSTMAX_WINDOW,
) -> tuple[Array, Array, Array]:
    """``P [B]``, ``dP/dmean [B, C]``, ``dP/dvar [B, C]`` for ``mean, var [B, C]``, ``y [B]``.

    Trapezoid on ``|t| <= window`` with the step of ``step_levels`` (``constant`` sets the
    accuracy: 0.9 gives ~1e-10 absolute, see the tests).
    """
    xp = ops.namespace(mean)
    B, C = mean.shape
    rows = ops.arange(mean, B)  # on a device: made once and kept
    others, sd_y, sd_o, d, rho = label_contrasts(mean, var, y)
    y = ops.index_like(mean, y) if ops.is_numpy(y) else y
    q, steps = step_levels(rho, constant)
    # the one host read (on a device one sync): the levels set the groups and their shapes
    halves = np.ceil(window / (ops.to_host(steps) if not ops.is_numpy(steps) else steps
                               ).astype(np.float64)).astype(np.int64)
    # class-major layout [K, b, n]: the products and sums over classes run on whole slabs
    d, rho, inv_sd = ops.copy(ops.mT(d)), ops.copy(ops.mT(rho)), 1.0 / ops.mT(sd_o)
    P = ops.empty(mean, (B,))
    dm_o, dv_o = ops.empty(mean, (C - 1, B)), ops.empty(mean, (C - 1, B))
    dm_y, dv_y = ops.empty(mean, (B,)), ops.empty(mean, (B,))
    for idx, half in padded_groups(halves):
        for sl in chunk_slices(idx.size, 4 * (2 * half + 1) * (C - 1)):
            ii = ops.index_like(mean, idx[sl]) if idx.size < B else sl
            t, w = _padded_grids(mean, steps[ii], window, half)  # [b, n], 0 beyond a row's
            z = d[:, ii, None] + rho[:, ii, None] * t  # [K, b, n]
            Phi = ops.ndtr(z)
            G = _exclusive_products(Phi)  # prod_{j != k} Phi_j
            P[ii] = xp.sum(G[0] * Phi[0] * w, axis=1)
            # G_k = w prod_{j != k} Phi_j phi_k / s_k = W r_k / s_k, never dividing by Phi
            xp.multiply(z, z, out=Phi)  # reuse the buffer: phi(z) up to 1 / sqrt(2 pi)
            Phi *= -0.5
            xp.exp(Phi, out=Phi)
            G *= Phi
            w *= _INV_SQRT_2PI
            G *= w
            G *= inv_sd[:, ii, None]
            sum_g = G.sum(axis=0)  # [b, n]
            dm_o[:, ii] = -G.sum(axis=2)
            dm_y[ii] = sum_g.sum(axis=1)
            dv_y[ii] = xp.sum(sum_g * t, axis=1) / (2.0 * sd_y[ii])
            G *= z
            dv_o[:, ii] = -G.sum(axis=2) * (0.5 * inv_sd[:, ii])
    P = xp.minimum(P, 1.0)
    dmean, dvar = ops.empty(mean, (B, C)), ops.empty(mean, (B, C))
    dmean[others] = xp.reshape(ops.mT(dm_o), (-1,))
    dvar[others] = xp.reshape(ops.mT(dv_o), (-1,))
    dmean[rows, y], dvar[rows, y] = dm_y, dv_y
    return P, dmean, dvar


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def argmax_probability_gh(mean: Array, var: Array, y: Array, n_nodes: int
                          ) -> tuple[Array, Array, Array]:
    """``P [B]``, ``dP/dmean [B, C]``, ``dP/dvar [B, C]`` by ``n_nodes``-point Gauss-Hermite in
    ``f_y``: ``P = E_t[prod_{c != y} Phi(z_c)]``, ``z_c = (m_y + s_y t - m_c) / s_c``.

    Derivatives of the same discretised ``P`` (exact for it): with ``r = phi/Phi (z)``,
    ``dP/dm_c = -E[prod r_c] / s_c``, ``dP/dv_c = -E[prod r_c z_c] / (2 s_c^2)``,
    ``dP/dm_y = E[prod sum_c r_c / s_c]``, ``dP/dv_y = E[prod t sum_c r_c / s_c] / (2 s_y)``.
    Fast but inaccurate for many classes or unequal variances (spec ep-sep §2.10).
    """
    xp = ops.namespace(mean)
    x, w = (ops.constant(mean, tuple(v.tolist())) for v in gauss_hermite(int(n_nodes)))
    y = ops.index_like(mean, y) if ops.is_numpy(y) else y
    B, C = mean.shape
    rows = ops.arange(mean, B)
    sd = xp.sqrt(var)
    m_y, sd_y = mean[rows, y], sd[rows, y]
    fy = m_y[:, None] + sd_y[:, None] * x  # [B, K]
    z = (fy[:, :, None] - mean[:, None, :]) / sd[:, None, :]  # [B, K, C]
    z[rows, :, y] = 40.0  # own class: Phi = 1 and r = 0 to double precision
    log_Phi = ops.log_ndtr(z)
    wprod = xp.exp(xp.sum(log_Phi, axis=2)) * w  # [B, K]
    r = xp.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_Phi)  # phi/Phi, 0 at z = inf
    r /= sd[:, None, :]
    P = xp.sum(wprod, axis=1)
    dmean = -ops.einsum("bk,bkc->bc", wprod, r)
    dvar = -ops.einsum("bk,bkc->bc", wprod, r * z) / (2.0 * sd)
    sum_r = xp.sum(r, axis=2)  # [B, K]
    dmean[rows, y] = ops.einsum("bk,bk->b", wprod, sum_r)
    dvar[rows, y] = ops.einsum("bk,bk->b", wprod * x, sum_r) / (2.0 * sd_y)
    return P, dmean, dvar
