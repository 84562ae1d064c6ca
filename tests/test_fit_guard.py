"""The fit guard (gpinfer.fit_guard) around every estimator fit: objective limit, best-iterate
restore, training NLL against the class-frequency baseline; with scripted and real methods."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler

from gpinfer import GPClassifier, GPRegressor
from gpinfer.errors import NumericalError
from gpinfer.fit_guard import (
    RESTORED_BEST,
    WORSE_THAN_BASELINE,
    BestIterate,
    classification_baseline_nll,
    regression_baseline_nll,
)
from gpinfer.interfaces import FitCallback, FitResult, IterationInfo, Method, Problem
from gpinfer.posterior import Posterior


class LinearPosterior(Posterior):
    """The latent ``f(x) = slope * (x_1 - CUT)`` (a binary posterior with tiny variance)."""

    def __init__(self, likelihood, slope: float):
        super().__init__(likelihood)
        self.slope = slope

    def predict_f(self, X):
        f = self.slope * (np.asarray(X)[:, :1] - CUT)
        return f, np.full_like(f, 1e-6)


class Scripted(Method):
    """Reports ``objectives`` with the posteriors of ``slopes``, ends at the last one."""

    name: ClassVar[str] = "scripted"
    likelihoods: ClassVar[tuple[str, ...]] = ("logit",)
    supports_minibatch: ClassVar[bool] = True
    default_options: ClassVar[dict[str, Any]] = {"objectives": (-1.0,), "slopes": (0.0,)}

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        lik = problem.likelihood
        pairs = list(zip(self.options["objectives"], self.options["slopes"]))
        for it, (value, a) in enumerate(pairs, start=1):
            if callback is not None:
                callback(IterationInfo(it, value, 0.0, lambda a=a: LinearPosterior(lik, a)))
        value, a = pairs[-1]
        return FitResult(LinearPosterior(lik, a), value, problem.kernel, len(pairs))


class ScriptedBound(Scripted):
    objective_limit: ClassVar[float | None] = 0.0


#: labels are 1 where ``x_1 > CUT`` (about 80 % ones); slopes of ``LinearPosterior``:
CUT = -0.84
GOOD = 3.0  # predicts the labels well: beats the class frequencies
NOTHING = 0.0  # probability 1/2 everywhere: worse than the class frequencies
WRONG = -3.0  # confidently wrong


def _data(n=200, seed=0):
    """``X [n, 2]`` and labels ``x_1 > CUT``."""
    X = np.random.default_rng(seed).normal(size=(n, 2))
    return X, (X[:, 0] > CUT).astype(int)


def _fit(cls=Scripted, **options):
    X, y = _data()
    batch = options.pop("batch_size", None)
    clf = GPClassifier(method=cls, method_options=options, batch_size=batch)
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


@pytest.mark.parametrize("slope", [WRONG, NOTHING])
def test_a_fit_no_better_than_the_class_frequencies_warns_and_is_flagged(slope):
    with pytest.warns(ConvergenceWarning, match="no better than predicting the class freq"):
        clf = _fit(objectives=(-5.0,), slopes=(slope,))
    assert clf.fit_warnings_ == [WORSE_THAN_BASELINE]
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] > d["baseline_nll"]


def test_baselines_are_the_entropy_and_the_gaussian_nll():
    y = np.array([0, 0, 0, 1])
    rows = np.arange(4)
    entropy = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert classification_baseline_nll(y, 2, rows) == pytest.approx(entropy)
    t = np.array([1.0, 2.0, 3.0, 6.0])
    assert regression_baseline_nll(t, rows) == pytest.approx(0.5 * np.log(2 * np.pi * 3.5) + 0.5)


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
    with pytest.warns(ConvergenceWarning, match="far below its best"):
        clf = GPClassifier(method="svi", M=20, max_iter=40, random_state=0,
                           method_options=opts).fit(X, y)
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


def test_a_model_that_learned_nothing_ties_on_balanced_classes_and_is_flagged():
    X = np.random.default_rng(1).normal(size=(100, 2))
    y = np.arange(100) % 2  # balanced: the prior's 1/2 is exactly the class frequency
    with pytest.warns(ConvergenceWarning, match="no better than"):
        clf = GPClassifier(method=Scripted, method_options={"slopes": (NOTHING,)}).fit(X, y)
    d = clf.fit_result_.diagnostics
    assert d["train_nll"] == pytest.approx(np.log(2.0)) and d["baseline_nll"] == pytest.approx(np.log(2.0))
    assert clf.fit_warnings_ == [WORSE_THAN_BASELINE]
