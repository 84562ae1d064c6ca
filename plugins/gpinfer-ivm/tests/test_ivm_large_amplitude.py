"""ivm-baseline at large amplitudes (issue 16): ``a = diag K - rowsum(M o M)`` and the cavity
precision ``1/a - pi`` are differences of large numbers; their round-off once produced negative
variances (``NumericalError: covariance is not positive semi-definite``) at log sigma_f 3.9-5."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.baseline import BaselineRepresentation

from gpinfer.estimator import GPClassifier
from gpinfer.kernels import RBF
from gpinfer.testing.method_suite import make_suite_data


@pytest.mark.parametrize("log_sf, log_ell", [(3.9, 2.0), (4.5, 0.0), (5.0, 2.0), (5.0, 5.0)])
def test_baseline_fits_at_large_amplitudes(log_sf, log_ell):
    """The round-off, not the model, is under test: at these fixed amplitudes (a prior standard
    deviation of 50-150 on 40 points) the predictions are overconfident and most fits are no
    better than the class frequencies, so the fit guard only warns."""
    X, y = make_suite_data(3, n=40, seed=0)
    kernel = RBF(lengthscale=np.exp(log_ell), variance=np.exp(2 * log_sf))
    est = GPClassifier(method="ivm-baseline", kernel=kernel, optimize=False, max_iter=20,
                       random_state=0, baseline_failure="warn").fit(X, y)
    P = est.posterior_.predict_proba(X)
    assert np.isfinite(est.log_evidence_) and np.all(np.isfinite(P))
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-10)
    rep = est.posterior_.rep
    assert np.all(rep.a > 0) and np.all(rep.a <= rep.prior_var)
    _, a_cav = rep.cavity()
    assert np.all(a_cav > 0) and np.all(a_cav <= rep.prior_var * (1 + 1e-12))


def test_cavity_is_exact_when_nothing_cancels():
    """The guards change nothing at unit amplitude: cavity = (1/a - pi)^-1 exactly."""
    X, _ = make_suite_data(3, n=12, seed=1)
    rep = BaselineRepresentation([RBF(lengthscale=1.0)] * 3, X)
    rep.include(0, 0, 0.7, 0.3)
    rep.include(5, 0, 1.3, -0.2)
    _, a_cav = rep.cavity()
    expected = 1.0 / (1.0 / rep.a - rep.site_pi)
    np.testing.assert_allclose(a_cav, expected, rtol=1e-14)
    assert np.all(a_cav[[0, 5], 0] < 1.0)  # the other site's information stays in the cavity


def test_baseline_predicts_at_a_large_amplitude_binary():
    """The predictive variances cancel the same way (grid node log ell 2.33, log sigma_f 5)."""
    X, y = make_suite_data(2, n=40, seed=0)
    kernel = RBF(lengthscale=np.exp(2.0 + 1.0 / 3.0), variance=np.exp(10.0))
    est = GPClassifier(method="ivm-baseline", kernel=kernel, optimize=False, max_iter=20,
                       random_state=0).fit(X, y)
    _, var = est.predict_f(X)
    assert np.all(var > 0) and np.all(var <= np.exp(10.0))
    np.testing.assert_allclose(est.predict_proba(X).sum(axis=1), 1.0, atol=1e-10)


def test_scores_finite_where_the_rule_collapses_the_tilted_variance():
    """GH-3 on wide cavities (a learned baseline on wine reached cavity variances of ~3000) can
    put all the tilted weight of an axis on one node, its neighbours' weights underflowing: a
    tilted variance of 0 or of -1e-11 (cancellation), once an infinite site precision with a
    divide-by-zero warning, or a negative one dropped as uninformative. Such a point is the most
    informative of all: its site precision is finite and positive, its score finite."""
    from gpinfer_ivm.baseline import baseline_scores

    X = np.zeros((1, 2))
    kernels = [RBF(lengthscale=1.0, variance=v) for v in (600.0, 90.0, 3000.0)]
    rep = BaselineRepresentation(kernels, X)
    rep.h[:] = [100.0, 130.0, 0.0]  # the label, class 2, far in the tail of the others
    with np.errstate(divide="raise", invalid="raise"):  # underflow in the weights is expected
        score, pi, h_hat = baseline_scores(rep, np.array([2]), np.array([1.58, 1.7, 0.0]), 3)
    assert np.all(np.isfinite(score)) and np.all(np.isfinite(pi)) and np.all(np.isfinite(h_hat))
    assert pi[0, 2] > 0 and np.all(pi >= 0)
