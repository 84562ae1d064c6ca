"""Tests of GPClassifier with small fake methods (no plugin needed), and of MethodTestSuite.

The fake methods do kernel ridge regression on +-1 (one-vs-rest) targets: deterministic,
exactly symmetric under label permutations, and good enough for scikit-learn's accuracy checks.
They are registered for the duration of a test by monkeypatching ``gpinfer.registry``; their
likelihoods (``fake_probit``, ``fake_softmax``) by monkeypatching
``gpinfer.likelihoods.make_likelihood``.
"""

from __future__ import annotations

import importlib
import pickle

import numpy as np
import pytest
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.special import log_softmax, ndtr
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import check_estimator

import gpinfer
from gpinfer import likelihoods, registry
from gpinfer.errors import InputError, NumericalError, UnknownNameError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import FitResult, IterationInfo, Likelihood, Method, Problem
from gpinfer.kernels import make_kernel
from gpinfer.kernels.base import Kernel
from gpinfer.posterior import Posterior
from gpinfer.testing import SUITES, MethodTestSuite
from gpinfer.testing.method_suite import make_suite_data

# --------------------------------------------------------------------------------------------
# fakes
# --------------------------------------------------------------------------------------------


class FakeProbit(Likelihood):
    """Binary probit, prediction only."""

    name = "fake_probit"

    def log_prob(self, y, F):
        return np.log(ndtr((2 * np.asarray(y) - 1) * F))

    def tilted(self, y, mean, var, power=1.0):
        raise NotImplementedError

    def expected_log_prob(self, y, mean, var):
        raise NotImplementedError

    def predict_proba(self, mean, var):
        p = ndtr(mean / np.sqrt(1.0 + var))
        return np.stack([1.0 - p, p], axis=1)


class FakeSoftmax(FakeProbit):
    """Softmax of the latent means (variances ignored), prediction only."""

    name = "fake_softmax"
    multiclass = True

    def predict_proba(self, mean, var):
        return np.exp(log_softmax(mean, axis=1))


FAKE_LIKELIHOODS = {"fake_probit": FakeProbit, "fake_softmax": FakeSoftmax}


def ridge_targets(y: np.ndarray, n_classes: int) -> np.ndarray:
    """+-1 targets ``[N, L]``: one column (2y - 1) for binary, one-vs-rest for multi-class."""
    if n_classes == 2:
        return (2.0 * y - 1.0)[:, None]
    return 2.0 * np.eye(n_classes)[y] - 1.0


def ridge_evidence(kernel: Kernel, X: np.ndarray, T: np.ndarray, noise: float,
                   weights: np.ndarray | None = None):
    """GP-regression log marginal likelihood of ``T [N, L]`` and its gradient wrt ``K [N, N]``;
    ``weights [N]`` divide each point's noise variance (weight 2: the point observed twice)."""
    n, n_latent = T.shape
    noise_diag = noise * np.ones(n) if weights is None else noise / weights
    L = cholesky(kernel.K(X) + np.diag(noise_diag), lower=True)
    A = cho_solve((L, True), T)
    value = (
        -0.5 * np.sum(T * A)
        - n_latent * np.sum(np.log(np.diag(L)))
        - 0.5 * n * n_latent * np.log(2 * np.pi)
    )
    dK = 0.5 * (A @ A.T - n_latent * cho_solve((L, True), np.eye(n)))
    return float(value), dK, L, A


class RidgePosterior(Posterior):
    def __init__(self, likelihood, kernel, X, A, L):
        super().__init__(likelihood)
        self.kernel, self.X, self.A, self.L = kernel, X, A, L

    def predict_f(self, X):
        Ks = self.kernel.K(self.X, X)  # [N, N*]
        mean = Ks.T @ self.A  # [N*, L]
        V = solve_triangular(self.L, Ks, lower=True)
        var = np.maximum(self.kernel.K_diag(X) - np.sum(V * V, axis=0), 1e-12)
        return mean, np.repeat(var[:, None], self.A.shape[1], axis=1)


class RidgeMethod(Method):
    """Binary fake: kernel ridge regression on +-1 targets, one reported iteration."""

    name = "fake"
    likelihoods = ("fake_probit",)
    default_options = {"noise": 0.3}
    supports_sample_weight = True

    def fit(self, problem: Problem, callback=None) -> FitResult:
        self.problem = problem  # kept for the tests to inspect
        T = ridge_targets(problem.y, problem.n_classes)
        value, _, L, A = ridge_evidence(problem.kernel, problem.X, T, self.options["noise"],
                                        problem.sample_weight)
        posterior = RidgePosterior(problem.likelihood, problem.kernel, problem.X, A, L)
        if callback is not None:
            callback(IterationInfo(iteration=1, objective=value, elapsed=0.0))
        return FitResult(
            posterior=posterior,
            log_evidence=value,
            kernel=problem.kernel,
            n_iter=1,
            history=[{"objective": value, "elapsed": 0.0}],
        )


class RidgeMulticlass(RidgeMethod):
    name = "fakemc"
    multiclass = True
    likelihoods = ("fake_probit", "fake_softmax")


class RidgeSparse(RidgeMethod):
    """Accepts M and batch_size (and records them); predictions as the full method."""

    name = "fakesparse"
    uses_inducing_points = True
    supports_minibatch = True

    def fit(self, problem, callback=None):
        result = super().fit(problem, callback)
        if isinstance(problem.inducing, int):
            pick = problem.rng.choice(problem.n, size=problem.inducing, replace=False)
            result.state["Z"] = problem.X[pick]
        return result


class BiasedMethod(RidgeMethod):
    """Broken on purpose: favours class 0, so it is not label-permutation invariant (mildly: a
    shift of its weights by 0.5 predicts class 0 everywhere, which the fit guard stops)."""

    name = "fakebiased"

    def fit(self, problem, callback=None):
        result = super().fit(problem, callback)
        result.posterior.A = result.posterior.A - 0.05
        return result


FAKE_METHODS = {c.name: c for c in (RidgeMethod, RidgeMulticlass, RidgeSparse, BiasedMethod)}


@pytest.fixture
def fake_plugins(monkeypatch):
    """Install the fake methods and likelihoods next to whatever is really registered."""
    real_load = registry.load_method
    real_make = getattr(likelihoods, "make_likelihood", None)

    def load_method(name):
        if name in FAKE_METHODS:
            return FAKE_METHODS[name]
        return real_load(name)

    def methods_supporting(predicate):
        return sorted(n for n, c in FAKE_METHODS.items() if n != "fakebiased" and predicate(c))

    def make_likelihood(spec, **params):
        if isinstance(spec, str) and spec in FAKE_LIKELIHOODS:
            return FAKE_LIKELIHOODS[spec](**params)
        if real_make is None:
            raise UnknownNameError(f"unknown likelihood {spec!r}")
        return real_make(spec, **params)

    monkeypatch.setattr(registry, "load_method", load_method)
    monkeypatch.setattr(registry, "methods_supporting", methods_supporting)
    monkeypatch.setattr(likelihoods, "make_likelihood", make_likelihood, raising=False)


@pytest.fixture
def data():
    return make_suite_data(2, n=40, seed=1)


@pytest.fixture
def data3():
    return make_suite_data(3, n=45, seed=2)


# --------------------------------------------------------------------------------------------
# package surface
# --------------------------------------------------------------------------------------------


def test_package_exports():
    assert gpinfer.GPClassifier is GPClassifier
    assert gpinfer.errors.InputError is InputError
    assert isinstance(gpinfer.__version__, str) and gpinfer.__version__
    assert {"GPClassifier", "errors", "__version__"} <= set(gpinfer.__all__)
    with pytest.raises(AttributeError):
        _ = gpinfer.NoSuchThing


def test_init_stores_parameters_only():
    est = GPClassifier(method="nonexistent", M=-5, kernel=3, max_iter="x")  # nothing checked
    assert est.get_params()["M"] == -5
    assert not [k for k in vars(est) if k.endswith("_")]


# --------------------------------------------------------------------------------------------
# fitting and predicting
# --------------------------------------------------------------------------------------------


def test_fit_sets_fitted_attributes(fake_plugins, data):
    X, y = data
    kernel = make_kernel("rbf", input_dim=2, lengthscale=0.7)
    before = kernel.get_unconstrained().copy()
    est = GPClassifier(method="fake", kernel=kernel, random_state=3)
    assert est.fit(X, y) is est
    np.testing.assert_array_equal(est.classes_, [0, 1])
    assert est.n_features_in_ == 2
    assert isinstance(est.method_, RidgeMethod)
    assert isinstance(est.fit_result_, FitResult)
    assert est.posterior_ is est.fit_result_.posterior
    assert est.kernel_ is est.fit_result_.kernel and est.kernel_ is not kernel
    assert isinstance(est.likelihood_, FakeProbit)
    assert est.log_evidence_ == pytest.approx(est.fit_result_.log_evidence)
    assert est.n_iter_ == 1 and est.history_ == [{"objective": est.log_evidence_, "elapsed": 0.0}]
    np.testing.assert_array_equal(kernel.get_unconstrained(), before)  # parameter untouched


def test_problem_passed_to_method(fake_plugins, data):
    X, y = data
    y_named = np.where(y == 1, "yes", "no")
    est = GPClassifier(method="fakesparse", M=0.25, max_iter=7, batch_size=8, optimize=False)
    est.set_params(random_state=11).fit(X, y_named)
    problem = est.method_.problem
    assert isinstance(problem, Problem)
    # a named kernel: the inputs are standardised by default, the scaling kept with the model
    np.testing.assert_array_equal(problem.X, (X - X.mean(axis=0)) / X.std(axis=0))
    np.testing.assert_array_equal(est.scaler_.transform(X), problem.X)
    assert problem.X is not X and problem.X.dtype == np.float64
    np.testing.assert_array_equal(problem.y, (y_named == "yes").astype(int))
    assert problem.y.dtype == np.int64 and problem.n_classes == 2
    assert problem.inducing == 10 and problem.max_iter == 7 and problem.batch_size == 8
    assert problem.optimize is False
    assert isinstance(problem.rng, np.random.Generator)
    assert est.method_.options == {"noise": 0.3}
    Z1 = est.fit_result_.state["Z"]
    Z2 = clone(est).fit(X, y_named).fit_result_.state["Z"]
    np.testing.assert_array_equal(Z1, Z2)  # same random_state, same draws
    Z3 = clone(est).set_params(random_state=12).fit(X, y_named).fit_result_.state["Z"]
    assert not np.array_equal(Z1, Z3)


def test_inducing_array_and_method_options(fake_plugins, data):
    X, y = data
    est = GPClassifier(method="fakesparse", M=X[:4].tolist(), method_options={"noise": 0.1})
    est.fit(X, y)
    np.testing.assert_array_equal(est.method_.problem.inducing, X[:4])
    assert est.method_.options["noise"] == 0.1


@pytest.mark.parametrize(
    "labels",
    [
        np.array(["cat", "dog"]),
        np.array([-1, 1]),
        np.array([10, 3]),  # non-contiguous and not sorted
        np.array(["b", "a"], dtype=object),
        np.array([False, True]),
        np.array([0.0, 2.0]),
    ],
)
def test_label_types(fake_plugins, data, labels):
    X, y = data
    base = GPClassifier(method="fake").fit(X, y)
    est = GPClassifier(method="fake").fit(X, labels[y])
    np.testing.assert_array_equal(est.classes_, np.sort(labels))
    pred = est.predict(X)
    assert set(pred.tolist()) <= set(labels.tolist())
    order = np.argsort(labels)  # column j of est is labels[order[j]]
    np.testing.assert_allclose(est.predict_proba(X), base.predict_proba(X)[:, order], atol=1e-12)
    np.testing.assert_array_equal(pred, labels[base.predict(X)])
    assert est.score(X, labels[y]) == pytest.approx(base.score(X, y))


def test_predict_proba_predict_and_predict_f(fake_plugins, data3):
    X, y = data3
    est = GPClassifier(method="fakemc").fit(X, y)
    P = est.predict_proba(X[:9])
    assert P.shape == (9, 3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(est.predict(X[:9]), np.argmax(P, axis=1))
    np.testing.assert_allclose(est.predict_log_proba(X[:9]), np.log(P))
    mean, var = est.predict_f(X[:9])
    assert mean.shape == (9, 3) and var.shape == (9, 3) and np.all(var > 0)
    assert est.score(X, y) > 0.8


def test_default_likelihood_suits_the_number_of_classes(fake_plugins, data, data3):
    """fakemc declares ("fake_probit", "fake_softmax"): binary data get the first, 3 classes the
    first multi-class one."""
    assert isinstance(GPClassifier(method="fakemc").fit(*data).likelihood_, FakeProbit)
    lik3 = GPClassifier(method="fakemc").fit(*data3).likelihood_
    assert isinstance(lik3, FakeSoftmax)


def test_likelihood_object_is_copied(fake_plugins, data):
    lik = FakeProbit()
    est = GPClassifier(method="fake", likelihood=lik).fit(*data)
    assert isinstance(est.likelihood_, FakeProbit) and est.likelihood_ is not lik


def test_callback_receives_iteration_info(fake_plugins, data):
    seen = []
    GPClassifier(method="fake").fit(*data, callback=seen.append)
    assert len(seen) == 1 and isinstance(seen[0], IterationInfo) and seen[0].iteration == 1


def test_pickle_round_trip(fake_plugins, data):
    X, y = data
    est = GPClassifier(method="fake").fit(X, y)
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict_proba(X), est.predict_proba(X))


def test_public_class_is_the_scikit_learn_estimator(fake_plugins, data):
    """``GPClassifier`` lives in ``gpinfer.sklearn_estimators`` but keeps its public name: a
    pickle names ``gpinfer.estimator.GPClassifier`` and loads as the same class."""
    from sklearn.base import BaseEstimator

    from gpinfer import sklearn_estimators
    from gpinfer.estimator import GPClassifierCore

    assert GPClassifier is sklearn_estimators.GPClassifier is gpinfer.GPClassifier
    assert issubclass(GPClassifier, BaseEstimator) and issubclass(GPClassifier, GPClassifierCore)
    assert not issubclass(GPClassifierCore, BaseEstimator)
    assert f"{GPClassifier.__module__}.{GPClassifier.__qualname__}" == "gpinfer.estimator.GPClassifier"
    est = GPClassifier(method="fake").fit(*data)
    assert b"gpinfer.estimator" in pickle.dumps(est)
    assert type(pickle.loads(pickle.dumps(est))) is GPClassifier


def test_core_fit_as_the_scikit_learn_estimator(fake_plugins, data):
    """A fitted ``GPClassifierCore`` (the runner's) becomes the ``GPClassifier`` fitted the same
    way: same parameters, same predictions, clonable."""
    from gpinfer.estimator import GPClassifierCore
    from gpinfer.sklearn_estimators import GPRegressor, as_sklearn

    X, y = data
    core = GPClassifierCore(method="fake", max_iter=7, random_state=3).fit(X, y)
    est = as_sklearn(core)
    assert type(est) is GPClassifier and as_sklearn(est) is est
    assert est.get_params() == GPClassifier(method="fake", max_iter=7, random_state=3).get_params()
    reference = GPClassifier(method="fake", max_iter=7, random_state=3).fit(X, y)
    np.testing.assert_array_equal(est.predict_proba(X), reference.predict_proba(X))
    np.testing.assert_array_equal(est.predict(X), reference.predict(X))
    assert clone(est).get_params() == est.get_params()
    with pytest.raises(TypeError, match="GPRegressorCore"):
        GPRegressor.from_core(core)


def test_not_fitted(fake_plugins, data):
    X, _ = data
    est = GPClassifier(method="fake")
    for call in (est.predict, est.predict_proba, est.predict_f, est.predict_log_proba):
        with pytest.raises(NotFittedError):
            call(X)


def test_predict_f_of_an_overflowing_kernel_is_a_numerical_error(data):
    """A finite input far outside the training data's scale overflows a linear kernel: the
    latent variance is ``inf - inf``; ``predict_f`` raises rather than return NaN."""
    X, y = data
    est = GPClassifier(method="kl", kernel=make_kernel("linear", 2), max_iter=2,
                       random_state=0).fit(X, y)
    assert np.all(np.isfinite(np.hstack(est.predict_f(X))))
    with pytest.raises(NumericalError, match="not finite \\(first at row 1\\)") as info:
        est.predict_f(np.array([[0.1, 0.2], [1e200, 0.0]]))
    assert info.value.quantity == "predict_f"


def test_wrong_feature_count_at_predict(fake_plugins, data):
    X, y = data
    est = GPClassifier(method="fake").fit(X, y)
    msg = "X has 3 features, but GPClassifier is expecting 2 features as input"
    for call in (est.predict, est.predict_proba, est.predict_f):
        with pytest.raises(InputError, match=msg):
            call(np.hstack([X, X[:, :1]]))
    with pytest.raises(InputError, match="2-D"):
        est.predict(X[0])
    with pytest.raises(InputError, match="NaN"):
        est.predict(np.full((1, 2), np.nan))


# --------------------------------------------------------------------------------------------
# bad input is rejected before training
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_training(fake_plugins, monkeypatch):
    def fit(self, problem, callback=None):
        raise AssertionError("training started although the input was invalid")

    for cls in FAKE_METHODS.values():
        monkeypatch.setattr(cls, "fit", fit)


def _with(X, row, col, value):
    X = X.copy()
    X[row, col] = value
    return X


@pytest.mark.parametrize(
    ("params", "make_xy", "error", "match"),
    [
        ({}, lambda X, y: (_with(X, 5, 1, np.nan), y), InputError, "1 NaN .* first at row 5"),
        ({}, lambda X, y: (_with(X, 2, 0, np.inf), y), InputError, "1 inf .* first at row 2"),
        ({}, lambda X, y: (X, np.where(y == 1, 1.0, np.nan)), InputError, "NaN"),
        ({}, lambda X, y: (X, y[:-1]), InputError, "X has 40 rows, y has 39 labels"),
        ({}, lambda X, y: (X, np.zeros_like(y)), InputError, "at least two classes"),
        ({}, lambda X, y: (X, None), InputError, "target y is None"),
        ({}, lambda X, y: (X, y + 0.5), InputError, "Unknown label type"),
        ({}, lambda X, y: (np.ones_like(X), y), InputError,
         "every one of its 2 feature.s. is constant over its 40 rows"),
        ({"method": "fakesparse", "M": 0}, None, InputError, "positive number"),
        ({"method": "fakesparse", "M": -2}, None, InputError, "positive number"),
        ({"method": "fakesparse", "M": 41}, None, InputError, "exceeds .* N=40"),
        ({"method": "fakesparse", "M": 1.5}, None, InputError, "fraction"),
        ({"M": 10}, None, InputError, "method 'fake' has no inducing points; leave M unset"),
        ({"batch_size": 8}, None, InputError, "mini-batches.*fakesparse"),
        ({"method": "fakesparse", "batch_size": 0}, None, InputError, "batch_size"),
        ({"likelihood": "fake_softmax"}, None, InputError, "does not accept likelihood"),
        ({"likelihood": 3.0}, None, InputError, "likelihood must be"),
        ({"kernel": 3}, None, InputError, "kernel must be"),
        ({"max_iter": 0}, None, InputError, "max_iter"),
        ({"max_iter": 2.5}, None, InputError, "max_iter"),
        ({"optimize": "yes"}, None, InputError, "optimize"),
        ({"method_options": {"nosie": 1}}, None, InputError, "unknown option.*nosie.*noise"),
        ({"method_options": [1]}, None, InputError, "method_options"),
        ({"random_state": "seed"}, None, InputError, "random_state"),
        ({"method": 5}, None, InputError, "method must be"),
    ],
)
def test_bad_input_rejected_before_training(no_training, data, params, make_xy, error, match):
    X, y = data
    if make_xy is not None:
        X, y = make_xy(X, y)
    est = GPClassifier(**{"method": "fake", **params})
    with pytest.raises(error, match=match):
        est.fit(X, y)
    assert not hasattr(est, "classes_")


def test_a_constant_feature_beside_a_varying_one_is_accepted(fake_plugins, data):
    X, y = data
    X = _with(X, slice(None), 0, 3.0)  # column 0 constant, column 1 varies
    assert GPClassifier(method="fake").fit(X, y).classes_.tolist() == [0, 1]


def test_all_constant_inputs_refused_before_training_where_they_are_known(no_training, data,
                                                                           tmp_path):
    """Every feature constant: the kernel sees one point (was a FitFailedError after
    training): refused for the rows of positive weight, for inputs out of core (from the
    chunked statistics) and by the regressor."""
    from gpinfer.regressor import GPRegressor

    X, y = data
    X = _with(X, slice(None), slice(None), 2.0)
    X[0] = [5.0, -1.0]  # the one row that varies has weight 0: dropped
    weight = np.r_[0.0, np.ones(len(y) - 1)]
    with pytest.raises(InputError, match="every one of its 2 feature.s. is constant over "
                                         "its 39 rows"):
        GPClassifier(method="fake").fit(X, y, sample_weight=weight)
    np.save(tmp_path / "X.npy", X[1:])
    with pytest.raises(InputError, match="is constant over its 39 rows"):
        GPClassifier(method="sep", batch_size=8).fit(  # out of core: sep streams
            np.load(tmp_path / "X.npy", mmap_mode="r"), y[1:])
    with pytest.raises(InputError, match="is constant over its 39 rows"):
        GPRegressor(max_iter=1).fit(X[1:], np.linspace(0.0, 1.0, len(y) - 1))


def test_unknown_method_name_suggests_near_names(no_training, data):
    """The real registry answers for names the fakes do not know (laplace is registered)."""
    with pytest.raises(UnknownNameError, match="did you mean 'laplace'"):
        GPClassifier(method="laplac").fit(*data)


def test_multiclass_data_on_binary_method_names_multiclass_methods(no_training, data3):
    with pytest.raises(InputError) as err:
        GPClassifier(method="fake").fit(*data3)
    msg = str(err.value)
    assert "handles binary problems only" in msg
    assert "for 3 classes use one of: fakemc" in msg


def test_binary_likelihood_object_with_three_classes(no_training, data3):
    with pytest.raises(InputError, match="binary but y has 3 classes"):
        GPClassifier(method="fakemc", likelihood=FakeProbit()).fit(*data3)


# --------------------------------------------------------------------------------------------
# scikit-learn contract
# --------------------------------------------------------------------------------------------


def test_get_set_params_and_clone(fake_plugins, data):
    kernel = make_kernel("rbf", input_dim=2)
    est = GPClassifier(method="fakesparse", M=5, kernel=kernel, method_options={"noise": 0.2})
    params = est.get_params()
    assert params == {
        "backend": None,
        "device": None,
        "dtype": None,
        "method": "fakesparse",
        "M": 5,
        "kernel": kernel,
        "kernel__lengthscale": 1.0,
        "kernel__variance": 1.0,
        "likelihood": None,
        "optimize": None,
        "max_iter": 100,
        "batch_size": None,
        "random_state": None,
        "method_options": {"noise": 0.2},
        "verbose": False,
        "validation_fraction": None,
        "validation_interval": 1,
        "n_iter_no_change": 10,
        "refit": "auto",
        "validation_folds": None,
        "refit_rule": "iterations",
        "choice_rule": "one_se",
        "refine_iter": None,
        "choice_refine_iter": 0,
        "standardize": "auto",
        "baseline_failure": "raise",
    }
    assert est.set_params(M=7, max_iter=3) is est and est.M == 7 and est.max_iter == 3
    assert est.set_params(choice_rule="median").choice_rule == "median"
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(nonsense=1)
    est.fit(*data)
    twin = clone(est)
    assert not hasattr(twin, "classes_")
    assert twin.get_params()["M"] == 7 and twin.kernel is not kernel
    assert twin.get_params()["choice_rule"] == "median"
    np.testing.assert_array_equal(twin.fit(*data).predict_proba(data[0]), est.predict_proba(data[0]))


def test_sklearn_tags_follow_method(fake_plugins):
    assert get_tags(GPClassifier(method="fake")).classifier_tags.multi_class is False
    assert get_tags(GPClassifier(method="fakemc")).classifier_tags.multi_class is True
    assert get_tags(GPClassifier(method="no-such-method")).estimator_type == "classifier"
    assert get_tags(GPClassifier(method=[1])).classifier_tags is not None


#: checks that do not apply to a GP classifier (none needed with the fake methods so far)
EXPECTED_FAILED_CHECKS: dict[str, str] = {}


@pytest.mark.parametrize("method", ["fake", "fakemc"])
def test_sklearn_check_estimator(fake_plugins, method):
    check_estimator(
        GPClassifier(method=method, random_state=0),
        expected_failed_checks=EXPECTED_FAILED_CHECKS,
        on_skip=None,
    )


# --------------------------------------------------------------------------------------------
# the method suite, run on the fakes (and shown to fail on a broken method)
# --------------------------------------------------------------------------------------------


class _FakeSuiteBase(MethodTestSuite):
    @pytest.fixture(autouse=True)
    def _fakes(self, fake_plugins):
        yield

    def objective_and_gradient(self, X, y):
        kernel = make_kernel("rbf", input_dim=X.shape[1], lengthscale=0.8, variance=1.3)
        T = ridge_targets(y, self.n_classes)
        noise = RidgeMethod.default_options["noise"]

        def at(theta):
            k = kernel.copy()
            k.set_unconstrained(theta)
            return k

        def value(theta):
            return ridge_evidence(at(theta), X, T, noise)[0]

        def gradient(theta):
            k = at(theta)
            return k.grad_params(X, None, ridge_evidence(k, X, T, noise)[1])

        return value, gradient, kernel.get_unconstrained()


class TestFakeBinarySuite(_FakeSuiteBase):
    method_name = "fake"


class TestFakeMulticlassSuite(_FakeSuiteBase):
    method_name = "fakemc"
    n_classes = 3


class TestFakeSparseSuite(_FakeSuiteBase):
    method_name = "fakesparse"
    inducing = 10


def test_suites_are_recorded():
    assert {"fake", "fakemc", "fakesparse"} <= SUITES
    assert "" not in SUITES


def test_suite_detects_broken_method(fake_plugins):
    class BiasedSuite(_FakeSuiteBase):
        method_name = "fakebiased"

    suite = BiasedSuite()
    suite.test_predict_proba_shape_and_rows_sum_to_one()  # fine on its own
    with pytest.raises(AssertionError):
        suite.test_label_permutation()


def test_suite_detects_wrong_gradient(fake_plugins):
    class WrongGradientSuite(_FakeSuiteBase):
        method_name = "fake"

        def objective_and_gradient(self, X, y):
            value, gradient, theta0 = super().objective_and_gradient(X, y)
            return value, lambda theta: 1.01 * gradient(theta), theta0

    with pytest.raises(AssertionError, match="disagrees with finite differences"):
        WrongGradientSuite().test_objective_gradient()


def test_suite_without_gradient_hook_fails(fake_plugins):
    class NoHookSuite(MethodTestSuite):
        method_name = "fake"

    with pytest.raises(NotImplementedError, match="objective_and_gradient"):
        NoHookSuite().test_objective_gradient()


# --------------------------------------------------------------------------------------------
# with the real pieces, when they are installed
# --------------------------------------------------------------------------------------------


def _laplace_available() -> bool:
    try:
        registry.load_method("laplace")
        importlib.import_module("gpinfer.likelihoods").make_likelihood("logit")
    except Exception:
        return False
    return True


needs_laplace = pytest.mark.skipif(
    not _laplace_available(), reason="laplace plugin or likelihoods not available"
)


@needs_laplace
def test_laplace_smoke(data, data3):
    X, y = data
    names = np.array(["neg", "pos"])
    est = GPClassifier(method="laplace", max_iter=5, random_state=0).fit(X, names[y])
    P = est.predict_proba(X)
    assert P.shape == (40, 2)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    assert est.score(X, names[y]) > 0.7
    assert np.isfinite(est.log_evidence_) and est.n_iter_ >= 1
    assert get_tags(est).classifier_tags.multi_class is False
    with pytest.raises(InputError, match="binary"):
        GPClassifier(method="laplace").fit(*data3)
    with pytest.raises(InputError, match="no inducing points"):
        GPClassifier(method="laplace", M=5).fit(X, y)


#: checks that do not apply to Laplace (none so far)
LAPLACE_EXPECTED_FAILED_CHECKS: dict[str, str] = {}


@needs_laplace
def test_laplace_check_estimator():
    """The whole contract with a real plugin; fixed hyper-parameters keep it quick."""
    check_estimator(
        GPClassifier(method="laplace", optimize=False, max_iter=20, random_state=0),
        expected_failed_checks=LAPLACE_EXPECTED_FAILED_CHECKS,
        on_skip=None,
    )
