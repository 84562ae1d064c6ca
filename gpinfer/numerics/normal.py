"""Stable functions of the standard normal distribution.

Symbols follow spec binary §1.2: ``phi`` is the standard normal density, ``Phi`` its cumulative
distribution, ``r(t) = phi(t) / Phi(t)`` the inverse Mills ratio and ``psi(t) = log Phi(t)``.
Every function is elementwise on arrays of any shape and accurate far in both tails, and takes
arrays of any array-API namespace (numpy, torch; ``gpinfer.backend``):

* ``log Phi`` via ``log_ndtr`` (``gpinfer.backend.ops``);
* ``r(t)`` via ``exp(log phi - log Phi)`` for ``t >= 0`` and ``sqrt(2/pi) / erfcx(-t/sqrt 2)`` for
  ``t < 0`` (exact to rounding for every ``t``; spec ep-sep §2.4); on a device, which would
  evaluate both branches on every entry, the ``erfcx`` form alone for every ``t`` (four
  operators instead of eleven; equal to the two-branch form within 2e-13 relative for
  ``t <= 37``, beyond which both are below 1e-300: ``tests/numerics/test_normal.py``);
* the curvature ``gamma(t) = -psi''(t) = r (t + r)`` and the higher derivatives of ``psi``, which
  cancel catastrophically for ``t << 0``, switch to their asymptotic series below
  ``-settings.PROBIT_ASYMPTOTIC_CUT``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from gpinfer.backend import ops
from gpinfer.numerics import settings

Array = Any

#: ``log sqrt(2 pi)``
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


def _mills_series_coefficients(n_terms: int) -> tuple[float, ...]:
    """Coefficients ``c_n`` of ``r(-x) = x * sum_n c_n x^(-2n)`` for ``x -> +inf``.

    They invert the classical series ``Phi(-x) / phi(x) ~ (1/x) sum_n (-1)^n (2n-1)!! x^(-2n)``
    (exact rational arithmetic): ``c = 1, 1, -2, 10, -74, 706, ...``.
    """
    mills = []
    double_factorial = 1
    for n in range(n_terms):
        if n > 0:
            double_factorial *= 2 * n - 1
        mills.append(Fraction((-1) ** n * double_factorial))
    inverse = [Fraction(1)] + [Fraction(0)] * (n_terms - 1)
    for n in range(1, n_terms):
        inverse[n] = -sum((mills[k] * inverse[n - k] for k in range(1, n + 1)), Fraction(0))
    return tuple(float(c) for c in inverse)


_MILLS_C = _mills_series_coefficients(settings.PROBIT_ASYMPTOTIC_TERMS)


def log_phi(t: Array) -> Array:
    """``log N(t | 0, 1)``, any shape."""
    t = ops.as_array(t)
    return -0.5 * t * t - LOG_SQRT_2PI


def log_Phi(t: Array) -> Array:
    """``log Phi(t)``, accurate for ``t << 0`` (``~ -t^2/2``) and ``t >> 0`` (``~ -phi(t)``)."""
    return ops.log_ndtr(ops.as_array(t))


def inv_mills(t: Array, log_Phi_t: Array | None = None) -> Array:
    """Inverse Mills ratio ``r(t) = phi(t) / Phi(t)``, positive, ``~ -t`` for ``t << 0``.

    ``log_Phi_t``: ``log Phi(t)`` when the caller has it already (used for ``t >= 0``).
    """
    t = ops.as_array(t)
    xp = ops.namespace(t)

    def left(x: Array, *_: Array) -> Array:
        # erfcx(x) = exp(x^2) erfc(x): Phi(t) = erfcx(-t/sqrt2) exp(-t^2/2) / 2 for every t
        return _SQRT_2_OVER_PI / ops.erfcx(x * -_SQRT_HALF)

    def right(x: Array, log_cdf: Array | None = None) -> Array:
        return xp.exp(log_phi(x) - (ops.log_ndtr(x) if log_cdf is None else log_cdf))

    def negative(x: Array, *_: Array) -> Array:
        return x < 0

    # numpy: each formula on its own entries; a device evaluates every entry anyway: the
    # first formula alone (valid everywhere), no mask and no select
    args = (t,) if log_Phi_t is None else (t, ops.as_array(log_Phi_t))
    return ops.piecewise_or_whole(negative, left, right, left, *args)


def _series_coefficients(derivative: int) -> tuple[float, ...]:
    """``b_n`` with ``d^k/dx^k sum_n c_n x^(1-2n) = x^(1-k) sum_n b_n x^(-2n)`` (k = derivative)."""
    out = []
    for n, c in enumerate(_MILLS_C):
        coef = c
        for i in range(derivative):
            coef *= 1 - 2 * n - i
        out.append(coef)
    return tuple(out)


_SERIES_B = tuple(_series_coefficients(k) for k in range(4))


def _asymptotic(x: Array, derivative: int) -> Array:
    """``d^k/dx^k`` of the series ``r(-x) = sum_n c_n x^(1-2n)`` for large ``x > 0``: a
    polynomial in ``x^-2`` (``ops.polyval``: Horner's rule on numpy, one product of its powers
    on a device) times ``x^(1-k)``."""
    out = ops.polyval(_SERIES_B[derivative], ops.reciprocal(x * x))
    return out if derivative == 1 else out * x ** (1 - derivative)


def probit_curvature(t: Array) -> Array:
    """``gamma(t) = -d^2/dt^2 log Phi(t) = r(t) (t + r(t))``, in ``(0, 1)``, without cancellation.

    Direct formula for ``t >= -PROBIT_ASYMPTOTIC_CUT``; below, the series
    ``1 - t^-2 + 6 t^-4 - 50 t^-6 + ...`` (spec ep-sep §2.4).
    """
    return -log_Phi_derivatives(t, 2)[2]


def log_Phi_derivatives(t: Array, order: int = 4) -> tuple[Array, ...]:
    """``(psi, psi', ..., psi^(order))`` of ``psi(t) = log Phi(t)``, ``order <= 4``, shaped like t.

    Closed forms of spec binary §1.2 (with ``q = t + r``): ``psi' = r``, ``psi'' = -r q``,
    ``psi''' = r [q (t + 2r) - 1]``,
    ``psi'''' = r' [q (t + 2r) - 1] + r [(1 + r')(t + 2r) + q (1 + 2r')]``
    with ``r' = -r q``. For ``t < -PROBIT_ASYMPTOTIC_CUT`` the derivatives of order >= 2 come from
    the asymptotic series of ``r``, which does not cancel.
    """
    if not 0 <= order <= 4:
        raise ValueError(f"order must be in 0..4, got {order}")
    t = ops.as_array(t)
    out: list[Array] = [log_Phi(t)]
    if order == 0:
        return tuple(out)
    r = inv_mills(t, out[0])
    out.append(r)
    if order == 1:
        return tuple(out)
    q = t + r
    r1 = -r * q
    out.append(r1)
    if order >= 3:
        bracket = q * (t + 2.0 * r) - 1.0
        out.append(r * bracket)
    if order >= 4:
        out.append(r1 * bracket + r * ((1.0 + r1) * (t + 2.0 * r) + q * (1.0 + 2.0 * r1)))
    far = t < -settings.PROBIT_ASYMPTOTIC_CUT
    if not ops.maybe_any(far):  # on a device: no sync, the series below
        return tuple(out)
    # with x = -t: d^k psi / dt^k = (-1)^(k-1) d^(k-1) r(-x) / dx^(k-1); numpy (not 0-d): the
    # series on the far entries only, written in place; else on every entry, selected
    x = ops.masked_entries(far, -t, 1.0)  # (1 elsewhere: no 1/0)
    for k in range(2, order + 1):
        out[k] = ops.set_masked(far, out[k], (-1.0) ** (k - 1) * _asymptotic(x, k - 1))
    return tuple(out)


def log_Phi_curvature(t: Array) -> tuple[Array, Array, Array]:
    """``(psi, r, gamma)``: ``log Phi(t)``, ``r = psi'`` and the curvature
    ``gamma = -psi''``, the values of ``log_Phi_derivatives(t, 2)`` (its third negated):
    ``gamma`` is formed as ``r (t + r)`` and, below ``-PROBIT_ASYMPTOTIC_CUT``, as the series
    in ``t^-2`` directly (even in ``t``: no sign flips of ``t`` or of the result; on a device
    four operators fewer)."""
    t = ops.as_array(t)
    psi = log_Phi(t)
    r = inv_mills(t, psi)
    gamma = r * (t + r)
    far = t < -settings.PROBIT_ASYMPTOTIC_CUT
    if not ops.maybe_any(far):  # on a device: no sync, the series below
        return psi, r, gamma
    x = ops.masked_entries(far, t, 1.0)  # (1 elsewhere: no 1/0)
    return psi, r, ops.set_masked(far, gamma, _asymptotic(x, 1))
