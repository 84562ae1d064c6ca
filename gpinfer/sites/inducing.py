"""Site algebra in inducing space for pairwise-probit multi-class EP / SEP (spec ep-sep §2).

Shared by the sparse EP, SEP and (for the role-site bookkeeping) GFITC plugins.

Symbols (spec ep-sep §1.3-1.5): per class ``c`` the inducing covariance ``K = Kuu = L L^T``
``[M, M]``, whitened cross-covariance ``A = L^-1 Kuf`` ``[M, n]`` (columns ``a_i``), directions
``upsilon_i = K^-1 k_i = L^-T a_i`` and FITC variances ``s_i = kappa_i - ||a_i||^2``. Sites of
class ``c`` summed in ``u``-space are ``(Lambda [M, M], h [M])``; in whitened coordinates
``P_w = L^T Lambda L`` and ``h_w = L^T h``, ``B = I + P_w = L_B L_B^T``, ``w = B^-1 h_w``, so that
``m = L w`` and ``V = L B^-1 L^T``.

Role-site layout (vectorised over points and classes): factor ``(i, k)`` (``k != y_i``) has a
winner role site on class ``y_i`` stored at ``win[i, k]`` and a loser role site on class ``k``
stored at ``lose[i, k]``; entries with ``k == y_i`` are zero (``mask[i, k]`` is False there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.kernels.base import Kernel
from gpinfer.likelihoods.multiclass import argmax_factor_tilted
from gpinfer.numerics.cholesky import cholesky_error, jittered_cholesky, tri_solve
from gpinfer.numerics.gram import weighted_gram

#: jitter added to ``Kuu`` and ``kappa`` (spec ep-sep §1.2, reference code)
INDUCING_JITTER = 1e-10
#: the same in single precision, where 1e-10 is below round-off (float32 eps is 1.2e-7)
INDUCING_JITTER_FLOAT32 = 1e-6


def inducing_jitter(X: Array) -> float:
    """The jitter for kernel matrices of ``X``'s floating dtype (float64 or float32)."""
    return INDUCING_JITTER_FLOAT32 if str(X.dtype).endswith("float32") else INDUCING_JITTER


# --------------------------------------------------------------------------------------------
# Kernel quantities of one class (spec §1.3)
# --------------------------------------------------------------------------------------------


@dataclass
class ClassTerms:
    """Kernel quantities of one class at a set of inputs ``X [n, D]``.

    ``L [M, M]`` chol of ``Kuu`` (noise + jitter on the diagonal), ``A [M, n]`` whitened
    cross-covariance, ``s [n]`` FITC conditional variances (noise included).
    """

    L: Array
    A: Array
    s: Array

    def directions(self, A: Array | None = None) -> Array:
        """``u``-space directions ``Upsilon = L^-T A`` ``[M, n]``."""
        return tri_solve(self.L, self.A if A is None else A, transpose=True)

    def to_whitened(self, Lam: Array, h: Array) -> tuple[Array, Array]:
        """``(L^T Lam L [M, M], L^T h [M])`` from ``u``-space site sums."""
        P = self.L.T @ Lam @ self.L
        return 0.5 * (P + P.T), self.L.T @ h

    def to_u_space(self, P_w: Array, h_w: Array) -> tuple[Array, Array]:
        """Inverse of ``to_whitened``: ``(L^-T P_w L^-1, L^-T h_w)``."""
        T = tri_solve(self.L, tri_solve(self.L, P_w, transpose=True).T, transpose=True)
        return 0.5 * (T + T.T), tri_solve(self.L, h_w, transpose=True)


def class_terms(
    kernel: Kernel,
    Z: Array,
    X: Array,
    *,
    jitter: float = INDUCING_JITTER,
    iteration: int | None = None,
) -> ClassTerms:
    """``ClassTerms`` of ``kernel`` with inducing inputs ``Z [M, D]`` at ``X [n, D]``.

    ``Kuu = kernel.K(Z) + jitter I`` (a ``White`` term adds its noise there); ``Kuf`` never gets
    noise; ``kappa = kernel.K_diag(X) + jitter``. ``NumericalError`` if ``Kuu`` cannot be
    factorised.
    """
    Kuu = kernel.K(Z) + jitter * np.eye(Z.shape[0])
    L = jittered_cholesky(Kuu, name="Kuu", iteration=iteration).L
    A = tri_solve(L, kernel.K(Z, X))
    s = kernel.K_diag(X) + jitter - np.sum(A * A, axis=0)
    return ClassTerms(L=L, A=A, s=np.maximum(s, jitter))


# --------------------------------------------------------------------------------------------
# A Gaussian over one class's inducing values in whitened coordinates (spec §2.1)
# --------------------------------------------------------------------------------------------


class Projections(NamedTuple):
    """Means ``mu [n]`` and variances ``v [n]`` of ``q`` along whitened directions, and
    ``R = L_B^-1 A`` ``[M, n]`` (kept for cross terms and gradients)."""

    mu: Array
    v: Array
    R: Array


def site_cholesky(Bm: Array, h_w: Array, iteration: int | None = None) -> Array:
    """Lower Cholesky factor of ``B = I + P_w`` ``[M, M]`` (or a stack ``[C, M, M]``), checked
    together with the whitened shift ``h_w``: ``NumericalError`` (quantity ``"B"``) when either is
    not finite or ``B`` is not positive definite (corrupted sites); inside
    ``ops.deferred_checks`` on a device the check is read with the others."""

    def failure() -> NumericalError:
        if not ops.all_finite(Bm, h_w):
            return NumericalError("site sums are not finite", iteration=iteration, quantity="B")
        return cholesky_error("B", iteration=iteration,
                              detail=" (B = I + L^T Lambda L: corrupted sites)")

    LB = ops.checked_cholesky(Bm, h_w, error=failure)  # the usual case: one check
    if LB is None:
        raise failure()
    return LB


class WhitenedGaussian:
    """``q(u) = N(L w, L B^-1 L^T)`` with ``B = I + P_w`` (``P_w [M, M]`` psd), ``w = B^-1 h_w``.

    ``NumericalError`` (quantity ``"B"``) when ``B`` is not positive definite.
    """

    def __init__(self, P_w: Array, h_w: Array, *, iteration: int | None = None):
        M = h_w.shape[0]
        self.LB = site_cholesky(np.eye(M) + P_w, h_w, iteration)
        self.h_w = h_w
        self.w = tri_solve(self.LB, tri_solve(self.LB, h_w), transpose=True)

    def project(self, A: Array) -> Projections:
        """Projections along whitened directions ``A [M, n]``.

        ``mu = A^T w`` and ``v = ||L_B^-1 a||^2`` per column.
        """
        R = tri_solve(self.LB, A)
        return Projections(A.T @ self.w, np.sum(R * R, axis=0), R)

    def log_norm_ratio(self) -> float:
        """``G(q) - G(prior) = -sum log diag L_B + w^T h_w / 2`` (spec §2.6)."""
        return float(-np.sum(np.log(np.diag(self.LB))) + 0.5 * self.w @ self.h_w)

    def B_inv(self, X: Array) -> Array:
        """``B^-1 X``."""
        return tri_solve(self.LB, tri_solve(self.LB, X), transpose=True)

    def moments(self, L: Array) -> tuple[Array, Array]:
        """``(m [M], V [M, M])`` in ``u``-space given ``L = chol(Kuu)``."""
        T = tri_solve(self.LB, L.T)
        return L @ self.w, T.T @ T


# --------------------------------------------------------------------------------------------
# Pairwise factors: layout, cavities, tilted moments, new sites (spec §1.5, 2.2, 2.4, 2.5)
# --------------------------------------------------------------------------------------------


def _rows(X: Array) -> Array:
    """``0..n-1`` for the rows of ``X`` (on its namespace and device)."""
    return ops.arange(X, X.shape[0])


def factor_mask(y: Array, C: int) -> Array:
    """``mask [n, C]``: True where ``(i, k)`` is a factor (``k != y_i``); ``y`` host or backend
    labels (the mask is on ``y``'s namespace and device)."""
    return y[:, None] != ops.arange(y, C)  # [n, 1] against [C]


def at_label(X: Array, y: Array) -> Array:
    """``X[i, y_i]`` as a column ``[n, 1]`` (the winner's value broadcast over factors) for
    labels ``y [n]``, or ``[n, 1]`` (a column the caller keeps for several calls: one
    operator each on a device, ``ops.take_columns``)."""
    if y.ndim == 2:
        return ops.take_columns(X, y)
    return X[_rows(X), y][:, None]


def aggregate(win: Array, lose: Array, mask: Array, *, win_masked: bool = False) -> Array:
    """Per ``(i, c)`` sums of role-site values ``[n, C]`` (spec §1.5): the ``C - 1`` winner
    roles at ``c = y_i`` (the one entry of row ``i`` where ``mask [n, C]`` is False), the
    single loser role elsewhere. ``win_masked``: ``win`` is already zero where ``mask`` is
    False (``pair_tilted``'s and ``pair_slopes``' outputs and sites formed from them), so
    its rows are summed as they are (one operator fewer; the same sums up to the sign of a
    zero)."""
    xp = ops.namespace(win, lose)
    win_sum = xp.sum(win if win_masked else xp.where(mask, win, 0.0), axis=1, keepdims=True)
    return xp.where(mask, lose, win_sum)  # [n, C] against [n, 1]: two or three operators


def factor_counts(y: Array, C: int) -> Array:
    """``n_c = (n - n_c^y) + (C - 1) n_c^y`` ``[C]``: factors touching each class (spec §1.4)
    (float64 on the host for host labels, else on ``y``'s namespace)."""
    counts = ops.class_counts(y, C)
    return (y.shape[0] - counts) + (C - 1) * counts


class RoleCavity(NamedTuple):
    """Cavity of role sites: means ``a``, variances ``v`` and ``d = 1 - C1 v_old`` (broadcast)."""

    a: Array
    v: Array
    d: Array


def remove_site(
    mu: Array, v: Array, C1: Array, C2: Array,
    mu_old: Array | None = None, v_old: Array | None = None, cross: Array | None = None,
) -> RoleCavity:
    """Remove a rank-one role site ``(C1, C2)`` and project on the current direction (spec §2.2).

    ``mu``, ``v``: ``q``'s projections on the current direction; ``mu_old``, ``v_old``: on the
    site's stored direction and ``cross = upsilon^T V upsilon_old`` (all ``None``: the stored
    direction is the current one). Raises ``NumericalError`` when ``d <= 0`` (invalid cavity).
    """
    if mu_old is None:
        mu_old, v_old, cross = mu, v, v
    assert v_old is not None and cross is not None  # given together with mu_old
    d = 1.0 - C1 * v_old
    ops.require_positive(d, lambda: NumericalError(  # deferred on a device, in a context
        "invalid cavity (1 - C1 v <= 0)", quantity="cavity"))
    shift = (C1 * mu_old - C2) / d
    return RoleCavity(mu + cross * shift, v + cross * cross * C1 / d, d)


def role_delta(mu_old: Array, v_old: Array, C1: Array, C2: Array, d: Array) -> Array:
    """``Delta_r = G(cavity) - G(q)`` of one role site on its class (spec §2.6), safe at 0."""
    r = mu_old - C2 * v_old
    log_d = ops.namespace(d).log(d)
    return -0.5 * log_d + 0.5 * (-2.0 * C2 * mu_old + C2 * C2 * v_old + C1 * r * r / d)


class PairTilted(NamedTuple):
    """Tilted quantities per factor ``[n, C]`` (zero where ``mask`` is False).

    ``log_z``, ``g_win = dlogZ/da_y`` (the loser's is ``-g_win``), ``g_b = dlogZ/db`` (both
    roles), ``gamma`` (curvature, both roles).
    """

    log_z: Array
    g_win: Array
    g_b: Array
    gamma: Array


class PairLogZ(NamedTuple):
    """``PairTilted`` without the curvature: what ``log Z_q`` and its gradient need."""

    log_z: Array
    g_win: Array
    g_b: Array


def pair_tilted(
    a_win: Array, v_win: Array, a_lose: Array, v_lose: Array, mask: Array
) -> PairTilted:
    """Tilted moments of every factor from role cavities with FITC variances added (``[n, C]``).

    ``v_win``/``v_lose`` already include ``s`` (``b = s + v_cavity``).
    """
    t = argmax_factor_tilted(a_win, a_lose, v_win, v_lose)
    assert t.gamma is not None and t.dlogz_db is not None  # asked for by default
    xp = ops.namespace(t.log_z)
    return PairTilted(*(xp.where(mask, f, 0.0) for f in (t.log_z, t.dlogz_da, t.dlogz_db,
                                                          t.gamma)))


def pair_log_z(
    a_win: Array, v_win: Array, a_lose: Array, v_lose: Array, mask: Array
) -> PairLogZ:
    """``pair_tilted`` without the curvature (one derivative of ``log Phi`` fewer)."""
    t = argmax_factor_tilted(a_win, a_lose, v_win, v_lose, curvature=False)
    assert t.dlogz_db is not None  # asked for by default
    xp = ops.namespace(t.log_z)
    return PairLogZ(*(xp.where(mask, f, 0.0) for f in (t.log_z, t.dlogz_da, t.dlogz_db)))


class PairSlopes(NamedTuple):
    """What a site update reads of ``PairTilted``: ``g_win`` and ``gamma`` ``[n, C]`` (zero
    where ``mask`` is False)."""

    g_win: Array
    gamma: Array


def pair_slopes(
    a_win: Array, v_win: Array, a_lose: Array, v_lose: Array, mask: Array
) -> PairSlopes:
    """``pair_tilted``'s ``g_win`` and ``gamma`` alone (the same values; ``log_z``, which a
    site update does not read, is left unmasked, and ``g_b`` is not formed: five operators
    fewer)."""
    t = argmax_factor_tilted(a_win, a_lose, v_win, v_lose, slope_b=False)
    assert t.gamma is not None  # asked for by default
    xp = ops.namespace(t.gamma)
    return PairSlopes(xp.where(mask, t.dlogz_da, 0.0), xp.where(mask, t.gamma, 0.0))


def new_role_site(g: Array, gamma: Array, a: Array, v: Array) -> tuple[Array, Array]:
    """Moment-matched role site ``(C1, C2)`` (spec §2.5.1): ``g`` the signed ``dlogZ/da``,
    ``a``, ``v`` the role's cavity mean and variance (without ``s``); ``1 - gamma v`` and
    ``g + gamma a`` one operator each on a device (``ops.add_product``)."""
    den = ops.add_product(1.0, gamma, v, -1.0)
    ops.require_positive(den, lambda: NumericalError(
        "non-positive site denominator 1 - gamma v", quantity="site"))
    return gamma / den, ops.add_product(g, gamma, a) / den


# --------------------------------------------------------------------------------------------
# Matrix gradients of log Z_q (spec §2.7.1-2.7.3)
# --------------------------------------------------------------------------------------------


def inducing_matrix_gradients(
    terms: ClassTerms,
    q: WhitenedGaussian,
    lik: WhitenedGaussian,
    R: Array,
    a_sum: Array,
    b_sum: Array,
    e_sum: Array | None = None,
) -> MatrixGradients:
    """``dlogZ_q / d(Kuu, Kuf, diag Kff)`` of one class from aggregated likelihood terms.

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
    S_B = weighted_gram(A, b_sum)
    S_E = 2.0 * S_B if e_sum is None else weighted_gram(A, e_sum)
    AX = np.outer(A @ a_sum, lik.w) + lik.B_inv(S_E).T - 2.0 * S_B  # A X^T, [M, M]
    prior = -0.5 * (np.eye(M) - q.B_inv(np.eye(M)) - np.outer(q.w, q.w))
    inner = prior - 0.5 * (AX + AX.T) - S_B
    G_K = tri_solve(L, tri_solve(L, inner, transpose=True).T, transpose=True)
    G_uf = tri_solve(L, X, transpose=True)
    return MatrixGradients(Kuu=0.5 * (G_K + G_K.T), Kuf=G_uf, Kff_diag=np.array(b_sum, float))
