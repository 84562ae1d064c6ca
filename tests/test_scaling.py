"""Input scales: a warning when they defeat the kernel's starting length-scale, and
``standardize`` ("auto" by default: on with a named kernel) that is stored with the fitted model
(issue 16: features times 1e8 or 1e-8 gave near-chance accuracy with no sign; issue 27: times
100 too; issue 26: the warning fired on standardised data with a constant training column)."""

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
    hundred = scale_problem(X * 100.0)  # issue 27: features in the hundreds were let through
    assert hundred.startswith("the median distance between inputs is 232 (164 per sqrt(feature)")
    big = scale_problem(X * 1e8)
    assert big.startswith("the median distance between inputs is 2.") and "e+08" in big
    assert "e-08" in scale_problem(X * 1e-8)
    mixed = X * np.array([1.0, 1e4]) / 30.0  # one length-scale cannot serve both
    assert ("standard deviations of the 2 non-constant features 0.0641 .. 263 differ by a "
            "factor 4.11e+03") in scale_problem(mixed)
    assert scale_problem(np.ones((5, 2))) is None  # constant features: nothing to judge
    assert scale_problem(np.ones((1, 2))) is None


def test_constant_training_columns_carry_no_scale():
    """Issue 26: data standardised on the whole set, then split, leave columns constant in the
    training part whose float std is about 1e-17, not 0: they were taken for a tiny scale."""
    X, _ = make_suite_data(2, n=60, seed=1)
    X = np.hstack([X, np.full((60, 1), 0.1 + 0.2)])  # np.std of this column is 5.6e-17
    assert X[:, 2].std() > 0 and scale_problem(X) is None


def test_many_small_pixels_are_not_a_spread():
    """Issue 26: pixels in [0, 1] whose border columns are nearly empty are one scale (an
    isotropic length-scale suits them); only a few columns dominating the rest is a spread."""
    rng = np.random.default_rng(0)
    X = rng.random((200, 50))
    X[:, :20] *= rng.random((200, 20)) < 0.01  # rarely-lit border pixels: tiny stds
    X[:, 20] = 0.0
    assert scale_problem(X) is None
    X[:, 21:23] *= 1e4  # two columns dominate the distances
    assert "differ by a factor" in scale_problem(X)


@pytest.mark.parametrize("explicit, advice", [
    (False, "Pass standardize=True or 'auto'"),
    (True, "Give the kernel a length-scale of the order of the median distance"),
])
def test_the_warning_says_what_to_do_in_each_case(blobs, explicit, advice):
    from gpinfer.kernels import RBF

    X, y, _, _ = blobs
    kernel = RBF() if explicit else "rbf"
    with pytest.warns(FeatureScaleWarning, match=advice):
        GPClassifier(method="laplace", kernel=kernel, standardize=False, max_iter=2,
                     random_state=0).fit(X * 1e8, y)
    with pytest.warns(FeatureScaleWarning, match="Pass standardize=True .per-feature scaling"):
        GPClassifier(method="laplace", kernel=kernel, standardize=False, max_iter=2,
                     random_state=0).fit(X * np.array([1.0, 1e5]), y)


def test_auto_standardizes_under_a_named_kernel_only(blobs):
    """The default kernel's unit length-scale is meant for standardised inputs; a Kernel
    object's parameters are in the units of X as given (protocols and oracles pass one)."""
    from gpinfer.kernels import RBF

    X, y, _, _ = blobs
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatureScaleWarning)
        named = GPClassifier(method="laplace", max_iter=2, random_state=0).fit(X * 1e8, y)
    assert named.scaler_ is not None
    with pytest.warns(FeatureScaleWarning):
        given = GPClassifier(method="laplace", kernel=RBF(), max_iter=2,
                             random_state=0).fit(X * 1e8, y)
    assert given.scaler_ is None


@pytest.mark.parametrize("factor", [1e8, 1e-8])
def test_unscaled_inputs_warn_and_standardize_fixes_them(blobs, factor):
    X, y, Xt, yt = blobs
    with (pytest.warns(FeatureScaleWarning, match=r"GPClassifier: the median distance .* "
                       r"Pass standardize=True"),
          pytest.raises(FitFailedError, match="no better than predicting the class freq")):
        GPClassifier(method="laplace", random_state=0,
                     standardize=False).fit(X * factor, y)  # once silent: 0.5
    raw = GPClassifier(method="laplace", random_state=0, baseline_failure="warn",
                       standardize=False)
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
    assert GPClassifier(method="laplace", standardize=False).fit(X, y).scaler_ is None


def test_standardize_must_be_auto_or_a_bool(blobs):
    X, y, _, _ = blobs
    with pytest.raises(InputError, match="standardize must be 'auto', True or False; got 'yes'"):
        GPClassifier(method="laplace", standardize="yes").fit(X, y)


def test_a_users_kernel_is_judged_by_its_own_lengthscale():
    """Issue 26: raw pixels (0-255) under the Seeger (2004) protocol's kernel, length-scale
    1009.75 (the /255 folded into it), are at the kernel's scale; under length-scale 1 not."""
    from gpinfer.kernels import RBF
    from gpinfer.scaling import check_feature_scales

    rng = np.random.default_rng(0)
    X = np.round(255 * rng.random((200, 784)) * (rng.random((200, 784)) < 0.2))
    X[:, :60] = 0.0  # never-lit border pixels
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatureScaleWarning)
        check_feature_scales(X, "GPClassifier", RBF(lengthscale=1009.75, variance=5.0))
    with pytest.warns(FeatureScaleWarning, match=r"far from the kernel's length-scale 1\b.*"
                      r"Give the kernel a length-scale of the order of the median distance"):
        check_feature_scales(X, "GPClassifier", RBF())


def test_a_named_kernel_starts_where_standardised_inputs_are():
    """Issue 27: on 64 standardised pixels a unit length-scale makes K nearly the identity (fv,
    which keeps its kernel, predicted 0.5 everywhere); the start is sqrt(max(D', 2) / 2)."""
    rng = np.random.default_rng(0)
    X = np.hstack([rng.normal(size=(40, 8)) * 16.0, np.ones((40, 1))])  # one constant column
    y = (X[:, 0] > 0).astype(int)
    est = GPClassifier(method="fv", random_state=0).fit(X, y)
    assert est.kernel_.lengthscale == pytest.approx(2.0)  # D' = 8 non-constant features
    est2 = GPClassifier(method="fv", random_state=0).fit(X[:, :2], y)
    assert est2.kernel_.lengthscale == pytest.approx(1.0)  # up to two features: unchanged
