"""The liquid set: an EP representation on top of the solid posterior (spec ivm §2.9.3-2.9.5).

The ``k`` liquid points are treated as a small GP problem whose prior is the solid posterior
``Q^f``: on the liquid points it is ``N(h^f, G)`` in point-major order (``[kC]``). With
``V = blockdiag(V_i)`` (``V_i V_i^T = Pi_i``) and ``b = (b_i)``:

``B_EP = I + V^T G V = L_B L_B^T`` (products with ``V`` block by block),
``N = L_B^-1 V^T G``, ``b~ = G b + h^f``,
``theta_B = L_B^-1 V^T b~``; liquid marginals ``A = G - N^T N``, ``h = b~ - N^T theta_B``; a
non-liquid point ``i`` with ``g_i = Cov_f(u_liquid, u_i)`` has
``A_i = Cov_f(u_i) - Nt^T Nt``, ``h_i = h^f_i + g_i^T b - Nt^T theta_B``, ``Nt = L_B^-1 V^T g_i``.

A site update changes the liquid covariance ``Sigma = G - N^T N`` and mean
``mu = b~ - N^T theta`` by a rank-``C`` Woodbury step, ``O((kC)^2 C)``: with ``S = Sigma[:, a]``,
``dPi = Pi_a' - Pi_a``, ``db = b_a' - b_a`` and ``M = (I + dPi S_aa)^-1 dPi``,
``Sigma' = Sigma - S M S^T``, ``mu' = mu - S M mu_a + (S - S M S_aa) db`` (the posterior
precision gains ``dPi`` on block ``a``, its natural mean ``db``). ``L_B``, ``N``, ``theta``
(needed only for non-liquid points) are rebuilt, ``O((kC)^3)``, the next time ``marginals``
asks for them; an EP sweep of ``k`` site updates thus costs one rebuild instead of ``k``
(issue 27: at ``C = 10``, ``L = 25`` the rebuilds were half of ``ivm``'s time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.linalg.blas import dgemm
from scipy.linalg.lapack import dgesv

from gpinfer.errors import NumericalError
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer_ivm.projection import site_precision, site_sqrt
from gpinfer_ivm.solid import SolidRepresentation

Array = np.ndarray


def marginal_change(h0: Array, var0: Array, h1: Array, var1: Array) -> float:
    """Largest change between two marginals with means ``h0``, ``h1 [C]`` and variances
    ``var0``, ``var1 [C]``: ``max_c max(|h1_c - h0_c| / sqrt(var0_c), |log(var1_c / var0_c)|)``
    (``inf`` if not finite). The mean moves in standard deviations, the variance by its log
    ratio: unchanged by any rescaling of the latents (the signal variance, which hyper-parameter
    learning can take to hundreds) or shift of them, and near the KL divergence's square root
    for small changes."""
    with np.errstate(all="ignore"):
        shift = np.abs(h1 - h0) / np.sqrt(var0)
        ratio = np.abs(np.log(var1 / var0))
    change = float(np.max(np.concatenate([shift, ratio])))  # NaN propagates
    return change if np.isfinite(change) else math.inf


class EPRepresentation:
    """Full posterior = solid posterior + liquid sites (see the module docstring).

    ``liquid [k]``: indices of the liquid points (oldest first); ``pi``, ``b``: their sites
    ``[k, C]``. With ``k = 0`` it is the solid posterior itself.
    """

    def __init__(self, solid: SolidRepresentation, liquid: Sequence[int], pi: Array, b: Array):
        self.solid = solid
        self.C = solid.C
        self.liquid = np.asarray(liquid, dtype=np.int64)
        self.pi = np.array(pi, dtype=float).reshape(len(self.liquid), self.C)
        self.b = np.array(b, dtype=float).reshape(len(self.liquid), self.C)
        self.gamma_f = solid.gamma()
        k, C = len(self.liquid), self.C
        self.G = solid.cross_covariances(self.liquid, self.liquid).reshape(k * C, k * C)
        self.G = 0.5 * (self.G + self.G.T)
        self.h_f = solid.means(self.liquid, self.gamma_f).reshape(-1)
        self.rebuild()
        self._moments()

    @property
    def k(self) -> int:
        return len(self.liquid)

    def rebuild(self) -> None:
        """Recompute ``V``, ``L_B``, ``N``, ``b~``, ``theta_B`` from the current sites."""
        k, C = self.k, self.C
        self.Vb = site_sqrt(self.pi)  # [k, C, C], the diagonal blocks of V
        VtG = self._Vt(self.G)  # V^T G [kC, kC], block-diagonal V
        # (V^T G) V: G is symmetric, so this is (V^T (V^T G)^T)^T, one batched matmul again
        VtGV = self._Vt(np.ascontiguousarray(VtG.T)).T
        self.LB = jittered_cholesky(np.eye(k * C) + VtGV, name="I + V^T G V").L
        self.N = tri_solve(self.LB, VtG)
        self.b_tilde = self.G @ self.b.reshape(-1) + self.h_f
        if not np.all(np.isfinite(self.b_tilde)):
            raise NumericalError("the liquid sites' mean b~ = G b + h^f is not finite",
                                 quantity="b~")
        self.theta = tri_solve(self.LB, self._Vt(self.b_tilde))
        self.stale = False

    def _moments(self) -> None:
        """Liquid posterior covariance ``Sigma [kC, kC]`` and mean ``mu [kC]`` from ``N``."""
        self.Sigma = self.G - self.N.T @ self.N
        self.Sigma = 0.5 * (self.Sigma + self.Sigma.T)
        self.mu = self.b_tilde - self.N.T @ self.theta

    def _Vt(self, Y: Array) -> Array:
        """``V^T Y`` for ``Y [kC, ...]`` (block-diagonal ``V``)."""
        k, C = self.k, self.C
        if k == 0:
            return np.zeros_like(Y)
        Yb = Y.reshape(k, C, -1)
        return np.matmul(np.swapaxes(self.Vb, 1, 2), Yb).reshape(Y.shape)  # one batched matmul

    def liquid_marginal(self, a: int) -> tuple[Array, Array]:
        """Marginal ``(h [C], A [C, C])`` of liquid point ``a`` under the full posterior."""
        sl = slice(a * self.C, (a + 1) * self.C)
        return self.mu[sl].copy(), self.Sigma[sl, sl].copy()

    def marginals(self, idx: Array) -> tuple[Array, Array]:
        """Marginals ``h [B, C]``, ``A [B, C, C]`` of non-liquid training points ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        h = self.solid.means(idx, self.gamma_f)
        A = self.solid.covariances(idx)
        if self.k == 0:
            return h, A
        if self.stale:
            self.rebuild()
        B, C = idx.size, self.C
        g = self.solid.cross_covariances(self.liquid, idx).reshape(self.k * C, B, C)
        Nt = tri_solve(self.LB, self._Vt(g.reshape(self.k * C, B * C))).reshape(self.k * C, B, C)
        Ntb = np.ascontiguousarray(np.swapaxes(Nt, 0, 1))  # [B, kC, C]
        A = A - np.swapaxes(Ntb, 1, 2) @ Ntb
        h = h + np.tensordot(self.b.reshape(-1), g, axes=1) - np.tensordot(self.theta, Nt, axes=1)
        return h, A

    def cavity(self, a: int) -> tuple[Array, Array] | None:
        """Cavity ``(h\\i, Lambda)`` of liquid point ``a``, or ``None`` if improper (§2.9.5)."""
        h, A = self.liquid_marginal(a)
        Vi = site_sqrt(self.pi[a])
        AV = A @ Vi
        W = -(Vi.T @ AV)
        W.flat[:: self.C + 1] += 1.0  # I - V^T A V (the same sums, without np.eye)
        try:  # no jitter: a W that is not positive definite is an improper cavity
            LW = jittered_cholesky(W, name="I - V^T A V", max_jitter=0.0).L
        except NumericalError:
            return None
        z = h - A @ self.b[a]
        rhs = np.concatenate([AV.T, (Vi.T @ z)[:, None]], axis=1)
        T = tri_solve(LW, rhs)  # LW^-1 [V^T A, V^T z]
        Lam = A + T[:, :-1].T @ T[:, :-1]
        h_cav = z + T[:, :-1].T @ T[:, -1]
        return h_cav, 0.5 * (Lam + Lam.T)

    def set_site(self, a: int, pi: Array, b: Array) -> float:
        """Replace liquid site ``a``: rank-``C`` update of ``Sigma`` and ``mu`` in place (module
        docstring); returns ``marginal_change`` of point ``a``'s marginal.
        ``np.linalg.LinAlgError`` if ``I + dPi S_aa`` is singular or the update is not finite
        (nothing is changed then)."""
        C = self.C
        sl = slice(a * C, (a + 1) * C)
        dPi = site_precision(np.asarray(pi, dtype=float)) - site_precision(self.pi[a])
        db = np.asarray(b, dtype=float) - self.b[a]
        S = self.Sigma[:, sl].copy()  # [kC, C]; Sigma changes below
        Saa = S[sl]
        h_old, var_old = self.mu[sl].copy(), Saa.diagonal().copy()
        IdS = dPi @ Saa
        IdS.flat[:: C + 1] += 1.0  # I + dPi S_aa
        # LAPACK's gesv directly (what np.linalg.solve calls, without its per-call wrapping)
        M, info = dgesv(IdS, dPi)[2:]  # symmetric (push-through identity)
        if info != 0:
            raise np.linalg.LinAlgError(f"I + dPi S_aa is singular (gesv info {info})")
        SM = S @ (0.5 * (M + M.T))
        dmu = (S - SM @ Saa) @ db - SM @ self.mu[sl]
        if not (np.all(np.isfinite(SM)) and np.all(np.isfinite(dmu))):
            raise np.linalg.LinAlgError("non-finite liquid covariance after a site update")
        # Sigma <- Sigma - SM S^T as one in-place GEMM: the C-ordered Sigma's buffer is the
        # Fortran-ordered Sigma^T, which gets - S SM^T (no symmetrisation per update: the
        # asymmetry stays at round-off within one EP phase; the next representation is rebuilt)
        self.Sigma = dgemm(-1.0, S, SM, 1.0, self.Sigma.T, trans_b=True, overwrite_c=True).T
        self.mu += dmu
        if not np.isfinite(self.Sigma.sum()):  # overflow only: SM and S are finite
            self.rebuild()  # the moments of the unchanged sites
            self._moments()
            raise np.linalg.LinAlgError("non-finite liquid covariance after a site update")
        self.pi[a], self.b[a] = pi, b
        self.stale = True
        return marginal_change(h_old, var_old, self.mu[sl], self.Sigma[sl, sl].diagonal())

    def site_change(self, a: int, pi_new: Array) -> tuple[float, float]:
        """``(||Pi' - Pi||_F, ||Pi||_F)`` for the rejection rule of §2.9.5."""
        P_old = site_precision(self.pi[a])
        return float(np.linalg.norm(site_precision(pi_new) - P_old)), float(np.linalg.norm(P_old))
