"""scikit-learn parity of the estimators (issue 26, item 3): nested kernel parameters in a grid
search, ``feature_names_in_``, ``sample_weight`` (oracles: weight 2 is the point twice, weight
0 the point removed), the early-stopping attributes of ``MLPClassifier`` and readable reprs.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import GridSearchCV

from gpinfer import GPClassifier, GPRegressor
from gpinfer.errors import InputError
from gpinfer.kernels import RBF, White
from gpinfer.testing.method_suite import make_suite_data
from gpinfer.training.early_stopping import split_validation, validation_size


@pytest.fixture
def data():
    return make_suite_data(2, n=30, seed=3)


@pytest.fixture
def no_laplace_training(monkeypatch):
    """Laplace whose ``fit`` fails the test: the errors must come before training."""
    from gpinfer_laplace.method import Laplace

    def fit(self, problem, callback=None):
        raise AssertionError("training started although the input was invalid")

    monkeypatch.setattr(Laplace, "fit", fit)


def _laplace(**params) -> GPClassifier:
    return GPClassifier(method="laplace", optimize=False, max_iter=100, random_state=0, **params)


# -- nested kernel parameters ----------------------------------------------------------------


def test_grid_search_over_the_kernel_lengthscale(data):
    X, y = data
    search = GridSearchCV(_laplace(kernel=RBF(lengthscale=1.0)),
                          {"kernel__lengthscale": [0.3, 1.0, 3.0]}, cv=3)
    search.fit(X, y)
    assert search.best_params_["kernel__lengthscale"] in (0.3, 1.0, 3.0)
    assert search.best_estimator_.kernel_.get_params()["lengthscale"] == pytest.approx(
        search.best_params_["kernel__lengthscale"])
    # each candidate fitted its own kernel: the lengthscale reached the fit
    best = search.best_params_["kernel__lengthscale"]
    direct = _laplace(kernel=RBF(lengthscale=best)).fit(X, y)
    np.testing.assert_allclose(search.best_estimator_.predict_proba(X), direct.predict_proba(X))


def test_nested_parameters_of_a_sum_by_part_index(data):
    X, y = data
    est = _laplace(kernel=RBF() + White(1e-4))
    est.set_params(kernel__0__lengthscale=2.0, kernel__1__variance=1e-3)
    assert est.kernel.get_params()["0__lengthscale"] == 2.0
    np.testing.assert_allclose(est.fit(X, y).predict_proba(X),
                               _laplace(kernel=RBF(2.0) + White(1e-3)).fit(X, y).predict_proba(X))


@pytest.mark.parametrize("kernel,key,match", [
    ("rbf", "kernel__lengthscale", "need a Kernel object as kernel, not 'rbf'"),
    (RBF(), "kernel__lenghtscale", r"invalid parameter\(s\) \['kernel__lenghtscale'\]"),
    (RBF() + White(), "kernel__2__variance", "kernel__0__lengthscale"),
])
def test_nested_parameters_that_do_not_exist_are_input_errors(kernel, key, match):
    with pytest.raises(InputError, match=match):
        _laplace(kernel=kernel).set_params(**{key: 1.0})


def test_reprs_show_given_and_learned_values_cleanly(data):
    est = GPClassifier(kernel=RBF(lengthscale=5.0))
    assert "RBF(lengthscale=5.0, variance=1.0)" in repr(est)
    est = GPClassifier(method="laplace", kernel=RBF(lengthscale=5.0), max_iter=5).fit(*data)
    assert not re.search(r"\d\.\d{7,}", repr(est.kernel_))  # rounded, no 4.999999999999999
    text = repr(est.posterior_)
    assert "object at 0x" not in text
    assert text.startswith("DenseSitePosterior(likelihood=") and "X_train=[30, 2]" in text
    assert "alpha=[30]" in text and "kernel=RBF(" in text


# -- feature names -----------------------------------------------------------------------------


def test_feature_names_from_a_dataframe(data):
    X, y = data
    frame = pd.DataFrame(X, columns=["age", "dose"])
    est = _laplace().fit(frame, y)
    np.testing.assert_array_equal(est.feature_names_in_, ["age", "dose"])
    assert est.n_features_in_ == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.predict_proba(frame)  # the same names: no warning
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict_proba(frame[["dose", "age"]])
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        est.predict_proba(X)
    assert not hasattr(_laplace().fit(X, y), "feature_names_in_")
    assert not hasattr(est.fit(X, y), "feature_names_in_")  # a refit on an array drops them


@pytest.mark.parametrize("columns,match", [
    (["a", "a"], r"duplicate column names \['a'\]"),
    (["a", 1], "column names are not all strings"),
    ([2, 5], "column names are not all strings"),
])
def test_bad_column_names_are_input_errors_before_training(no_laplace_training, data, columns,
                                                           match):
    X, y = data
    with pytest.raises(InputError, match=match):
        _laplace().fit(pd.DataFrame(X, columns=columns), y)


def test_positional_column_names_are_no_feature_names(data):
    X, y = data
    assert not hasattr(_laplace().fit(pd.DataFrame(X), y), "feature_names_in_")


# -- sample_weight -------------------------------------------------------------------------------


def _repeated(X, y, w):
    return X.repeat(w, axis=0), y.repeat(w)


def test_laplace_integer_weights_equal_repeated_rows(data):
    """Oracle: log Z_LA and the posterior with weight k are those with the row k times
    (a repeated row only adds its curvature; both are the same mode and the same log|B|)."""
    X, y = data
    w = np.random.default_rng(0).integers(1, 4, size=y.size)
    weighted = _laplace().fit(X, y, sample_weight=w)
    repeated = _laplace().fit(*_repeated(X, y, w))
    assert weighted.log_evidence_ == pytest.approx(repeated.log_evidence_, rel=1e-10)
    np.testing.assert_allclose(weighted.predict_proba(X), repeated.predict_proba(X), rtol=1e-9)


def test_zero_weight_equals_the_row_removed(data):
    X, y = data
    w = np.ones(y.size)
    w[[0, 7, 11]] = 0.0
    for method, extra in (("laplace", {}), ("ep", {})):  # ep takes no weights, but 0/1 masks
        est = GPClassifier(method=method, optimize=False, max_iter=50, random_state=0, **extra)
        weighted = est.fit(X, y, sample_weight=w).predict_proba(X)
        removed = est.fit(X[w > 0], y[w > 0]).predict_proba(X)
        np.testing.assert_array_equal(weighted, removed)


def test_svi_integer_weights_equal_repeated_rows(data):
    """Oracle for svi: the weighted ELBO is the ELBO of the repeated rows, so with fixed
    kernel and inducing inputs (and a data-independent initialisation) both converge to the
    same q(u)."""
    X, y = data
    w = np.random.default_rng(1).integers(1, 4, size=y.size)
    est = GPClassifier(method="svi", M=X[:8], optimize=False, max_iter=300, random_state=0,
                       kernel=RBF(lengthscale=1.5),
                       method_options={"optimizer": "lbfgs", "lengthscale_init": "kernel"})
    weighted = est.fit(X, y, sample_weight=w)
    P_weighted, elbo_weighted = weighted.predict_proba(X), weighted.log_evidence_
    repeated = est.fit(*_repeated(X, y, w))
    assert elbo_weighted == pytest.approx(repeated.log_evidence_, rel=1e-7)
    np.testing.assert_allclose(P_weighted, repeated.predict_proba(X), rtol=1e-5, atol=1e-7)


def test_svi_weights_on_the_torch_backend():
    """The weights reach the ELBO on the torch backend too (three classes, full batches)."""
    pytest.importorskip("torch")
    X, y = make_suite_data(3, n=30, seed=3)
    w = np.random.default_rng(1).integers(1, 4, size=y.size)
    est = GPClassifier(method="svi", M=X[:8], optimize=False, max_iter=100, random_state=0,
                       kernel=RBF(lengthscale=1.5), backend="torch",
                       method_options={"optimizer": "adam", "lengthscale_init": "kernel"})
    weighted = est.fit(X, y, sample_weight=w).predict_proba(X)
    np.testing.assert_allclose(weighted, est.fit(*_repeated(X, y, w)).predict_proba(X),
                               rtol=1e-9, atol=1e-12)
    numpy = est.set_params(backend=None).fit(X, y, sample_weight=w).predict_proba(X)
    np.testing.assert_allclose(weighted, numpy, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weights,match", [
    (np.ones(29), r"shape \(30,\); got shape \(29,\)"),
    (np.ones((30, 2)), r"got shape \(30, 2\)"),
    (-np.ones(30), "non-negative; got 30 negative"),
    (np.zeros(30), "zero for every row"),
    (np.full(30, np.nan), "NaN/inf"),
    (["a"] * 30, "numbers only"),
])
def test_bad_sample_weights_are_input_errors_before_training(no_laplace_training, data, weights,
                                                             match):
    with pytest.raises(InputError, match=match):
        _laplace().fit(*data, sample_weight=weights)


def test_methods_without_weights_name_those_with_them(data):
    X, y = data
    with pytest.raises(InputError) as err:
        GPClassifier(method="ep").fit(X, y, sample_weight=np.full(y.size, 2.0))
    assert "method 'ep' does not take sample_weight" in str(err.value)
    assert re.search(r"use one of: .*laplace.*svi", str(err.value))
    with pytest.raises(InputError, match="does not take sample_weight"):
        GPRegressor(method="pep", M=5).fit(X, X[:, 0], sample_weight=np.arange(1.0, 31.0))


def test_weights_that_leave_one_class_are_an_input_error(no_laplace_training, data):
    X, y = data
    with pytest.raises(InputError, match="leaves only class 1 with a positive weight"):
        _laplace().fit(X, y, sample_weight=(y == 1).astype(float))


# -- early stopping --------------------------------------------------------------------------------


def test_early_stopping_attributes_as_mlp_classifier():
    """The attributes come from the validation curve that chose the number of iterations
    (``fit_result_.state["val_nll"]``). Since the backend branch, early stopping refits on all
    the data by default (``refit=True``), so ``history_`` is the refit's and has no ``val_nll``,
    and a hold-out under 200 points becomes K-fold cross-validation (a fold-averaged curve whose
    chosen iteration follows the one-standard-error rule, so not necessarily its maximum); the
    single hold-out without refit keeps MLPClassifier's exact semantics (checked below)."""
    X, y = make_suite_data(2, n=80, seed=2)
    kw = dict(method="laplace", max_iter=60, random_state=0, validation_fraction=0.25,
              n_iter_no_change=3)
    # defaults: 20 held-out points, so K folds and a refit for the chosen number of iterations
    est = GPClassifier(**kw).fit(X, y)
    d, state = est.fit_result_.diagnostics, est.fit_result_.state
    assert d["refit"] == 1.0 and d["validation_folds"] > 1
    checked = [int(i) for i in state["val_iteration"]]
    assert checked == list(range(1, len(checked) + 1))  # validation_interval=1: every iteration
    assert est.validation_scores_ == [-float(v) for v in state["val_nll"]]
    assert est.best_iteration_ == int(d["best_iteration"]) == int(d["best_val_iteration"])
    assert est.best_validation_score_ == est.validation_scores_[checked.index(est.best_iteration_)]
    assert est.best_validation_score_ == -d["best_val_nll"]
    assert est.best_validation_score_ <= max(est.validation_scores_) == -d["min_val_nll"]
    assert est.n_iter_ == est.best_iteration_  # the refit trained for the chosen iterations
    assert all("val_nll" not in h for h in est.history_)
    # one hold-out: the best score is the maximum, at the chosen iteration, with or without refit
    for refit in (True, False):
        one = GPClassifier(**kw, validation_folds=1, refit=refit).fit(X, y)
        scores = one.validation_scores_
        assert one.fit_result_.diagnostics["validation_folds"] == 1.0
        assert one.best_validation_score_ == max(scores)
        iterations = [int(i) for i in one.fit_result_.state["val_iteration"]]
        assert one.best_iteration_ == iterations[scores.index(max(scores))]
        if refit:
            assert one.n_iter_ == one.best_iteration_
        else:  # the fit kept its best validation iterate: val_nll in history_, as MLPClassifier
            nll = [h["val_nll"] for h in one.history_ if "val_nll" in h]
            assert len(nll) == len(one.history_)
            assert scores == [-v for v in nll]
            best = one.history_[scores.index(one.best_validation_score_)]
            assert one.best_iteration_ == int(best["iteration"])
    plain = GPClassifier(method="laplace", max_iter=3).fit(X, y)
    assert plain.best_iteration_ is None and plain.validation_scores_ is None
    assert plain.best_validation_score_ is None


def test_validation_size_is_the_held_out_count():
    y = np.array(["a"] * 10 + ["b"] * 31 + ["c"] * 5)
    index = np.unique(y, return_inverse=True)[1]
    _, val = split_validation(index, 0.2, np.random.default_rng(0), 3)
    assert validation_size(y, 0.2, 3) == val.size == 2 + 6 + 1
    assert validation_size(np.zeros(50), 0.2, 0) == 10
