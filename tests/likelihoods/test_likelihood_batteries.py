"""``LikelihoodTestSuite`` on every built-in likelihood (and every expectation rule), and the
completeness check: every likelihood registered in ``gpinfer.likelihoods`` has a battery."""

from __future__ import annotations

from gpinfer.likelihoods import (
    ArgmaxNoise,
    BernoulliLogit,
    BernoulliProbit,
    Gaussian,
    MultinomialProbit,
    RobustMax,
    Softmax,
)
from gpinfer.testing import LIKELIHOOD_SUITES, LikelihoodTestSuite, missing_batteries


class TestProbit(LikelihoodTestSuite):
    likelihood = BernoulliProbit()


class TestProbitAdaptiveRule(LikelihoodTestSuite):
    likelihood = BernoulliProbit(expectation="adaptive")


class TestLogit(LikelihoodTestSuite):
    likelihood = BernoulliLogit()


class TestGaussian(LikelihoodTestSuite):
    likelihood = Gaussian(variance=0.7)


class TestArgmaxNoiseFree(LikelihoodTestSuite):
    """The Heaviside likelihood: no expected log-likelihood (those checks skip)."""

    likelihood = ArgmaxNoise()


class TestMultinomialProbit(LikelihoodTestSuite):
    """Nested quadrature (~15 ms a point and call): fewer draws and points."""

    likelihood = MultinomialProbit()
    rtol = 1e-5
    mc_draws = 20_000
    fd_points = 1


class TestRobustMax(LikelihoodTestSuite):
    likelihood = RobustMax(1e-3)


class TestRobustMaxLogSpace(LikelihoodTestSuite):
    likelihood = RobustMax(1e-3, expectation="log_space")


class TestSoftmax(LikelihoodTestSuite):
    likelihood = Softmax()
    rtol = 1e-5


class TestSoftmaxMonteCarlo(LikelihoodTestSuite):
    likelihood = Softmax(expectation="monte_carlo", mc_samples=64, seed=0)
    rtol = 1e-5


def test_every_registered_likelihood_has_a_battery():
    missing = missing_batteries("gpinfer.likelihoods", LIKELIHOOD_SUITES)
    assert not missing, f"likelihoods without a LikelihoodTestSuite: {missing}"
