"""Early stopping (gpinfer.training.early_stopping): the split, the monitor, the estimators."""

from __future__ import annotations

import numpy as np
import pytest

import gpinfer
from gpinfer.errors import InputError
from gpinfer.interfaces import FitResult, IterationInfo
from gpinfer.testing.datasets import ring_classes
from gpinfer.training.early_stopping import (
    EarlyStopping,
    RefitStop,
    ValidationChoice,
    ValidationMonitor,
    choose_check,
    level_target,
    split_validation,
    stop_at,
    validation_splits,
)


def _three_classes(n: int = 90, seed: int = 0):
    return ring_classes(n, seed)


def test_stratified_split_keeps_every_class_on_both_sides():
    y = np.array([0] * 10 + [1] * 30 + [2] * 5)
    train, val = split_validation(y, 0.2, np.random.default_rng(0), 3)
    assert np.intersect1d(train, val).size == 0 and train.size + val.size == y.size
    np.testing.assert_array_equal(np.bincount(y[val], minlength=3), [2, 6, 1])
    assert set(y[train]) == {0, 1, 2}


@pytest.mark.parametrize("bad", [0.0, -0.1, 0.51, 1.0, "0.1", True, float("nan")])
def test_fraction_outside_the_range_is_an_input_error(bad):
    with pytest.raises(InputError, match="validation_fraction"):
        EarlyStopping.from_settings(bad, 1, 10)


@pytest.mark.parametrize("name,value", [("validation_interval", 0), ("n_iter_no_change", -1),
                                        ("validation_interval", 1.5)])
def test_bad_interval_or_patience_is_an_input_error(name, value):
    kwargs = {"validation_interval": 1, "n_iter_no_change": 10, name: value}
    with pytest.raises(InputError, match=name):
        EarlyStopping.from_settings(0.2, kwargs["validation_interval"],
                                    kwargs["n_iter_no_change"])


def test_a_class_left_without_points_is_an_input_error_before_training():
    X, y = _three_classes(30)
    y[:2] = 3  # a class of two points: 0.5 of it leaves one on each side, but 1 point cannot
    y[2] = 4
    calls = []
    with pytest.raises(InputError, match="class 4"):
        gpinfer.GPClassifier(method="sep", M=5, validation_fraction=0.5).fit(
            X, y, callback=calls.append)
    assert calls == []


def _info(it: int, posterior) -> IterationInfo:
    return IterationInfo(it, -float(it), 0.0, lambda: posterior, {})


def test_monitor_checks_every_k_stops_after_patience_and_restores_the_best():
    nll = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 2.5, "e": 2.6, "f": 0.5}
    seen = []
    monitor = ValidationMonitor(lambda post: nll[post], EarlyStopping(0.2, 2, 2), seen.append)
    stops = [monitor(_info(it, post)) for it, post in enumerate("abcdef", start=1)]
    # checks at iterations 2 (b: 1.0 best), 4 (d: worse), 6 (f: better)
    assert stops == [False] * 6
    assert [i.extra.get("val_nll") for i in seen] == [None, 1.0, None, 2.5, None, 0.5]
    monitor = ValidationMonitor(lambda post: nll[post], EarlyStopping(0.2, 1, 2))
    stops = [monitor(_info(it, post)) for it, post in enumerate("abcde", start=1)]
    assert stops == [False, False, False, True, True]  # c and d are no better than b
    result = FitResult(posterior="e", log_evidence=0.0, kernel=None, n_iter=5)
    result = monitor.restore(result)
    assert result.posterior == "b"
    assert result.diagnostics["best_val_iteration"] == 2.0
    assert result.diagnostics["stopped_early"] == 1.0


def test_the_monitor_writes_val_nll_into_the_checked_history_entries():
    nll = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.5}
    monitor = ValidationMonitor(lambda post: nll[post], EarlyStopping(0.2, 2, 5))
    for it, post in enumerate("abcd", start=1):
        monitor(_info(it, post))
    history = [{"iteration": float(it), "objective": -float(it)} for it in range(1, 5)]
    result = monitor.restore(FitResult(posterior="d", log_evidence=0.0, kernel=None, n_iter=4,
                                       history=history))
    assert [h.get("val_nll") for h in result.history] == [None, 1.0, None, 0.5]
    # a method whose entries carry no iteration number: one entry per iteration, from 1
    bare = monitor.restore(FitResult(posterior="d", log_evidence=0.0, kernel=None, n_iter=4,
                                     history=[{"objective": 0.0} for _ in range(4)]))
    assert [h.get("val_nll") for h in bare.history] == [None, 1.0, None, 0.5]


def test_a_stop_request_of_the_wrapped_callback_passes_through():
    monitor = ValidationMonitor(lambda post: 1.0, EarlyStopping(0.2), lambda info: True)
    assert monitor(_info(1, "a")) is True


@pytest.mark.parametrize("method,extra", [
    ("sep", {"M": 10}),
    ("sep", {"M": 10, "batch_size": 20}),
    ("svi", {"M": 10, "batch_size": 20, "method_options": {"optimizer": "adam"}}),
    ("laplace", {}),
])
def test_fits_stop_early_and_keep_the_best_validation_iterate(method, extra):
    """``refit=False`` (one hold-out): the fitted model is the best validation iterate."""
    X, y = _three_classes()
    if method == "laplace":
        y = (y == 0).astype(int)
    reports = []
    est = gpinfer.GPClassifier(method=method, max_iter=400, random_state=0,
                               validation_fraction=0.25, n_iter_no_change=3, refit=False,
                               **extra)
    est.fit(X, y, callback=reports.append)
    diag = est.fit_result_.diagnostics
    checked = [r for r in reports if "val_nll" in r.extra]
    assert checked, "the validation NLL was never computed"
    best = min(r.extra["val_nll"] for r in checked)
    assert diag["best_val_nll"] == pytest.approx(best)
    if diag["stopped_early"]:
        # training ended within patience checks of the request
        assert len(reports) <= int(diag["best_val_iteration"]) + 3 + 1
        assert len(reports) < 400
    # the fitted model is the best validation iterate: its NLL on the held-out part is ``best``
    _, val = split_validation(y, 0.25, np.random.default_rng(0), len(np.unique(y)))
    Xs = est.scaler_.transform(X)  # the posterior lives in the standardised inputs (default)
    held_out_nll = -np.mean(est.posterior_.log_predictive(Xs[val], y[val]))
    assert held_out_nll == pytest.approx(best, rel=1e-9)
    assert getattr(est, "_validation", None) is None  # not pickled with the fitted model


def test_without_a_validation_fraction_nothing_is_held_out():
    X, y = _three_classes(60)
    est = gpinfer.GPClassifier(method="sep", M=8, max_iter=3, random_state=0).fit(X, y)
    assert "best_val_nll" not in est.fit_result_.diagnostics
    assert all("val_nll" not in h for h in est.history_)


# -- the refit on all the data, K folds ---------------------------------------------------------


def test_refit_is_the_plain_fit_on_all_the_data_for_the_chosen_iterations():
    """``refit_rule="iterations"``: the hold-out chooses the number of iterations, the model is
    trained on all the data for that many, exactly as ``max_iter=k`` without early stopping
    would train it."""
    X, y = _three_classes()
    reports = []
    est = gpinfer.GPClassifier(method="sep", M=10, max_iter=400, random_state=0,
                               validation_fraction=0.25, refit=True, n_iter_no_change=3,
                               validation_folds=1, refit_rule="iterations").fit(
        X, y, callback=reports.append)
    diag, state = est.fit_result_.diagnostics, est.fit_result_.state
    k = int(diag["best_iteration"])
    assert diag["refit"] == 1.0 and diag["validation_folds"] == 1.0 and 1 <= k < 400
    assert diag["best_val_iteration"] == k and est.n_iter_ == k
    assert state["val_nll"].shape == state["val_iteration"].shape == (diag["validation_checks"],)
    assert diag["best_val_nll"] == pytest.approx(state["val_nll"].min())
    assert state["val_iteration"][np.argmin(state["val_nll"])] == k
    plain = gpinfer.GPClassifier(method="sep", M=10, max_iter=k, random_state=0).fit(X, y)
    np.testing.assert_allclose(est.predict_proba(X), plain.predict_proba(X), rtol=0, atol=1e-12)
    # one increasing count of iterations for the callback; the refit's own count in extra
    its = [r.iteration for r in reports]
    assert its == list(range(1, len(its) + 1))
    assert [r.extra["refit_iteration"] for r in reports[-k:]] == list(range(1, k + 1))
    assert "refit_iteration" not in reports[-k - 1].extra


def test_small_data_choose_the_iterations_by_k_folds():
    """A hold-out under ``MIN_HOLDOUT`` points: K = round(1 / fraction) stratified folds, the
    curve their mean, the best iteration its minimum; then the refit."""
    X, y = _three_classes()
    reports = []
    est = gpinfer.GPClassifier(method="sep", M=8, max_iter=60, random_state=0,
                               validation_fraction=0.25, refit=True, n_iter_no_change=3).fit(
        X, y, callback=reports.append)
    diag = est.fit_result_.diagnostics
    assert diag["validation_folds"] == 4.0 and diag["refit"] == 1.0
    assert est.n_iter_ == int(diag["best_iteration"])
    folds = [r.extra["fold_iteration"] for r in reports if "fold_iteration" in r.extra]
    assert folds.count(1) == 4  # four monitored fits, then the refit
    assert [r.iteration for r in reports] == list(range(1, len(reports) + 1))


def test_the_estimator_chooses_by_its_choice_rule_on_the_folds_curves():
    X, y = _three_classes(60)
    flip = np.random.default_rng(0).choice(60, 12, replace=False)
    y[flip] = (y[flip] + 1) % 3  # label noise: the folds' curves disagree on the best stage
    est = gpinfer.GPClassifier(method="sep", M=5, max_iter=30, random_state=0,
                               validation_fraction=0.25, refit=True, n_iter_no_change=3,
                               choice_rule="median").fit(X, y)
    state, diag = est.fit_result_.state, est.fit_result_.diagnostics
    k = choose_check(state["val_nll_folds"], "median")
    assert k is not None and diag["best_iteration"] == state["val_iteration"][k]
    assert est.n_iter_ == int(diag["best_iteration"])
    # the default rule would have chosen another count on these curves
    assert choose_check(state["val_nll_folds"], "one_se") != k


def test_k_folds_hold_out_every_row_once_stratified():
    y = np.array([0] * 10 + [1] * 30 + [2] * 5)
    splits = validation_splits(y, EarlyStopping(0.2, folds=5), np.random.default_rng(0), 3)
    assert len(splits) == 5
    held = np.concatenate([val for _, val in splits])
    np.testing.assert_array_equal(np.sort(held), np.arange(y.size))
    for train, val in splits:
        assert np.intersect1d(train, val).size == 0 and set(y[train]) == {0, 1, 2}
        assert abs(val.size - y.size / 5) <= 1
        np.testing.assert_array_equal(np.bincount(y[val], minlength=3), [2, 6, 1])
    # MIN_HOLDOUT decides with folds=None: 0.2 of 2000 points is a hold-out of 400
    assert EarlyStopping(0.2).n_folds(2000) == 1 and EarlyStopping(0.2).n_folds(500) == 5
    assert EarlyStopping(0.2, refit=False).n_folds(500) == 1
    assert len(validation_splits(y, EarlyStopping(0.2, folds=1), np.random.default_rng(0),
                                 3)) == 1
    with pytest.raises(InputError, match="class 2 has 1 point"):
        validation_splits(np.array([0, 0, 1, 1, 2, 0]), EarlyStopping(0.5, folds=2),
                          np.random.default_rng(0), 3)


def _monitors(*curves: list[float]) -> list[ValidationMonitor]:
    monitors = []
    for curve in curves:
        m = ValidationMonitor(lambda post: 0.0, EarlyStopping(0.2))
        m.checks = list(enumerate(curve, start=1))
        monitors.append(m)
    return monitors


def test_the_choice_averages_the_folds_and_carries_a_stopped_fold_on():
    # the second fold stopped after 3 checks; the folds agree at the minimum (no spread)
    choice = ValidationChoice(_monitors([3.0, 2.0, 1.5, 2.0], [3.0, 1.0, 1.5]))
    np.testing.assert_allclose(choice.curve, [3.0, 1.5, 1.5, 1.75])
    assert choice.best_iteration == 2 and choice.best_nll == 1.5  # the first minimum


def test_k_folds_judge_the_excess_over_the_minimum_by_the_folds_paired_differences():
    # the folds differ in level (0.4 apart) but agree on the shape: every fold says iterations
    # 2 and 3 are 0.15 and 0.05 worse than 4, so the paired standard error is 0 and the
    # minimum is chosen (the folds' spread at the minimum, 0.2, would have taken iteration 2)
    choice = ValidationChoice(_monitors([3.0, 1.4, 1.3, 1.25], [3.4, 1.8, 1.7, 1.65]))
    assert choice.min_iteration == 4 and choice.min_nll == pytest.approx(1.45)
    assert choice.best_iteration == 4
    np.testing.assert_allclose(choice.excess_se(3), [0.0] * 4, atol=1e-12)
    # one monitor (a hold-out): the minimum
    single = ValidationChoice(_monitors([3.0, 1.4, 1.3, 1.25]))
    assert single.best_iteration == single.min_iteration == 4


def test_k_folds_take_the_earliest_iteration_within_one_paired_standard_error():
    # excess of iteration 2 over the minimum (3): the folds say +0.30 and -0.10, mean 0.10,
    # standard error 0.2 (within: chosen); iteration 1: +2.0 and +1.9 (se 0.05: not)
    choice = ValidationChoice(_monitors([3.0, 1.3, 1.0], [3.0, 1.0, 1.1]))
    assert choice.min_iteration == 3 and choice.min_nll == pytest.approx(1.05)
    np.testing.assert_allclose(choice.excess_se(2), [0.05, 0.2, 0.0], atol=1e-12)
    assert choice.best_iteration == 2 and choice.best_nll == pytest.approx(1.15)


def test_an_iteration_a_fold_never_checked_is_never_chosen():
    # the second fold's first check is at iteration 2: iteration 1 has no fold-averaged value
    # and no paired difference (infinite standard error), so it is not chosen although the
    # first fold's value there is the lowest of all
    first = ValidationMonitor(lambda post: 0.0, EarlyStopping(0.2))
    first.checks = [(1, 0.5), (2, 1.0), (3, 0.9)]
    second = ValidationMonitor(lambda post: 0.0, EarlyStopping(0.2))
    second.checks = [(2, 1.2), (3, 1.0)]
    choice = ValidationChoice([first, second])
    assert not np.isfinite(choice.curve[0]) and np.isinf(choice.excess_se(2)[0])
    # iteration 2: excess +0.1 and +0.2, mean 0.15 > its standard error 0.05
    assert choice.min_iteration == choice.best_iteration == 3


def test_each_choice_rule_on_fold_curves_with_a_known_answer():
    # two folds at very different levels: A = [0.04, 0.01, 0.011], B = [1.0, 1.02, 0.98]
    curves = np.array([[0.04, 0.01, 0.011], [1.0, 1.02, 0.98]])
    # min: the mean curve [0.52, 0.515, 0.4955] is lowest at check 2
    assert choose_check(curves, "min") == 2
    # one_se: check 1's paired excess over check 2 is (-0.001, +0.04): mean 0.0195, standard
    # error 0.0205 (within); check 0's is (+0.029, +0.02): mean 0.0245, se 0.0045 (not)
    assert choose_check(curves, "one_se") == 1
    # log_one_se: the mean log curve [-1.609, -2.293, -2.265] is lowest at check 1; check 0's
    # paired log excess (+1.386, -0.020): mean 0.683 within its standard error 0.703
    assert choose_check(curves, "log_one_se") == 0
    np.testing.assert_allclose(np.log(curves).mean(axis=0), [-1.6094, -2.2927, -2.2651],
                               atol=1e-4)
    # median: each fold's own first minimum (1 and 2), the lower median of an even count
    assert choose_check(curves, "median") == 1
    # three folds whose own minima are at checks 3, 3, 1 (median 3) while the mean curve
    # [3, 1.667, 1.7, 1.8, 2.333] is lowest at check 1
    curves = np.array([[3, 2, 1.5, 1.4, 2], [3, 2, 1.6, 1.5, 2], [3, 1.0, 2.0, 2.5, 3]])
    assert choose_check(curves, "median") == 3 and choose_check(curves, "min") == 1
    # one curve (a hold-out): its first minimum, whatever the rule
    for rule in ("one_se", "log_one_se", "min", "median"):
        assert choose_check(np.array([[3.0, 1.0, 2.0, 1.0]]), rule) == 1


def test_the_choice_rules_skip_a_check_some_fold_lacks_and_none_is_chosen_without_values():
    curves = np.array([[0.5, 1.0, 0.9], [np.nan, 1.2, 1.0]])
    for rule in ("one_se", "log_one_se", "min", "median"):
        assert choose_check(curves, rule) == 2
    assert choose_check(np.full((2, 3), np.nan), "median") is None
    with pytest.raises(InputError, match="positive validation NLL"):
        choose_check(np.array([[0.5, -0.1], [0.4, 0.3]]), "log_one_se")


def test_the_validation_choice_applies_its_rule():
    monitors = _monitors([3, 2, 1.5, 1.4, 2], [3, 2, 1.6, 1.5, 2], [3, 1.0, 2.0, 2.5, 3])
    assert ValidationChoice(monitors, "median").best_iteration == 4  # checks are 1-based
    assert ValidationChoice(monitors, "min").best_iteration == 2
    choice = ValidationChoice(monitors)  # one_se, the default
    assert choice.best_iteration == choose_check(choice.fold_curves, "one_se") + 1


# -- the refit's stop: the folds' objective level, not their iteration count ---------------------


def test_the_level_target_is_the_folds_mean_objective_per_point_at_the_chosen_iteration():
    # two folds of 40 and 50 rows; at iteration 2: -20 / 40 = -0.5 and -30 / 50 = -0.6
    curves = np.array([[-40.0, -20.0, -10.0], [-60.0, -30.0, np.nan]])
    points = np.array([40.0, 50.0])
    assert level_target(curves, points, 2, "objective") == pytest.approx(-0.55)
    # the gain from iteration 1: +20 / 40 = 0.5 and +30 / 50 = 0.6
    assert level_target(curves, points, 2, "gain") == pytest.approx(0.55)
    # a fold that stopped before k (the second, after 2) counts with its last value
    assert level_target(curves, points, 3, "objective") == pytest.approx((-0.25 - 0.6) / 2)
    assert level_target(curves, points, 4, "objective") == pytest.approx((-0.25 - 0.6) / 2)
    # the count rule has no level; a fold without any value up to k: the count
    assert level_target(curves, points, 2, "iterations") is None
    assert level_target(np.array([[np.nan, -1.0], [-2.0, -1.0]]), points, 1, "objective") is None


def test_the_refit_stops_where_its_level_reaches_the_target_not_after_the_same_count():
    # the folds chose iteration 3 at -0.5 per point; the refit on 100 rows climbs faster and
    # is there at iteration 2 (a slower one at 5): the same level, not the same count
    fast = [-90.0, -50.0, -40.0, -30.0, -20.0, -10.0]
    slow = [-90.0, -80.0, -70.0, -60.0, -49.0, -40.0]
    assert stop_at(np.array(fast), "objective", -0.5, 100) == 2
    assert stop_at(np.array(slow), "objective", -0.5, 100) == 5
    # never reached: None (the refit then trains for max_iter)
    assert stop_at(np.array(slow), "objective", -0.3, 100) is None
    # the gain rule measures from the first report: a constant offset changes nothing
    assert stop_at(np.array(fast), "gain", 0.4, 100) == 2
    assert stop_at(np.array(fast) - 1e3, "gain", 0.4, 100) == 2
    assert stop_at(np.array(fast) - 1e3, "objective", -0.5, 100) is None
    # a level is met once: a later dip does not undo the stop request
    assert stop_at(np.array([-90.0, -40.0, -95.0]), "objective", -0.5, 100) == 2


def test_the_refit_stop_wraps_the_callback_and_passes_its_stop_request_through():
    seen = []
    stop = RefitStop("objective", -0.5, 10, lambda info: seen.append(info.iteration) or
                     info.iteration == 2)
    assert stop(IterationInfo(1, -9.0, 0.0)) is False
    assert stop(IterationInfo(2, -9.0, 0.0)) is True and stop.reached is None  # the callback's
    assert stop(IterationInfo(3, -4.0, 0.0)) is True and stop.reached == 3
    assert seen == [1, 2, 3]
    with pytest.raises(ValueError, match="objective' or 'gain"):
        RefitStop("iterations", 0.0, 10)


def test_the_choice_takes_the_target_from_its_monitors_objectives():
    monitors = _monitors([3.0, 1.0, 2.0], [3.0, 1.2, 1.5])  # minimum at iteration 2
    for m, points, objectives in zip(monitors, (20, 30), ([-30.0, -10.0, -5.0],
                                                           [-45.0, -15.0, -9.0]), strict=True):
        m.n_points = points
        m.objectives = dict(enumerate(objectives, start=1))
    choice = ValidationChoice(monitors)
    assert choice.best_iteration == 2
    assert choice.refit_target("objective") == pytest.approx(-0.5)
    assert choice.refit_target("gain") == pytest.approx(1.0)
    assert choice.refit_target("iterations") is None
    np.testing.assert_array_equal(choice.objective_curves(),
                                  [[-30.0, -10.0, -5.0], [-45.0, -15.0, -9.0]])
    monitors[1].n_points = None  # a fit without its size: the count
    assert ValidationChoice(monitors).refit_target("objective") is None


def test_the_objective_rule_stops_the_refit_at_the_folds_level_and_is_the_plain_fit_there():
    """``refit_rule="objective"``: the refit on all the data stops at the first iteration whose
    objective per point reaches the folds' level at their chosen iteration; the model is the
    plain fit for that many iterations."""
    X, y = _three_classes()
    kw = dict(method="sep", M=10, random_state=0)
    est = gpinfer.GPClassifier(**kw, max_iter=300, validation_fraction=0.25, refit=True,
                               n_iter_no_change=3, refit_rule="objective").fit(X, y)
    diag, state = est.fit_result_.diagnostics, est.fit_result_.state
    k, reached = int(diag["best_iteration"]), int(diag["refit_reached"])
    assert diag["validation_folds"] == 4.0 and 1 <= reached == est.n_iter_ < 300
    # each fold's objective at k, or at its last iteration where it stopped before k
    upto = state["objective_folds"][:, :k]
    last = [row[np.isfinite(row)][-1] for row in upto]
    assert diag["refit_target"] == pytest.approx(np.mean(last / state["fold_points"]))
    history = [h["objective"] / 90 for h in est.history_]
    assert history[-1] >= diag["refit_target"] > max(history[:-1])
    plain = gpinfer.GPClassifier(**kw, max_iter=reached).fit(X, y)
    np.testing.assert_allclose(est.predict_proba(X), plain.predict_proba(X), rtol=0, atol=1e-12)
    # the count rule, the default
    count = gpinfer.GPClassifier(**kw, max_iter=300, validation_fraction=0.25, refit=True,
                                 n_iter_no_change=3).fit(X, y)
    assert count.n_iter_ == count.best_iteration_ == k
    assert "refit_target" not in count.fit_result_.diagnostics


def test_a_mini_batch_refit_takes_the_count_whatever_the_rule():
    """A mini-batch objective is noisy from one iteration to the next: the count, not a level."""
    X, y = _three_classes()
    est = gpinfer.GPClassifier(method="sep", M=8, max_iter=60, batch_size=30, random_state=0,
                               validation_fraction=0.25, refit=True, n_iter_no_change=3,
                               refit_rule="objective").fit(X, y)
    diag = est.fit_result_.diagnostics
    assert "refit_target" not in diag and est.n_iter_ == int(diag["best_iteration"])


@pytest.mark.parametrize("kwargs,pattern", [
    ({"refit_rule": "level"}, "refit_rule must be one of"),
    ({"choice_rule": "best"}, "choice_rule must be one of"),
    ({"choice_rule": None}, "choice_rule must be one of"),
    ({"refit": "yes"}, "refit must be .auto."),
    ({"validation_folds": 0}, "validation_folds must be"),
    ({"validation_folds": 1.5}, "validation_folds must be"),
    ({"validation_folds": 3, "refit": False}, "needs refit=True"),
    ({"refine_iter": -1}, "refine_iter must be a non-negative integer"),
    ({"refine_iter": 2.5}, "refine_iter must be a non-negative integer"),
    ({"refine_iter": True}, "refine_iter must be a non-negative integer"),
    ({"refine_iter": 5, "refit": False}, "refine_iter=5 needs refit=True"),
    ({"refine_iter": 5, "method": "ep"}, "'ep' cannot refine"),
    ({"refit": "Auto"}, "refit must be 'auto'"),
    ({"refit": None}, "refit must be 'auto'"),
    ({"refine_iter": "250"}, r"refine_iter must be a non-negative integer .* or None"),
    ({"choice_refine_iter": -1}, "choice_refine_iter must be a non-negative integer"),
    ({"choice_refine_iter": 1.5}, "choice_refine_iter must be a non-negative integer"),
    ({"choice_refine_iter": 3, "method": "ep"}, "'ep' cannot refine"),
    ({"refit": "mean"}, "refit must be"),
    ({"refit": "Average"}, "refit must be"),
    ({"refit": 1}, "refit must be"),
])
def test_bad_refit_or_folds_is_an_input_error_before_training(kwargs, pattern):
    X, y = _three_classes(30)
    calls = []
    with pytest.raises(InputError, match=pattern):
        gpinfer.GPClassifier(**{"method": "sep", "M": 5, "validation_fraction": 0.2,
                                **kwargs}).fit(X, y, callback=calls.append)
    assert calls == []


@pytest.mark.parametrize("kwargs,pattern", [
    ({"choice_rule": "log_one_se"}, "log_one_se"),
    ({"refine_iter": 3}, "'fitc' cannot refine"),
])
def test_the_regressor_refuses_before_training(kwargs, pattern):
    X = np.linspace(-1, 1, 40)[:, None]
    calls = []
    with pytest.raises(InputError, match=pattern):
        gpinfer.GPRegressor(method="fitc", M=4, validation_fraction=0.2,
                            **kwargs).fit(X, X[:, 0], callback=calls.append)
    assert calls == []


def test_the_regressor_refits_on_all_the_data_too():
    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, size=(80, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=80)
    kw = {"method": "fitc", "M": 8, "random_state": 0}
    est = gpinfer.GPRegressor(max_iter=40, validation_fraction=0.25, validation_folds=1,
                              n_iter_no_change=3, refit_rule="iterations", **kw).fit(X, y)
    k = int(est.fit_result_.diagnostics["best_iteration"])
    assert est.fit_result_.diagnostics["refit"] == 1.0 and est.n_iter_ <= k
    plain = gpinfer.GPRegressor(max_iter=k, **kw).fit(X, y)
    np.testing.assert_allclose(est.predict(X), plain.predict(X), rtol=0, atol=1e-10)


# -- refine_iter: the posterior at the refit's hyper-parameters --------------------------------


@pytest.mark.parametrize("method,extra", [
    ("vi-robustmax", {}),
    ("sep", {"max_iter": 60}),
])
def test_refine_continues_the_refit_with_its_hyper_parameters_held(method, extra):
    """``refine_iter``: the refit (the same as with ``refine_iter=0``: the same choice, the
    same steps), then up to ``refine_iter`` iterations on the posterior alone: the kernel
    parameters and inducing inputs are the refit's, bit for bit; the iterations and the
    callback's count go on from the refit's."""
    X, y = _three_classes()
    kw = {"method": method, "M": 8, "max_iter": 40, "random_state": 0,
          "validation_fraction": 0.25, "validation_folds": 1, "n_iter_no_change": 3,
          "refit": True, **extra}
    plain = gpinfer.GPClassifier(**kw).fit(X, y)
    reports = []
    est = gpinfer.GPClassifier(**kw, refine_iter=15).fit(X, y, callback=reports.append)
    diag = est.fit_result_.diagnostics
    k, refined = int(diag["best_iteration"]), int(diag["refined"])
    assert k == plain.best_iteration_ and plain.n_iter_ == k and 1 <= refined <= 15
    assert est.n_iter_ == k + refined and "refined" not in plain.fit_result_.diagnostics
    for a, b in zip(est.posterior_.kernels, plain.posterior_.kernels):
        np.testing.assert_array_equal(a.get_unconstrained(), b.get_unconstrained())
    for a, b in zip(est.posterior_.Z, plain.posterior_.Z):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(est.posterior_.m, plain.posterior_.m)  # the posterior moved
    its = [r.iteration for r in reports]
    assert its == list(range(1, len(its) + 1))
    assert [r.extra["refine_iteration"] for r in reports[-refined:]] == list(
        range(1, refined + 1))
    assert [h.get("refine") for h in est.history_[-refined:]] == [1.0] * refined
    assert est.score(X, y) >= 0.9


def test_refine_with_the_average_refines_every_fold_model_on_all_the_rows():
    """``refit="average"`` with ``refine_iter``: each fold's model keeps its own kernel
    parameters and inducing inputs (those of ``refine_iter=0``'s members, bit for bit) and its
    posterior is trained further on all the rows."""
    X, y = _three_classes(60)
    kw = {"method": "vi-robustmax", "M": 6, "max_iter": 30, "random_state": 0,
          "validation_fraction": 0.2, "validation_folds": 3, "n_iter_no_change": 3,
          "refit": "average"}
    plain = gpinfer.GPClassifier(**kw).fit(X, y)
    est = gpinfer.GPClassifier(**kw, refine_iter=10).fit(X, y)
    assert len(est.posterior_.members) == len(plain.posterior_.members) == 3
    assert 1 <= est.fit_result_.diagnostics["refined"] <= 10
    for a, b in zip(est.posterior_.members, plain.posterior_.members):
        for ka, kb in zip(a.kernels, b.kernels):
            np.testing.assert_array_equal(ka.get_unconstrained(), kb.get_unconstrained())
        np.testing.assert_array_equal(a.Z[0], b.Z[0])
        assert not np.allclose(a.m, b.m)
    assert est.score(X, y) >= 0.9


@pytest.mark.parametrize("method,extra", [
    ("vi-robustmax", {}),
    ("sep", {"max_iter": 30}),
])
def test_refine_gives_the_same_model_on_torch_as_on_numpy(method, extra):
    """The refinement runs on the fit's backend: float64 torch (CPU) gives numpy's model."""
    pytest.importorskip("torch")
    X, y = _three_classes(60)
    kw = {"method": method, "M": 6, "max_iter": 20, "random_state": 0,
          "validation_fraction": 0.25, "validation_folds": 1, "n_iter_no_change": 3,
          "refit": True, "refine_iter": 8, **extra}
    on_numpy = gpinfer.GPClassifier(**kw).fit(X, y)
    on_torch = gpinfer.GPClassifier(**kw, backend="torch", dtype="float64").fit(X, y)
    assert on_torch.fit_result_.diagnostics["refined"] == on_numpy.fit_result_.diagnostics[
        "refined"] > 0
    np.testing.assert_allclose(on_torch.predict_proba(X), on_numpy.predict_proba(X),
                               rtol=0, atol=1e-6)
