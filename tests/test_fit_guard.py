"""The fit guard (gpinfer.fit_guard) around every estimator fit: objective limit, best-iterate
restore, training NLL against the class-frequency baseline; with scripted and real methods."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler

from gpinfer import GPClassifier, GPRegressor
from gpinfer.errors import FitFailedError, InputError, NumericalError
from gpinfer.fit_guard import (
    CONSTANT_PREDICTIONS,
    RESTORED_BEST,
    SINGLE_CLASS_PREDICTIONS,
    WORSE_THAN_BASELINE,
    BestIterate,
    classification_baseline_nll,
    regression_baseline_nll,
)
from gpinfer.interfaces import FitCallback, FitResult, IterationInfo, Method, Problem
from gpinfer.posterior import Posterior


class LinearPosterior(Posterior):
    """The latent ``f(x) = slope * (x_1 - CUT) + offset`` (a binary posterior with tiny
    variance)."""

    def __init__(self, likelihood, slope: float, offset: float = 0.0):
        super().__init__(likelihood)
        self.slope, self.offset = slope, offset

    def predict_f(self, X):
        f = self.slope * (np.asarray(X)[:, :1] - CUT) + self.offset
        return f, np.full_like(f, 1e-6)


class Scripted(Method):
    """Reports ``objectives`` with the posteriors of ``slopes``, ends at the last one."""

    name: ClassVar[str] = "scripted"
    likelihoods: ClassVar[tuple[str, ...]] = ("logit",)
    supports_minibatch: ClassVar[bool] = True
    default_options: ClassVar[dict[str, Any]] = {"objectives": (-1.0,), "slopes": (0.0,),
                                                  "offset": 0.0}

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        lik, b = problem.likelihood, self.options["offset"]
        pairs = list(zip(self.options["objectives"], self.options["slopes"]))
        history = []
        for it, (value, a) in enumerate(pairs, start=1):
            history.append({"iteration": float(it), "objective": value, "elapsed": 0.0})
            if callback is not None:
                callback(IterationInfo(it, value, 0.0, lambda a=a: LinearPosterior(lik, a, b)))
        value, a = pairs[-1]
        return FitResult(LinearPosterior(lik, a, b), value, problem.kernel, len(pairs),
                         history=history)


class ScriptedBound(Scripted):
    objective_limit: ClassVar[float | None] = 0.0


class ScriptedSurrogate(Scripted):
    """A surrogate objective (vi-taylor's kind): it can rise while the model gets worse."""

    objective_kind = "surrogate"


#: labels are 1 where ``x_1 > CUT`` (about 80 % ones); slopes of ``LinearPosterior``:
CUT = -0.84
GOOD = 3.0  # predicts the labels well: beats the class frequencies
NOTHING = 0.0  # probability 1/2 everywhere: worse than the class frequencies
WRONG = -3.0  # confidently wrong


def _data(n=200, seed=0):
    """``X [n, 2]`` and labels ``x_1 > CUT``."""
    X = np.random.default_rng(seed).normal(size=(n, 2))
    return X, (X[:, 0] > CUT).astype(int)


def _fit(cls=Scripted, baseline_failure="raise", **options):
    X, y = _data()
    batch = options.pop("batch_size", None)
    clf = GPClassifier(method=cls, method_options=options, batch_size=batch,
                       baseline_failure=baseline_failure)
    return clf.fit(X, y)


def test_a_fit_that_ends_far_below_its_best_is_restored_with_a_warning():
    with pytest.warns(ConvergenceWarning, match="far below its best"):
        clf = _fit(objectives=(-30.0, -10.0, -5.0, -40.0, -60.0),
                   slopes=(NOTHING, 1.0, GOOD, WRONG, WRONG))
    assert RESTORED_BEST in clf.fit_warnings_
    assert clf.log_evidence_ == -5.0
    assert clf.fit_result_.diagnostics["restored_iteration"] == 3.0
    assert clf.predict_proba(np.array([[1.0, 0.0]]))[0, 1] > 0.99
    assert WORSE_THAN_BASELINE not in clf.fit_warnings_  # the restored posterior is sound


def test_a_small_fall_is_not_restored_and_a_sound_fit_has_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = _fit(objectives=(-30.0, -5.0, -5.5), slopes=(NOTHING, GOOD, GOOD))
    assert clf.fit_warnings_ == []
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] < 0.5 * d["baseline_nll"]


def test_minibatch_fits_compare_moving_averages():
    noisy = (-10.0, -14.0, -10.0, -14.0, -10.0, -14.0, -10.0, -14.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = _fit(objectives=noisy, slopes=(GOOD,) * 8, batch_size=50)
    assert RESTORED_BEST not in clf.fit_warnings_
    with pytest.warns(ConvergenceWarning, match="far below"):  # the same trace, batch: restored
        clf = _fit(objectives=noisy, slopes=(GOOD,) * 8)
    assert clf.fit_result_.diagnostics["restored_iteration"] == 1.0


def test_an_objective_past_its_limit_is_a_numerical_error():
    with pytest.raises(NumericalError, match="above 0.*broken down"):
        _fit(ScriptedBound, objectives=(-3.0, 2.0), slopes=(GOOD, GOOD))
    _fit(ScriptedBound, objectives=(-3.0, -1e-9), slopes=(GOOD, GOOD))  # round-off is allowed


@pytest.mark.parametrize("slope, flags", [(WRONG, []), (NOTHING, [CONSTANT_PREDICTIONS])])
def test_a_fit_no_better_than_the_class_frequencies_raises_with_its_trace(slope, flags):
    with pytest.raises(FitFailedError, match="no better than predicting the class freq") as info:
        _fit(objectives=(-9.0, -5.0, -5.5), slopes=(slope,) * 3)
    assert isinstance(info.value, NumericalError) and info.value.quantity == "training NLL"
    message = str(info.value)
    assert "3 iteration(s); objective -9 at iteration 1, best -5 at 2, last -5.5 at 3" in message
    assert "baseline_failure='warn'" in message  # the way to keep the model anyway
    assert info.value.result.warnings == [*flags, WORSE_THAN_BASELINE]
    d = info.value.result.diagnostics
    assert d["train_nll"] > d["baseline_nll"]


@pytest.mark.parametrize("slope, flags", [(WRONG, []), (NOTHING, [CONSTANT_PREDICTIONS])])
def test_baseline_failure_warn_keeps_the_model_with_a_warning(slope, flags):
    with pytest.warns(ConvergenceWarning, match="no better than predicting the class freq"):
        clf = _fit(objectives=(-5.0,), slopes=(slope,), baseline_failure="warn")
    assert clf.fit_warnings_ == [*flags, WORSE_THAN_BASELINE]
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] > d["baseline_nll"]
    assert clf.get_params()["baseline_failure"] == "warn"


def test_baseline_failure_is_checked_before_training():
    with pytest.raises(InputError, match="baseline_failure must be 'raise'.*or 'warn'"):
        _fit(objectives=(-1.0,), slopes=(GOOD,), baseline_failure="ignore")
    assert GPClassifier().get_params()["baseline_failure"] == "raise"
    assert GPRegressor().get_params()["baseline_failure"] == "raise"


def test_single_class_predictions_that_beat_the_baseline_are_flagged():
    """Every training point gets class 1 (labels 80 % ones), confidently where it is right."""
    with pytest.warns(ConvergenceWarning, match="predicts class index 1 at every training"):
        clf = _fit(objectives=(-5.0,), slopes=(0.5,), offset=1.5)
    assert clf.fit_warnings_ == [SINGLE_CLASS_PREDICTIONS]
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] < d["baseline_nll"]
    assert set(clf.predict(_data()[0])) == {1}


def test_a_surrogates_best_iterate_is_ranked_by_training_nll_not_by_the_surrogate():
    """Iteration 3's surrogate is the highest (unbounded, positive) and its model confidently
    wrong; the model of iteration 2 predicts well: that one is kept."""
    trace = {"objectives": (-30.0, -10.0, 50.0, -20.0, -25.0),
             "slopes": (NOTHING, GOOD, WRONG, WRONG, WRONG)}
    with pytest.warns(ConvergenceWarning, match="training NLL .* far above its best"):
        clf = _fit(ScriptedSurrogate, **trace)
    assert clf.fit_result_.diagnostics["restored_iteration"] == 2.0
    assert clf.log_evidence_ == -10.0
    assert RESTORED_BEST in clf.fit_warnings_ and WORSE_THAN_BASELINE not in clf.fit_warnings_
    d = clf.fit_result_.diagnostics
    assert d["best_rank_nll"] < d["final_rank_nll"] and d["train_nll"] < 0.5 * d["baseline_nll"]
    # the same trace ranked by its objective restores iteration 3, the broken model
    with (pytest.warns(ConvergenceWarning, match="iteration 3 was restored"),
          pytest.raises(FitFailedError, match="no better than")):
        _fit(Scripted, **trace)


def test_a_surrogate_that_improves_to_its_end_is_kept():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = _fit(ScriptedSurrogate, objectives=(-10.0, 40.0, -5.0),
                   slopes=(NOTHING, 1.0, GOOD))
    assert clf.fit_warnings_ == [] and clf.log_evidence_ == -5.0


def test_objective_kind_is_declared_from_a_closed_set():
    with pytest.raises(TypeError, match="objective_kind must be one of"):
        type("Odd", (Scripted,), {"objective_kind": "heuristic"})


def test_baseline_measure_is_declared_from_a_closed_set():
    with pytest.raises(TypeError, match=r"baseline_measure must be one of \['nll', 'error'\]"):
        type("Odd", (Scripted,), {"baseline_measure": "auc"})


def test_majority_error_and_classification_error_weigh_rows():
    from types import SimpleNamespace

    from gpinfer.fit_guard import classification_error, majority_error

    y = np.array([0, 0, 0, 1, 1])
    rows = np.arange(5)
    assert majority_error(y, 2, rows) == pytest.approx(0.4)
    # weight 4 on the last row: class 1 is the majority (5 of 8), class 0 rows are wrong
    w = np.array([1.0, 1.0, 1.0, 1.0, 4.0])
    assert majority_error(y, 2, rows, w) == pytest.approx(3.0 / 8.0)
    P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.6, 0.4]])
    post = SimpleNamespace(predict_proba=lambda X: P)  # wrong at rows 1 and 4
    assert classification_error(post, np.zeros((5, 1)), y, 2) == pytest.approx(0.4)
    assert classification_error(post, np.zeros((5, 1)), y, 2, w) == pytest.approx(5.0 / 8.0)


class NaNPosterior(LinearPosterior):
    def predict_f(self, X):
        f, v = super().predict_f(X)
        f[::7] = np.nan
        return f, v


class InternalNaN(Scripted):
    """``where="posterior"``: the fitted posterior predicts NaN at some inputs;
    ``"likelihood"``: the fit hands its likelihood a NaN mean."""

    default_options: ClassVar[dict[str, Any]] = {"where": "posterior"}

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        lik = problem.likelihood
        if self.options["where"] == "likelihood":
            lik.expected_log_prob(problem.y, np.full(problem.n, np.nan), np.ones(problem.n))
        return FitResult(NaNPosterior(lik, GOOD), -1.0, problem.kernel, 1)


def test_an_internal_nan_is_a_numerical_error_naming_the_quantity_never_an_input_error():
    with pytest.raises(NumericalError, match="predictive mean is not finite at 29 of 200") as e:
        _fit(InternalNaN)
    assert e.value.quantity == "latent predictive mean" and not isinstance(e.value, InputError)
    with pytest.raises(NumericalError, match="mean contains NaN .*computed during the fit") as e:
        _fit(InternalNaN, where="likelihood")
    assert e.value.quantity == "mean" and not isinstance(e.value, InputError)


def test_baselines_are_the_entropy_and_the_gaussian_nll():
    y = np.array([0, 0, 0, 1])
    rows = np.arange(4)
    entropy = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert classification_baseline_nll(y, 2, rows) == pytest.approx(entropy)
    t = np.array([1.0, 2.0, 3.0, 6.0])
    assert regression_baseline_nll(t, rows) == pytest.approx(0.5 * np.log(2 * np.pi * 3.5) + 0.5)


def test_weighted_baselines_equal_those_of_the_repeated_rows():
    """A row of integer weight k is judged as the row k times (sample_weight in the guard)."""
    rng = np.random.default_rng(0)
    y, t = rng.integers(0, 3, size=12), rng.normal(size=12)
    w = rng.integers(1, 4, size=12)
    rows, rep = np.arange(12), np.arange(int(w.sum()))
    assert classification_baseline_nll(y, 3, rows, w.astype(float)) == pytest.approx(
        classification_baseline_nll(y.repeat(w), 3, rep), rel=1e-12)
    assert regression_baseline_nll(t, rows, w.astype(float)) == pytest.approx(
        regression_baseline_nll(t.repeat(w), rep), rel=1e-12)


def test_tracker_passes_every_iteration_to_the_user_callback():
    seen = []
    tracker = BestIterate(seen.append, "m", None, 10)
    for it, v in enumerate((-3.0, -1.0, -2.0), start=1):
        tracker(IterationInfo(it, v, 0.0))
    assert [i.objective for i in seen] == [-3.0, -1.0, -2.0]
    assert tracker.best.iteration == 2 and not tracker.far_below_best()


def test_a_diverging_svi_fit_is_restored_to_its_best_iterate():
    """A real method forced to diverge: Adam with a step of 3 on breast_cancer."""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    opts = {"optimizer": "adam", "optimizer_options": {"learning_rate": 3.0},
            "lengthscale_init": "kernel"}  # length-scale 1: it learns, then diverges
    # standardize=False: X is standardised above, and the default standardize="auto" would also
    # start the named kernel at standardised_lengthscale(X) = sqrt(30/2) (the new default, not
    # the unit length-scale this scenario is built on); from there the first Adam step of 3
    # already lands on constant predictions, so there is no good iterate to restore.
    with pytest.warns(ConvergenceWarning, match="far below its best"):
        clf = GPClassifier(method="svi", M=20, max_iter=40, random_state=0,
                           method_options=opts, standardize=False).fit(X, y)
    best = max(h["objective"] for h in clf.history_)
    assert clf.history_[-1]["objective"] < best - 1000.0
    assert clf.log_evidence_ == best
    assert RESTORED_BEST in clf.fit_warnings_
    assert clf.score(X, y) > 0.8  # the restored posterior, not the diverged one


def test_regression_fits_are_checked_against_a_constant_gaussian():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=60)
    reg = GPRegressor(method="fitc", M=10, max_iter=30).fit(X, y)
    d = reg.fit_result_.diagnostics
    assert d["train_nll"] < d["baseline_nll"] and reg.fit_warnings_ == []


def test_a_model_that_learned_nothing_ties_on_balanced_classes_and_fails():
    X = np.random.default_rng(1).normal(size=(100, 2))
    y = np.arange(100) % 2  # balanced: the prior's 1/2 is exactly the class frequency
    clf = GPClassifier(method=Scripted, method_options={"slopes": (NOTHING,)})
    with pytest.raises(FitFailedError, match="no better than.*the same at every training"):
        clf.fit(X, y)
    with pytest.warns(ConvergenceWarning, match="no better than"):
        clf.set_params(baseline_failure="warn").fit(X, y)
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] == pytest.approx(np.log(2.0)) and d["baseline_nll"] == pytest.approx(np.log(2.0))
    assert clf.fit_warnings_ == [CONSTANT_PREDICTIONS, WORSE_THAN_BASELINE]


def _methods_with_a_limit() -> list[str]:
    from gpinfer import registry

    return [e.name for e in registry.entries(registry.METHODS)
            if e.dist in registry.OWN_DISTRIBUTIONS
            and registry.load_method(e.name).objective_limit is not None]


def _pushed_past_its_limit(cls: type[Method], at: int, seen: list[int]) -> type[Method]:
    """``cls`` whose reported objective is 1000 nats above its limit from iteration ``at`` on
    (the method runs unchanged; what it reports to the guard is shifted)."""
    limit = float(cls.objective_limit or 0.0)

    class Pushed(cls):  # type: ignore[valid-type, misc]
        def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
            assert callback is not None  # the estimator's guard

            def shifted(info: IterationInfo) -> bool | None:
                seen.append(info.iteration)
                if info.iteration >= at:
                    info = dataclasses.replace(info, objective=limit + 1000.0)
                return callback(info)

            return super().fit(problem, shifted)

    return Pushed


@pytest.mark.parametrize("name", _methods_with_a_limit())
def test_every_methods_objective_past_its_limit_raises_at_that_iteration(name):
    """Real fits on 40 points: kl, vb and vi-jj-full report from inside L-BFGS-B's callback,
    whose trial-point back-off once swallowed the error and ran on to the final check."""
    from gpinfer import registry
    from gpinfer.testing.method_suite import make_suite_data

    assert {"laplace", "kl", "vb", "svi", "vi-jj", "vi-jj-full"} <= set(_methods_with_a_limit())
    X, y = make_suite_data(2, n=40, seed=1)
    seen: list[int] = []
    method = _pushed_past_its_limit(registry.load_method(name), 2, seen)
    with pytest.raises(NumericalError, match=f"{name}: objective 1000 is above 0") as info:
        GPClassifier(method=method, max_iter=20, random_state=0).fit(X, y)
    assert info.value.iteration == 2 and info.value.quantity == "objective"
    assert seen == [1, 2]  # nothing ran after the offending iteration



def test_vi_taylors_surrogate_is_ranked_by_training_nll_in_a_real_fit():
    """vi-taylor declares a surrogate: its tracker builds each iterate's posterior and ranks it
    by training NLL; the bounds (vi-jj) are ranked by their objective."""
    from gpinfer import registry
    from gpinfer.fit_guard import tracker_for
    from gpinfer.testing.method_suite import make_suite_data

    X, y = make_suite_data(2, n=40, seed=1)
    rng = np.random.default_rng(0)
    taylor, jj = registry.load_method("vi-taylor"), registry.load_method("vi-jj")
    assert (taylor.objective_kind, taylor.objective_limit) == ("surrogate", None)
    assert jj.objective_kind == "bound"
    assert tracker_for(taylor, None, "vi-taylor", X, y, rng, minibatch=False).nll is not None
    assert tracker_for(taylor, None, "vi-taylor", X, y, rng, minibatch=False,
                       ranks_iterates=False).nll is None  # a validation monitor ranks them
    assert tracker_for(jj, None, "vi-jj", X, y, rng, minibatch=False).nll is None
    levels = []
    clf = GPClassifier(method="vi-taylor", max_iter=5, random_state=0)
    clf.fit(X, y, callback=lambda info: levels.append(info.posterior is not None) and None)
    assert all(levels) and clf.score(X, y) > 0.85
