"""Quadrature: Gauss-Hermite and Gauss-Legendre rules and the 1-D Gaussian-integral engine.

* ``gauss_hermite(n)``: cached probabilists' rule for ``E_{N(0,1)}[g(x)]`` (weights sum to one).
* ``gauss_legendre(n)`` and ``composite_gauss_legendre(lo, hi, ...)``: panels on ``[lo, hi]``,
  vectorised over intervals.
* The engine of spec binary §1.3 for a log-sigmoid likelihood ``psi(t) = log sig(t)``:
  ``sigmoid_tilted`` (``log Z`` of ``sig(t)^alpha N(t | m, s^2)`` and its first two
  ``m``-derivatives, Stein form, in log space) and ``sigmoid_expectations``
  (``E_k = E_{N(t|m,s^2)}[psi^(k)(t)]``). Everything is computed in the standardised variable
  ``x = (t - m) / s`` with a fixed node count per point, so any ``s > 0`` works.
* ``shift_invariant_rule``: a product Gauss-Hermite rule on the ``C - 1`` dimensional subspace
  orthogonal to the ones vector, for expectations of shift-invariant functions of ``C``
  independent Gaussians (multi-class likelihoods, spec ivm §2.5 "reduced rule").
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss
from scipy.special import log_ndtr

from gpinfer.backend import ops
from gpinfer.errors import NumericalError
from gpinfer.numerics import settings
from gpinfer.numerics.normal import log_phi

Array = np.ndarray


# --------------------------------------------------------------------------------------------
# Basic rules
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def gauss_hermite(n: int) -> tuple[Array, Array]:
    """Probabilists' Gauss-Hermite rule: ``E_{N(0,1)}[g(x)] ~ sum_k w_k g(x_k)``, ``[n]`` each.

    The weights sum to one. Exact for polynomials of degree ``<= 2n - 1``. Read-only arrays.
    """
    if not 1 <= n <= settings.GAUSS_HERMITE_MAX_POINTS:
        raise ValueError(
            f"a Gauss-Hermite rule needs 1..{settings.GAUSS_HERMITE_MAX_POINTS} nodes, got {n}"
        )
    x, w = hermegauss(n)
    w = w / w.sum()
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def gauss_hermite_expectation(
    g: Callable[[Array], Array],
    mean: Array,
    var: Array,
    n: int = settings.GAUSS_HERMITE_POINTS,
) -> Array:
    """``E_{N(f | mean, var)}[g(f)]`` by ``n``-point Gauss-Hermite.

    ``mean`` and ``var`` broadcast to a common shape ``S``; ``g`` maps an array ``[*S, n]`` of
    nodes to values of the same shape. Returns ``[*S]``. Accurate when ``g`` varies slowly on the
    scale ``sqrt(var)``; for step-like integrands use the engine below.
    """
    x, w = gauss_hermite(n)
    mean, var = np.broadcast_arrays(np.asarray(mean, float), np.asarray(var, float))
    f = mean[..., None] + np.sqrt(var)[..., None] * x
    return np.sum(w * g(f), axis=-1)


@lru_cache(maxsize=64)
def gauss_legendre(n: int) -> tuple[Array, Array]:
    """Gauss-Legendre nodes and weights on ``[-1, 1]``, ``[n]`` each (read-only)."""
    if n < 1:
        raise ValueError(f"a Gauss-Legendre rule needs n >= 1 nodes, got {n}")
    x, w = leggauss(n)
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def gauss_legendre_panels(
    edges: Array, n_nodes: int = settings.ENGINE_PANEL_NODES
) -> tuple[Array, Array]:
    """Gauss-Legendre on the panels between consecutive ``edges [B, P+1]`` (non-decreasing rows).

    Returns nodes ``[B, P * n_nodes]`` and log weights of the same shape; an empty panel gets
    log weight ``-inf`` (and finite nodes), so it contributes nothing to a ``logsumexp``.
    """
    edges = np.asarray(edges, dtype=float)
    z, w = gauss_legendre(n_nodes)
    left = edges[:, :-1]
    width = np.maximum(edges[:, 1:] - left, 0.0)  # [B, P]
    nodes = left[:, :, None] + (0.5 * width)[:, :, None] * (z + 1.0)  # [B, P, n]
    with np.errstate(divide="ignore"):
        log_w = np.log(0.5 * width)[:, :, None] + np.log(w)  # -inf where width = 0
    shape = (edges.shape[0], -1)
    return nodes.reshape(shape), log_w.reshape(shape)


def composite_gauss_legendre(
    lo: Array, hi: Array, n_panels: int, n_nodes: int = settings.ENGINE_PANEL_NODES
) -> tuple[Array, Array]:
    """Composite Gauss-Legendre on ``[lo_b, hi_b]`` with equal panels, for ``B`` intervals at once.

    ``lo``, ``hi``: ``[B]``. Returns nodes ``[B, n_panels * n_nodes]`` and log weights of the
    same shape. An empty or reversed interval (``hi <= lo``) gets log weight ``-inf`` and nodes at
    ``lo`` (finite), so it contributes nothing to a ``logsumexp``.
    """
    lo = np.asarray(lo, dtype=float).reshape(-1)
    hi = np.asarray(hi, dtype=float).reshape(-1)
    width = np.maximum(hi - lo, 0.0)
    unit, log_unit = _unit_composite_rule(n_panels, n_nodes)
    with np.errstate(divide="ignore"):
        log_width = np.log(width)  # -inf where the interval is empty
    return lo[:, None] + width[:, None] * unit, log_width[:, None] + log_unit


@lru_cache(maxsize=16)
def _unit_composite_rule(n_panels: int, n_nodes: int) -> tuple[Array, Array]:
    """Nodes ``[n_panels * n_nodes]`` and log weights: equal-panel Gauss-Legendre on ``[0, 1]``."""
    nodes, log_w = gauss_legendre_panels(np.linspace(0.0, 1.0, n_panels + 1)[None, :], n_nodes)
    nodes, log_w = nodes[0], log_w[0]
    nodes.setflags(write=False)
    log_w.setflags(write=False)
    return nodes, log_w


def graded_edges(lo: Array, hi: Array, m: Array, s: Array, cut: float) -> Array:
    """Panel edges ``[B, P+1]`` in ``x`` for a left outer segment ``t = m + s x <= -cut``.

    The union of ``ENGINE_OUTER_PANELS`` equal panels on ``[lo, hi]`` (resolving the Gaussian) and
    ``ENGINE_GRADED_PANELS`` panels whose ``t``-edges grow geometrically from ``-cut`` to the far
    end (resolving a likelihood whose derivatives vary on the scale ``|t|``, such as the probit's
    ``1/t^2`` tails), clipped to ``[lo, hi]`` and sorted.
    """
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    width = np.maximum(hi - lo, 0.0)
    uniform = lo[:, None] + width[:, None] * np.linspace(0.0, 1.0, settings.ENGINE_OUTER_PANELS + 1)
    far = np.maximum(-(m + s * lo), cut)  # |t| at the far end
    levels = np.linspace(0.0, 1.0, settings.ENGINE_GRADED_PANELS + 1)[1:-1]
    t_edges = -cut * (far / cut)[:, None] ** levels  # [B, G-1], from -cut outwards
    graded = np.clip((t_edges - m[:, None]) / s[:, None], lo[:, None], lo[:, None] + width[:, None])
    return np.sort(np.concatenate([uniform, graded], axis=1), axis=1)


def checked_gaussians(h: Array, cov: Array, full: bool) -> tuple[Array, Array]:
    """Float copies of a batch of Gaussians' means ``h [B, C]`` and covariances ``cov``:
    ``[B, C, C]`` where ``full``, else the marginal variances ``[B, C]``.

    ``ValueError`` on other shapes, ``NumericalError`` on a non-finite entry.
    """
    h = np.asarray(h, dtype=float)
    cov = np.asarray(cov, dtype=float)
    need = "A [B, C, C]" if full else "a [B, C]"
    if h.ndim != 2 or cov.shape != (h.shape + h.shape[1:] if full else h.shape):
        raise ValueError(f"need h [B, C] and {need}, got {h.shape} and {cov.shape}")
    if not (np.all(np.isfinite(h)) and np.all(np.isfinite(cov))):
        what = "covariance" if full else "variance"
        raise NumericalError(f"non-finite Gaussian mean or {what}", quantity="quadrature")
    return h, cov


def chunk_slices(n_rows: int, floats_per_row: int,
                 max_floats: int = settings.QUADRATURE_CHUNK_FLOATS) -> Iterator[slice]:
    """Row slices such that each block holds at most ``max_floats`` floats (at least one row;
    ``settings.CACHE_BLOCK_FLOATS`` for cache-sized blocks)."""
    step = max(1, int(max_floats) // max(1, floats_per_row))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


# --------------------------------------------------------------------------------------------
# Tilted quantities from weighted nodes (Stein forms)
# --------------------------------------------------------------------------------------------


class TiltedScalars(NamedTuple):
    """``log Z`` and the first two derivatives of ``log Z`` wrt the cavity mean, ``[B]`` each."""

    log_z: Array
    d1: Array
    d2: Array


def row_logsumexp(lam: Array) -> Array:
    """``log sum exp`` of each row of a numpy ``lam [b, n]`` -> ``[b]`` (``-inf`` entries
    allowed; a row of ``-inf`` only gives ``-inf``): ``scipy.special.logsumexp``'s value to
    round-off without its per-call overhead (0.1-0.4 ms, paid per site or per block in the
    quadrature loops: ``softmax_tilted``, the argmax predictions)."""
    peak = np.max(lam, axis=1)
    shift = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):  # a row of -inf only: log 0 = -inf, its value
        return shift + np.log(np.sum(np.exp(lam - shift[:, None]), axis=1))


def tilted_from_nodes(log_w: Array, l1: Array, l2: Array) -> TiltedScalars:
    """Combine nodes of a tilted integral ``Z = sum_k exp(log_w_k)``, all arrays ``[B, K]``.

    ``log_w`` holds the log of (quadrature weight x cavity density x likelihood^power) at each
    node, ``l1``/``l2`` the first/second derivative of the log of the likelihood^power there. With
    responsibilities ``pi = softmax(log_w)``: ``d1 = E[l1]`` and, cancellation free,
    ``d2 = E[l2] + E[(l1 - d1)^2]`` (spec binary §1.2, Stein forms).
    """
    top = np.max(log_w, axis=1, keepdims=True)  # logsumexp by hand: scipy's has ~0.1 ms
    top[~np.isfinite(top)] = 0.0                 # of overhead, paid per site in EP sweeps
    e = np.exp(log_w - top)
    total = np.sum(e, axis=1)
    with np.errstate(divide="ignore"):
        log_z = np.log(total) + top[:, 0]
    pi = e / total[:, None]
    d1 = np.sum(pi * l1, axis=1)
    d2 = np.sum(pi * l2, axis=1) + np.sum(pi * (l1 - d1[:, None]) ** 2, axis=1)
    return TiltedScalars(log_z, d1, d2)


def gauss_hermite_tilted(
    log_lik_derivs: Callable[[Array], tuple[Array, Array, Array]],
    mean: Array,
    var: Array,
    power: float = 1.0,
    n: int = settings.GAUSS_HERMITE_POINTS,
) -> TiltedScalars:
    """Tilted quantities of ``p(f)^power N(f | mean, var)`` by log-space Gauss-Hermite, ``[B]``.

    ``log_lik_derivs(F)`` returns ``(log p, d log p/df, d^2 log p/df^2)`` at nodes ``F [B, n]``.
    Fine for smooth likelihoods and moderate variances (``var <~ 1`` on the likelihood's scale).
    """
    x, w = gauss_hermite(n)
    mean = np.asarray(mean, dtype=float).reshape(-1)
    var = np.asarray(var, dtype=float).reshape(-1)
    f = mean[:, None] + np.sqrt(var)[:, None] * x
    l0, l1, l2 = log_lik_derivs(f)
    return tilted_from_nodes(np.log(w) + power * l0, power * l1, power * l2)


# --------------------------------------------------------------------------------------------
# The 1-D Gaussian-integral engine for log-sigmoid likelihoods (spec binary §1.3)
# --------------------------------------------------------------------------------------------


class LogSigmoid(abc.ABC):
    """``psi(t) = log sig(t)`` of an increasing, log-concave sigmoid with ``sig(-t) = 1 - sig(t)``.

    * ``right_cut``: ``psi(t) = 0`` to double precision for ``t > right_cut``.
    * ``left_linear_cut``: ``psi(t) = t`` to double precision for ``t < -left_linear_cut``
      (logistic), or ``None`` when the left tail has no such form (probit). In that case the
      engine needs ``-psi''`` non-increasing in ``t`` (true for the probit).
    """

    right_cut: float
    left_linear_cut: float | None = None

    @abc.abstractmethod
    def derivatives(self, t: Array, order: int) -> tuple[Array, ...]:
        """``(psi, psi', ..., psi^(order))`` at ``t`` (any shape), ``order <= 4``."""


def _standardise(m: Array, s2: Array) -> tuple[Array, Array, tuple[int, ...]]:
    m, s2 = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(s2, dtype=float))
    shape = m.shape
    s = np.sqrt(np.maximum(s2, settings.VARIANCE_FLOOR)).reshape(-1)
    return m.reshape(-1), s, shape


def _tilted_mode(link: LogSigmoid, m: Array, s: Array, power: float) -> Array:
    """Mode ``x*`` of ``power * psi(m + s x) - x^2/2``, ``[B]``.

    The function is concave with curvature ``>= 1``; its derivative is positive at 0 and
    non-positive at ``power * s * psi'(m)``, which brackets a safeguarded Newton iteration.
    """
    lo = np.zeros_like(m)
    hi = power * s * link.derivatives(m, 1)[1]
    x = np.zeros_like(m)
    for _ in range(settings.ENGINE_MODE_ITERATIONS):
        _, d1, d2 = link.derivatives(m + s * x, 2)
        grad = power * s * d1 - x
        curv = 1.0 - power * s * s * d2
        lo = np.where(grad > 0, x, lo)
        hi = np.where(grad > 0, hi, x)
        step = grad / curv
        new = x + step
        outside = (new <= lo) | (new >= hi)
        new = np.where(outside, 0.5 * (lo + hi), new)
        done = np.abs(new - x) <= 1e-10 * (1.0 + np.abs(x))
        x = new
        if np.all(done):
            break
    return x


def _mode_panels(
    link: LogSigmoid, m: Array, s: Array, power: float, x_right: Array
) -> tuple[Array, Array]:
    """Nodes and log weights ``[B, K]`` for a link without a linear left tail (probit, any power).

    With ``x*`` the tilted mode and ``T = right_cut``, two panelled segments:

    * middle, ``t in [-T, T]``: ``x in [max(x(-T), x* - K), min(x(T), x* + K)]`` (the
      log-integrand has curvature ``>= 1`` in ``x``, so ``x* +- K`` holds all the mass), with
      ``ENGINE_MIDDLE_PANELS`` panels: at most ``2T / 96`` wide in ``t``, ``2K / 96`` in ``x``;
    * left, ``t < -T``: there ``-psi'' >= gamma_T := -psi''(-T)`` (non-increasing curvature), so
      the log-integrand has curvature ``>= H = 1 + power s^2 gamma_T``; with
      ``x_c = min(x*, x(-T))``
      the segment is ``[x_c - K/sqrt(H), min(x_c + K/sqrt(H), x(-T))]`` with
      ``ENGINE_OUTER_PANELS`` panels.
    """
    K = settings.ENGINE_WINDOW_SD
    x_mode = _tilted_mode(link, m, s, power)
    x_left = (-link.right_cut - m) / s
    gamma_T = -link.derivatives(np.array([-link.right_cut]), 2)[2][0]
    half = K / np.sqrt(1.0 + power * s * s * gamma_T)
    x_c = np.minimum(x_mode, x_left)
    left = composite_gauss_legendre(
        x_c - half, np.minimum(x_c + half, x_left), settings.ENGINE_OUTER_PANELS
    )
    middle = composite_gauss_legendre(
        np.maximum(x_left, x_mode - K),
        np.minimum(x_right, x_mode + K),
        settings.ENGINE_MIDDLE_PANELS,
    )
    return np.concatenate([left[0], middle[0]], axis=1), np.concatenate(
        [left[1], middle[1]], axis=1
    )


def sigmoid_tilted(link: LogSigmoid, m: Array, s2: Array, power: float = 1.0) -> TiltedScalars:
    """``log Z``, ``d1 = d log Z / dm``, ``d2 = d^2 log Z / dm^2`` of ``sig(t)^power N(t | m, s2)``.

    ``m``, ``s2`` broadcast to a shape ``S``; each output has shape ``S``. In ``x = (t - m)/s``:

    * logistic-type links (``left_linear_cut`` set; spec binary §1.3): analytic right tail
      ``log Phi((m - T)/s)`` and left tail
      ``power m + power^2 s^2/2 + log Phi((-T - m - power s^2)/s)``,
      composite Gauss-Legendre (``ENGINE_MIDDLE_PANELS`` x ``ENGINE_PANEL_NODES``) on
      ``[max(-K, (-T - m)/s), min(power s + K, (T - m)/s)]``, ``K = ENGINE_WINDOW_SD``;
    * other links (probit with ``power != 1``): analytic right tail and two panelled segments
      placed from the tilted mode (``_mode_panels``).

    ``d2`` uses the Stein form ``E[l''] + Var[l']`` under the tilted density (no cancellation).
    """
    if not power > 0:
        raise ValueError(f"power must be positive, got {power}")
    m, s, shape = _standardise(m, s2)
    K = settings.ENGINE_WINDOW_SD
    T_right = link.right_cut
    x_right = (T_right - m) / s
    pieces_w = [log_ndtr((m - T_right) / s)]  # t > T_right: psi = psi' = psi'' = 0
    pieces_l1 = [np.zeros_like(m)]
    if link.left_linear_cut is not None:
        T_left = link.left_linear_cut
        x_lo = np.maximum(-K, (-T_left - m) / s)
        x_hi = np.minimum(power * s + K, x_right)
        # t < -T_left: psi = t, so sig^a N(t|m,s2) = exp(a m + a^2 s2/2) N(t | m + a s2, s2)
        pieces_w.append(
            power * m + 0.5 * (power * s) ** 2 + log_ndtr((-T_left - m) / s - power * s)
        )
        pieces_l1.append(np.full_like(m, power))
        x, log_w = composite_gauss_legendre(x_lo, x_hi, settings.ENGINE_MIDDLE_PANELS)
    else:
        x, log_w = _mode_panels(link, m, s, power, x_right)
    psi, dpsi, d2psi = link.derivatives(m[:, None] + s[:, None] * x, 2)
    lam = np.concatenate([log_w + log_phi(x) + power * psi, np.stack(pieces_w, axis=1)], axis=1)
    l1 = np.concatenate([power * dpsi, np.stack(pieces_l1, axis=1)], axis=1)
    l2 = np.concatenate([power * d2psi, np.zeros((m.size, len(pieces_w)))], axis=1)
    out = tilted_from_nodes(lam, l1, l2)
    return TiltedScalars(*(a.reshape(shape) for a in out))


def sigmoid_expectations(
    link: LogSigmoid, m: Array, s2: Array, order: int = 2
) -> tuple[Array, ...]:
    """``(E_0, ..., E_order)``, ``E_k = E_{N(t | m, s2)}[psi^(k)(t)]`` (spec binary §1.3 step 3).

    Composite Gauss-Legendre on ``x in [-K, K]``, split where ``t = -T`` and ``t = T``
    (``T`` the link's cuts): ``ENGINE_MIDDLE_PANELS`` panels inside ``[-T, T]`` and
    ``ENGINE_OUTER_PANELS`` on each outer part, ``ENGINE_PANEL_NODES`` nodes each (1280 evaluations
    per point); for links without a linear left tail (probit) the left part also gets
    ``ENGINE_GRADED_PANELS`` panels graded in ``|t|`` (``graded_edges``). Outputs have the
    broadcast shape of ``m`` and ``s2``.
    """
    m, s, shape = _standardise(m, s2)
    K = settings.ENGINE_WINDOW_SD
    T_left = link.left_linear_cut if link.left_linear_cut is not None else link.right_cut
    xa = np.clip((-T_left - m) / s, -K, K)
    xb = np.clip((link.right_cut - m) / s, -K, K)
    lo, hi = np.full_like(m, -K), np.full_like(m, K)
    if link.left_linear_cut is None:  # psi is not linear there: grade the panels in |t|
        left = gauss_legendre_panels(graded_edges(lo, xa, m, s, T_left))
    else:
        left = composite_gauss_legendre(lo, xa, settings.ENGINE_OUTER_PANELS)
    segments = [
        left,
        composite_gauss_legendre(xa, xb, settings.ENGINE_MIDDLE_PANELS),
        composite_gauss_legendre(xb, hi, settings.ENGINE_OUTER_PANELS),
    ]
    x = np.concatenate([seg[0] for seg in segments], axis=1)
    weight = np.exp(np.concatenate([seg[1] for seg in segments], axis=1) + log_phi(x))
    derivs = link.derivatives(m[:, None] + s[:, None] * x, order)
    return tuple(np.sum(weight * d, axis=1).reshape(shape) for d in derivs)


# --------------------------------------------------------------------------------------------
# Multi-class: product Gauss-Hermite on the subspace orthogonal to the ones vector
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def ones_complement_basis(C: int) -> Array:
    """Orthonormal basis ``U [C, C-1]`` of ``{x : sum(x) = 0}`` (read-only)."""
    if C < 2:
        raise ValueError(f"need at least two classes, got {C}")
    centred = np.eye(C) - 1.0 / C
    U, _ = np.linalg.qr(centred[:, : C - 1])
    U.setflags(write=False)
    return U


def multiclass_gh_order(C: int, budget: int = settings.MULTICLASS_GH_NODE_BUDGET) -> int:
    """Nodes per dimension of ``shift_invariant_rule`` for ``C`` classes and a node ``budget``.

    ``floor(budget ** (1/(C-1)))`` clipped to ``[MULTICLASS_GH_MIN_ORDER, MULTICLASS_GH_MAX_ORDER]``
    (default budget 8192: C=2: 128, C=3: 90, C=4: 20, C=5: 9, C=6: 6, C=7: 4, C=8, 9: 3).
    """
    order = int(np.floor(budget ** (1.0 / (C - 1)) + 1e-9))
    return int(np.clip(order, settings.MULTICLASS_GH_MIN_ORDER, settings.MULTICLASS_GH_MAX_ORDER))


@lru_cache(maxsize=32)
def _product_rule(dim: int, order: int) -> tuple[Array, Array]:
    x, w = gauss_hermite(order)
    grids = np.meshgrid(*([x] * dim), indexing="ij")
    wgrids = np.meshgrid(*([w] * dim), indexing="ij")
    nodes = np.stack([g.reshape(-1) for g in grids], axis=1)  # [Q, dim]
    weights = np.prod(np.stack([g.reshape(-1) for g in wgrids], axis=1), axis=1)  # [Q]
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def shift_invariant_rule(mean: Any, var: Any, order: int | None = None) -> tuple[Any, Any]:
    """Nodes ``F [B, Q, C]`` and weights ``w [Q]`` for ``E[g(f)]``, ``f ~ N(mean_b, diag(var_b))``.

    Valid for functions with ``g(f + a 1) = g(f)`` (softmax, argmax probabilities). With ``U`` an
    orthonormal basis of the complement of ``1`` and ``G = U^T diag(var) U = L L^T``, the nodes are
    ``mean + U L s_q`` for a product Gauss-Hermite rule ``s_q`` in ``C - 1`` dimensions
    (``Q = order^(C-1)``; default ``multiclass_gh_order(C)``). Weights sum to one; some may
    underflow to zero for large orders (use ``np.log`` under ``np.errstate(divide="ignore")``).
    ``mean``, ``var`` may be arrays of another array-API namespace (torch: ``gpinfer.backend``);
    ``F`` and ``w`` are then arrays of it.
    """
    mean, var = ops.as_array(mean), ops.as_array(var)  # host values as float64 numpy
    C = mean.shape[1]
    order = multiclass_gh_order(C) if order is None else order
    U = ops.like(mean, ones_complement_basis(C))
    G = ops.einsum("ck,bc,cl->bkl", U, var, U)
    L, failed = ops.cholesky(G)  # [B, C-1, C-1]
    if np.any(failed):
        raise np.linalg.LinAlgError("shift_invariant_rule: the projected covariance is not "
                                    "positive definite")
    s, w = (ops.like(mean, a) for a in _product_rule(C - 1, order))
    UL = ops.einsum("ck,bkl->blc", U, L)  # [B, C-1, C]
    F = mean[:, None, :] + s @ UL
    return F, w
