"""Dense Gaussian posteriors with diagonal site precisions: the "B-trick" (spec binary §1.4).

Every diagonal-``W`` method (Laplace, EP, KL, VB, LR) writes its posterior as
``q(f) = N(K alpha, V)`` with ``V = (K^-1 + W)^-1``, ``W = Dg(w)``, ``w >= 0``. With
``s = sqrt(w)`` and ``B = I + Dg(s) K Dg(s) = L L^T`` (eigenvalues in ``[1, 1 + n max w max|K|]``)
every quantity they need is safe even when ``K`` is numerically singular; ``K^-1`` is never
formed:

* ``R = (K + W^-1)^-1 = Dg(s) L^-T L^-1 Dg(s)`` (finite when some ``w_i = 0``);
* ``C = L^-1 Dg(s) K``, ``V = K - C^T C``;
* ``(I + K W)^-1 = I - K R``, ``log|I + K W| = log|B| = 2 sum log L_ii``;
* ``tr(V K^-1) = tr(B^-1) = ||L^-1||_F^2``;
* ``(K^-1 + W)^-1 b = K b - K R K b`` (the Newton / mode update).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, Likelihood
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, log_det_from_chol, tri_solve
from gpinfer.posterior import DenseSitePosterior


class DiagonalSiteAlgebra:
    """The B-trick for a prior covariance ``K [N, N]`` and site precisions ``w [N] >= 0``.

    Build with ``from_kernel_matrix(K, w)``; the Cholesky factor ``L`` of ``B`` is computed once
    and the ``O(N^3)`` derived matrices (``R``, ``C``) on first use, then cached. Treat an
    instance as immutable: new ``K`` or ``w`` means a new instance.
    """

    def __init__(self, K: Array, w: Array, L: Array, jitter: float = 0.0):
        self.K = K
        self.w = w
        self.sqrt_w = np.sqrt(w)
        self.L = L
        self.jitter = jitter

    @classmethod
    def from_kernel_matrix(
        cls, K: Array, w: Array, *, iteration: int | None = None
    ) -> DiagonalSiteAlgebra:
        """Factorise ``B = I + Dg(sqrt w) K Dg(sqrt w)``.

        ``w`` must be finite and non-negative (round-off negatives down to ``-1e-12 * max w``
        are set to zero); otherwise ``NumericalError`` names ``iteration`` and ``w``.
        """
        K = np.asarray(K, dtype=float)
        w = np.array(w, dtype=float).reshape(-1)
        n = w.size
        if K.shape != (n, n):
            raise ValueError(f"K must be [{n}, {n}] to match w [{n}], got {K.shape}")
        if not np.all(np.isfinite(w)):
            raise NumericalError("site precisions are not finite", iteration=iteration,
                                 quantity="w")
        tol = 1e-12 * max(float(np.max(np.abs(w), initial=0.0)), 1.0)
        if np.any(w < -tol):
            raise NumericalError(
                f"site precisions must be non-negative, min is {w.min():.3g}",
                iteration=iteration, quantity="w",
            )
        w = np.maximum(w, 0.0)
        s = np.sqrt(w)
        Bmat = np.eye(n) + s[:, None] * K * s[None, :]
        try:
            L, jitter = jittered_cholesky(Bmat, name="B = I + sW K sW")
        except NumericalError as err:
            raise NumericalError(str(err), iteration=iteration, quantity="B") from err
        return cls(K, w, L, jitter)

    # -- basic quantities --------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.w.size

    @cached_property
    def log_det_B(self) -> float:
        """``log|B| = log|I + K W|``."""
        return log_det_from_chol(self.L)

    def solve_B(self, b: Array) -> Array:
        """``B^-1 b`` for ``b [N]`` or ``[N, k]``."""
        return chol_solve(self.L, b)

    @cached_property
    def _L_inv(self) -> Array:
        """``L^-1 [N, N]``."""
        return tri_solve(self.L, np.eye(self.n))

    @cached_property
    def trace_B_inv(self) -> float:
        """``tr(B^-1) = tr(V K^-1) = ||L^-1||_F^2``."""
        return float(np.sum(self._L_inv**2))

    # -- R = (K + W^-1)^-1 and products with it ----------------------------------------------
    def R(self) -> Array:
        """``R = (K + W^-1)^-1 = Dg(s) B^-1 Dg(s)``, ``[N, N]`` (cached)."""
        return self._R

    @cached_property
    def _R(self) -> Array:
        S = self.sqrt_w[:, None] * self._L_inv.T  # Dg(s) L^-T
        R = S @ S.T
        return 0.5 * (R + R.T)

    def R_matvec(self, v: Array) -> Array:
        """``R v`` for ``v [N]`` or ``[N, k]`` by two triangular solves (no ``R`` formed)."""
        s = self.sqrt_w if np.ndim(v) == 1 else self.sqrt_w[:, None]
        return s * self.solve_B(s * v)

    def posterior_solve(self, b: Array) -> Array:
        """``alpha = K^-1 (K^-1 + W)^-1 b = b - s * B^-1 (s * K b)`` for ``b [N]``.

        So that ``(K^-1 + W)^-1 b = K alpha`` (spec binary §2.1, Newton update).
        """
        return b - self.R_matvec(self.K @ b)

    # -- posterior covariance V = (K^-1 + W)^-1 ----------------------------------------------
    @cached_property
    def C(self) -> Array:
        """``C = L^-1 Dg(s) K``, ``[N, N]``; ``V = K - C^T C``."""
        return tri_solve(self.L, self.sqrt_w[:, None] * self.K)

    def posterior_cov(self) -> Array:
        """``V = (K^-1 + W)^-1 = K - C^T C``, ``[N, N]``."""
        V = self.K - self.C.T @ self.C
        return 0.5 * (V + V.T)

    def posterior_var_diag(self) -> Array:
        """``diag(V) [N]`` (``O(N^3)`` once, through ``C``)."""
        return np.diag(self.K) - np.sum(self.C**2, axis=0)

    # -- prediction --------------------------------------------------------------------------
    def posterior(
        self, likelihood: Likelihood, kernel: Kernel, X: Array, alpha: Array
    ) -> DenseSitePosterior:
        """The fitted-posterior object for prediction at new inputs (``X [N, D]`` training)."""
        return DenseSitePosterior(likelihood, kernel, X, np.asarray(alpha, float),
                                  self.sqrt_w.copy(), self.L)
