"""Weighted Gram matrices ``A diag(d) A^T`` at half the cost of a general product."""

from __future__ import annotations

import numpy as np

from gpinfer.interfaces import Array


def weighted_gram(A: Array, d: Array) -> Array:
    """``A diag(d) A^T`` ``[M, M]`` for ``A [M, n]`` and weights ``d [n]`` of any sign.

    Written as the difference of two symmetric rank-k products,
    ``(A_+ sqrt(d_+)) (.)^T - (A_- sqrt(-d_-)) (.)^T`` over the columns with positive and
    negative weights, which BLAS computes with ``syrk`` (``M^2 n`` flops instead of ``2 M^2 n``).
    The result is exactly symmetric.
    """
    A = np.asarray(A, dtype=float)
    d = np.asarray(d, dtype=float)
    if d.shape != (A.shape[1],):
        raise ValueError(f"weights must have shape ({A.shape[1]},), got {d.shape}")
    out = np.zeros((A.shape[0], A.shape[0]))
    pos, neg = d > 0.0, d < 0.0
    for cols, sign in ((pos, 1.0), (neg, -1.0)):
        if not np.any(cols):
            continue
        P = A[:, cols] * np.sqrt(sign * d[cols])
        out += sign * (P @ P.T)  # numpy hands P @ P.T to syrk
    return out
