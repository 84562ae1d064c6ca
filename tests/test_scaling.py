"""Input scales: a warning when they defeat the kernel's starting length-scale, and the opt-in
``standardize`` that is stored with the fitted model (issue 16: features times 1e8 or 1e-8 gave
near-chance accuracy with no sign)."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from gpinfer.errors import FitFailedError, InputError
from gpinfer.estimator import GPClassifier
from gpinfer.scaling import FeatureScaleWarning, scale_problem
from gpinfer.testing.method_suite import make_suite_data


@pytest.fixture(scope="module")
def blobs():
    X, y = make_suite_data(2, n=60, seed=1)
    Xt, yt = make_suite_data(2, n=200, seed=7)
    return X, y, Xt, yt


def test_scale_problem_names_what_is_wrong():
    X, _ = make_suite_data(2, n=60, seed=1)
    assert scale_problem(X) is None
    assert scale_problem(X * 100.0) is None  # distances of a few hundred are still fine
    big = scale_problem(X * 1e8)
    assert big.startswith("the median distance between inputs is 2.") and "e+08" in big
    assert "e-08" in scale_problem(X * 1e-8)
    mixed = X * np.array([1.0, 1e4]) / 30.0  # distances fine, one length-scale cannot serve
    assert "standard deviations 0.0641 .. 263 differ by a factor 4.11e+03" in scale_problem(mixed)
    assert scale_problem(np.ones((5, 2))) is None  # constant features: nothing to judge
    assert scale_problem(np.ones((1, 2))) is None


@pytest.mark.parametrize("factor", [1e8, 1e-8])
def test_unscaled_inputs_warn_and_standardize_fixes_them(blobs, factor):
    X, y, Xt, yt = blobs
    with (pytest.warns(FeatureScaleWarning, match=r"GPClassifier: the median distance .* "
                       r"Pass standardize=True"),
          pytest.raises(FitFailedError, match="no better than predicting the class freq")):
        GPClassifier(method="laplace", random_state=0).fit(X * factor, y)  # once silent: 0.5
    raw = GPClassifier(method="laplace", random_state=0, baseline_failure="warn")
    with pytest.warns(ConvergenceWarning, match="no better than"):
        raw.fit(X * factor, y)
    assert raw.score(Xt * factor, yt) == pytest.approx(0.5)  # the failure the guard reports
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatureScaleWarning)
        est = GPClassifier(method="laplace", random_state=0, standardize=True).fit(X * factor, y)
    assert est.score(Xt * factor, yt) > 0.9
    np.testing.assert_allclose(est.scaler_.scale_, X.std(axis=0) * factor, rtol=1e-12)
    ref = GPClassifier(method="laplace", random_state=0, standardize=True).fit(X, y)
    np.testing.assert_allclose(est.predict_proba(Xt * factor), ref.predict_proba(Xt),
                               rtol=1e-6, atol=1e-9)


def test_scaling_is_stored_with_the_model(blobs):
    X, y, Xt, _ = blobs
    est = GPClassifier(method="laplace", random_state=0, standardize=True).fit(X * 1e8, y)
    twin = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(twin.predict_proba(Xt * 1e8), est.predict_proba(Xt * 1e8))
    assert GPClassifier(method="laplace").fit(X, y).scaler_ is None


def test_standardize_must_be_a_bool(blobs):
    X, y, _, _ = blobs
    with pytest.raises(InputError, match="standardize must be True or False; got 'yes'"):
        GPClassifier(method="laplace", standardize="yes").fit(X, y)
