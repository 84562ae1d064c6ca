"""``GPRegressor`` has the classifier's parameters (``standardize``, ``backend``, ``device``,
``dtype`` included), the same ``InputError``s for bad values, and scikit-learn's estimator
contract (``check_estimator``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import check_estimator

from gpinfer import GPClassifier, GPRegressor
from gpinfer.errors import InputError

#: checks that do not apply to pep's regressor: pep's objective is not a weighted sum over
#: points, so weights other than 0 and 1 are an InputError naming the methods that take them
#: (the classifier's laplace passes these checks); and M=5 inducing points cannot be fitted on
#: one sample (the InputError says "M=5 inducing points exceeds ... N=1", not "1 sample")
PEP_EXPECTED_FAILED_CHECKS = {
    "check_sample_weights_list": "pep takes no sample weights other than 0/1",
    "check_sample_weights_not_overwritten": "pep takes no sample weights other than 0/1",
    "check_sample_weight_equivalence_on_dense_data": "pep takes no sample weights other than 0/1",
    "check_fit2d_1sample": "M=5 inducing points need at least 5 samples",
}


@pytest.fixture
def regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    return X, np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=40)


@pytest.fixture
def classification_data(regression_data):
    X, y = regression_data
    return X, (y > 0).astype(int)


def test_the_two_estimators_have_the_same_parameters():
    assert set(GPRegressor().get_params()) == set(GPClassifier().get_params())
    # the regressor keeps its fits of before: inputs as given unless asked
    assert GPRegressor().get_params()["standardize"] is False


@pytest.mark.parametrize("knobs", [
    {"backend": "jax"},
    {"device": "tpu"},
    {"dtype": "float16"},
    {"backend": "torch"},  # pep and laplace run on numpy only
    {"backend": "torch", "dtype": "float32"},
    {"standardize": "yes"},
    {"standardize": 1},
], ids=str)
def test_bad_knobs_give_the_classifiers_errors_before_training(knobs, regression_data,
                                                                classification_data):
    calls = []
    with pytest.raises(InputError) as reg_err:
        GPRegressor(method="pep", M=5, **knobs).fit(*regression_data, callback=calls.append)
    with pytest.raises(InputError) as cls_err:
        GPClassifier(method="laplace", **knobs).fit(*classification_data,
                                                    callback=calls.append)
    assert calls == []  # refused before any training
    same = re.sub(r"'laplace'", "'pep'", str(cls_err.value))
    assert str(reg_err.value) == same


def test_standardize_makes_the_fit_independent_of_the_units(regression_data):
    X, y = regression_data
    shifted = X * np.array([1000.0, 0.01]) + np.array([5.0, -3.0])
    fits = [GPRegressor(method="pep", M=8, max_iter=15, random_state=0, standardize=True)
            .fit(inputs, y) for inputs in (X, shifted)]
    assert fits[0].scaler_ is not None
    mean_a, std_a = fits[0].predict(X[:10], return_std=True)
    mean_b, std_b = fits[1].predict(shifted[:10], return_std=True)
    np.testing.assert_allclose(mean_b, mean_a, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(std_b, std_a, rtol=1e-6, atol=1e-8)
    # as given (the default), the units matter: the check above can fail
    with pytest.warns(ConvergenceWarning):  # on the raw units the fit is poor: kept
        plain = [GPRegressor(method="pep", M=8, max_iter=15, random_state=0,
                             baseline_failure="warn").fit(inputs, y)
                 for inputs in (X, shifted)]
    assert plain[0].scaler_ is None
    assert not np.allclose(plain[1].predict(shifted[:10]), plain[0].predict(X[:10]), rtol=1e-3)


def test_the_regressor_passes_check_estimator():
    """scikit-learn's whole estimator contract with pep (a few iterations keep it quick; its
    checks fit pure-noise targets, where no model beats the constant Gaussian, so the fit
    guard warns instead of raising)."""
    check_estimator(
        GPRegressor(method="pep", M=5, max_iter=5, random_state=0, baseline_failure="warn"),
        expected_failed_checks=PEP_EXPECTED_FAILED_CHECKS,
        on_skip=None,
    )


@pytest.mark.parametrize("core", [False, True], ids=["GPRegressor", "GPRegressorCore"])
def test_a_regressor_pickled_before_the_new_parameters_loads(core, regression_data):
    import pickle

    from sklearn.base import clone

    from gpinfer.regressor import GPRegressorCore

    cls = GPRegressorCore if core else GPRegressor
    est = cls(method="pep", M=5, max_iter=3, random_state=0).fit(*regression_data)
    for key in ("standardize", "backend", "device", "dtype"):  # as an old pickle holds it
        del est.__dict__[key]
    old = pickle.loads(pickle.dumps(est))
    assert (old.standardize, old.backend, old.device, old.dtype) == (False, None, None, None)
    X = regression_data[0]
    np.testing.assert_array_equal(old.posterior_.predict_f(X)[0], est.posterior_.predict_f(X)[0])
    if not core:
        assert clone(old).get_params() == GPRegressor(method="pep", M=5, max_iter=3,
                                                      random_state=0).get_params()
    old.fit(*regression_data)  # a refit reads the parameters


def test_the_cores_predict_as_their_estimators(regression_data, classification_data):
    """The cores (no scikit-learn base classes: the runner's) predict, and refuse to before
    ``fit``, as the scikit-learn estimators do."""
    from sklearn.exceptions import NotFittedError

    from gpinfer.estimator import GPClassifierCore
    from gpinfer.regressor import GPRegressorCore

    for core_cls, est_cls, (X, y), kw in (
            (GPRegressorCore, GPRegressor, regression_data, {"method": "pep", "M": 5}),
            (GPClassifierCore, GPClassifier, classification_data, {"method": "laplace"})):
        with pytest.raises(NotFittedError, match=core_cls.__name__):
            core_cls(**kw).predict(X)
        core = core_cls(max_iter=3, random_state=0, **kw).fit(X, y)
        est = est_cls(max_iter=3, random_state=0, **kw).fit(X, y)
        np.testing.assert_array_equal(core.predict(X), est.predict(X))
