"""The exact 1-D reduction of diagonal-Gaussian softmax integrals
(``gpinfer_ivm.diagonal_softmax``) against converged Gauss-Hermite product rules (C = 3, 4)
and, over variances 1e-4 to 1e4, means
-50 to 50 and C = 2 to 20, against an independent reference (composite Gauss-Legendre in the
Gumbel variable); its derivative identities against finite differences of its own ``log Z``,
and bad input."""

import numpy as np
import pytest
from gpinfer_ivm.diagonal_softmax import (
    DiagonalTiltedCache,
    diagonal_softmax_expected_log_prob,
    diagonal_softmax_predictive,
    diagonal_softmax_tilted,
)
from gpinfer_ivm.gaussian_cubature import (
    softmax_expected_log_prob,
    softmax_predictive,
    softmax_tilted,
)
from numpy.polynomial.legendre import leggauss

from gpinfer.errors import NumericalError
from gpinfer.numerics.quadrature import gauss_hermite


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
    from gpinfer_ivm import diagonal_softmax as ds

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


# --------------------------------------------------------------------------------------------
# Stress test over variances 1e-4..1e4 (issue 27) against an independent reference
# --------------------------------------------------------------------------------------------


def _reference_factors(label: bool, m: float, s: float, t: np.ndarray):
    """``log E[f(t - v)]``, ``E[x f] / E[f]``, ``E[x^2 f] / E[f]`` ``[T]`` for ``v ~ N(m, s^2)``
    (``f = g`` if ``label``, else ``G``), computed unlike the module: over the Gumbel variable
    ``z = t - v``, ``int N(t - z; m, s^2) f(z) dz``, by 10-point Gauss-Legendre on panels that
    merge 24 equal panels of the window ``t - m +- 9 s`` (for ``g`` reaching ``s^2`` further
    down, where its exponential tail tilts the mass) with unit panels on ``[-6, 30]`` (the
    Gumbel feature), in log space. ``z < -6``: ``G < e^-400``."""
    gx, gw = leggauss(10)
    c = t - m
    zlo = np.maximum(c - 9.0 * s - (s * s if label else 0.0), -6.0)
    zhi = c + 9.0 * s
    window = zlo[:, None] + (zhi - zlo)[:, None] * np.linspace(0.0, 1.0, 25)[None, :]
    fine = np.clip(np.arange(-6.0, 31.0)[None, :], zlo[:, None], zhi[:, None])
    br = np.sort(np.concatenate([window, fine], axis=1), axis=1)
    lo, hi = br[:, :-1, None], br[:, 1:, None]
    z = 0.5 * (lo + hi) + 0.5 * (hi - lo) * gx  # [T, panels, 10]
    x = (c[:, None, None] - z) / s
    with np.errstate(divide="ignore"):  # empty panels: weight 0
        log_f = -np.exp(-z) - (z if label else 0.0) + np.log(0.5 * (hi - lo) * gw) - 0.5 * x * x
    log_f, x = log_f.reshape(t.size, -1), x.reshape(t.size, -1)
    top = log_f.max(axis=1, keepdims=True)
    p = np.exp(log_f - top)
    S0 = p.sum(axis=1)
    return (np.log(S0) + top[:, 0] - np.log(s * np.sqrt(2.0 * np.pi)),
            (p * x).sum(axis=1) / S0,
            (p * x * x).sum(axis=1) / S0)


def _reference_tilted(y, h, a):
    """``(log Z [B], h_hat [B, C], a_hat [B, C])`` from ``_reference_factors`` and a trapezoid
    in ``t`` over ``max(m - 9 s) - 4 .. max(m + 9 s) + 36``, step ``max(0.2, min_c s_c /
    (2 sqrt C))``: each factor is a convolution with ``N(0, s_c^2)``, so ``|W(t + i d)| <=
    e^(C d^2 / (2 s_min^2)) W(t)`` and the trapezoid's relative error is below ``2 exp(-2 pi^2
    s_min^2 / (C step^2)) = 2 e^-79`` at the wider step (``e^-49`` from the Gumbel strip at
    0.2)."""
    B, C = h.shape
    sd = np.sqrt(a)
    out = (np.empty(B), np.empty((B, C)), np.empty((B, C)))
    for i in range(B):
        lo = np.max(h[i] - 9.0 * sd[i]) - 4.0
        hi = np.max(h[i] + 9.0 * sd[i]) + 36.0
        step = max(0.2, sd[i].min() / (2.0 * np.sqrt(C)))
        T = int(np.ceil((hi - lo) / step)) + 1
        t = np.linspace(lo, hi, T)
        fac = [_reference_factors(c == y[i], h[i, c], sd[i, c], t) for c in range(C)]
        trap = np.full(T, t[1] - t[0])
        trap[[0, -1]] *= 0.5
        lw = np.sum([f[0] for f in fac], axis=0) + np.log(trap)
        W = np.exp(lw - lw.max())
        out[0][i] = np.log(W.sum()) + lw.max()
        W /= W.sum()
        for c in range(C):
            e1, e2 = W @ fac[c][1], W @ fac[c][2]
            out[1][i, c] = h[i, c] + sd[i, c] * e1
            out[2][i, c] = a[i, c] * (e2 - e1 * e1)
    return out


def _stress_cases():
    """7 variance scales x C in (2, 7, 20), means uniform on [-50, 50], variances within a
    factor 2 of the scale; and rows whose variances spread log-uniformly over 1e-4..1e4."""
    rng = np.random.default_rng(27)
    for v in (1e-4, 1e-2, 1.0, 2.5, 30.0, 1e3, 1e4):
        for C in (2, 7, 20):
            B = 1 if C == 20 else 2
            yield (f"v={v:g},C={C}", rng.integers(C, size=B), rng.uniform(-50, 50, (B, C)),
                   v * rng.uniform(0.5, 1.0, (B, C)))
    for C in (3, 6):
        yield (f"mixed,C={C}", rng.integers(C, size=1), rng.uniform(-50, 50, (1, C)),
               10.0 ** rng.uniform(-4, 4, (1, C)))


@pytest.mark.parametrize(("y", "h", "a"), [c[1:] for c in _stress_cases()],
                         ids=[c[0] for c in _stress_cases()])
def test_stress_against_independent_reference(y, h, a):
    """Issue 27's targets at every variance: ``log Z`` within 1e-6, tilted means and variances
    within 1e-5 (absolute) of the reference."""
    ref = _reference_tilted(y, h, a)
    got = diagonal_softmax_tilted(y, h, a)
    assert np.max(np.abs(got.log_z - ref[0])) <= 1e-6
    assert np.max(np.abs(got.h_hat - ref[1])) <= 1e-5
    assert np.max(np.abs(got.a_hat - ref[2])) <= 1e-5


def test_old_inner_rule_fails_the_stress_reference():
    """The reference resolves the defect: Gauss-Hermite in ``x`` at every variance (the former
    rule) misses it by far at variance 50."""
    from gpinfer_ivm import diagonal_softmax as ds

    rng = np.random.default_rng(3)
    y, h, a = rng.integers(5, size=2), rng.normal(size=(2, 5)), np.full((2, 5), 50.0)
    ref = _reference_tilted(y, h, a)
    label = np.zeros((2, 5), dtype=bool)
    label[np.arange(2), y] = True
    t, log_trap = ds._grid(h, np.sqrt(a), ds.STEP)
    x, w = gauss_hermite(ds.INNER)
    old = ds._direct_factors(label.ravel(), h.ravel(), np.sqrt(a).ravel(),
                             np.repeat(t, 5, axis=0), x, w)
    log_z = ds._tilted_moments(*(f.reshape(2, 5, -1) for f in old), log_trap, h, a,
                               np.sqrt(a))[0]
    assert np.max(np.abs(log_z - ref[0])) > 1e-3


@pytest.mark.parametrize("v", [5.0, 80.0, 3000.0])
def test_wide_rule_derivatives_against_finite_differences(v):
    """At variances the Gumbel-variable rule handles (``sd >= WIDE_SD``): ``dlogZ/dh = (h_hat -
    h) / a``, ``dlogZ/da = ((a_hat - a) / a^2 + g^2) / 2``, and the expected log-probability's
    ``dmean``, ``dvar``, by central differences at the default quadrature (C = 4)."""
    rng = np.random.default_rng(11)
    y, h = rng.integers(4, size=3), rng.normal(scale=3.0, size=(3, 4))
    a = v * rng.uniform(0.5, 1.0, size=(3, 4))
    T = diagonal_softmax_tilted(y, h, a)
    ex = diagonal_softmax_expected_log_prob(y, h, a)
    g = (T.h_hat - h) / a
    ga = 0.5 * ((T.a_hat - a) / a**2 + g**2)
    for c in range(4):
        dh = np.zeros_like(h)
        dh[:, c] = 1e-4 * np.sqrt(a[:, c])
        da = np.zeros_like(a)
        da[:, c] = 1e-4 * a[:, c]
        for f, got_h, got_a in ((lambda h, a: diagonal_softmax_tilted(y, h, a).log_z, g, ga),
                                (lambda h, a: diagonal_softmax_expected_log_prob(y, h, a).value,
                                 ex.dmean, ex.dvar)):
            fd = (f(h + dh, a) - f(h - dh, a)) / (2 * dh[:, c])
            assert np.allclose(fd, got_h[:, c], rtol=1e-6, atol=1e-8 / np.sqrt(a[:, c]))
            fd = (f(h, a + da) - f(h, a - da)) / (2 * da[:, c])
            assert np.allclose(fd, got_a[:, c], rtol=1e-6, atol=1e-8 / a[:, c])


@pytest.mark.parametrize("v", [3.0, 300.0, 1e4])
def test_wide_predictive_rows_sum_to_one(v):
    _, h, a, beta = _case(8, B=4, seed=6, scale=v)
    P = diagonal_softmax_predictive(h, a + v / 2, beta)
    assert np.all(P > 0) and np.max(np.abs(P.sum(axis=1) - 1.0)) < 1e-9


def test_wide_rule_needs_one_uniform_step():
    from gpinfer_ivm import diagonal_softmax as ds

    t = np.array([[0.0, 0.5, 1.5]])
    with pytest.raises(ValueError, match="uniform"):
        ds._wide_factors(False, np.zeros(1), np.full(1, 2.0), t)
