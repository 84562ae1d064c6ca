"""Failures found by the randomized stress hunt (``benchmarks/stress_hunt.py``, session s40) in
modules another helper owned that session. The one here, ivm's collapse with ``M = 30`` in 100
features, is what the method's criterion prefers: tests of that behaviour and of the warning
that names it. A new finding goes here as a minimal reproduction marked ``xfail(strict=True)``
with its cause until the owner fixes it (then the mark goes).

Shapes: ``X [N, D]``, ``y [N]``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gpinfer_ivm.criterion import FrozenSites, criterion
from gpinfer_ivm.method import constant_model_criterion
from sklearn.exceptions import ConvergenceWarning

from gpinfer.errors import FitFailedError
from gpinfer.estimator import GPClassifier
from gpinfer.hyper import HyperParameters
from gpinfer.kernels.stationary import RBF

Array = np.ndarray


def _separable_blobs(n: int, d: int, seed: int) -> tuple[Array, Array]:
    """Three balanced classes, centres 12 apart-ish in the first 5 of ``d`` standard-normal
    features (the other ``d - 5`` carry no signal): ``X [n, d]``, ``y [n]``."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    centres = rng.standard_normal((3, 5))
    centres *= 12.0 / np.linalg.norm(centres, axis=1, keepdims=True)
    X = rng.standard_normal((n, d))
    X[:, :5] += centres[y]
    return X, y


def _standardised(X: Array) -> Array:
    return (X - X.mean(0)) / X.std(0)


def _major_criterion(X: Array, y: Array, M: int, lengthscale: float, variance: float
                     ) -> tuple[float, GPClassifier]:
    """ivm's major-mode ``G`` (conditional inference at this RBF kernel, intercepts 0) on
    ``X [N, D]`` as given, and the fitted estimator."""
    est = GPClassifier(method="ivm", M=M, kernel=RBF(lengthscale, variance), optimize=False,
                       random_state=0, standardize=False, baseline_failure="warn").fit(X, y)
    return -float(est.log_evidence_), est


def test_ivm_criterion_with_30_active_points_in_100_dimensions_prefers_the_flat_kernel():
    """Why ``M = 30`` on D = 100 collapses (stress hunt s40): not the optimiser, the criterion.
    ``G`` (spec ivm §3.1) charges all ``n = 86`` points ``E_Q[-log p(y | u)]``; with 30 active
    points far apart in 100 features the other 56 keep nearly their prior variance, so at the
    start (length-scale ``sqrt(D/2)``, variance 1) and at kernels that classify the training
    set perfectly ``G`` lies above the constant model's ``-sum_c n_c log(n_c / n)``, which a
    vanishing variance reaches. With ``M = 86`` the same kernels beat it by > 10 nats."""
    X, y = _separable_blobs(86, 100, seed=0)
    Xs = _standardised(X)
    flat = constant_model_criterion(y)
    start, est = _major_criterion(Xs, y, 30, np.sqrt(50.0), 1.0)
    assert start > flat + 5.0
    assert np.mean(est.predict(Xs) != y) < 0.05  # the start kernel itself classifies well
    for lengthscale, variance in [(np.exp(3.0), np.exp(4.0)), (np.exp(4.0), np.exp(6.0))]:
        sparse, est = _major_criterion(Xs, y, 30, lengthscale, variance)
        assert np.mean(est.predict(Xs) != y) < 0.05
        assert sparse > flat + 5.0
        dense, _ = _major_criterion(Xs, y, 86, lengthscale, variance)
        assert dense < flat - 10.0
    with warnings.catch_warnings():  # the guard's warning: this model is the constant one
        warnings.simplefilter("ignore", ConvergenceWarning)
        tiny, _ = _major_criterion(Xs, y, 30, np.sqrt(50.0), 1e-4)
    at_zero = constant_model_criterion(y, np.zeros(3))  # intercepts 0 here
    assert at_zero == pytest.approx(86 * np.log(3.0), rel=1e-12) and flat < at_zero
    assert flat <= tiny < at_zero + 0.05


def test_ivm_criterion_gradient_at_the_collapsing_start_points_to_a_smaller_variance():
    """The analytic gradient of ``G`` (sites of the start's major step frozen) equals central
    finite differences (GH order 12: the price-form covariance term is the derivative of the
    integral, not of the default order-5 rule) and says: shrink the variance."""
    X, y = _separable_blobs(86, 100, seed=0)
    Xs = _standardised(X)
    _, est = _major_criterion(Xs, y, 30, np.sqrt(50.0), 1.0)
    st = est.fit_result_.state
    sites = FrozenSites.from_restricted(st["active"], st["pi"], st["b"])
    kernels = [RBF(np.sqrt(50.0), 1.0)] * 3
    hp = HyperParameters(kernels)
    theta = hp.pack()

    def value(th: Array) -> float:
        hp.unpack(th)
        return criterion(kernels, Xs, y, sites, np.zeros(3), 12, None, False).value

    hp.unpack(theta)
    grad = criterion(kernels, Xs, y, sites, np.zeros(3), 12, None, True).dkernel[0]
    eps = 1e-5
    fd = np.array([(value(theta + eps * e) - value(theta - eps * e)) / (2 * eps)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    names = list(hp.describe())
    assert grad[names.index("kernel.variance")] > 1.0  # G rises with the variance
    assert grad[names.index("kernel.lengthscale")] < -1.0


def test_ivm_with_30_active_points_in_100_dimensions_fails_naming_the_flat_kernel_and_the_way_out():
    """Learning keeps the best major step, the flat kernel; the plugin says why and what to do
    (a larger M, or a fixed kernel), and the guard refuses the constant model. The default M
    (min(n, 150) = 86) and the fixed start kernel fit the same data."""
    X, y = _separable_blobs(86, 100, seed=0)
    with pytest.warns(RuntimeWarning, match=r"flat kernel.*larger M.*optimize=False"):
        with pytest.raises(FitFailedError, match="no better than predicting the class"):
            GPClassifier(method="ivm", M=30, random_state=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*flat kernel", category=RuntimeWarning)
        est = GPClassifier(method="ivm", random_state=0).fit(X, y)
    assert np.mean(est.predict(X) != y) < 0.05
    fixed = GPClassifier(method="ivm", M=30, optimize=False, random_state=0).fit(X, y)
    assert np.mean(fixed.predict(X) != y) < 0.05
