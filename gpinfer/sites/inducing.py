"""Site algebra in inducing space for pairwise-probit multi-class EP / SEP (spec ep-sep §2).

Shared by the sparse EP, SEP and (for the role-site bookkeeping) GFITC plugins; the kernel
quantities of a class (``L``, ``A``, ``s``) are the inducing geometry of ``gpinfer.sites.stacked``
(``StackedTerms``, one latent: ``latent_terms``).

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

import warnings
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array
from gpinfer.likelihoods.multiclass import argmax_factor_tilted
from gpinfer.moved import renamed
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer.numerics.settings import INDUCING_JITTER, INDUCING_JITTER_FLOAT32


def inducing_jitter(X: Array) -> float:
    """The jitter for kernel matrices of ``X``'s floating dtype (float64 or float32):
    ``settings.INDUCING_JITTER`` or ``INDUCING_JITTER_FLOAT32``."""
    return INDUCING_JITTER_FLOAT32 if str(X.dtype).endswith("float32") else INDUCING_JITTER


# --------------------------------------------------------------------------------------------
# A Gaussian over one class's inducing values in whitened coordinates (spec §2.1)
# --------------------------------------------------------------------------------------------


class Projections(NamedTuple):
    """Means ``mu [n]`` and variances ``v [n]`` of ``q`` along whitened directions, and
    ``R = L_B^-1 A`` ``[M, n]`` (kept for cross terms and gradients)."""

    mu: Array
    v: Array
    R: Array


#: the lower Cholesky factor of ``B = I + P_w`` ``[M, M]`` (or a stack ``[C, M, M]``), checked
#: together with the whitened shift ``h_w`` (``site_factor(B, h_w, iteration=...).L``): no
#: jitter, ``NumericalError`` (quantity ``"B"``) when either is not finite or ``B`` is not
#: positive definite (corrupted sites); inside ``ops.deferred_checks`` on a device the check
#: is read with the others (``jittered_cholesky``'s)
site_factor = partial(jittered_cholesky, name="B", max_jitter=0.0, inputs="site sums",
                      detail=" (B = I + L^T Lambda L: corrupted sites)")


class WhitenedGaussian:
    """``q(u) = N(L w, L B^-1 L^T)`` with ``B = I + P_w`` (``P_w [M, M]`` psd), ``w = B^-1 h_w``.

    ``NumericalError`` (quantity ``"B"``) when ``B`` is not positive definite.
    """

    def __init__(self, P_w: Array, h_w: Array, *, iteration: int | None = None):
        M = h_w.shape[0]
        self.LB = site_factor(np.eye(M) + P_w, h_w, iteration=iteration).L
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
# Names that moved (one release): the per-class terms are the one geometry's single-latent view
# --------------------------------------------------------------------------------------------

if not TYPE_CHECKING:  # at run time only: mypy keeps checking the imports from here
    _renamed = renamed(__name__, {"ClassTerms": "gpinfer.sites.stacked:StackedTerms",
                                  "class_terms": "gpinfer.sites.stacked:latent_terms"})

    def __getattr__(name: str) -> Any:
        """The deprecated names, for one more release: ``ClassTerms`` and ``class_terms``
        (``gpinfer.moved.renamed``), and ``site_cholesky(Bm, h_w, iteration)`` for
        ``site_factor(Bm, h_w, iteration=...).L`` (``jittered_cholesky`` without jitter)."""
        if name != "site_cholesky":
            return _renamed(name)
        warnings.warn("gpinfer.sites.inducing.site_cholesky is deprecated: use site_factor(Bm, "
                      "h_w, iteration=...).L; the old name works for one more release",
                      DeprecationWarning, stacklevel=2)
        return lambda Bm, h_w, iteration=None: site_factor(Bm, h_w, iteration=iteration).L
