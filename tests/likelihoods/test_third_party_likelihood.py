"""Likelihoods defined here, outside gpinfer, work with every method whose declared requirements
(``Method.likelihood_requirements``) they meet, and pass the likelihood battery.

* ``Cauchit`` (a bare ``ScalarLikelihood``, not log-concave): svi (any classification
  likelihood, through ``variational_expectations``); laplace refuses it (needs ``log_concave``).
* ``SlopedProbit`` (a ``Bernoulli`` with its own log-sigmoid): svi, laplace and vi-taylor.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer import GPClassifier
from gpinfer.errors import InputError
from gpinfer.likelihoods import Bernoulli, BernoulliProbit, ScalarLikelihood, check_labels
from gpinfer.numerics import settings
from gpinfer.numerics.normal import log_Phi_derivatives
from gpinfer.numerics.quadrature import LogSigmoid
from gpinfer.testing import LikelihoodTestSuite

Array = np.ndarray


class Cauchit(ScalarLikelihood):
    """``p(y | f) = F(s f)``, ``F(t) = 1/2 + arctan(t) / pi`` (the Cauchy CDF), labels 0/1.

    Only the two hooks: everything else (tilted moments, expectations, predictions) comes from
    the Gauss-Hermite defaults of ``ScalarLikelihood``.
    """

    name = "cauchit"
    n_classes = 2
    #: heavy (polynomial) tails: more Gauss-Hermite nodes than the default 40
    n_gh = 200

    def _targets(self, y: Array, n: int) -> Array:
        return 2.0 * check_labels(y, 2, n) - 1.0

    def _log_prob_derivatives(self, y: Array, F: Array, order: int) -> tuple[Array, ...]:
        t = y * F
        # F(t) without cancellation in the left tail: arctan(1/|t|) / pi for t < 0
        cdf = np.where(t < 0, np.arctan(1.0 / np.maximum(np.abs(t), 1e-300)) / np.pi,
                       0.5 + np.arctan(t) / np.pi)
        q = 1.0 + t * t
        f = 1.0 / (np.pi * q)  # F'
        r = f / cdf
        out = [np.log(cdf)]
        if order >= 1:
            out.append(y * r)
        if order >= 2:
            f1 = -2.0 * t / (np.pi * q * q)  # F''
            out.append(f1 / cdf - r * r)
        if order >= 3:
            f2 = (6.0 * t * t - 2.0) / (np.pi * q**3)  # F'''
            out.append(y * (f2 / cdf - 3.0 * r * f1 / cdf + 2.0 * r**3))
        return tuple(out)


class SlopedProbitLink(LogSigmoid):
    """``psi(t) = log Phi(t / slope)``."""

    left_linear_cut = None

    def __init__(self, slope: float):
        self.slope = float(slope)
        self.right_cut = settings.PROBIT_TAIL_CUT * self.slope

    def derivatives(self, t: Array, order: int) -> tuple[Array, ...]:
        d = log_Phi_derivatives(np.asarray(t, dtype=float) / self.slope, order)
        return tuple(dk / self.slope**k for k, dk in enumerate(d))


class SlopedProbit(Bernoulli):
    """``p(y | f) = Phi(s f / slope)``: a ``Bernoulli`` with its own link, nothing else."""

    name = "sloped_probit"

    def __init__(self, slope: float = 2.0, **options):
        super().__init__(**options)
        self.link = SlopedProbitLink(slope)


class TestCauchitBattery(LikelihoodTestSuite):
    """The third party's likelihoods pass the same battery as the built-in ones."""

    likelihood = Cauchit()
    # log F has polynomial (not Gaussian) tails: the Gauss-Hermite defaults are less accurate
    rtol = 2e-4
    fd_rtol = 1e-4


class TestSlopedProbitBattery(LikelihoodTestSuite):
    likelihood = SlopedProbit()


def test_sloped_probit_is_the_probit_of_the_scaled_latent():
    """Oracle: ``Phi(f / slope)`` with ``f ~ N(m, v)`` is the probit of ``N(m / slope, v / slope^2)``."""
    rng = np.random.default_rng(0)
    y, m, v = rng.integers(0, 2, 6), rng.normal(size=6) * 2, rng.uniform(0.2, 3, 6)
    got = SlopedProbit(2.0).tilted(y, m, v)
    ref = BernoulliProbit().tilted(y, m / 2.0, v / 4.0)
    np.testing.assert_allclose(got.log_z, ref.log_z, rtol=1e-10)
    np.testing.assert_allclose(got.dlogz_dmean, ref.dlogz_dmean / 2.0, rtol=1e-9)
    np.testing.assert_allclose(got.dlogz_dvar, ref.dlogz_dvar / 4.0, rtol=1e-9)


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


@pytest.mark.parametrize(
    ("likelihood", "method", "options", "M"),
    [
        (Cauchit(), "svi", {"optimizer": "lbfgs"}, 10),
        (SlopedProbit(), "svi", {"optimizer": "lbfgs"}, 10),
        (SlopedProbit(), "laplace", {}, None),
        (SlopedProbit(), "vi-taylor", {}, 10),
    ],
)
def test_methods_fit_with_a_likelihood_defined_in_the_test(likelihood, method, options, M):
    X, y = _data()
    clf = GPClassifier(method=method, likelihood=likelihood, M=M, max_iter=20,
                       random_state=0, method_options=options)
    clf.fit(X, y)
    assert type(clf.likelihood_) is type(likelihood)
    assert np.isfinite(clf.log_evidence_)
    P = clf.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-10)
    assert np.mean(clf.predict(X) == y) > 0.85


def test_svi_elbo_uses_the_likelihoods_own_expectation():
    """svi's per-point expectation is ``Cauchit.variational_expectations`` (the GH default)."""
    from gpinfer_svi.method import VariationalState

    from gpinfer.hyper import HyperParameters
    from gpinfer.kernels import RBF
    from gpinfer.testing.gradcheck import assert_gradient_close

    X, y = _data(20)
    hp = HyperParameters([RBF(lengthscale=1.0, variance=1.5)], Z=[X[:5] + 0.05])
    st = VariationalState(X, y, Cauchit(), hp, 1, 5)
    rng = np.random.default_rng(1)
    x = st.pack(rng.normal(size=(1, 5)) * 0.3, np.eye(5)[None] * 0.7)
    value, grad = st.elbo(x, None)
    assert np.isfinite(value)
    assert_gradient_close(lambda z: st.elbo(z, None)[0], grad, x, rtol=1e-5, atol=1e-6,
                          name="svi ELBO with a third party's likelihood")


def test_methods_needing_more_refuse_it_by_name():
    X, y = _data()
    with pytest.raises(InputError, match=r"'cauchit'.*lacks \['log_concave'\]"):
        GPClassifier(method="laplace", likelihood=Cauchit(), max_iter=2).fit(X, y)
    unnamed = Cauchit()
    unnamed.name = ""  # an unnamed object is still held to the method's requirements
    with pytest.raises(InputError, match="log_concave"):
        GPClassifier(method="laplace", likelihood=unnamed, max_iter=2).fit(X, y)
    with pytest.raises(InputError, match="sloped_probit"):
        GPClassifier(method="vi-jj", likelihood=SlopedProbit(), M=5, max_iter=2).fit(X, y)
