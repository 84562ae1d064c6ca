"""The one finite-difference gradient checker used by every test in gpinfer and its plugins."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Array = np.ndarray


def numerical_gradient(f: Callable[[Array], float], x: Array, eps: float = 1e-6) -> Array:
    """Central finite differences of a scalar function ``f`` at ``x`` (any shape)."""
    x = np.array(x, dtype=float)
    grad = np.zeros_like(x)
    flat_x, flat_g = x.reshape(-1), grad.reshape(-1)
    for i in range(flat_x.size):
        orig = flat_x[i]
        step = eps * max(1.0, abs(orig))
        flat_x[i] = orig + step
        f_plus = f(x.copy())
        flat_x[i] = orig - step
        f_minus = f(x.copy())
        flat_x[i] = orig
        flat_g[i] = (f_plus - f_minus) / (2.0 * step)
    return grad


def relative_error(a: Array, b: Array, floor: float = 1e-8) -> float:
    """``max |a - b| / max(|a|, |b|, floor)`` elementwise, as a single float."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    denom = np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)
    return float(np.max(np.abs(a - b) / denom)) if a.size else 0.0


def assert_gradient_close(
    f: Callable[[Array], float],
    grad: Array,
    x: Array,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    name: str = "gradient",
) -> None:
    """Assert that analytic ``grad`` (shape of ``x``) matches central differences of ``f``."""
    num = numerical_gradient(f, x, eps=eps)
    grad = np.asarray(grad, dtype=float).reshape(num.shape)
    bad = np.abs(grad - num) > atol + rtol * np.maximum(np.abs(num), np.abs(grad))
    if np.any(bad):
        idx = np.argwhere(bad)[:5].tolist()
        raise AssertionError(
            f"{name} disagrees with finite differences at {idx}: analytic "
            f"{grad[bad][:5]}, numerical {num[bad][:5]} "
            f"(max rel err {relative_error(grad, num):.3g})"
        )
