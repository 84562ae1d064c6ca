"""Naive double-loop reference kernels, written from the textbook formulas (no vectorisation)."""

from __future__ import annotations

import math

import numpy as np


def _pairs(X, X2):
    X = np.asarray(X, dtype=float)
    X2 = X if X2 is None else np.asarray(X2, dtype=float)
    return X, X2, np.zeros((X.shape[0], X2.shape[0]))


def _scaled_distance(x, x2, lengthscale) -> float:
    ell = np.broadcast_to(np.asarray(lengthscale, dtype=float), x.shape)
    return math.sqrt(sum(((x[d] - x2[d]) / ell[d]) ** 2 for d in range(x.shape[0])))


def _stationary(X, X2, lengthscale, profile):
    """``K[i, j] = profile(r)``, ``r`` the scaled distance of ``X[i]`` and ``X2[j]``."""
    X, X2, K = _pairs(X, X2)
    for i in range(X.shape[0]):
        for j in range(X2.shape[0]):
            K[i, j] = profile(_scaled_distance(X[i], X2[j], lengthscale))
    return K


def rbf(X, X2, lengthscale, variance):
    return _stationary(X, X2, lengthscale, lambda r: variance * math.exp(-0.5 * r * r))


def matern32(X, X2, lengthscale, variance):
    return _stationary(X, X2, lengthscale, lambda r: variance * (1 + math.sqrt(3) * r)
                       * math.exp(-math.sqrt(3) * r))


def matern52(X, X2, lengthscale, variance):
    return _stationary(X, X2, lengthscale, lambda r: variance
                       * (1 + math.sqrt(5) * r + 5 * r * r / 3) * math.exp(-math.sqrt(5) * r))


def linear(X, X2, variance):
    X, X2, K = _pairs(X, X2)
    v = np.broadcast_to(np.asarray(variance, dtype=float), (X.shape[1],))
    for i in range(X.shape[0]):
        for j in range(X2.shape[0]):
            K[i, j] = sum(v[d] * X[i, d] * X2[j, d] for d in range(X.shape[1]))
    return K


def white(X, X2, variance):
    square = X2 is None
    X, X2, K = _pairs(X, X2)
    if square:
        for i in range(X.shape[0]):
            K[i, i] = variance
    return K
