"""Tests of gpinfer.validation: arrays, labels, inducing points, method compatibility."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.exceptions import DataConversionWarning

from gpinfer import registry
from gpinfer.backend.choice import NUMPY, Backend
from gpinfer.errors import InputError
from gpinfer.interfaces import Method
from gpinfer.likelihoods import BernoulliProbit, RobustMax, Softmax
from gpinfer.validation import (
    check_binary_labels,
    check_features_vary,
    check_inducing,
    check_method_compatible,
    check_targets,
    check_X,
    check_X_y,
    encode_labels,
)

# --------------------------------------------------------------------------------------------
# check_X / check_X_y
# --------------------------------------------------------------------------------------------


def test_check_features_vary_refuses_only_every_feature_constant():
    X = np.ones((5, 3))
    with pytest.raises(InputError, match=r"^X: every one of its 3 feature\(s\) is constant "
                                         r"over its 5 rows"):
        check_features_vary(X.min(axis=0), X.max(axis=0), 5)
    X[2, 1] = 1.5  # one feature varies, at one row: fine
    check_features_vary(X.min(axis=0), X.max(axis=0), 5)
    check_features_vary(np.ones(3), np.ones(3), 1)  # a single row: no pair to tell apart


def test_check_X_returns_float64_copy():
    X = np.arange(6, dtype=np.int32).reshape(3, 2)
    out = check_X(X)
    assert out.dtype == np.float64 and out.shape == (3, 2) and out.flags.c_contiguous
    out[0, 0] = 99.0
    assert X[0, 0] == 0  # never a view of the caller's array
    Xf = np.asfortranarray(np.ones((3, 2)))
    assert check_X(Xf) is not Xf
    assert check_X([[1, 2], [3, 4]]).tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_check_X_read_only_input():
    X = np.ones((4, 2))
    X.setflags(write=False)
    out = check_X(X)
    assert out.flags.writeable and not X.flags.writeable


@pytest.mark.parametrize(
    ("value", "nan", "inf"), [(np.nan, 1, 0), (np.inf, 0, 1), (-np.inf, 0, 1)]
)
def test_check_X_non_finite_names_array_count_and_row(value, nan, inf):
    X = np.ones((5, 3))
    X[2, 1] = value
    X[4, 0] = value
    with pytest.raises(InputError) as err:
        check_X(X, name="X_test")
    msg = str(err.value)
    assert "X_test" in msg
    assert f"{2 * nan} NaN and {2 * inf} inf value(s) in 2 row(s)" in msg
    assert "row 2, column 1" in msg


@pytest.mark.parametrize(
    ("X", "match"),
    [
        (None, "X is None"),
        (np.ones(4), "2-D array"),
        (np.ones((2, 2, 2)), "2-D array"),
        (np.ones((0, 3)), "0 sample"),
        (np.ones((4, 0)), r"0 feature\(s\) \(shape=\(4, 0\)\) while a minimum of 1"),
        (np.array([["a", "b"], ["c", "d"]]), "numbers only"),
        (np.ones((2, 2)) + 1j, "Complex data not supported"),
        (sparse.csr_matrix(np.eye(3)), "sparse"),
    ],
)
def test_check_X_rejects(X, match):
    with pytest.raises(InputError, match=match):
        check_X(X)


def test_check_X_unconvertible_object_is_type_error():
    X = np.ones((2, 2), dtype=object)
    X[0, 0] = {"a": 1}
    with pytest.raises(TypeError, match="argument must be a string or a real number"):
        check_X(X)


def test_check_X_y_lengths_and_column_vector():
    X = np.ones((4, 2))
    with pytest.raises(InputError, match="X has 4 rows, y has 3 labels"):
        check_X_y(X, [0, 1, 0])
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        _, y = check_X_y(X, np.array([[0], [1], [0], [1]]))
    assert y.shape == (4,)
    with pytest.raises(InputError, match="1d array"):
        check_X_y(X, np.ones((4, 2)))
    with pytest.raises(InputError, match="requires y to be passed, but the target y is None"):
        check_X_y(X, None)


# --------------------------------------------------------------------------------------------
# encode_labels
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("y", "classes"),
    [
        ([0, 1, 1, 0], [0, 1]),
        ([7, 3, 11, 3], [3, 7, 11]),
        (["b", "a", "b", "c"], ["a", "b", "c"]),
        ([True, False, True], [False, True]),
        ([1.0, -1.0, 1.0], [-1.0, 1.0]),
        (np.array(["x", "y"], dtype=object), ["x", "y"]),
        (np.array([2, 5, 2], dtype=object), [2, 5]),
    ],
)
def test_encode_labels_round_trip(y, classes):
    got_classes, index = encode_labels(y)
    assert got_classes.tolist() == classes
    assert index.dtype == np.int64
    assert index.min() == 0 and index.max() == len(classes) - 1
    assert got_classes[index].tolist() == list(y)


def test_encode_labels_keeps_object_int_type():
    classes, _ = encode_labels(np.array([2, 5, 2], dtype=object))
    assert all(type(c) is int for c in classes)


@pytest.mark.parametrize(
    ("y", "match"),
    [
        ([1, 1, 1], r"1 class \(1\); classification needs at least two classes"),
        (["a"], "at least two classes"),
        ([0.0, np.nan, 1.0], "1 NaN and 0 inf label"),
        ([0.0, np.inf, 1.0], "0 NaN and 1 inf label"),
        (np.array([0, np.nan, 1], dtype=object), "1 NaN and 0 inf label"),
        (np.array(["a", np.nan, "b"], dtype=object), "NaN/inf label"),
        ([0.5, 1.0, 2.25], "Unknown label type: continuous"),
        (np.array([1 + 1j, 2 + 0j]), "Complex data not supported"),
        (np.array(["a", 1, "b"], dtype=object), "mixes label types"),
    ],
)
def test_encode_labels_rejects(y, match):
    with pytest.raises(InputError, match=match):
        encode_labels(y)


@pytest.mark.parametrize(
    ("y", "message"),
    [
        ([0.5, np.nan, np.inf, np.nan], "regression targets y contain 2 NaN and 1 inf value(s); "
                                        "first at index 1"),
        ([0.5, 1.0, -np.inf], "regression targets y contain 0 NaN and 1 inf value(s); first at "
                              "index 2"),
        (["a", "b"], "regression targets y must be real numbers"),
    ],
)
def test_check_targets_rejects(y, message):
    with pytest.raises(InputError) as err:
        check_targets(y)
    assert str(err.value).startswith(message)


def test_check_targets_keeps_its_regressor_name():
    import gpinfer.regressor

    assert gpinfer.regressor.check_targets is check_targets
    np.testing.assert_array_equal(check_targets([1, 2.5]), np.array([1.0, 2.5]))
    assert check_targets([1, 2]).dtype == np.float64


# --------------------------------------------------------------------------------------------
# check_inducing
# --------------------------------------------------------------------------------------------


def test_check_inducing_counts_fractions_and_arrays():
    assert check_inducing(None, 50, 2, "ep", True) is None
    assert check_inducing(None, 50, 2, "laplace", False) is None
    assert check_inducing(10, 50, 2, "ep", True) == 10
    assert check_inducing(np.int64(50), 50, 2, "ep", True) == 50
    assert check_inducing(0.1, 50, 2, "ep", True) == 5
    assert check_inducing(1.0, 50, 2, "ep", True) == 50
    assert check_inducing(0.001, 50, 2, "ep", True) == 1  # never fewer than one
    assert check_inducing(0.25, 10, 2, "ep", True) == 2  # round(2.5) -> 2 (banker's rounding)
    Z = [[0.0, 1.0], [2.0, 3.0]]
    out = check_inducing(Z, 50, 2, "ep", True)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2) and out.dtype == np.float64


@pytest.mark.parametrize(
    ("M", "match"),
    [
        (0, r"positive number of inducing points .* got M=0"),
        (-3, "got M=-3"),
        (51, "M=51 inducing points exceeds the number of training points N=50"),
        (0.0, r"fraction of N in \(0, 1\]"),
        (1.5, "pass an int for a count"),
        (float("nan"), "fraction"),
        (True, "count of inducing points"),
        ("10", "count of inducing points"),
        (np.ones((3, 5)), "have 5 column"),
        (np.ones((51, 2)), "51 inducing inputs exceed"),
        (np.array([[0.0, np.nan]]), "NaN"),
    ],
)
def test_check_inducing_rejects(M, match):
    with pytest.raises(InputError, match=match):
        check_inducing(M, 50, 2, "ep", True)


@pytest.mark.parametrize("M", [5, 0.5, np.ones((2, 2)), 0])
def test_check_inducing_method_without_inducing_points(M):
    with pytest.raises(InputError, match="method 'laplace' has no inducing points; leave M unset"):
        check_inducing(M, 50, 2, "laplace", False)


# --------------------------------------------------------------------------------------------
# check_method_compatible
# --------------------------------------------------------------------------------------------


class _Binary(Method):
    name = "binary_only"
    likelihoods = ("probit", "logit")

    def fit(self, problem, callback=None):  # pragma: no cover - never trained here
        raise AssertionError


def _declaring(name, **capabilities):
    """A ``_Binary`` subclass named ``name`` that declares ``capabilities`` (class attributes)."""
    return type(f"_{name}", (_Binary,), {"name": name, **capabilities})


_Multi = _declaring("multi", multiclass=True, likelihoods=("softmax", "robustmax"))
_Stochastic = _declaring("stochastic", supports_minibatch=True, uses_inducing_points=True)
_Regression = _declaring("regress", tasks=("regression",), likelihoods=("gaussian",))


_INSTALLED = {c.name: c for c in (_Binary, _Multi, _Stochastic, _Regression)}


@pytest.fixture
def installed(monkeypatch):
    """Pretend the four classes above are the installed methods."""
    monkeypatch.setattr(
        registry,
        "methods_supporting",
        lambda predicate: sorted(n for n, c in _INSTALLED.items() if predicate(c)),
    )


def test_compatible_problems_pass(installed):
    check_method_compatible(_Binary, 2, "classification", None, None)
    check_method_compatible(_Binary, 2, "classification", None, "logit")
    check_method_compatible(_Multi, 5, "classification", None, "softmax")
    check_method_compatible(_Stochastic, 2, "classification", 16, "probit")
    check_method_compatible(_Regression, 0, "regression", None, "gaussian")


def test_multiclass_on_binary_method_names_alternatives(installed):
    with pytest.raises(InputError) as err:
        check_method_compatible(_Binary, 3, "classification", None, None)
    msg = str(err.value)
    assert "method 'binary_only' handles binary problems only" in msg
    assert "Only binary classification is supported" in msg
    assert "for 3 classes use one of: multi" in msg


def test_no_alternative_installed(monkeypatch):
    monkeypatch.setattr(registry, "methods_supporting", lambda predicate: [])
    with pytest.raises(InputError, match=r"use one of: \(none installed\)"):
        check_method_compatible(_Binary, 4, "classification", None, None)


def test_minibatch_on_batch_method(installed):
    with pytest.raises(InputError, match="does not train on mini-batches.*use one of: stochastic"):
        check_method_compatible(_Binary, 2, "classification", 32, None)


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, "8"])
def test_bad_batch_size(installed, batch_size):
    with pytest.raises(InputError, match="batch_size must be a positive int"):
        check_method_compatible(_Stochastic, 2, "classification", batch_size, None)


def test_unsupported_likelihood(installed):
    with pytest.raises(InputError) as err:
        check_method_compatible(_Binary, 2, "classification", None, "softmax")
    msg = str(err.value)
    assert "does not accept likelihood 'softmax'" in msg
    assert "it accepts: probit, logit" in msg
    assert "use one of: multi" in msg


def test_wrong_task(installed):
    with pytest.raises(InputError, match="not regression; for regression use one of: regress"):
        check_method_compatible(_Binary, 0, "regression", None, None)
    with pytest.raises(InputError, match="for classification use one of: binary_only, multi"):
        check_method_compatible(_Regression, 2, "classification", None, None)


# --------------------------------------------------------------------------------------------
# check_method_compatible with a backend: the method, then its likelihood's expectation rule
# --------------------------------------------------------------------------------------------

TORCH = Backend("torch", "cpu", "float64")  # a resolved setting: no torch needed to check it
TORCH32 = Backend("torch", "cpu", "float32")


class _Variational(_Binary):
    """A torch-capable method whose training evaluates ``variational_expectations``."""

    name = "variational"
    multiclass = True
    backends = ("numpy", "torch")
    float32 = True
    likelihoods = ("logit", "probit", "robustmax", "softmax")

    @classmethod
    def expectation_likelihood(cls, likelihood, options):
        return likelihood


#: a torch-capable method that evaluates no expectation rule (ep's kind)
_Sites = _declaring("sites", multiclass=True, backends=("numpy", "torch"),
                    likelihoods=("robustmax",))


@pytest.fixture
def torch_installed(monkeypatch):
    """The four classes above plus the two torch-capable ones as the installed methods."""
    classes = {**_INSTALLED, "variational": _Variational, "sites": _Sites}
    monkeypatch.setattr(
        registry, "methods_supporting",
        lambda predicate: sorted(n for n, c in classes.items() if predicate(c)))


def test_a_numpy_only_method_names_the_registry_s_torch_methods(torch_installed, monkeypatch):
    with pytest.raises(InputError) as err:
        check_method_compatible(_Binary, 2, "classification", None, None, backend=TORCH)
    assert str(err.value).endswith("runs on numpy only (backend='torch', device='cpu' asked "
                                   "for): leave backend and device unset, or use one of the "
                                   "methods with a torch backend: sites, variational")
    # the message follows the registry: one more torch method installed, one more name
    monkeypatch.setattr(_Stochastic, "backends", ("numpy", "torch"))
    with pytest.raises(InputError, match=r"torch backend: sites, stochastic, variational$"):
        check_method_compatible(_Binary, 2, "classification", None, None, backend=TORCH)
    check_method_compatible(_Binary, 2, "classification", None, None, backend=NUMPY)


def test_float32_names_the_methods_that_run_in_it(torch_installed):
    with pytest.raises(InputError, match=r"method 'sites' needs dtype='float64': it is not stable "
                                         r"in single precision; methods that run in float32 on "
                                         r"torch: variational$"):
        check_method_compatible(_Sites, 3, "classification", None, None, backend=TORCH32)
    check_method_compatible(_Variational, 3, "classification", None, None, backend=TORCH32)


@pytest.mark.parametrize(
    ("likelihood", "n_classes", "rule", "fix", "others"),
    [(RobustMax(expectation="log_space"), 3, r"RobustMax\(expectation='log_space'\)",
      "expectation='trapezoid' or 'gauss_hermite'", "softmax"),
     (Softmax(), 2, r"Softmax\(expectation='gauss_hermite'\) with 2 classes",
      "expectation='monte_carlo'", "logit, probit, robustmax"),
     (BernoulliProbit(expectation="adaptive"), 2, r"BernoulliProbit\(expectation='adaptive'\)",
      "expectation='gauss_hermite'", "logit, robustmax")],
    ids=["robustmax-log-space", "softmax-2-classes", "probit-adaptive"])
def test_a_numpy_only_rule_is_refused_naming_the_rule_backend_and_fixes(
        torch_installed, likelihood, n_classes, rule, fix, others):
    with pytest.raises(InputError, match=(
            rf"^method 'variational' evaluates its likelihood's rule on the torch backend, and "
            rf"{rule} runs on numpy only, not on the torch backend: on torch use {fix}, or leave "
            rf"backend and device unset \(numpy\); or a likelihood of variational whose "
            rf"default rule runs there: {others}$")):
        check_method_compatible(_Variational, n_classes, "classification", None,
                                likelihood.name, likelihood=likelihood, backend=TORCH)
    # numpy runs every rule; a method that evaluates no rule (sites) is not asked about it
    check_method_compatible(_Variational, n_classes, "classification", None, likelihood.name,
                            likelihood=likelihood, backend=NUMPY)
    check_method_compatible(_Sites, 3, "classification", None, None,
                            likelihood=RobustMax(expectation="log_space"), backend=TORCH)


def test_the_rule_of_a_named_or_default_likelihood_is_checked(torch_installed):
    """No object: the likelihood named, else the method's default for the classes (softmax
    first among the multi-class ones here, so its two-class Gauss-Hermite is refused)."""
    with pytest.raises(InputError, match=r"Softmax\(expectation='gauss_hermite'\) with 2"):
        check_method_compatible(_Variational, 2, "classification", None, "softmax",
                                backend=TORCH)
    check_method_compatible(_Variational, 3, "classification", None, "softmax", backend=TORCH)
    check_method_compatible(_Variational, 2, "classification", None, None, backend=TORCH)
    multi_first = _declaring("multi_first", multiclass=True, backends=("numpy", "torch"),
                             likelihoods=("softmax",),
                             expectation_likelihood=_Variational.expectation_likelihood)
    with pytest.raises(InputError, match=r"method 'multi_first' evaluates its likelihood's rule"):
        check_method_compatible(multi_first, 2, "classification", None, None, backend=TORCH)


def test_a_rule_set_by_the_method_s_options_is_the_one_checked(torch_installed):
    """svi's deprecated ``robustmax_rule`` picks the robust-max rule: checked as the method
    sets it (``Method.expectation_likelihood`` with the options)."""

    class _Legacy(_Variational):
        name = "legacy"

        @classmethod
        def expectation_likelihood(cls, likelihood, options):
            return likelihood.with_expectation(options.get("rule"))

    check_method_compatible(_Legacy, 3, "classification", None, "robustmax", backend=TORCH,
                            options={})
    with pytest.raises(InputError, match=r"method 'legacy' evaluates the rule legacy's options "
                                         r"set on the torch backend, and RobustMax\(expectation="
                                         r"'log_space'\) runs on numpy only"):
        check_method_compatible(_Legacy, 3, "classification", None, "robustmax", backend=TORCH,
                                options={"rule": "log_space"})


# --------------------------------------------------------------------------------------------
# check_binary_labels (the one binary-label check every binary method uses)
# --------------------------------------------------------------------------------------------


def test_check_binary_labels_accepts_0_1_and_names_multiclass_methods_otherwise():
    y = check_binary_labels([0, 1, 1, 0], 2, "mymethod")
    assert y.dtype == np.int64 and y.tolist() == [0, 1, 1, 0]
    with pytest.raises(InputError, match=r"mymethod handles binary.*Multi-class methods: .*sep"):
        check_binary_labels([0, 1, 2], 3, "mymethod")
    with pytest.raises(InputError, match="labels 0/1"):
        check_binary_labels([0, 5], 2, "mymethod")
    assert check_binary_labels([1, 1], 2, "mymethod").tolist() == [1, 1]
    with pytest.raises(InputError, match="both classes"):
        check_binary_labels([1, 1], 2, "mymethod", require_both=True)
