"""Stable normal functions: values against independent formulas, derivatives against finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpinfer.numerics import settings
from gpinfer.numerics.normal import (
    inv_mills,
    log_Phi,
    log_phi,
    log_Phi_curvature,
    log_Phi_derivatives,
    probit_curvature,
)

#: spec binary §7.1 item 1
FD_POINTS = [-30.0, -5.0, -0.3, 0.0, 1.2, 7.0]
FD_STEP = 1e-4


def _log_Phi_erfc(t: float) -> float:
    """``log Phi`` from ``math.erfc`` (fine for ``t > -25``)."""
    return math.log(0.5 * math.erfc(-t / math.sqrt(2.0)))


def _log_Phi_asymptotic(t: float) -> float:
    """``log Phi(t)`` for ``t << 0`` from the Mills-ratio series (6 terms)."""
    x = -t
    series = sum((-1) ** n * math.prod(range(1, 2 * n, 2)) / x ** (2 * n) for n in range(6))
    return -0.5 * x * x - math.log(x) - 0.5 * math.log(2 * math.pi) + math.log(series)


def test_log_phi_matches_density():
    t = np.linspace(-10, 10, 41)
    np.testing.assert_allclose(np.exp(log_phi(t)), np.exp(-0.5 * t**2) / math.sqrt(2 * math.pi))


@pytest.mark.parametrize("t", [-20.0, -3.0, -0.5, 0.0, 0.7, 4.0])
def test_log_Phi_moderate(t):
    assert log_Phi(t) == pytest.approx(_log_Phi_erfc(t), rel=1e-13)


@pytest.mark.parametrize("t", [-50.0, -300.0, -1e4])
def test_log_Phi_far_left_tail(t):
    assert log_Phi(t) == pytest.approx(_log_Phi_asymptotic(t), rel=1e-14)


def test_log_Phi_far_right_tail_is_minus_phi():
    t = 12.0
    assert log_Phi(t) == pytest.approx(-math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi), rel=1e-10)


def test_inv_mills_moderate_matches_ratio():
    t = np.linspace(-8, 8, 33)
    direct = np.array([math.exp(-0.5 * s * s) / math.sqrt(2 * math.pi) / (0.5 * math.erfc(-s / math.sqrt(2))) for s in t])
    np.testing.assert_allclose(inv_mills(t), direct, rtol=1e-12)


def test_inv_mills_tails_and_continuity():
    # r(-x) = x + 1/x - 2/x^3 + 10/x^5 - 74/x^7 + ... for x -> inf (erfcx branch, no cancellation)
    for x in [1e2, 1e4, 1e8]:
        r = float(inv_mills(np.array([-x]))[0])
        assert r == pytest.approx(x + 1 / x - 2 / x**3 + 10 / x**5 - 74 / x**7, rel=1e-15)
    t = np.array([-1e-12, 0.0, 1e-12])
    r = inv_mills(t)
    assert np.all(np.abs(np.diff(r)) < 1e-11)
    assert r[1] == pytest.approx(2.0 / math.sqrt(2 * math.pi), rel=1e-15)
    assert np.all(np.isfinite(inv_mills(np.array([-1e150, 40.0, 1e3]))))


def test_probit_curvature_in_unit_interval_and_asymptotics():
    t = np.concatenate([-np.logspace(-3, 8, 60), np.linspace(0, 30, 31)])
    gamma = probit_curvature(t)
    assert np.all(gamma > 0) and np.all(gamma < 1)
    # gamma z = 1 - t^-2 + 6 t^-4 - 50 t^-6 + 518 t^-8 (spec ep-sep §2.4)
    for x in [40.0, 1e3, 1e4]:
        expected = 1 - x**-2 + 6 * x**-4 - 50 * x**-6 + 518 * x**-8
        assert float(probit_curvature(np.array([-x]))[0]) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("t", FD_POINTS + [-80.0, -1e3])
def test_log_Phi_derivatives_vs_finite_differences(t):
    """Each derivative against central differences of the one below (spec binary §7.1 item 1)."""
    derivs = log_Phi_derivatives(np.array([t]), 4)
    plus = log_Phi_derivatives(np.array([t + FD_STEP]), 4)
    minus = log_Phi_derivatives(np.array([t - FD_STEP]), 4)
    for k in range(1, 5):
        if k == 4 and t == -30.0:
            continue  # spec: FD of the probit 4th derivative is inaccurate there
        numerical = (plus[k - 1][0] - minus[k - 1][0]) / (2 * FD_STEP)
        analytic = derivs[k][0]
        scale = max(abs(analytic), abs(numerical))
        assert abs(analytic - numerical) <= 1e-6 * scale + 1e-12, (k, t, analytic, numerical)


def test_asymptotic_branch_is_continuous_at_the_cut():
    cut = settings.PROBIT_ASYMPTOTIC_CUT
    inside = log_Phi_derivatives(np.array([-cut * (1 - 1e-12)]), 4)
    outside = log_Phi_derivatives(np.array([-cut * (1 + 1e-12)]), 4)
    for k in range(2, 5):
        assert inside[k][0] == pytest.approx(outside[k][0], rel=1e-8)


def test_log_Phi_derivatives_order_checks():
    assert len(log_Phi_derivatives(np.zeros(3), 0)) == 1
    assert len(log_Phi_derivatives(np.zeros(3), 2)) == 3
    with pytest.raises(ValueError):
        log_Phi_derivatives(np.zeros(3), 5)


def test_device_inverse_mills_one_formula_equals_the_two_branch_form():
    """On a device ``r(t)`` is the ``erfcx`` form for every ``t`` (no select between two
    evaluated branches): equal to numpy's two-branch form (``exp(log phi - log Phi)`` for
    ``t >= 0``) and to the former device form (both branches and a select) within 2e-13
    relative from the far left tail to ``t = 37``, bit-equal to the latter for ``t < 0``, and below 1e-300 with it beyond; in float32 within 2e-5."""
    torch = pytest.importorskip("torch")
    t = np.concatenate([-np.logspace(-3, 150, 300), np.linspace(-40.0, 37.0, 3081),
                        np.logspace(-12, 0, 50), [0.0, -0.0]])
    dev = inv_mills(torch.as_tensor(t)).numpy()
    host = inv_mills(t)
    np.testing.assert_allclose(dev, host, rtol=2e-13, atol=0.0)
    tt = torch.as_tensor(t)  # the former device form: both branches, then a select
    right = torch.exp(log_phi(tt) - torch.special.log_ndtr(tt))
    left = math.sqrt(2 / math.pi) / torch.special.erfcx(-tt * math.sqrt(0.5))
    former = torch.where(tt < 0, left, right).numpy()
    assert np.array_equal(dev[t < 0], former[t < 0])
    np.testing.assert_allclose(dev, former, rtol=2e-13, atol=0.0)
    far = np.array([37.5, 38.0, 40.0, 1e3, 1e150])
    dev_far, host_far = inv_mills(torch.as_tensor(far)).numpy(), inv_mills(far)
    assert np.all((dev_far >= 0) & (dev_far < 1e-300)) and np.all(host_far < 1e-300)
    # float32 against float64 at the same inputs: 2e-6 up to t = 5, 2e-5 out to t = 12
    # (exp(t^2 / 2) inside erfcx carries t^2 / 2 float32 roundings; r(12) ~ 1e-32)
    for hi, rtol in ((5.0, 2e-6), (12.0, 2e-5)):
        t32 = torch.linspace(-30.0, hi, 421, dtype=torch.float32)
        np.testing.assert_allclose(inv_mills(t32).numpy(), inv_mills(t32.double().numpy()),
                                   rtol=rtol)


@pytest.mark.parametrize("device", [False, True])
def test_log_Phi_curvature_equals_the_derivatives_it_stands_for(device):
    """``log_Phi_curvature`` (the device form: ``r (t + r)`` and the even series, without
    sign flips) gives bit for bit ``log Phi``, ``r`` and ``-psi''`` of
    ``log_Phi_derivatives(t, 2)``, across the asymptotic cut and far in both tails."""
    torch = pytest.importorskip("torch")
    cut = settings.PROBIT_ASYMPTOTIC_CUT
    t = np.concatenate([-np.logspace(-3, 150, 200), np.linspace(-60.0, 40.0, 2001),
                        [-cut, np.nextafter(-cut, 0.0), np.nextafter(-cut, -np.inf), 0.0]])
    tt = torch.as_tensor(t) if device else t
    psi, r, gamma = log_Phi_curvature(tt)
    d = log_Phi_derivatives(tt, 2)
    for got, want in zip((psi, r, gamma), (d[0], d[1], -d[2])):
        got = np.asarray(got)
        want = np.asarray(want)
        assert np.array_equal(got, want)
    assert np.all(np.asarray(gamma) >= 0)  # 0 where r underflows (t > 37)


def test_a_scalar_beyond_the_cut_gets_the_bits_of_an_array_entry():
    """A 0-d ``t`` below ``-PROBIT_ASYMPTOTIC_CUT`` takes the series of an array's entries (one
    ``_asymptotic``: ``ops.polyval``); it took the device's form of the series (the powers of
    ``t^-2`` times the coefficients) and differed by an ulp (2.2e-16 relative at ``t = -25``)."""
    cut = settings.PROBIT_ASYMPTOTIC_CUT
    ts = np.array([-cut * 1.05, -25.0, -40.0, -1e3])
    vector = log_Phi_derivatives(ts, 4)
    curvature = log_Phi_curvature(ts)[2]
    for i, t in enumerate(ts):
        scalar = log_Phi_derivatives(float(t), 4)
        for k in range(5):
            assert float(scalar[k]) == vector[k][i], (k, t)
        assert float(log_Phi_curvature(float(t))[2]) == curvature[i]
