"""Defaults that work: every registered method of this project, with its default options and
the estimator's defaults, fits 60 points of two classes (and three, when it is multi-class),
returns finite evidence and valid probabilities, beats the class frequencies and honours
``max_iter``. Every Hydra method preset is a registered method (``tests/test_options.py``), so
this covers the presets too.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from gpinfer import registry
from gpinfer.estimator import GPClassifier
from gpinfer.testing.method_suite import make_suite_data

#: methods whose default fit takes more than a few seconds here (AIS at its full budget,
#: the IVM's liquid-set EP, KL's Newton to 1e-16): run with GPINFER_FULL_CHECKS=1 only
SLOW = {"mcmc-ais", "ivm", "kl"}
#: the heavy batteries (every method's default fit and check_estimator: about 40 minutes on
#: two cores) run when this is set; the suite keeps to its 10-minute budget otherwise
FULL = os.environ.get("GPINFER_FULL_CHECKS") == "1"
HEAVY = [pytest.mark.slow,
         pytest.mark.skipif(not FULL, reason="heavy: set GPINFER_FULL_CHECKS=1 to run")]
#: the budget of the slow methods' fits (the others run the estimator's default, 100)
SLOW_MAX_ITER = 3


def _cases() -> list:
    out = []
    for entry in registry.entries(registry.METHODS):
        if entry.dist not in registry.OWN_DISTRIBUTIONS:
            continue
        cls = registry.load_method(entry.name)
        for C in (2, 3) if cls.multiclass else (2,):
            marks = HEAVY if entry.name in SLOW else []
            out.append(pytest.param(entry.name, C, marks=marks, id=f"{entry.name}-C{C}"))
    return out


@pytest.mark.parametrize("name, n_classes", _cases())
def test_method_fits_with_its_defaults(name, n_classes):
    X, y = make_suite_data(n_classes, n=60, seed=1)
    est = GPClassifier(method=name, random_state=0)
    if name in SLOW:
        est.set_params(max_iter=SLOW_MAX_ITER)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # "no better than the frequencies"
        est.fit(X, y)
    assert 1 <= est.n_iter_ <= est.max_iter, f"{name} ran {est.n_iter_} iterations"
    assert np.isfinite(est.log_evidence_)
    P = est.predict_proba(X)
    assert P.shape == (60, n_classes) and np.all(np.isfinite(P)) and np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-10)
    assert est.score(X, y) >= 0.85, f"{name}: training accuracy {est.score(X, y):.2f}"
    # confident where the classes are apart: not stuck near 1/C (an under-trained model)
    assert np.mean(P.max(axis=1)) > 1.0 / n_classes + 0.2, f"{name}: probabilities near 1/C"


def _honour_cases() -> list:
    """Every method but mcmc-ais (tested in the runner at a small AIS budget); KL (a minute:
    its inner Newton needs its 100 steps at the second L-BFGS point) and ivm's 3-class case
    only with GPINFER_FULL_CHECKS=1."""
    heavy = {("kl", 2), ("ivm", 3)}
    return [pytest.param(*c.values, id=c.id, marks=HEAVY if tuple(c.values) in heavy else [])
            for c in _cases() if c.values[0] != "mcmc-ais"]


@pytest.mark.parametrize("name, n_classes", _honour_cases())
def test_method_honours_max_iter(name, n_classes):
    """Two iterations means at most two reported iterations (ivm's rounds once ignored it;
    mcmc-ais: tests/experiment/test_robustness_runs.py, at a small AIS budget)."""
    X, y = make_suite_data(n_classes, n=60, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = GPClassifier(method=name, max_iter=2, random_state=0).fit(X, y)
    assert 1 <= est.n_iter_ <= 2 and len(est.history_) <= 2


#: methods whose check_estimator run takes a few seconds here (the rest are slow-marked)
QUICK_CHECKS = {"fv", "vi-jj-full"}


def _check_cases() -> list:
    out = []
    for entry in registry.entries(registry.METHODS):
        if entry.dist in registry.OWN_DISTRIBUTIONS:
            marks = [] if entry.name in QUICK_CHECKS else HEAVY
            out.append(pytest.param(entry.name, marks=marks, id=entry.name))
    return out


#: methods that take weights but whose data-dependent initialisation (median lengthscale,
#: K-means inducing inputs) sees repeated rows that a weight does not repeat
INIT_SEES_ROWS = {"svi", "vi-robustmax"}


def _expected_failures(name: str) -> dict[str, str]:
    """The checks with weights other than 0/1 that a method fails by design: an ``InputError``
    for a method without ``supports_sample_weight``; for ``INIT_SEES_ROWS``, the equivalence of
    weight k and the row k times at the default options."""
    if not registry.load_method(name).supports_sample_weight:
        why = f"{name} takes no sample_weight but 0/1 (an InputError naming those that do)"
        return {check: why for check in ("check_sample_weights_list",
                                         "check_sample_weights_not_overwritten",
                                         "check_sample_weight_equivalence_on_dense_data")}
    if name in INIT_SEES_ROWS:
        return {"check_sample_weight_equivalence_on_dense_data":
                f"{name}'s default initialisation (median lengthscale, K-means inducing inputs) "
                "sees repeated rows; weights equal repeats with those fixed (test_sklearn_parity)"}
    return {}


@pytest.mark.parametrize("name", _check_cases())
def test_method_passes_check_estimator_with_its_defaults(name):
    """scikit-learn's whole estimator contract, every method option at its default (a budget of
    ten iterations keeps it affordable; AIS and the IVM at their defaults would take minutes).
    Its checks fit labels that are pure noise (``check_fit_score_takes_y``: ``arange(30) % 3``
    on uniform inputs), where no model beats the class frequencies: the fit guard's default
    ``baseline_failure="raise"`` would stop them, so the contract is checked with ``"warn"``.

    The fit guard's "no better than predicting the class frequencies" warnings that some
    methods (vi-jj-full, issue 27) raise here come from checks whose labels are drawn
    independently of X (check_fit_idempotent, check_n_features_in, check_supervised_y_2d,
    check_n_features_in_after_fitting): the class frequencies are the right answer there. Fit
    quality at the defaults is asserted on data with a signal, against the class frequencies on
    held-out points, by tests/test_default_battery.py (vi-jj-full included)."""
    from sklearn.utils.estimator_checks import check_estimator

    check_estimator(GPClassifier(method=name, random_state=0, max_iter=10,
                                 baseline_failure="warn"),
                    expected_failed_checks=_expected_failures(name), on_skip=None)
