"""Early stopping (gpinfer.training.early_stopping): the split, the monitor, the estimators."""

from __future__ import annotations

import numpy as np
import pytest

import gpinfer
from gpinfer.errors import InputError
from gpinfer.interfaces import FitResult, IterationInfo
from gpinfer.training.early_stopping import EarlyStopping, ValidationMonitor, split_validation


def _three_classes(n: int = 90, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 2)) + 2.5 * np.stack([np.cos(2.1 * y), np.sin(2.1 * y)], axis=1)
    return X, y


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
    X, y = _three_classes()
    if method == "laplace":
        y = (y == 0).astype(int)
    reports = []
    est = gpinfer.GPClassifier(method=method, max_iter=400, random_state=0,
                               validation_fraction=0.25, n_iter_no_change=3, **extra)
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
