"""Early stopping's ``choice_refine_iter``: the validation fits' checked iterates are ranked by
their posteriors refined at frozen hyper-parameters (``ValidationMonitor.rescore``)."""

from __future__ import annotations

import numpy as np
import pytest

import gpinfer
from gpinfer.interfaces import FitResult, IterationInfo
from gpinfer.testing.datasets import ring_classes
from gpinfer.training.early_stopping import EarlyStopping, ValidationMonitor, split_validation


def _info(it: int, posterior) -> IterationInfo:
    return IterationInfo(it, -float(it), 0.0, lambda: posterior, {})


def _three_classes(n: int = 60, seed: int = 0):
    return ring_classes(n, seed)


def test_rescore_ranks_the_checks_by_their_refined_posteriors():
    nll = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 2.5, "A": 2.0, "B": 1.5, "C": 0.7, "D": 0.9}
    monitor = ValidationMonitor(lambda post: nll[post],
                                EarlyStopping(0.2, 1, 5, choice_refine_iter=3))
    for it, post in enumerate("abcd", start=1):
        monitor(_info(it, post))
    assert monitor.best_iteration == 2 and set(monitor.posteriors) == {1, 2, 3, 4}
    monitor.rescore(str.upper)  # the "refined" posterior of each check
    assert monitor.checks == [(1, 2.0), (2, 1.5), (3, 0.7), (4, 0.9)]
    assert (monitor.best_iteration, monitor.best_nll, monitor.best_posterior) == (3, 0.7, "C")
    assert monitor.posteriors == {} and monitor.val_nll == {1: 2.0, 2: 1.5, 3: 0.7, 4: 0.9}
    # the fit's model is the refined best, even where the best is the last iterate
    result = monitor.restore(FitResult(posterior="d", log_evidence=0.0, kernel=None, n_iter=4))
    assert result.posterior == "C" and result.diagnostics["best_val_nll"] == 0.7


def test_without_the_setting_nothing_is_kept_or_rescored():
    monitor = ValidationMonitor(lambda post: 1.0, EarlyStopping(0.2))
    monitor(_info(1, "a"))
    assert monitor.posteriors == {}
    monitor.rescore(lambda post: pytest.fail("rescored without choice_refine_iter"))
    assert not monitor.rescored


def test_the_hold_out_model_is_its_best_refined_iterate():
    """``refit=False`` with ``choice_refine_iter``: the fitted model is the checked iterate
    whose refined posterior has the least validation NLL, that refined posterior (its NLL on
    the held-out rows is the recorded best); without refinement the curve is another one."""
    X, y = _three_classes()
    kw = {"method": "vi-robustmax", "M": 6, "max_iter": 15, "random_state": 0,
          "validation_fraction": 0.25, "validation_folds": 1, "n_iter_no_change": 3,
          "refit": False}
    est = gpinfer.GPClassifier(**kw, choice_refine_iter=20).fit(X, y)
    plain = gpinfer.GPClassifier(**kw).fit(X, y)
    state = est.fit_result_.state
    _, val = split_validation(y, 0.25, np.random.default_rng(0), 3)
    Xs = est.scaler_.transform(X)
    held_out = -np.mean(est.posterior_.log_predictive(Xs[val], y[val]))
    assert held_out == pytest.approx(np.min(state["val_nll"]), rel=1e-9)
    assert held_out == pytest.approx(est.fit_result_.diagnostics["best_val_nll"], rel=1e-9)
    assert not np.allclose(state["val_nll"], plain.fit_result_.state["val_nll"])
