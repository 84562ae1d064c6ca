"""The exact 1-D reduction of diagonal-Gaussian softmax integrals (``numerics.diagonal_softmax``)
against converged Gauss-Hermite product rules (C = 3, 4), its derivative identities against
finite differences of its own ``log Z``, and bad input."""

import numpy as np
import pytest

from gpinfer.errors import NumericalError
from gpinfer.numerics.diagonal_softmax import (
    DiagonalTiltedCache,
    diagonal_softmax_expected_log_prob,
    diagonal_softmax_predictive,
    diagonal_softmax_tilted,
)
from gpinfer.numerics.gaussian_cubature import (
    softmax_expected_log_prob,
    softmax_predictive,
    softmax_tilted,
)


def _case(C: int, B: int = 5, seed: int = 0, scale: float = 3.0):
    rng = np.random.default_rng(seed)
    h = 1.5 * rng.normal(size=(B, C))
    a = rng.uniform(0.05, scale, size=(B, C))
    y = rng.integers(C, size=B)
    beta = rng.normal(size=C)
    return y, h, a, beta


def _full(a: np.ndarray) -> np.ndarray:
    A = np.zeros(a.shape + a.shape[-1:])
    A[:, np.arange(a.shape[1]), np.arange(a.shape[1])] = a
    return A


@pytest.mark.parametrize(("C", "order", "B"), [(3, 48, 5), (4, 30, 3)])
def test_matches_converged_product_rule(C, order, B):
    y, h, a, beta = _case(C, B=B)
    ref = softmax_tilted(y, h, _full(a), beta, order=order, reduced=False, rule="product")
    got = diagonal_softmax_tilted(y, h, a, beta)
    assert np.max(np.abs(got.log_z - ref.log_z)) < 1e-8
    assert np.max(np.abs(got.h_hat - ref.h_hat)) < 1e-8
    ref_var = np.diagonal(ref.A_hat, axis1=1, axis2=2)
    assert np.max(np.abs(got.a_hat - ref_var)) < 3e-8
    P_ref = softmax_predictive(h, _full(a), beta, order=order, reduced=False, rule="product")
    assert np.max(np.abs(diagonal_softmax_predictive(h, a, beta) - P_ref)) < 1e-8
    ex_ref = softmax_expected_log_prob(y, h, _full(a), beta, order=order, reduced=False,
                                       rule="product")
    ex = diagonal_softmax_expected_log_prob(y, h, a, beta)
    assert np.max(np.abs(ex.value - ex_ref.value)) < 1e-8
    assert np.max(np.abs(ex.dmean - ex_ref.dmean)) < 1e-8
    assert np.max(np.abs(ex.dvar - np.diagonal(ex_ref.dcov, axis1=1, axis2=2))) < 1e-8


def test_gh3_product_rule_is_far_from_it():
    """The baseline's former default (GH-3 product) is off by far more than the new rule."""
    y, h, a, beta = _case(3)
    ref = softmax_tilted(y, h, _full(a), beta, order=60, reduced=False, rule="product")
    gh3 = softmax_tilted(y, h, _full(a), beta, order=3, reduced=False, rule="product")
    assert np.max(np.abs(np.diagonal(gh3.A_hat, axis1=1, axis2=2)
                         - np.diagonal(ref.A_hat, axis1=1, axis2=2))) > 1e-3


def test_moments_are_the_derivatives_of_log_z():
    """``dlogZ/dh = (h_hat - h)/a`` and ``dlogZ/da = ((a_hat - a)/a^2 + g^2)/2`` by central
    differences of the rule's own ``log Z`` (C = 4; fine grid, see the next test)."""
    y, h, a, beta = _case(4, B=3, seed=1)

    def tilted(h, a):
        return diagonal_softmax_tilted(y, h, a, beta, step=0.25, inner=48)

    T = tilted(h, a)
    g = (T.h_hat - h) / a
    ga = 0.5 * ((T.a_hat - a) / a**2 + g**2)
    eps = 1e-5
    for c in range(4):
        dh = np.zeros_like(h)
        dh[:, c] = eps
        fd = (tilted(h + dh, a).log_z - tilted(h - dh, a).log_z) / (2 * eps)
        assert np.allclose(fd, g[:, c], rtol=1e-6, atol=1e-8)
        fd = (tilted(h, a + dh).log_z - tilted(h, a - dh).log_z) / (2 * eps)
        assert np.allclose(fd, ga[:, c], rtol=1e-6, atol=1e-8)


def test_expected_log_prob_derivatives_against_finite_differences():
    """On a fine grid (step 0.25, 48 inner nodes): the ``t`` grid moves with ``h`` and ``a``,
    so at the default step the value's ~1e-9 quadrature error varies with them at a rate
    ~1e-7, more than the identities' own error."""
    y, h, a, beta = _case(4, B=3, seed=3)

    def E(h, a):
        return diagonal_softmax_expected_log_prob(y, h, a, beta, step=0.25, inner=48)

    ex = E(h, a)
    eps = 1e-5
    for c in range(4):
        d = np.zeros_like(h)
        d[:, c] = eps
        fd = (E(h + d, a).value - E(h - d, a).value) / (2 * eps)
        assert np.allclose(fd, ex.dmean[:, c], rtol=1e-6, atol=1e-8)
        fd = (E(h, a + d).value - E(h, a - d).value) / (2 * eps)
        assert np.allclose(fd, ex.dvar[:, c], rtol=1e-6, atol=1e-8)


def test_unlikely_label_and_wide_spread():
    """A label ten nats behind the others, and means spread over 60 units: log Z still agrees
    with the product rule (the ``t`` range follows every class, not only the label)."""
    h = np.array([[-10.0, 0.0, 0.5], [-30.0, 30.0, 0.0]])
    a = np.array([[0.3, 0.5, 1.0], [0.2, 2.0, 0.7]])
    y = np.array([0, 2])
    ref = softmax_tilted(y, h, _full(a), None, order=60, reduced=False, rule="product")
    got = diagonal_softmax_tilted(y, h, a)
    assert np.allclose(got.log_z, ref.log_z, rtol=1e-9, atol=1e-9)
    assert np.max(np.abs(got.h_hat - ref.h_hat)) < 1e-7


def test_ten_classes_rows_sum_to_one():
    _, h, a, beta = _case(10, B=4, seed=2, scale=2.0)
    P = diagonal_softmax_predictive(h, a, beta)
    assert np.all(P > 0) and np.max(np.abs(P.sum(axis=1) - 1.0)) < 1e-8


def test_bad_input_is_a_numerical_error():
    with pytest.raises(NumericalError, match="variance"):
        diagonal_softmax_tilted([0], np.zeros((1, 3)), np.array([[1.0, 0.0, 1.0]]))
    with pytest.raises(NumericalError, match="non-finite"):
        diagonal_softmax_tilted([0], np.array([[np.nan, 0.0, 0.0]]), np.ones((1, 3)))


def test_cache_follows_column_updates_and_moves():
    """``DiagonalTiltedCache`` over a sequence of one-column updates (the baseline's pattern),
    a row whose mean leaves its grid, and a variance that needs a wider grid, against fresh
    ``diagonal_softmax_tilted`` calls."""
    y, h, a, beta = _case(5, B=6, seed=4, scale=1.0)
    cache = DiagonalTiltedCache(y, beta)
    rng = np.random.default_rng(5)
    for step in range(6):
        if step:
            c = step % 5
            h[:, c] += 0.3 * rng.normal(size=6)
            a[:, c] *= rng.uniform(0.5, 1.0, size=6)
        if step == 3:
            h[2] += 40.0  # leaves its grid
        if step == 5:
            a[1, 0] = 9.0  # wider than every grid
        got = cache(h, a)
        fresh = diagonal_softmax_tilted(y, h, a, beta)
        ref = diagonal_softmax_tilted(y, h, a, beta, step=0.25, inner=64)  # converged
        for name in ("log_z", "h_hat", "a_hat"):  # as accurate as a fresh call
            err_cache = np.max(np.abs(getattr(got, name) - getattr(ref, name)))
            err_fresh = np.max(np.abs(getattr(fresh, name) - getattr(ref, name)))
            assert err_cache <= 2.0 * err_fresh + 3e-8


@pytest.mark.parametrize("density", [False, True])
def test_separable_factors_equal_the_definition(density):
    """The separable evaluation of the 1-D factors (``_split_factors``) equals the definition
    (``_direct_factors``) to round-off, on grids that reach far into both tails (``G`` and
    ``g`` underflowing at the left end: ``log`` factors below ``-1e20``), for standard
    deviations from 0.01 to 60; ``_entry_factors`` takes the definition where the separable
    form could overflow (``m - t`` above ``SPLIT_MAX``: factors of exactly 0 there)."""
    from gpinfer.numerics import diagonal_softmax as ds
    from gpinfer.numerics.quadrature import gauss_hermite

    rng = np.random.default_rng(7)
    x, w = gauss_hermite(ds.INNER)
    sd = np.array([0.01, 0.3, 1.0, 3.0, 10.0, 30.0, 60.0])
    m = rng.normal(scale=5.0, size=sd.size)
    t = np.linspace(-120.0, 150.0, 541)[None, :] + rng.normal(size=(sd.size, 1))
    fast = ds._split_factors(density, m, sd, t, x, w)
    slow = ds._direct_factors(np.full(sd.size, density), m, sd, t, x, w)
    assert np.min(slow[0]) < -1e20
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(np.isfinite(f), np.isfinite(s))
        fin = np.isfinite(s)
        np.testing.assert_allclose(f[fin], s[fin], rtol=1e-11, atol=1e-11)
    # a grid reaching 800 below the mean: the definition (the separable e^(m - t) overflows)
    far = np.linspace(-800.0, 40.0, 200)[None, :]
    got = ds._entry_factors(np.array([density]), np.zeros(1), np.ones(1), far, ds.INNER)
    ref = ds._direct_factors(np.array([density]), np.zeros(1), np.ones(1), far, x, w)
    assert np.isneginf(ref[0][0, 0])
    for f, s in zip(got, ref, strict=True):
        np.testing.assert_array_equal(f, s)
