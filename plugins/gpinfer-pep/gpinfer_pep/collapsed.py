"""Collapsed Power-EP regression energy, gradients and posterior (spec power-ep §3.1-3.5).

For ``N(y_n | f_n, s2)`` the PEP fixed point is analytic, so no sites are stored. With
``Delta = blkdiag(s2 I + alpha_b H_b)`` (``H_b = K_bb - Q_bb``; singleton blocks give
``Delta_n = s2 + alpha_n h_n``)::

    F = log N(y | 0, Q_ff + Delta) - sum_b (1 - alpha_b) / (2 alpha_b) log|I + alpha_b H_b / s2|

with the ``alpha_b = 0`` term ``-tr(H_b) / (2 s2)`` (VFE). Everything is computed in the whitened
space: ``A = L^-1 Kuf``, ``B = I + A Delta^-1 A^T = L_B L_B^T``, ``chat = B^-1 A Delta^-1 y``;
``b = L^-T chat`` is the predictive ``gamma`` and ``Kuu^-1 - Sigma = L^-T (I - B^-1) L^-1``.
The "noise" (``Delta``) is an object, diagonal or block-diagonal, so one routine serves FITC,
VFE, every alpha in between and the PITC-like block variant.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy.linalg.blas import dsyrk

from gpinfer.errors import InputError
from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.numerics.cholesky import chol_inverse, chol_solve, jittered_cholesky, tri_solve
from gpinfer.sites.stacked import StackedTerms

_LOG_2PI = math.log(2.0 * math.pi)


class Noise(abc.ABC):
    """The effective noise ``Delta [N, N]`` (diagonal or block-diagonal) and its terms."""

    @abc.abstractmethod
    def right_solve(self, A: Array) -> Array:
        """``A Delta^-1`` for ``A [M, N]``."""

    def gram(self, A: Array, Ad: Array) -> Array:
        """``A Delta^-1 A^T [M, M]`` given ``Ad = A Delta^-1`` (symmetrised)."""
        G = Ad @ A.T
        return 0.5 * (G + G.T)

    @abc.abstractmethod
    def solve(self, v: Array) -> Array:
        """``Delta^-1 v`` for ``v [N]``."""

    @abc.abstractmethod
    def log_det(self) -> float:
        """``log|Delta|``."""

    @abc.abstractmethod
    def correction(self) -> float:
        """``-sum_b (1 - alpha_b) / (2 alpha_b) log|I + alpha_b H_b / s2|`` (VFE limit at 0)."""

    @abc.abstractmethod
    def gradient_terms(self, A: Array, Ad: Array, Ud: Array, r: Array
                       ) -> tuple[Array, Array, Array | list[Array], float]:
        """With ``R_b = alpha_b P_b - (1 - alpha_b)/2 Delta_b^-1`` and
        ``P_b = (r_b r_b^T - Delta_b^-1 + Ad_b^T Ud_b) / 2``: returns ``sum_b A_b R_b A_b^T
        [M, M]``, ``[A_b R_b]_b [M, N]``, ``dF/dK_bb`` (``[N]`` diagonal or one ``R_b`` per
        block) and ``dF/ds2``."""


class DiagonalNoise(Noise):
    """Singleton blocks: ``Delta_n = s2 + alpha_n h_n`` (spec §3.2-3.3)."""

    def __init__(self, h: Array, s2: float, alpha: Array):
        self.h, self.s2, self.alpha = h, s2, alpha
        self.delta = s2 + alpha * h

    def right_solve(self, A: Array) -> Array:
        return A / self.delta

    def solve(self, v: Array) -> Array:
        return v / self.delta

    def gram(self, A: Array, Ad: Array) -> Array:
        """Symmetric rank-k update (``dsyrk``): half the work of a general product."""
        G = dsyrk(1.0, A * np.sqrt(1.0 / self.delta), lower=1)
        return G + np.tril(G, -1).T

    def log_det(self) -> float:
        return float(np.sum(np.log(self.delta)))

    def correction(self) -> float:
        a, x = self.alpha, self.h / self.s2
        pos = a > 0
        safe = np.where(pos, a, 1.0)
        terms = np.where(pos, -(1.0 - a) / (2.0 * safe) * np.log1p(safe * x), -0.5 * x)
        return float(np.sum(terms))

    def gradient_terms(self, A: Array, Ad: Array, Ud: Array, r: Array
                       ) -> tuple[Array, Array, Array | list[Array], float]:
        a, d = self.alpha, self.delta
        P = 0.5 * (r * r - 1.0 / d + np.einsum("ij,ij->j", Ad, Ud))
        R = a * P - 0.5 * (1.0 - a) / d
        AR = A * R
        ds2 = float(np.sum(P) + 0.5 * np.sum((1.0 - a) * self.h / d) / self.s2)
        return AR @ A.T, AR, R, ds2


class BlockNoise(Noise):
    """PITC-like blocks: ``Delta_b = s2 I + alpha_b H_b`` with dense ``H_b`` (spec §3.5)."""

    def __init__(self, blocks: list[Array], Kbb: list[Array], A: Array, s2: float,
                 alpha: Array):
        self.blocks, self.s2, self.alpha = blocks, s2, alpha
        self.H: list[Array] = []
        self.chol: list[Array] = []  # chol(I + alpha_b H_b / s2)
        for idx, K, a in zip(blocks, Kbb, alpha):
            Ab = A[:, idx]
            H = K - Ab.T @ Ab
            H = 0.5 * (H + H.T)
            self.H.append(H)
            self.chol.append(jittered_cholesky(np.eye(len(idx)) + (a / s2) * H,
                                               name="I + alpha H_b / s2", max_jitter=0.0).L)
        self.n = sum(len(b) for b in blocks)

    def _solve_block(self, j: int, V: Array) -> Array:
        return chol_solve(self.chol[j], V) / self.s2

    def right_solve(self, A: Array) -> Array:
        out = np.empty_like(A)
        for j, idx in enumerate(self.blocks):
            out[:, idx] = self._solve_block(j, A[:, idx].T).T
        return out

    def solve(self, v: Array) -> Array:
        out = np.empty_like(v)
        for j, idx in enumerate(self.blocks):
            out[idx] = self._solve_block(j, v[idx])
        return out

    def _logdet_scaled(self, j: int) -> float:
        return float(2.0 * np.sum(np.log(np.diag(self.chol[j]))))

    def log_det(self) -> float:
        return self.n * math.log(self.s2) + sum(self._logdet_scaled(j)
                                                for j in range(len(self.blocks)))

    def correction(self) -> float:
        total = 0.0
        for j, a in enumerate(self.alpha):
            if a > 0:
                total -= (1.0 - a) / (2.0 * a) * self._logdet_scaled(j)
            else:
                total -= np.trace(self.H[j]) / (2.0 * self.s2)
        return float(total)

    def gradient_terms(self, A: Array, Ad: Array, Ud: Array, r: Array
                       ) -> tuple[Array, Array, Array | list[Array], float]:
        M = A.shape[0]
        S, AR, dK, ds2 = np.zeros((M, M)), np.empty_like(A), [], 0.0
        for j, (idx, a) in enumerate(zip(self.blocks, self.alpha)):
            Dinv = self._solve_block(j, np.eye(len(idx)))
            P = 0.5 * (np.outer(r[idx], r[idx]) - Dinv + Ad[:, idx].T @ Ud[:, idx])
            R = a * P - 0.5 * (1.0 - a) * Dinv
            R = 0.5 * (R + R.T)
            ARb = A[:, idx] @ R
            AR[:, idx] = ARb
            S += ARb @ A[:, idx].T
            dK.append(R)
            ds2 += float(np.trace(P) + 0.5 * (1.0 - a) * np.sum(Dinv * self.H[j]) / self.s2)
        return S, AR, dK, ds2


def check_partition(blocks: list, n: int) -> list[Array]:
    """Validate a partition of ``range(n)`` into blocks (each index exactly once)."""
    try:
        out = [np.asarray(b, dtype=int).reshape(-1) for b in blocks]
    except (TypeError, ValueError) as exc:
        raise InputError(f"blocks must be a list of integer index arrays: {exc}") from exc
    if any(b.size == 0 for b in out):
        raise InputError("blocks must not be empty")
    allidx = np.concatenate(out) if out else np.zeros(0, dtype=int)
    if allidx.size != n or not np.array_equal(np.sort(allidx), np.arange(n)):
        missing = np.setdiff1d(np.arange(n), allidx)[:5].tolist()
        raise InputError(
            f"blocks must partition the {n} training points (every index exactly once); got "
            f"{allidx.size} indices, missing e.g. {missing}, "
            f"{allidx.size - np.unique(allidx).size} repeated"
        )
    return out


@dataclass
class CollapsedResult:
    """Energy ``value``; ``grads`` (``Kuu``, ``Kuf``, ``Kff_diag`` (zero with blocks),
    ``likelihood = [dF/d log s2]``); ``block_grads``: ``dF/dK_bb`` per block (or ``None``);
    the posterior as ``L``, ``L_B``, ``gamma`` (= ``b``)."""

    value: float
    grads: MatrixGradients
    block_grads: list[Array] | None
    L: Array
    L_B: Array
    gamma: Array


def collapsed_pep(
    geo: StackedTerms,
    y: Array,
    s2: float,
    alpha: Array,
    blocks: list[Array] | None = None,
    Kbb: list[Array] | None = None,
    with_gradients: bool = True,
) -> CollapsedResult:
    """Collapsed PEP energy (§3.2 / §3.5) and its gradients (§3.3 / §3.5).

    ``y [N]``, ``s2`` the noise variance, ``alpha``: ``[N]`` per point (singleton blocks) or one
    per block. ``Kbb``: the dense kernel block of each block (only with ``blocks``).
    """
    A, L = geo.A, geo.L
    M, N = A.shape
    if blocks is None:
        noise: Noise = DiagonalNoise(geo.s, s2, alpha)
    else:
        if Kbb is None:
            raise InputError("collapsed PEP with blocks needs Kbb, the kernel block of each")
        noise = BlockNoise(blocks, Kbb, A, s2, alpha)
    Ad = noise.right_solve(A)
    B = np.eye(M) + noise.gram(A, Ad)
    L_B = jittered_cholesky(B, name="B = I + A Delta^-1 A^T", max_jitter=0.0).L
    Ay = Ad @ y
    # B >= I is well conditioned, so its explicit inverse is safe and turns the O(N M^2)
    # solves below into matrix products
    Binv = chol_inverse(L_B)
    chat = Binv @ Ay
    value = (-0.5 * N * _LOG_2PI - np.sum(np.log(np.diag(L_B))) - 0.5 * noise.log_det()
             - 0.5 * y @ noise.solve(y) + 0.5 * Ay @ chat + noise.correction())
    gamma = tri_solve(L, chat, transpose=True)
    if not with_gradients:
        return CollapsedResult(float(value), MatrixGradients(), None, L, L_B, gamma)
    r = noise.solve(y - A.T @ chat)
    Ud = Binv @ Ad
    S, AR, dK, ds2 = noise.gradient_terms(A, Ad, Ud, r)
    inner = 0.5 * (np.eye(M) - Binv - np.outer(chat, chat)) + S
    Li_T = tri_solve(L, np.eye(M), transpose=True)  # L^-T
    dKuu = Li_T @ inner @ Li_T.T
    dKuu = 0.5 * (dKuu + dKuu.T)
    dKuf = tri_solve(L, np.outer(chat, r) - Ud - 2.0 * AR, transpose=True)
    # dK: the diagonal [N] for singleton blocks, one R_b per block otherwise (Noise.gradient_terms)
    diag = cast(Array, dK) if blocks is None else np.zeros(N)
    grads = MatrixGradients(Kff_diag=diag, Kuu=dKuu, Kuf=dKuf, likelihood=np.array([s2 * ds2]))
    block_grads = None if blocks is None else cast(list[Array], dK)
    return CollapsedResult(float(value), grads, block_grads, L, L_B, gamma)
