"""Early stopping's default ``refit="auto"``: the rule the method declares
(``Method.early_stopping_rule``) is the one that runs (``EarlyStopping.resolved``)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ep.method import SEP

import gpinfer
from gpinfer.interfaces import Method
from gpinfer.posterior import AveragedPosterior
from gpinfer.testing.datasets import ring_classes
from gpinfer.training.early_stopping import AUTO, EarlyStopping


def _three_classes(n: int = 60, seed: int = 0):
    return ring_classes(n, seed)


def _fit(X, y, **kwargs):
    kw = {"method": "sep", "M": 6, "max_iter": 12, "random_state": 0,
          "validation_fraction": 0.2, "validation_folds": 3, "n_iter_no_change": 3, **kwargs}
    return gpinfer.GPClassifier(**kw).fit(X, y)


def test_auto_is_the_default_and_resolves_to_the_declared_rule():
    es = EarlyStopping.from_settings(0.2, 1, 10)
    assert es is not None and es.refit == AUTO and es.refine_iter is None
    assert gpinfer.GPClassifier().get_params()["refit"] == AUTO
    assert gpinfer.GPClassifier().get_params()["refine_iter"] is None
    run = es.resolved(("average", 250))
    assert (run.refit, run.refine_iter) == ("average", 250) and run.averages
    assert (es.resolved((True, 0)).refit, es.resolved((True, 0)).refine_iter) == (True, 0)
    # a regressor refits where the rule averages; an explicit refine_iter is kept
    run = es.resolved(("average", 250), classifier=False)
    assert (run.refit, run.refine_iter) == (True, 250)
    run = EarlyStopping.from_settings(0.2, 1, 10, AUTO, refine_iter=0).resolved(("average", 9))
    assert (run.refit, run.refine_iter) == ("average", 0)
    # an explicit refit ignores the method's rule; refine_iter None is then 0
    run = EarlyStopping.from_settings(0.2, 1, 10, True).resolved(("average", 250))
    assert (run.refit, run.refine_iter) == (True, 0)


def test_the_declared_rule_is_what_runs(monkeypatch):
    """sep's auto fit is its explicit rule's fit, bit for bit; declaring another rule on the
    class changes what the same call fits."""
    X, y = _three_classes()
    refit, count = SEP.early_stopping_rule
    auto = _fit(X, y)
    explicit = _fit(X, y, refit=refit, refine_iter=count)
    np.testing.assert_array_equal(auto.predict_proba(X), explicit.predict_proba(X))
    assert auto.fit_result_.diagnostics["refine_iter"] == float(count)

    monkeypatch.setattr(SEP, "early_stopping_rule", ("average", 4))
    averaged = _fit(X, y)
    diag = averaged.fit_result_.diagnostics
    assert isinstance(averaged.posterior_, AveragedPosterior)
    assert diag["averaged"] == 3.0 and diag["refit"] == 0.0 and diag["refine_iter"] == 4.0
    assert 1.0 <= diag["refined"] <= 4.0
    np.testing.assert_array_equal(averaged.predict_proba(X), _fit(
        X, y, refit="average", refine_iter=4).predict_proba(X))

    monkeypatch.setattr(SEP, "early_stopping_rule", (True, 5))
    refitted = _fit(X, y)
    diag = refitted.fit_result_.diagnostics
    assert diag["refit"] == 1.0 and diag["refine_iter"] == 5.0 and 1.0 <= diag["refined"] <= 5.0
    # an explicit refine_iter overrides the rule's count
    assert "refined" not in _fit(X, y, refine_iter=0).fit_result_.diagnostics


def test_vi_robustmax_averages_its_folds_and_refines_them_by_default():
    X, y = _three_classes()
    est = _fit(X, y, method="vi-robustmax")
    diag = est.fit_result_.diagnostics
    assert isinstance(est.posterior_, AveragedPosterior) and len(est.posterior_.members) == 3
    assert diag["refine_iter"] == 250.0 and diag["refined"] >= 1.0


@pytest.mark.parametrize("rule", [("average", -1), ("mean", 0), (True,), [True, 0],
                                  (True, 1.5), (True, True)])
def test_a_badly_declared_rule_is_refused_at_class_definition(rule):
    with pytest.raises(TypeError, match="early_stopping_rule must be"):
        type("Bad", (Method,), {"early_stopping_rule": rule})


def test_a_rule_that_refines_needs_a_method_that_refines():
    with pytest.raises(TypeError, match="refines"):
        type("Bad", (Method,), {"early_stopping_rule": (True, 5)})
    with pytest.raises(TypeError, match="refines"):
        type("Bad", (Method,), {"early_stopping_rule": (False, 5), "refines": True})
    ok = type("Ok", (Method,), {"early_stopping_rule": ("average", 5),
                                          "refines": True})
    assert ok.early_stopping_rule == ("average", 5)
