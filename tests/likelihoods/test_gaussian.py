"""Gaussian likelihood: closed forms against quadrature and finite differences (spec power-ep §2.5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from gpinfer.errors import InputError
from gpinfer.likelihoods import Gaussian, ScalarLikelihood
from gpinfer.testing import assert_gradient_close

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")

Y = np.array([0.3, -1.2, 2.5, 0.0])
MEAN = np.array([0.1, 0.4, -1.0, 3.0])
VAR = np.array([0.2, 1.5, 4.0, 1e-3])


def quad_tilted(y: float, m: float, v: float, noise: float, power: float) -> tuple[float, float, float]:
    """``log Z``, ``d log Z/dm`` and ``d log Z/dv`` of ``N(y|f,noise)^power N(f|m,v)`` by quad (Stein forms)."""
    s = math.sqrt(v)

    def dens(x: float) -> float:
        f = m + s * x
        log_lik = -0.5 * math.log(2 * math.pi * noise) - 0.5 * (y - f) ** 2 / noise
        return math.exp(power * log_lik - 0.5 * x * x) / math.sqrt(2 * math.pi)

    Z = integrate.quad(dens, -12, 12, epsrel=1e-13, epsabs=0)[0]
    l1 = lambda x: power * (y - m - s * x) / noise
    d1 = integrate.quad(lambda x: dens(x) * l1(x), -12, 12, epsrel=1e-13, epsabs=0)[0] / Z
    second = integrate.quad(lambda x: dens(x) * (l1(x) ** 2 - power / noise), -12, 12, epsrel=1e-13, epsabs=0)[0] / Z
    return math.log(Z), d1, 0.5 * second


@pytest.mark.parametrize("power", [1.0, 0.5, 0.1, 2.0])
def test_tilted_vs_quad(power):
    lik = Gaussian(variance=0.7)
    out = lik.tilted(Y, MEAN, VAR, power)
    for i in range(Y.size):
        log_z, d1, dvar = quad_tilted(Y[i], MEAN[i], VAR[i], 0.7, power)
        assert out.log_z[i] == pytest.approx(log_z, rel=1e-10, abs=1e-12)
        assert out.dlogz_dmean[i] == pytest.approx(d1, rel=1e-8, abs=1e-12)
        assert out.dlogz_dvar[i] == pytest.approx(dvar, rel=1e-8, abs=1e-12)


@pytest.mark.parametrize("power", [1.0, 0.3])
def test_tilted_derivatives_vs_finite_differences(power):
    lik = Gaussian(variance=0.4)
    out = lik.tilted(Y, MEAN, VAR, power)
    assert_gradient_close(lambda m: lik.tilted(Y, m, VAR, power).log_z.sum(), out.dlogz_dmean, MEAN)
    assert_gradient_close(lambda v: lik.tilted(Y, MEAN, v, power).log_z.sum(), out.dlogz_dvar, VAR)

    def by_noise(theta):
        lik_t = Gaussian()
        lik_t.set_unconstrained(theta)
        return lik_t.tilted(Y, MEAN, VAR, power).log_z.sum()

    grad = lik.tilted_grad_params(Y, MEAN, VAR, power)
    assert grad.shape == (4, 1)
    assert_gradient_close(by_noise, grad.sum(axis=0), lik.get_unconstrained(), name="d/dlog noise")


def test_tilted_small_power_tends_to_zero_smoothly():
    lik = Gaussian(variance=1e-3)
    out = lik.tilted(Y, MEAN, VAR, power=1e-10)
    assert np.all(np.abs(out.log_z) < 1e-6)
    assert np.all(np.isfinite(out.dlogz_dvar))


def test_power_one_is_log_predictive_and_log_prob():
    lik = Gaussian(variance=0.5)
    want = norm.logpdf(Y, MEAN, np.sqrt(VAR + 0.5))
    np.testing.assert_allclose(lik.tilted(Y, MEAN, VAR).log_z, want, rtol=1e-13)
    np.testing.assert_allclose(lik.log_predictive(Y, MEAN, VAR), want, rtol=1e-13)
    np.testing.assert_allclose(lik.log_prob(Y, MEAN), norm.logpdf(Y, MEAN, math.sqrt(0.5)), rtol=1e-13)
    d1, d2, d3 = lik.log_prob_derivatives(Y, MEAN, order=3)
    np.testing.assert_allclose(d1, (Y - MEAN) / 0.5)
    np.testing.assert_allclose(d2, -2.0)
    np.testing.assert_allclose(d3, 0.0)


def test_expected_log_prob_vs_quad_and_fd():
    lik = Gaussian(variance=0.6)
    out = lik.expected_log_prob(Y, MEAN, VAR)
    for i in range(Y.size):
        s = math.sqrt(VAR[i])
        def integrand(x, i=i, s=s):
            log_lik = -0.5 * math.log(2 * math.pi * 0.6) - 0.5 * (Y[i] - MEAN[i] - s * x) ** 2 / 0.6
            return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * log_lik

        want = integrate.quad(integrand, -12, 12, epsrel=1e-13)[0]
        assert out.value[i] == pytest.approx(want, rel=1e-11)
    assert_gradient_close(lambda m: lik.expected_log_prob(Y, m, VAR).value.sum(), out.dmean, MEAN)
    assert_gradient_close(lambda v: lik.expected_log_prob(Y, MEAN, v).value.sum(), out.dvar, VAR)

    def by_noise(theta):
        lik_t = Gaussian()
        lik_t.set_unconstrained(theta)
        return lik_t.expected_log_prob(Y, MEAN, VAR).value.sum()

    grad = lik.expected_log_prob_grad_params(Y, MEAN, VAR)
    assert grad.shape == (4, 1)
    assert_gradient_close(by_noise, grad.sum(axis=0), lik.get_unconstrained())


def test_prediction_and_parameters():
    lik = Gaussian(variance=0.25)
    mu, v = lik.predict_mean_var(MEAN, VAR)
    np.testing.assert_allclose(mu, MEAN)
    np.testing.assert_allclose(v, VAR + 0.25)
    with pytest.raises(InputError, match="regression"):
        lik.predict_proba(MEAN, VAR)
    assert lik.task == "regression" and not lik.multiclass and lik.n_latent(0) == 1
    assert lik.param_names == ["log_variance"]
    lik.set_unconstrained(np.array([math.log(2.0)]))
    assert lik.variance == pytest.approx(2.0)
    np.testing.assert_allclose(lik.get_unconstrained(), [math.log(2.0)])


def test_bad_input():
    with pytest.raises(InputError):
        Gaussian(variance=0.0)
    with pytest.raises(InputError):
        Gaussian(variance=float("nan"))
    lik = Gaussian()
    with pytest.raises(InputError):
        lik.set_unconstrained(np.array([0.0, 1.0]))
    with pytest.raises(InputError, match="NaN"):
        lik.log_prob(np.array([np.nan, 0.0, 0, 0]), MEAN)
    with pytest.raises(InputError, match="shape"):
        lik.tilted(Y[:3], MEAN, VAR)
    with pytest.raises(InputError, match="power"):
        lik.tilted(Y, MEAN, VAR, power=-1.0)


class _QuadratureGaussian(Gaussian):
    """A Gaussian that keeps the base class's default Gauss-Hermite strategies."""

    n_gh = 120
    _tilted = ScalarLikelihood._tilted
    _expected_log_prob = ScalarLikelihood._expected_log_prob
    _log_predictive = ScalarLikelihood._log_predictive


def test_default_gauss_hermite_strategies_match_closed_forms():
    """The base class's GH defaults (used by likelihoods without closed forms) on a known case."""
    exact, quad = Gaussian(variance=0.8), _QuadratureGaussian(variance=0.8)
    for power in (1.0, 0.5):
        for a, b in zip(quad.tilted(Y, MEAN, VAR, power), exact.tilted(Y, MEAN, VAR, power)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    for a, b in zip(quad.expected_log_prob(Y, MEAN, VAR), exact.expected_log_prob(Y, MEAN, VAR)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(quad.log_predictive(Y, MEAN, VAR), exact.log_predictive(Y, MEAN, VAR), rtol=1e-9)


def test_default_predict_proba_of_a_classification_likelihood():
    """ScalarLikelihood's default predict_proba: exp(log Z) per class (probit via GH, moderate var)."""
    from gpinfer.likelihoods import BernoulliProbit

    class _GHProbit(BernoulliProbit):
        _tilted = ScalarLikelihood._tilted
        _predict_proba = ScalarLikelihood._predict_proba

    mean, var = np.array([-1.0, 0.2, 2.0]), np.array([0.3, 0.5, 0.1])
    np.testing.assert_allclose(_GHProbit().predict_proba(mean, var), BernoulliProbit().predict_proba(mean, var), rtol=1e-8)
