"""Softmax expectations under a *diagonal* Gaussian, reduced exactly to one dimension.

For independent ``v_c ~ N(m_c, a_c)`` (``m = h + beta``) the ``C``-dimensional integrals of the
softmax need no ``C``-dimensional rule. The Gumbel-max identity

    softmax(v)_y = int g(t - v_y) prod_{c != y} G(t - v_c) dt,
    G(z) = exp(-e^-z) (Gumbel CDF),  g(z) = G'(z) = e^-z G(z),

holds exactly for every ``v`` (substitute ``s = e^-t``). The integrand is a product over the
classes, so the expectation over independent ``v_c`` moves inside the product:

    Z = E[softmax(v)_y] = int phi_y(t) prod_{c != y} Phi_c(t) dt,
    Phi_c(t) = E[G(t - v_c)],  phi_y(t) = E[g(t - v_y)],

and the tilted moments follow from the same integrand with ``v_c`` or ``v_c^2`` inside the one
factor of class ``c``: ``E[v_c softmax_y] = int W(t) E[v_c f_c(t - v_c)] / E[f_c(t - v_c)] dt``
with ``W`` the integrand of ``Z`` and ``f_c = g`` for ``c = y``, else ``G``. Cost
``O(C T K)`` per point (``T`` nodes in ``t``, ``K`` in each 1-D expectation) against the
product rule's ``k^C``.

Quadrature, outer. Trapezoid on a uniform grid of step exactly ``step`` from ``max_c(m_c -
8 s_c) - 3.6`` to at least ``max_c(m_c + 8 s_c) + 32`` (``s_c = sqrt(a_c)``), outside which the
integrand is below ``e^-30`` of its mass (Gumbel left tail ``exp(-e^3.6)``, right tail ``e^-32``,
Gaussian tails beyond 8 standard deviations). The integrand is analytic in a strip of half-width
about ``pi / 2`` around the real axis, so the trapezoid error falls like ``exp(-pi^2 / step)``.

Quadrature, inner: two rules for ``E[f(t - v)]``, ``v ~ N(m, s^2)``, chosen per entry by ``s``.

* ``s < WIDE_SD = 1.5``: ``K``-point Gauss-Hermite in ``x = (v - m) / s`` (``inner``), in log
  space (``log G = -e^-z`` underflows for no ``t`` on the grid). As a function of ``x``,
  ``G(t - m - s x)`` is a step of width ``1 / s`` at ``x = (t - m) / s``: a fixed rule resolves
  it only while ``s`` is small (the former default used it at every ``s``; against the same
  reference, ``benchmarks/diagonal_softmax_accuracy.py --old``: ``log Z`` off by ``6e-6`` and
  ``a_hat`` by ``1e-4`` at variance 10, ``1.2e-2`` and ``0.24`` at 50, ``0.1`` and 5 at 200).
* ``s >= WIDE_SD``: the Gumbel variable. ``G(z) = P(eps <= z)`` for a standard Gumbel ``eps``,
  so with ``b = (t - m - eps) / s``

      E[G(t - v)] = P(v + eps <= t) = E_eps[Phi(b)],
      E[x G(t - v)] = -E_eps[phi(b)],  E[x^2 G(t - v)] = E_eps[Phi(b) - b phi(b)]

  (``E[x 1{x <= b}] = -phi(b)``, ``E[x^2 1{x <= b}] = Phi(b) - b phi(b)``). The integrand in
  ``eps`` is the Gumbel density ``e^(-eps - e^-eps)`` (width one, strip ``pi / 2``) times a
  normal CDF of width ``s >= 1.5``: smooth at every ``s``, where the ``x`` integrand was a step.
  The density goes through the exponential tilt ``g(z) = e^-z G(z)``: ``E[g(t - v)] =
  e^(s^2/2 - (t - m)) E[G(t - v')]``, ``v' ~ N(m + s^2, s^2)``, ``x = x' + s``, so one rule
  serves both, and the label's far right tail (an unlikely label, ``t - m >> s^2``), where the
  mass of ``e^-eps phi(b)`` would sit at ``eps = t - m - s^2``, stays at ``eps ~ 0``. Rule:
  trapezoid in ``eps`` on ``[-4.5, 28]`` with step ``h = step / q <= 0.25``; the ``G``-type
  integrand's peak is at ``e^-eps = 1 + lambda(b) / s <= 9`` on the grid (``lambda = phi /
  Phi``), so the left end is ``e^-60`` below it, and ``Phi`` decreasing in ``eps`` bounds the
  right tail by ``e^-28`` relative; error ``~ exp(-pi^2 / h) = e^-39``. ``Phi`` in log space
  (``Phi(b) = erfcx(u) e^(-u^2) / 2``, ``u = -b / sqrt 2``; ``phi / Phi = sqrt(2 / pi) /
  erfcx(u)`` exactly, which the tilt's ``x = x' + s`` needs at large ``s``). Cost: ``b`` depends
  on ``q j - k`` only (grid point ``j``, node ``k``), so ``erfcx`` runs once per diagonal on a
  1-D array per block of 64 grid points (scaled by the block's largest ``Phi``; by the bounds on
  ``b`` above, a row's leading terms lie within about ``e^-350`` of it) and the sums over nodes
  are one matrix product with a banded Toeplitz matrix; about the Gauss-Hermite rule's cost per
  entry.

Accuracy, against the independent reference of
``plugins/gpinfer-ivm/tests/test_ivm_diagonal_softmax.py`` (its stress
test asserts ``1e-6`` in ``log Z``, ``1e-5`` in the moments), measured by
``benchmarks/diagonal_softmax_accuracy.py`` (3 points each for ``C`` in 2, 5, 20, means uniform
on ``[-50, 50]``, variances within a factor 2 of ``v``, at the defaults): entries on the
Gauss-Hermite side (``v`` from ``1e-4`` to 2.5) ``log Z`` within ``4.7e-8``, tilted means
``2.4e-8`` standard deviations, variances ``3.3e-8`` relative (``1.9e-8`` and ``1.5e-8``
absolute); the Gumbel side (``v`` from 5 to ``1e4``) ``1.2e-11``, ``6e-12`` and ``4e-11``
(``a_hat`` ``1.2e-8`` absolute at ``v = 1e4``). Against a converged product rule (C = 3, 4,
variances up to 3): about ``1e-8``.

``E[log softmax(v)_y]`` (the learning criterion) reduces the same way by Frullani's integral
(``diagonal_softmax_expected_log_prob``).

Used by ``ivm-baseline`` (spec ivm §4), whose marginals are diagonal. Non-finite inputs or
results and non-positive variances raise ``NumericalError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy.special import erfcx

from gpinfer.errors import NumericalError
from gpinfer.numerics import settings
from gpinfer.numerics.quadrature import checked_gaussians, chunk_slices, gauss_hermite

Array = np.ndarray

#: defaults: largest trapezoid step in ``t`` and Gauss-Hermite nodes per 1-D expectation
STEP, INNER = 0.5, 32
#: half-width of the ``t`` range in standard deviations, and the Gumbel tail margins
SPREAD, LEFT_TAIL, RIGHT_TAIL = 8.0, 3.6, 32.0
#: standard deviations from which the 1-D factors use the Gumbel-variable rule
#: (``_wide_factors``): its range ``[EPS_LO, EPS_HI]``, largest step, and rows per block
WIDE_SD = 1.5
EPS_LO, EPS_HI, EPS_STEP, EPS_BLOCK = -4.5, 28.0, 0.25, 64
#: floats per grid point and entry that ``_wide_factors`` holds at once (about 8 arrays of
#: ``(q (EPS_BLOCK - 1) + K) / EPS_BLOCK`` values), for its block sizes
WIDE_FLOATS = 40


class DiagonalTilted(NamedTuple):
    """``log_z [B]``, tilted means ``h_hat [B, C]`` and variances ``a_hat [B, C]``."""

    log_z: Array
    h_hat: Array
    a_hat: Array


def _prepare(h: Array, a: Array, beta: Array | None) -> tuple[Array, Array, Array, Array]:
    """Checked ``h [B, C]``, ``a [B, C]`` and the shifted means ``m = h + beta`` and standard
    deviations ``sd`` ``[B, C]`` (``beta [C]``, zeros by default)."""
    h, a = checked_gaussians(h, a, full=False)
    if np.any(a <= 0.0):
        raise NumericalError("non-positive marginal variance", quantity="quadrature")
    beta = np.zeros(h.shape[1]) if beta is None else np.asarray(beta, dtype=float)
    return h, a, h + beta, np.sqrt(a)


def _tilted_moments(log_phi: Array, r1: Array, r2: Array, log_trap: Array, h: Array, a: Array,
                    sd: Array) -> tuple[Array, Array, Array]:
    """``log Z [B]``, tilted means and variances ``[B, C]`` from the 1-D factors ``[B, C, T]``
    (``_factors``) and the trapezoid log-weights ``[B, T]`` (or ``[T]``)."""
    with np.errstate(over="ignore"):  # factors near -1e308 sum to -inf: an underflowed product
        lw = log_phi.sum(axis=1) + log_trap  # [B, T]
    top = lw.max(axis=1, keepdims=True)
    W = np.exp(lw - top)
    Zs = W.sum(axis=1)
    W /= Zs[:, None]
    e1 = (r1 @ W[:, :, None])[..., 0]  # [B, C]
    e2 = (r2 @ W[:, :, None])[..., 0]
    return np.log(Zs) + top[:, 0], h + sd * e1, a * np.maximum(e2 - e1 * e1, 0.0)


def _nodes(sd: Array, step: float) -> int:
    """An upper bound on the grid size of ``_grid`` for standard deviations ``sd``."""
    return int(np.ceil((2.0 * SPREAD * float(sd.max()) + LEFT_TAIL + RIGHT_TAIL) / step)) + 1


def _grid(m: Array, sd: Array, step: float) -> tuple[Array, Array]:
    """Per-row uniform ``t`` grids ``[B, T]`` of step exactly ``step`` (the wide rule's
    Toeplitz structure needs it, ``_wide_factors``) covering each row's range, and the
    trapezoid log-weights ``[1, T]``."""
    lo = np.max(m - SPREAD * sd, axis=1) - LEFT_TAIL
    hi = np.max(m + SPREAD * sd, axis=1) + RIGHT_TAIL
    T = int(np.ceil(np.max(hi - lo) / step)) + 1
    t = lo[:, None] + step * np.arange(T)[None, :]
    trap = np.full(T, step)
    trap[[0, -1]] *= 0.5
    return t, np.log(trap)[None, :]


#: the separable form of ``e^-z`` (``_split_factors``) is used while neither of its two
#: exponentials, ``e^(m - t)`` and ``e^(s x)``, can exceed ``e^SPLIT_MAX`` (below overflow)
SPLIT_MAX = 700.0


def _direct_factors(label: Array, m: Array, sd: Array, t: Array, x: Array, w: Array
                    ) -> tuple[Array, Array, Array]:
    """``_factors`` for entries ``[N]`` (``t [N, T]``) by the definition: ``z = t - m - s x``
    on every node ``[N, T, K]``, in log space."""
    z = t[:, :, None] - m[:, None, None] - sd[:, None, None] * x  # [N, T, K]
    with np.errstate(over="ignore"):
        log_f = -np.exp(-z)  # log G(z); -inf where G underflows
    log_f = np.where(label[:, None, None], log_f - z, log_f)
    top = np.max(log_f, axis=2, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    F = np.exp(log_f - top) * w
    S0 = F.sum(axis=2)
    S1, S2 = F @ x, F @ (x * x)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_phi = np.log(S0) + top[..., 0]
        r1 = np.where(S0 > 0.0, S1 / S0, 0.0)
        r2 = np.where(S0 > 0.0, S2 / S0, 0.0)
    return log_phi, r1, r2


def _split_factors(density: bool, m: Array, sd: Array, t: Array, x: Array, w: Array
                   ) -> tuple[Array, Array, Array]:
    """``_factors`` of entries ``[N]`` on grids ``t [N, T]``, all with ``f = g`` (``density``)
    or all with ``f = G``, by the separable ``e^-z = e^(m - t) e^(s x)``: relative to the
    smallest node ``x_0``, ``log G(z_k) - log G(z_0) = -e^(m - t) (e^(s x_k) - e^(s x_0))`` is
    one product per node (``log g = log G - z`` adds ``s (x_k - x_0)``), and the three moments
    one matrix product, instead of the two exponentials, shift and three sums per node of the
    definition. Needs ``m - t <= SPLIT_MAX`` and ``s |x| <= SPLIT_MAX`` (``_entry_factors``)."""
    u = np.exp(m[:, None] - t)  # [N, T]
    v = np.exp(sd[:, None] * x)  # [N, K], increasing in k
    with np.errstate(over="ignore", invalid="ignore"):
        top = -u * v[:, :1]  # log G(z_0); -inf where it underflows
        A = u[:, :, None] * (v[:, :1] - v)[:, None, :]  # [N, T, K], <= 0
    moments = w[:, None] * np.stack([np.ones_like(x), x, x * x], axis=1)  # [K, 3]
    if density:  # log g(z_k) - log g(z_0), shifted by its largest node
        A += (sd[:, None] * (x - x[0]))[:, None, :]
        shift = A.max(axis=2, keepdims=True)
        shift = np.where(np.isfinite(shift), shift, 0.0)
        A -= shift
        with np.errstate(invalid="ignore"):
            top = top - (t - m[:, None]) + sd[:, None] * x[0] + shift[..., 0]  # log g(z_0)
    np.exp(A, out=A)
    S = A @ moments  # [N, T, 3]
    fin = np.isfinite(top) & (S[..., 0] > 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_phi = np.where(fin, np.log(S[..., 0]) + top, -np.inf)
        r1 = np.where(fin, S[..., 1] / S[..., 0], 0.0)
        r2 = np.where(fin, S[..., 2] / S[..., 0], 0.0)
    return log_phi, r1, r2


@lru_cache(maxsize=8)
def _wide_rule(h_t: float) -> tuple[int, float, Array, Array]:
    """The Gumbel-variable rule for a ``t`` step ``h_t``: ``q``, the ``eps`` step ``h = h_t / q
    <= EPS_STEP``, the nodes ``eps [K]`` on ``[EPS_LO, EPS_HI]`` and the banded Toeplitz matrix
    ``[q (EPS_BLOCK - 1) + K, EPS_BLOCK]`` whose column ``p`` holds the trapezoid weights times
    the Gumbel density ``e^(-eps - e^-eps)``, reversed, at rows ``q p .. q p + K - 1``."""
    q = max(1, int(np.ceil(h_t / EPS_STEP - 1e-9)))
    h = h_t / q
    K = int(np.ceil((EPS_HI - EPS_LO) / h)) + 1
    eps = EPS_LO + h * np.arange(K)
    w_rev = (h * np.exp(-eps - np.exp(-eps)))[::-1]  # negligible at both ends: no half weights
    band = np.zeros((q * (EPS_BLOCK - 1) + K, EPS_BLOCK))
    for p in range(EPS_BLOCK):
        band[q * p:q * p + K, p] = w_rev
    eps.setflags(write=False)
    band.setflags(write=False)
    return q, h, eps, band


def _wide_factors(density: bool, m: Array, sd: Array, t: Array) -> tuple[Array, Array, Array]:
    """``_factors`` of entries ``[N]`` on uniform grids ``t [N, T]`` (one step for all), all
    with ``f = g`` (``density``) or all with ``f = G``, by the Gumbel variable: ``G(t - v) =
    E_eps[1{v <= t - eps}]`` gives ``E[G(t - v)] = E_eps[Phi(b)]``, ``E[x G] = -E_eps[phi(b)]``
    and ``E[x^2 G] = E_eps[Phi(b) - b phi(b)]`` with ``b = (t - m - eps) / s``; the density by
    the exponential tilt ``E[g(t - v)] = e^(s^2/2 - (t - m)) E[G(t - v')]``, ``v' ~ N(m + s^2,
    s^2)`` (``x = x' + s``). Trapezoid in ``eps`` of step ``h = step / q`` on ``[EPS_LO,
    EPS_HI]``: ``b`` depends on ``q j - k`` only (node ``k``, grid point ``j``), so ``log Phi``
    (``erfcx``) is evaluated once per diagonal, on a 1-D array per block of ``EPS_BLOCK`` grid
    points scaled by the block's largest ``Phi``, and the sums over nodes are one product with
    the banded Toeplitz matrix of ``_wide_rule``."""
    N, T = t.shape
    h_t = float(t[0, 1] - t[0, 0])
    if np.max(np.abs(np.diff(t, axis=1) - h_t)) > 1e-9 * max(1.0, float(np.max(np.abs(t)))):
        raise ValueError("the wide rule needs uniform t grids of one step")
    q, h, eps, band = _wide_rule(float(f"{h_t:.12g}"))  # grids' steps differ by rounding
    K = eps.size
    s = sd[:, None, None]
    c0 = t[:, :1] - m[:, None]  # [N, 1]
    if density:
        c0 = c0 - sd[:, None] ** 2
    n_blocks = -(-T // EPS_BLOCK)
    i = q * EPS_BLOCK * np.arange(n_blocks)[:, None] + np.arange(q * (EPS_BLOCK - 1) + K)
    b = (c0[:, :, None] - eps[-1] + h * i[None]) / s  # [N, blocks, L], increasing along L
    u = np.maximum(b * -np.sqrt(0.5), -26.0)  # Phi(b) = erfcx(u) e^(-u^2) / 2; 1 beyond 36.8
    E = erfcx(u)
    log_Phi = np.log(0.5 * E) - u * u
    ref = log_Phi[..., -1:]  # the block's largest
    Phi = np.exp(log_Phi - ref)
    phi = Phi * (np.sqrt(2.0 / np.pi) / E)  # phi / Phi exactly, not a difference of logs
    arr = np.stack([Phi, phi, Phi - b * phi], axis=2)  # [N, blocks, 3, L]
    S = (arr.reshape(-1, arr.shape[-1]) @ band).reshape(N, n_blocks, 3, EPS_BLOCK)
    S = S.transpose(0, 2, 1, 3).reshape(N, 3, n_blocks * EPS_BLOCK)[:, :, :T]
    top = np.repeat(ref[..., 0], EPS_BLOCK, axis=1)[:, :T]
    fin = S[:, 0] > 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_phi = np.where(fin, np.log(S[:, 0]) + top, -np.inf)
        r1 = np.where(fin, -S[:, 1] / S[:, 0], 0.0)
        r2 = np.where(fin, S[:, 2] / S[:, 0], 0.0)
    if density:
        s2 = sd[:, None]
        log_phi = log_phi + (0.5 * s2 * s2 - (t - m[:, None]))
        r2 = np.where(fin, r2 + s2 * (2.0 * r1 + s2), 0.0)
        r1 = np.where(fin, r1 + s2, 0.0)
    return log_phi, r1, r2


def _entry_factors(label: Array, m: Array, sd: Array, t: Array, inner: int
                   ) -> tuple[Array, Array, Array]:
    """``log E[f(t - v)]``, ``E[x f] / E[f]`` and ``E[x^2 f] / E[f]`` ``[N, T]`` for entries
    ``v ~ N(m, sd^2)`` ``[N]`` on grids ``t [N, T]`` (``x`` the standardised ``v``; ``f = g``
    where ``label [N]`` is set, else ``G``), in blocks of ``CACHE_BLOCK_FLOATS``: the Gumbel
    variable from ``sd >= WIDE_SD`` (``_wide_factors``), below it Gauss-Hermite in ``x``, the
    separable form where it cannot overflow, else the definition."""
    x, w = gauss_hermite(inner)
    N, T = t.shape
    out = np.empty((3, N, T))
    wide = sd >= WIDE_SD
    split = (np.max(m[:, None] - t, axis=1) <= SPLIT_MAX) & (sd * np.max(np.abs(x)) <= SPLIT_MAX)
    kinds = ((~wide & split & ~label, "G"), (~wide & split & label, "g"),
             (~wide & ~split, "direct"), (wide & ~label, "wide G"), (wide & label, "wide g"))
    for rows, kind in kinds:
        rows = np.flatnonzero(rows)
        per_row = T * (WIDE_FLOATS if kind.startswith("wide") else inner)
        for sl in chunk_slices(rows.size, per_row, settings.CACHE_BLOCK_FLOATS):
            r = rows[sl]
            if kind == "direct":
                out[:, r] = _direct_factors(label[r], m[r], sd[r], t[r], x, w)
            elif kind.startswith("wide"):
                out[:, r] = _wide_factors(kind == "wide g", m[r], sd[r], t[r])
            else:
                out[:, r] = _split_factors(kind == "g", m[r], sd[r], t[r], x, w)
    return out[0], out[1], out[2]


def _grids(m: Array, sd: Array, step: float, inner: int
           ) -> Iterator[tuple[slice, Array, Array]]:
    """Slice by slice of the batch (bounded by the grids' size), the slice and its rows' grids
    ``t [b, T]`` and log trapezoid weights (``_grid``) for shifted means ``m`` and standard
    deviations ``sd`` ``[B, C]``."""
    B, C = m.shape
    for sl in chunk_slices(B, 3 * C * _nodes(sd, step) * inner):
        yield (sl, *_grid(m[sl], sd[sl], step))


def _one_hot(y: Array, B: int, C: int) -> Array:
    """``label [B, C]``: ``True`` at each row's class ``y [B]``."""
    label = np.zeros((B, C), dtype=bool)
    label[np.arange(B), y] = True
    return label


def _factors(label: Array, m: Array, sd: Array, t: Array, inner: int
             ) -> tuple[Array, Array, Array]:
    """``log E[f_c(t - v_c)]``, ``E[x f_c] / E[f_c]`` and ``E[x^2 f_c] / E[f_c]`` ``[B, C, T]``
    (``x`` the standardised ``v_c``; ``f_c = g`` where ``label [B, C]`` is set, else ``G``) on
    the rows' grids ``t [B, T]``."""
    B, C = m.shape
    T = t.shape[1]
    tt = np.broadcast_to(t[:, None, :], (B, C, T)).reshape(B * C, T)
    out = _entry_factors(label.reshape(-1), m.reshape(-1), sd.reshape(-1), tt, inner)
    return out[0].reshape(B, C, T), out[1].reshape(B, C, T), out[2].reshape(B, C, T)


def diagonal_softmax_tilted(
    y: Array, h: Array, a: Array, beta: Array | None = None, step: float = STEP,
    inner: int = INNER,
) -> DiagonalTilted:
    """Moments of ``softmax(u + beta)_y N(u | h, diag a)``, batched over ``B``.

    ``y [B]`` labels, ``h [B, C]`` means, ``a [B, C]`` variances, ``beta [C]`` intercepts
    (zeros by default); ``step``, ``inner``: the quadrature (module docstring).
    """
    h, a, m, sd = _prepare(h, a, beta)
    B, C = h.shape
    y = np.asarray(y, dtype=np.int64).reshape(B)
    out = DiagonalTilted(np.empty(B), np.empty((B, C)), np.empty((B, C)))
    label = _one_hot(y, B, C)
    for sl, t, log_trap in _grids(m, sd, step, inner):
        log_phi, r1, r2 = _factors(label[sl], m[sl], sd[sl], t, inner)
        out.log_z[sl], out.h_hat[sl], out.a_hat[sl] = _tilted_moments(
            log_phi, r1, r2, log_trap, h[sl], a[sl], sd[sl])
    if not all(np.all(np.isfinite(v)) for v in out):
        raise NumericalError("non-finite tilted moments", quantity="diagonal_softmax_tilted")
    if np.any(out.a_hat <= 0.0):
        raise NumericalError("tilted variance underflowed to zero",
                             quantity="diagonal_softmax_tilted")
    return out


class DiagonalExpectation(NamedTuple):
    """``value [B] = E[log softmax(u + beta)_y]`` and its derivatives ``dmean [B, C]``
    (``= delta_y - E[p]``) and ``dvar [B, C]`` (wrt the variances ``a``)."""

    value: Array
    dmean: Array
    dvar: Array


def diagonal_softmax_expected_log_prob(
    y: Array, h: Array, a: Array, beta: Array | None = None, step: float = STEP,
    inner: int = INNER,
) -> DiagonalExpectation:
    """``E_{N(h, diag a)}[log softmax(u + beta)_y]`` and its derivatives wrt ``h`` and ``a``.

    ``log sum_c e^v_c = k + int [G(t - k) - prod_c G(t - v_c)] dt`` for any shift ``k``
    (Frullani), so ``E[lse(v)]`` is one 1-D integral of ``prod_c Phi_c(t)``; its derivatives
    put ``E[x G] / sigma_c`` (means) or ``E[(x^2 - 1) G] / (2 a_c)`` (variances) in the
    factor of class ``c`` (score-function identities of the 1-D Gaussian expectations).
    ``k = max_c(m_c - 8 s_c)``, so ``G(t - k)`` is negligible below the grid.
    """
    h, a, m, sd = _prepare(h, a, beta)
    B, C = h.shape
    y = np.asarray(y, dtype=np.int64).reshape(B)
    out = DiagonalExpectation(np.empty(B), np.empty((B, C)), np.empty((B, C)))
    for sl, t, log_trap in _grids(m, sd, step, inner):
        log_phi, r1, r2 = _factors(np.zeros(m[sl].shape, dtype=bool), m[sl], sd[sl], t, inner)
        k = t[:, :1] + LEFT_TAIL
        with np.errstate(over="ignore"):  # a sum of factors near -1e308: -inf, W = 0
            W = np.exp(log_phi.sum(axis=1) + log_trap)  # prod_c Phi_c(t) dt, [b, T]
        G_k = np.exp(-np.exp(-(t - k)) + log_trap)
        lse = k[:, 0] + np.sum(G_k - W, axis=1)
        Ep = -np.einsum("bt,bct->bc", W, r1) / sd[sl]  # dE[lse]/dm = E[p]
        dlse_da = -np.einsum("bt,bct->bc", W, r2 - 1.0) / (2.0 * a[sl])
        rows = np.arange(sl.stop - sl.start)
        out.value[sl] = m[sl][rows, y[sl]] - lse
        out.dmean[sl] = -Ep
        out.dmean[rows + sl.start, y[sl]] += 1.0
        out.dvar[sl] = -dlse_da
    if not all(np.all(np.isfinite(v)) for v in out):
        raise NumericalError("non-finite expected log-likelihood",
                             quantity="diagonal_softmax_expected_log_prob")
    return out


class DiagonalTiltedCache:
    """``diagonal_softmax_tilted`` for a sequence of calls on the same ``B`` rows in which
    few entries ``(b, c)`` of ``(h, a)`` change between calls (``ivm-baseline``: one class
    column per inclusion): each row keeps its ``t`` grid while it covers the row's range, and
    only the changed entries' 1-D factors are recomputed, ``O(changed * T * K)`` instead of
    ``O(B C T K)``, and only the rows with a changed entry are assembled, ``O(rows * C * T)``
    (the others keep their moments). A row whose range leaves its grid gets a new one. Results
    equal ``diagonal_softmax_tilted``'s up to the quadrature error (the grids differ).
    """

    def __init__(self, y: Array, beta: Array | None = None, step: float = STEP,
                 inner: int = INNER):
        self.y = np.asarray(y, dtype=np.int64).reshape(-1)
        self.beta, self.step, self.inner = beta, float(step), int(inner)
        self.h: Array | None = None
        self.a = np.zeros(0)
        #: the last call's moments (a row whose entries did not change keeps its own)
        self.out = DiagonalTilted(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0)))

    def _rebuild(self, m: Array, sd: Array) -> None:
        """New grids (wide enough for every row) and all factors."""
        B, C = m.shape
        self.T = _nodes(sd, self.step)
        lo = np.max(m - SPREAD * sd, axis=1) - LEFT_TAIL
        width = (self.T - 1) * self.step
        hi_need = np.max(m + SPREAD * sd, axis=1) + RIGHT_TAIL
        lo = np.minimum(lo, hi_need - width)  # at least the rows' needed range
        self.lo, self.hi = lo, lo + width
        self.t = lo[:, None] + width * np.linspace(0.0, 1.0, self.T)[None, :]
        trap = np.full(self.T, 1.0)
        trap[[0, -1]] = 0.5
        self.log_trap = np.log(trap * self.step)
        self.label = _one_hot(self.y, B, C)
        self.log_phi = np.empty((B, C, self.T))
        self.r1, self.r2 = np.empty((B, C, self.T)), np.empty((B, C, self.T))
        for sl in chunk_slices(B, 3 * C * self.T * self.inner):
            self.log_phi[sl], self.r1[sl], self.r2[sl] = _factors(
                self.label[sl], m[sl], sd[sl], self.t[sl], self.inner)

    def _update(self, rows: Array, cols: Array, m: Array, sd: Array) -> None:
        """Recompute the factors of the entries ``(rows[p], cols[p])``."""
        self.log_phi[rows, cols], self.r1[rows, cols], self.r2[rows, cols] = _entry_factors(
            self.label[rows, cols], m[rows, cols], sd[rows, cols], self.t[rows], self.inner)

    def __call__(self, h: Array, a: Array) -> DiagonalTilted:
        """Moments for ``h [B, C]``, ``a [B, C]`` (as ``diagonal_softmax_tilted``)."""
        h, a, m, sd = _prepare(h, a, self.beta)
        lo_need = np.max(m - SPREAD * sd, axis=1) - LEFT_TAIL
        hi_need = np.max(m + SPREAD * sd, axis=1) + RIGHT_TAIL
        if self.h is None or self.h.shape != h.shape or np.any(hi_need - lo_need
                                                               > self.hi - self.lo):
            self._rebuild(m, sd)
            rows = np.arange(h.shape[0])
            self.out = DiagonalTilted(np.empty(h.shape[0]), np.empty(h.shape), np.empty(h.shape))
        else:
            moved = (lo_need < self.lo) | (hi_need > self.hi)
            if np.any(moved):  # those rows get grids centred on their range
                shift = np.where(moved, 0.5 * (lo_need + hi_need - self.lo - self.hi), 0.0)
                self.lo, self.hi, self.t = self.lo + shift, self.hi + shift, self.t + shift[:, None]
            changed = (h != self.h) | (a != self.a) | moved[:, None]
            rows, cols = np.nonzero(changed)
            if rows.size:
                self._update(rows, cols, m, sd)
            rows = np.unique(rows)
        self.h, self.a = h.copy(), a.copy()
        # a row none of whose entries changed keeps its moments (all rows: no gathered copies)
        sel: Array | slice = slice(None) if 2 * rows.size > h.shape[0] else rows
        if rows.size:
            self.out.log_z[sel], self.out.h_hat[sel], self.out.a_hat[sel] = _tilted_moments(
                self.log_phi[sel], self.r1[sel], self.r2[sel], self.log_trap, h[sel], a[sel],
                sd[sel])
        out = DiagonalTilted(*(v.copy() for v in self.out))
        if not all(np.all(np.isfinite(v)) for v in out) or np.any(out.a_hat <= 0.0):
            raise NumericalError("non-finite or zero tilted moments",
                                 quantity="diagonal_softmax_tilted")
        return out


def diagonal_softmax_predictive(
    h: Array, a: Array, beta: Array | None = None, step: float = STEP, inner: int = INNER
) -> Array:
    """``E_{N(h, diag a)}[softmax(u + beta)]`` ``[B, C]``; rows sum to one up to the quadrature
    error (module docstring). Every label's ``Z`` on one grid (it covers every class):
    ``p_y = int (phi_y / Phi_y)(t) prod_c Phi_c(t) dt``, two factors per class instead of
    ``C``."""
    h, a, m, sd = _prepare(h, a, beta)
    B, C = h.shape
    out = np.empty((B, C))
    for sl in chunk_slices(B, 6 * C * _nodes(sd, step) * inner):
        t, log_trap = _grid(m[sl], sd[sl], step)
        shape = m[sl].shape
        log_G = _factors(np.zeros(shape, dtype=bool), m[sl], sd[sl], t, inner)[0]
        log_g = _factors(np.ones(shape, dtype=bool), m[sl], sd[sl], t, inner)[0]
        with np.errstate(invalid="ignore", over="ignore"):
            own = np.where(np.isfinite(log_G), log_g - log_G, -np.inf)  # log(phi_y / Phi_y)
            rest = np.where(np.isfinite(log_G), log_G, -np.inf).sum(axis=1)  # [b, T]
        lw = rest[:, None, :] + own + log_trap[:, None, :]  # [b, C, T]
        top = lw.max(axis=2, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)  # a label with no mass on the grid: p = 0
        out[sl] = np.exp(top[..., 0]) * np.sum(np.exp(lw - top), axis=2)
    if not np.all(np.isfinite(out)):
        raise NumericalError("non-finite predictive probabilities", quantity="predictive")
    return out


__all__ = [
    "DiagonalExpectation",
    "DiagonalTilted",
    "DiagonalTiltedCache",
    "diagonal_softmax_expected_log_prob",
    "diagonal_softmax_predictive",
    "diagonal_softmax_tilted",
]
