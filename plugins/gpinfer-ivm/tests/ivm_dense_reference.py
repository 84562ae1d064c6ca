"""Naive dense references for the IVM tests (full ``Cn x Cn`` algebra, class-major order)."""

from __future__ import annotations

import numpy as np
from gpinfer_ivm.projection import site_precision

Array = np.ndarray


def prior_cov(kernels, X: Array) -> Array:
    """Block-diagonal ``K [Cn, Cn]`` in class-major order."""
    n, C = X.shape[0], len(kernels)
    K = np.zeros((C * n, C * n))
    for c, k in enumerate(kernels):
        K[c * n : (c + 1) * n, c * n : (c + 1) * n] = k.K(X)
    return K


def site_arrays(n: int, C: int, I, pi: Array, b: Array) -> tuple[Array, Array]:
    """Dense ``Pi [Cn, Cn]`` and ``b [Cn]`` (class-major) from restricted sites."""
    Pi = np.zeros((C * n, C * n))
    bb = np.zeros(C * n)
    for a, i in enumerate(I):
        ix = np.arange(C) * n + i
        Pi[np.ix_(ix, ix)] += site_precision(pi[a])
        bb[ix] += b[a]
    return Pi, bb


def dense_posterior(kernels, X: Array, I, pi: Array, b: Array) -> tuple[Array, Array, Array]:
    """Means ``[n, C]``, covariance ``A [Cn, Cn]`` and ``Phi [Cn, Cn]`` of the dense posterior."""
    n, C = X.shape[0], len(kernels)
    K = prior_cov(kernels, X)
    Pi, bb = site_arrays(n, C, I, pi, b)
    Phi = np.linalg.solve(np.eye(C * n) + Pi @ K, Pi)
    A = K - K @ Phi @ K
    return (A @ bb).reshape(C, n).T, A, Phi


def point_block(A: Array, n: int, C: int, j: int, k: int | None = None) -> Array:
    """``Cov(u_j, u_k)`` ``[C, C]`` from a class-major dense covariance."""
    k = j if k is None else k
    return A[np.ix_(np.arange(C) * n + j, np.arange(C) * n + k)]
