"""Bernoulli probit and logit: tilted moments and Gaussian expectations against scipy's adaptive
quadrature (spec binary §7.1), derivatives against finite differences, predictions, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.optimize import minimize_scalar
from scipy.special import erfcx, log_ndtr

from gpinfer.errors import InputError
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.numerics.quadrature import gauss_hermite_tilted, sigmoid_tilted
from gpinfer.testing import assert_gradient_close

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# quad at epsrel=1e-13 may report round-off; the reference is still far below the tolerances
pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")

# --------------------------------------------------------------------------------------------
# Scalar reference log-sigmoids (plain Python) and an adaptive-quadrature reference
# --------------------------------------------------------------------------------------------


def logistic_ref(t: float, order: int) -> list[float]:
    """``log sigma(t)`` and derivatives, from ``p = sigma(t)`` (spec binary §1.2 table)."""
    log_sig = -math.log1p(math.exp(-t)) if t >= 0 else t - math.log1p(math.exp(t))
    p = 1.0 / (1.0 + math.exp(-t)) if t >= 0 else math.exp(t) / (1.0 + math.exp(t))
    q = 1.0 - p if t < 0 else math.exp(-t) / (1.0 + math.exp(-t))
    out = [log_sig, q, -p * q, -p * q * (1 - 2 * p), -p * q * (1 - 6 * p + 6 * p * p)]
    return out[: order + 1]


def probit_ref(t: float, order: int) -> list[float]:
    """``log Phi(t)`` and derivatives; the curvature from its asymptotic series for ``t < -20``."""
    r = math.sqrt(2 / math.pi) / float(erfcx(-t / math.sqrt(2)))
    if t < -20:
        u = 1.0 / (t * t)
        gamma = 1 - u + 6 * u**2 - 50 * u**3 + 518 * u**4 - 6354 * u**5
    else:
        gamma = r * (t + r)
    q = t + r
    d3 = r * (q * (t + 2 * r) - 1)
    r1 = -r * q
    d4 = r1 * (q * (t + 2 * r) - 1) + r * ((1 + r1) * (t + 2 * r) + q * (1 + 2 * r1))
    return [float(log_ndtr(t)), r, -gamma, d3, d4][: order + 1]


REFS = {"logit": logistic_ref, "probit": probit_ref}
BREAKS_T = (-36.0, -9.0, -3.0, 0.0, 3.0, 9.0, 36.0)


def _segments(points: list[float], lo: float, hi: float) -> list[tuple[float, float]]:
    edges = [lo] + sorted(p for p in set(points) if lo < p < hi) + [hi]
    return list(zip(edges[:-1], edges[1:]))


def quad_tilted(link: str, m: float, s2: float, power: float) -> tuple[float, float, float]:
    """``log Z``, ``d1 = E~[l']``, ``d2 = E~[l''] + Var~[l']`` of ``sig(t)^power N(t|m, s2)`` by quad."""
    ref, s = REFS[link], math.sqrt(s2)

    def log_f(x: float) -> float:
        return power * ref(m + s * x, 0)[0] - 0.5 * x * x

    hi = power * s * ref(m, 1)[1] + 1.0
    best = minimize_scalar(lambda x: -log_f(x), bounds=(-1.0, hi), method="bounded", options={"xatol": 1e-12})
    x_mode, peak = best.x, -best.fun
    width = 1.0 / math.sqrt(1.0 + power * s2)
    points = [x_mode + k * width for k in (-8, -3, -1, 0, 1, 3, 8)] + [(b - m) / s for b in BREAKS_T]

    def integral(g) -> float:
        total = 0.0
        for a, b in _segments(points, x_mode - 45.0, x_mode + 45.0):
            total += integrate.quad(lambda x: math.exp(log_f(x) - peak) * g(x), a, b, epsabs=0.0, epsrel=1e-13, limit=400)[0]
        return total

    Z = integral(lambda x: 1.0)
    d1 = integral(lambda x: power * ref(m + s * x, 1)[1]) / Z
    var_l1 = integral(lambda x: (power * ref(m + s * x, 1)[1] - d1) ** 2) / Z
    e_l2 = integral(lambda x: power * ref(m + s * x, 2)[2]) / Z
    return math.log(Z) + peak - LOG_SQRT_2PI, d1, e_l2 + var_l1


def quad_expectations(link: str, m: float, s2: float, order: int) -> list[float]:
    """``E_k = E_{N(t|m,s2)}[psi^(k)(t)]`` by quad (standardised variable, breakpoints at the cuts)."""
    ref, s = REFS[link], math.sqrt(s2)
    points = [(b - m) / s for b in BREAKS_T] + [0.0]
    out = []
    for k in range(order + 1):
        total = 0.0
        for a, b in _segments(points, -40.0, 40.0):
            total += integrate.quad(
                lambda x, k=k: math.exp(-0.5 * x * x - LOG_SQRT_2PI) * ref(m + s * x, k)[k],
                a, b, epsabs=0.0, epsrel=1e-13, limit=400,
            )[0]
        out.append(total)
    return out


def assert_close_spec(got: float, want: float, rel: float, name: str) -> None:
    """Relative error ``rel`` (absolute ``1e-12`` for values below ``1e-8``, spec binary §7.1)."""
    if abs(want) < 1e-8:
        assert abs(got - want) <= 1e-12, (name, got, want)
    else:
        assert abs(got - want) <= rel * abs(want), (name, got, want, abs(got - want) / abs(want))


LIKELIHOODS = {"logit": BernoulliLogit(), "probit": BernoulliProbit()}

# (m, s2) in t = y f; includes the wrong-side tail (m = -30, -300) and large variances
LOGIT_CASES = [
    (-300.0, 0.5), (-40.0, 1e-4), (-40.0, 4.0), (-30.0, 1.0), (-30.0, 1e4), (-5.0, 1e-2),
    (-5.0, 2e4), (-1.0, 30.0), (0.0, 1.0), (0.0, 1e4), (0.5, 1e-4), (0.5, 1e3), (3.0, 4.0),
    (20.0, 1e3), (200.0, 30.0), (1.0, 1e5), (-1000.0, 1e5),
]
PROBIT_CASES = [(-1000.0, 1e5), (-300.0, 1.0), (-30.0, 1.0), (-5.0, 2e4), (-1.0, 0.5), (0.0, 1e-4), (0.5, 30.0), (3.0, 4.0), (20.0, 1e3)]


def _check_tilted(name: str, m: float, s2: float, power: float, rel: float = 1e-7) -> None:
    lik = LIKELIHOODS[name]
    want = quad_tilted(name, m, s2, power)
    for y, sign in ((1, 1.0), (0, -1.0)):
        got, d2 = lik.tilted_and_d2(np.array([y]), np.array([sign * m]), np.array([s2]), power)
        assert_close_spec(float(got.log_z[0]), want[0], rel, "log Z")
        assert_close_spec(sign * float(got.dlogz_dmean[0]), want[1], rel, "d1")
        assert_close_spec(float(d2[0]), want[2], rel, "d2")
        dvar = 0.5 * (want[2] + want[1] ** 2)
        assert_close_spec(float(got.dlogz_dvar[0]), dvar, rel, "dlogz/dvar")


# --------------------------------------------------------------------------------------------
# Tilted moments vs quad
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, s2", LOGIT_CASES)
def test_logit_tilted_vs_quad(m, s2):
    _check_tilted("logit", m, s2, 1.0)


@pytest.mark.parametrize("m, s2", [(-40.0, 4.0), (-5.0, 2e4), (0.0, 1.0), (0.5, 1e3), (20.0, 1e3)])
@pytest.mark.parametrize("power", [0.5, 2.0])
def test_logit_tilted_power_vs_quad(m, s2, power):
    _check_tilted("logit", m, s2, power)


@pytest.mark.parametrize("m, s2", PROBIT_CASES)
def test_probit_closed_form_vs_quad(m, s2):
    _check_tilted("probit", m, s2, 1.0, rel=1e-10)


@pytest.mark.parametrize("m, s2", PROBIT_CASES)
@pytest.mark.parametrize("power", [0.5, 2.0])
def test_probit_tilted_power_vs_quad(m, s2, power):
    _check_tilted("probit", m, s2, power)


def test_probit_engine_at_power_one_matches_closed_form():
    """The mode-based engine (used for power != 1) reproduces the closed form at power 1."""
    m = np.array([-300.0, -30.0, -5.0, -1.0, 0.0, 0.5, 3.0, 20.0, 200.0])
    for s2 in [1e-4, 0.5, 30.0, 2e4]:
        v = np.full_like(m, s2)
        engine = sigmoid_tilted(BernoulliProbit.link, m, v, 1.0)
        closed, d2 = LIKELIHOODS["probit"].tilted_and_d2(np.ones(m.size, int), m, v)
        np.testing.assert_allclose(engine.log_z, closed.log_z, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(engine.d1, closed.dlogz_dmean, rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose(engine.d2, d2, rtol=1e-8, atol=1e-13)


def test_gauss_hermite_fails_for_large_logistic_variance():
    """Spec binary §7.1 item 3: GH-64 logistic d1 at (m, s2) = (0.5, 100) is off by > 1e-3."""
    gh = gauss_hermite_tilted(lambda F: LOGISTIC.derivatives(F, 2), np.array([0.5]), np.array([100.0]), n=64)
    engine = sigmoid_tilted(LOGISTIC, np.array([0.5]), np.array([100.0]))
    assert abs(gh.d1[0] - engine.d1[0]) > 1e-3 * abs(engine.d1[0])


def test_tilted_identities_and_bounds():
    """dvar = (d2 + d1^2)/2; 0 <= -d2 <= 1/(1/c + s2) with c = 1/4 (logit), 1 (probit) (§7.1 item 5)."""
    rng = np.random.default_rng(0)
    mean = rng.normal(size=200) * 10
    var = np.exp(rng.uniform(-8, 9, size=200))
    y = rng.integers(0, 2, size=200)
    for name, c in (("logit", 0.25), ("probit", 1.0)):
        moments, d2 = LIKELIHOODS[name].tilted_and_d2(y, mean, var)
        np.testing.assert_allclose(moments.dlogz_dvar, 0.5 * (d2 + moments.dlogz_dmean**2), rtol=1e-9, atol=1e-14)
        assert np.all(-d2 >= -1e-15)
        assert np.all(-d2 <= 1.0 / (1.0 / c + var) * (1 + 1e-9))
        np.testing.assert_allclose(LIKELIHOODS[name].tilted_d2(y, mean, var), d2)


@pytest.mark.parametrize("name", ["logit", "probit"])
@pytest.mark.parametrize("power", [1.0, 0.5])
def test_tilted_derivatives_vs_finite_differences(name, power):
    lik = LIKELIHOODS[name]
    y = np.array([0, 1, 1, 0, 1])
    mean = np.array([-2.0, 0.3, 4.0, -6.0, 1.5])
    var = np.array([0.3, 2.0, 50.0, 1.0, 1e3])
    moments, d2 = lik.tilted_and_d2(y, mean, var, power)
    assert_gradient_close(lambda m: lik.tilted(y, m, var, power).log_z.sum(), moments.dlogz_dmean, mean, name="dmean")
    assert_gradient_close(lambda v: lik.tilted(y, mean, v, power).log_z.sum(), moments.dlogz_dvar, var, name="dvar")
    assert_gradient_close(lambda m: lik.tilted(y, m, var, power).dlogz_dmean.sum(), d2, mean, name="d2")


# --------------------------------------------------------------------------------------------
# Expected log-likelihood E_k vs quad and FD
# --------------------------------------------------------------------------------------------

EXPECTATION_CASES = [(-5.0, 1e5), (-300.0, 0.5), (-30.0, 1.0), (-5.0, 2e4), (0.0, 1e-4), (0.5, 30.0), (3.0, 1.0), (20.0, 1e3), (200.0, 4.0)]


@pytest.mark.parametrize("m, s2", EXPECTATION_CASES)
def test_logit_expectations_vs_quad(m, s2):
    want = quad_expectations("logit", m, s2, 4)
    for y, sign in ((1, 1.0), (0, -1.0)):
        got = LIKELIHOODS["logit"].expected_log_prob_derivatives(np.array([y]), np.array([sign * m]), np.array([s2]), 4)
        for k in range(5):
            assert_close_spec(float(got[k][0]) * sign**k, want[k], 1e-7 if k <= 2 else 1e-6, f"E{k}")


@pytest.mark.parametrize("m, s2", [(-300.0, 0.5), (-30.0, 1.0), (-5.0, 2e4), (-1.0, 1e5), (0.0, 1e-4), (0.5, 30.0), (3.0, 1.0), (20.0, 1e3)])
def test_probit_expectations_vs_quad(m, s2):
    order = 4 if m > -20 and s2 < 100 else 2  # the reference's psi''', psi'''' are direct formulas
    want = quad_expectations("probit", m, s2, order)
    got = LIKELIHOODS["probit"].expected_log_prob_derivatives(np.array([1]), np.array([m]), np.array([s2]), order)
    for k in range(order + 1):
        assert_close_spec(float(got[k][0]), want[k], 1e-7 if k <= 2 else 1e-6, f"E{k}")


@pytest.mark.parametrize("name", ["logit", "probit"])
def test_expected_log_prob_derivatives_vs_finite_differences(name):
    lik = LIKELIHOODS[name]
    y = np.array([0, 1, 1, 0])
    mean = np.array([-2.0, 0.3, 4.0, 8.0])
    var = np.array([0.3, 2.0, 50.0, 1.0])
    out = lik.expected_log_prob(y, mean, var)
    assert_gradient_close(lambda m: lik.expected_log_prob(y, m, var).value.sum(), out.dmean, mean, name="dmean")
    assert_gradient_close(lambda v: lik.expected_log_prob(y, mean, v).value.sum(), out.dvar, var, name="dvar")
    E = lik.expected_log_prob_derivatives(y, mean, var, 4)
    np.testing.assert_allclose(E[0], out.value)
    # second-order identities: d2a/dm2 = E2, d2a/dm dv = E3/2, d2a/dv2 = E4/4
    assert_gradient_close(lambda m: lik.expected_log_prob(y, m, var).dmean.sum(), E[2], mean, name="E2")
    assert_gradient_close(lambda v: lik.expected_log_prob(y, mean, v).dmean.sum(), 0.5 * E[3], var, name="E3")
    assert_gradient_close(lambda v: lik.expected_log_prob(y, mean, v).dvar.sum(), 0.25 * E[4], var, name="E4")


# --------------------------------------------------------------------------------------------
# log_prob, its derivatives, predictions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["logit", "probit"])
def test_log_prob_and_derivatives(name):
    lik, ref = LIKELIHOODS[name], REFS[name]
    F = np.array([-30.0, -5.0, -0.3, 0.0, 1.2, 7.0])
    for y, sign in ((1, 1.0), (0, -1.0)):
        labels = np.full(F.size, y)
        np.testing.assert_allclose(lik.log_prob(labels, F), [ref(sign * f, 0)[0] for f in F], rtol=1e-13)
        derivs = lik.log_prob_derivatives(labels, F, order=4)
        assert len(derivs) == 4
        h = 1e-4  # spec binary §7.1 item 1
        lower = [lik.log_prob(labels, F + h), lik.log_prob(labels, F - h)]
        for k in range(1, 5):
            if k > 1:
                lower = [lik.log_prob_derivatives(labels, F + h, k - 1)[-1], lik.log_prob_derivatives(labels, F - h, k - 1)[-1]]
            fd = (lower[0] - lower[1]) / (2 * h)
            mask = np.ones(F.size, bool)
            if name == "probit" and k == 4:
                mask[0] = False  # FD inaccurate for the probit 4th derivative at -30 (spec)
            scale = np.maximum(np.abs(fd), np.abs(derivs[k - 1]))
            assert np.all(np.abs(fd - derivs[k - 1])[mask] <= 1e-6 * scale[mask] + 1e-12), (k, y)


def test_logit_curvature_bound():
    F = np.linspace(-40, 40, 161)
    d2 = LIKELIHOODS["logit"].log_prob_derivatives(np.ones(F.size, int), F, 2)[1]
    assert np.all(d2 <= 0) and np.all(d2 >= -0.25)


@pytest.mark.parametrize("name", ["logit", "probit"])
def test_predict_proba_rows_sum_to_one_and_log_predictive(name):
    lik = LIKELIHOODS[name]
    rng = np.random.default_rng(1)
    mean = np.concatenate([rng.normal(size=20) * 5, [-1e3, 1e3, 0.0]])
    var = np.concatenate([np.exp(rng.uniform(-5, 8, size=20)), [1e-2, 1e-2, 1e5]])
    P = lik.predict_proba(mean, var)
    assert P.shape == (23, 2)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-13)
    assert np.all((P >= 0) & (P <= 1))
    for y in (0, 1):
        lp = lik.log_predictive(np.full(23, y), mean, var)
        assert np.all(np.isfinite(lp))
        ok = P[:, y] > 1e-250
        np.testing.assert_allclose(lp[ok], np.log(P[ok, y]), rtol=1e-9, atol=1e-13)
    # confident wrong prediction: log p stays finite and accurate in the tail
    assert lik.log_predictive(np.array([0]), np.array([1e3]), np.array([1e-2]))[0] < -300


def test_probit_predict_closed_form_and_logit_sanity():
    mean = np.linspace(-4, 4, 9)
    var = np.full(9, 0.7)
    P = LIKELIHOODS["probit"].predict_proba(mean, var)
    np.testing.assert_allclose(P[:, 1], [0.5 * math.erfc(-m / math.sqrt(2 * 1.7)) for m in mean], rtol=1e-13)
    # sigma(t) ~ Phi(t sqrt(pi/8)): logistic predictions track the probit with rescaled latents
    scale = math.sqrt(math.pi / 8)
    Pl = LIKELIHOODS["logit"].predict_proba(mean / scale, var / scale**2)
    assert np.max(np.abs(Pl - P)) < 0.02


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["logit", "probit"])
def test_bad_input_errors(name):
    lik = LIKELIHOODS[name]
    m, v = np.zeros(3), np.ones(3)
    with pytest.raises(InputError, match="0..1"):
        lik.tilted(np.array([0, 1, 2]), m, v)
    with pytest.raises(InputError, match="sign labels"):
        lik.log_prob(np.array([-1, 1, 1]), m)
    with pytest.raises(InputError, match="integer"):
        lik.log_prob(np.array([0.5, 1, 1]), m)
    with pytest.raises(InputError, match="shape"):
        lik.tilted(np.array([0, 1]), m, v)
    with pytest.raises(InputError, match="same shape"):
        lik.tilted(np.array([0, 1, 1]), m, np.ones(2))
    with pytest.raises(InputError, match="non-negative"):
        lik.expected_log_prob(np.array([0, 1, 1]), m, -v)
    with pytest.raises(InputError, match="NaN"):
        lik.predict_proba(np.array([0.0, np.nan, 1.0]), v)
    with pytest.raises(InputError, match="power"):
        lik.tilted(np.array([0, 1, 1]), m, v, power=0.0)
    with pytest.raises(InputError, match="shape"):
        lik.tilted(np.array([0, 1, 1]), m[:, None], v[:, None])


def test_zero_variance_is_a_point_evaluation():
    lik = LIKELIHOODS["logit"]
    y, mean = np.array([1, 0]), np.array([0.7, 2.0])
    out = lik.tilted(y, mean, np.zeros(2))
    np.testing.assert_allclose(out.log_z, lik.log_prob(y, mean), rtol=1e-12)
    np.testing.assert_allclose(out.dlogz_dmean, lik.log_prob_derivatives(y, mean, 1)[0], rtol=1e-10)
