"""Random test data shared by the IVM tests (draw order fixed: the tests' numbers depend on it)."""

from __future__ import annotations

import numpy as np

from gpinfer.kernels.stationary import RBF

Array = np.ndarray


def spd(rng: np.random.Generator, C: int, scale: float = 1.0) -> Array:
    """A random well-conditioned ``[C, C]`` covariance times ``scale``."""
    Z = rng.standard_normal((C, C))
    return scale * (Z @ Z.T / C + 0.3 * np.eye(C))


def tilted_batch(rng: np.random.Generator, C: int, scales: Array) -> tuple[Array, Array, Array]:
    """One marginal per scale: ``A [B, C, C]``, means ``h [B, C]``, labels ``y [B]``."""
    A = np.stack([spd(rng, C, s) for s in scales])
    h = rng.standard_normal((len(scales), C))
    y = rng.integers(0, C, len(scales))
    return A, h, y


def three_blobs(n: int) -> tuple[Array, Array, RBF]:
    """``n`` points of three Gaussian blobs in 5-D (seed 0), labels, and a kernel that fits."""
    rng = np.random.default_rng(0)
    means = rng.normal(0.0, 1.6, (3, 5))
    y = rng.integers(0, 3, n)
    X = means[y] + rng.standard_normal((n, 5))
    return X, y, RBF(lengthscale=np.sqrt(5.0), variance=2.0)
