"""Quadrature rules (exactness, vectorisation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from gpinfer.numerics import settings
from gpinfer.numerics.quadrature import (
    chunk_slices,
    composite_gauss_legendre,
    gauss_hermite,
    gauss_hermite_expectation,
    gauss_hermite_tilted,
    gauss_legendre,
    multiclass_gh_order,
    ones_complement_basis,
    shift_invariant_rule,
    tilted_from_nodes,
)

# --------------------------------------------------------------------------------------------
# Gauss-Hermite
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 10, 40])
def test_gauss_hermite_is_exact_for_normal_moments(n):
    x, w = gauss_hermite(n)
    assert w.sum() == pytest.approx(1.0, abs=1e-14)
    for k in range(min(2 * n, 13)):  # exact up to degree 2n - 1
        exact = 0.0 if k % 2 else float(math.prod(range(1, k, 2)))
        assert float(np.sum(w * x**k)) == pytest.approx(exact, rel=1e-10, abs=1e-10)


def test_gauss_hermite_is_cached_and_read_only():
    assert gauss_hermite(20)[0] is gauss_hermite(20)[0]
    with pytest.raises(ValueError):
        gauss_hermite(20)[0][0] = 1.0
    with pytest.raises(ValueError):
        gauss_hermite(0)
    with pytest.raises(ValueError):
        gauss_hermite(settings.GAUSS_HERMITE_MAX_POINTS + 1)


def test_gauss_hermite_expectation_lognormal_mean():
    mean = np.array([[-1.0, 0.0], [0.5, 2.0]])
    var = np.array([[0.1, 0.5], [1.0, 0.01]])
    got = gauss_hermite_expectation(np.exp, mean, var, n=40)
    np.testing.assert_allclose(got, np.exp(mean + 0.5 * var), rtol=1e-12)


def test_gauss_hermite_tilted_gaussian_likelihood():
    """A Gaussian likelihood N(0 | f, 1): smooth and entire, so GH-60 converges to the closed form."""
    mean, var = np.array([0.3, -1.0]), np.array([0.5, 2.0])

    def derivs(F):
        return -0.5 * F**2 - 0.5 * math.log(2 * math.pi), -F, -np.ones_like(F)

    out = gauss_hermite_tilted(derivs, mean, var, power=1.0, n=60)
    s = var + 1.0
    np.testing.assert_allclose(out.log_z, -0.5 * np.log(2 * math.pi * s) - 0.5 * mean**2 / s, rtol=1e-12)
    np.testing.assert_allclose(out.d1, -mean / s, rtol=1e-12)
    np.testing.assert_allclose(out.d2, -1.0 / s, rtol=1e-12)


def test_tilted_from_nodes_matches_discrete_moments():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(7), size=2)
    l1, l2 = rng.normal(size=(2, 7)), rng.normal(size=(2, 7))
    out = tilted_from_nodes(np.log(p) + 5.0, l1, l2)
    np.testing.assert_allclose(out.log_z, 5.0, rtol=1e-14)
    mean = np.sum(p * l1, axis=1)
    np.testing.assert_allclose(out.d1, mean, rtol=1e-13)
    np.testing.assert_allclose(out.d2, np.sum(p * l2, axis=1) + np.sum(p * l1**2, axis=1) - mean**2, rtol=1e-12)


# --------------------------------------------------------------------------------------------
# Gauss-Legendre panels
# --------------------------------------------------------------------------------------------


def test_gauss_legendre_exact_for_polynomials():
    x, w = gauss_legendre(8)
    for k in range(16):
        exact = 0.0 if k % 2 else 2.0 / (k + 1)
        assert float(np.sum(w * x**k)) == pytest.approx(exact, abs=1e-14)


def test_composite_gauss_legendre_vectorised_intervals():
    lo = np.array([-3.0, 0.0, 2.0, 5.0])
    hi = np.array([4.0, 1e-6, 2.0, 4.0])  # the last two are empty / reversed
    x, log_w = composite_gauss_legendre(lo, hi, n_panels=12, n_nodes=8)
    assert x.shape == log_w.shape == (4, 96)
    assert np.all(np.isfinite(x))
    integral = np.sum(np.exp(log_w) * np.cos(x), axis=1)
    expected = np.where(hi > lo, np.sin(hi) - np.sin(lo), 0.0)
    np.testing.assert_allclose(integral, expected, rtol=1e-13, atol=1e-18)
    assert np.all(np.isneginf(log_w[2:]))


def test_chunk_slices_cover_all_rows():
    slices = list(chunk_slices(10, settings.QUADRATURE_CHUNK_FLOATS // 3))
    assert [s.start for s in slices] == [0, 3, 6, 9] and slices[-1].stop == 10
    assert list(chunk_slices(0, 5)) == []


# --------------------------------------------------------------------------------------------
# Multi-class rule on the complement of the ones vector
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("C", [2, 3, 5])
def test_ones_complement_basis_is_orthonormal(C):
    U = ones_complement_basis(C)
    np.testing.assert_allclose(U.T @ U, np.eye(C - 1), atol=1e-14)
    np.testing.assert_allclose(U.sum(axis=0), 0.0, atol=1e-14)


def test_multiclass_gh_order_budget():
    assert multiclass_gh_order(3, budget=8192) == 90
    assert multiclass_gh_order(4, budget=8192) == 20
    assert multiclass_gh_order(12) == settings.MULTICLASS_GH_MIN_ORDER
    assert multiclass_gh_order(2) == settings.MULTICLASS_GH_MAX_ORDER


def test_shift_invariant_rule_reproduces_difference_moments():
    """Shift-invariant polynomials of degree <= 2 integrate exactly: means and covariances of f_i - f_j."""
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(4, 3))
    var = np.exp(rng.normal(size=(4, 3)))
    F, w = shift_invariant_rule(mean, var, order=5)
    assert F.shape == (4, 25, 3) and w.shape == (25,)
    assert w.sum() == pytest.approx(1.0)
    d01, d12 = F[:, :, 0] - F[:, :, 1], F[:, :, 1] - F[:, :, 2]
    np.testing.assert_allclose(d01 @ w, mean[:, 0] - mean[:, 1], rtol=1e-12)
    np.testing.assert_allclose((d01**2) @ w - (d01 @ w) ** 2, var[:, 0] + var[:, 1], rtol=1e-12)
    cov = (d01 * d12) @ w - (d01 @ w) * (d12 @ w)
    np.testing.assert_allclose(cov, -var[:, 1], rtol=1e-12)


def test_quad_reference_sanity():
    """The scipy quad reference used in the likelihood tests integrates a Gaussian to one."""
    val, _ = integrate.quad(lambda t: math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi), -40, 40, points=[0.0])
    assert val == pytest.approx(1.0, abs=1e-13)


def test_row_logsumexp_equals_scipy_with_infinite_entries():
    """``row_logsumexp`` equals scipy's to round-off, with ``-inf`` entries (dropped nodes),
    a row of them only (``-inf``) and rows far from zero."""
    from scipy.special import logsumexp

    from gpinfer.numerics.quadrature import row_logsumexp

    rng = np.random.default_rng(7)
    lam = rng.normal(size=(6, 9)) + np.array([0.0, -800.0, 700.0, -5.0, 0.0, 0.0])[:, None]
    lam[3, 4:] = -np.inf
    lam[4, :] = -np.inf
    np.testing.assert_allclose(row_logsumexp(lam), logsumexp(lam, axis=1), rtol=1e-15)
    assert row_logsumexp(lam)[4] == -np.inf
