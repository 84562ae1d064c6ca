"""Incremental Cholesky primitives: append a row/column, rank-one update with "dragging".

Spec ivm §2.3. ``S = L L^T`` with ``L [d, d]`` lower triangular.

* ``cholext(L, s, sigma)``: factor of ``S`` extended by the last column ``(s^T, sigma)^T``;
  returns the new row ``(l^T, lam)`` with ``l = L^-1 s``, ``lam = sqrt(sigma - l^T l)``.
* ``chollrup(L, r, sign, X)``: factor ``L'`` of ``S + sign r r^T`` (``sign = +-1``) and, for any
  ``X [d, m]``, the "dragged" ``X'`` with ``L' X' = L X`` (computed without forming ``L X``).

Both raise ``NumericalError`` when the modified matrix is not positive definite, so callers can
roll back (negative updates can break down by round-off).
"""

from __future__ import annotations

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.numerics.cholesky import tri_solve

Array = np.ndarray


def cholext(L: Array, s: Array, sigma: float) -> tuple[Array, float]:
    """New last row ``(l [d], lam)`` of the factor of ``[[S, s], [s^T, sigma]]``; ``O(d^2)``."""
    d = L.shape[0]
    l = tri_solve(L, s) if d else np.zeros(0)
    rad = float(sigma - l @ l)
    if not np.isfinite(rad) or rad <= 0.0:
        raise NumericalError(
            f"cholext: extended matrix is not positive definite (radicand {rad:.3g})",
            quantity="cholext",
        )
    return l, float(np.sqrt(rad))


def chollrup(
    L: Array, r: Array, sign: float = 1.0, X: Array | None = None
) -> tuple[Array, Array | None]:
    """Factor of ``L L^T + sign r r^T`` and the dragged ``X' = Lt^-1 X`` (spec ivm §2.3).

    ``L [d, d]`` lower, ``r [d]``, ``sign`` in ``{+1, -1}``, ``X [d, m]`` or None. With
    ``p = L^-1 r``, ``t_k = 1 + sign sum_{j<=k} p_j^2``, ``g_k = sqrt(t_k / t_{k-1})``,
    ``phi_k = sign p_k / sqrt(t_k t_{k-1})``:
    ``L'[:, k] = g_k L[:, k] + phi_k sum_{j>k} p_j L[:, j]``
    (vectorised, ``O(d^2)``); the dragging recursion runs row by row in ``O(d m)``.
    """
    d = L.shape[0]
    if d == 0:
        return L.copy(), None if X is None else X.copy()
    p = tri_solve(L, r)
    t = 1.0 + sign * np.cumsum(p * p)
    t_prev = np.concatenate([[1.0], t[:-1]])
    if np.any(~np.isfinite(t)) or np.any(t <= 0.0):
        raise NumericalError(
            "chollrup: the downdated matrix is not positive definite", quantity="chollrup"
        )
    g = np.sqrt(t / t_prev)
    phi = sign * p / np.sqrt(t * t_prev)
    Lp = L * p[None, :]
    suffix = np.cumsum(Lp[:, ::-1], axis=1)[:, ::-1] - Lp  # sum_{j>k} p_j L[:, j]
    L_new = L * g[None, :] + suffix * phi[None, :]
    if X is None:
        return L_new, None
    X_new = np.empty_like(X, dtype=float)
    acc = np.zeros(X.shape[1:], dtype=float)
    for k in range(d):
        X_new[k] = (X[k] - p[k] * acc) / g[k]
        acc += phi[k] * X_new[k]
    return L_new, X_new
