"""Early stopping with ``refit="average"``: the validation folds' models, averaged
(``gpinfer.posterior.AveragedPosterior``, ``gpinfer.training.early_stopping.averaged_result``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import gpinfer
from gpinfer.errors import InputError
from gpinfer.experiment.runner import fitted_inducing_count
from gpinfer.kernels import make_kernel
from gpinfer.likelihoods import make_likelihood
from gpinfer.posterior import AveragedPosterior, InducingPosterior
from gpinfer.testing.datasets import ring_classes
from gpinfer.training.early_stopping import EarlyStopping, validation_splits


def _three_classes(n: int = 90, seed: int = 0):
    return ring_classes(n, seed)


def _members(likelihood: str, latents: int, k: int = 3, seed: int = 0):
    """``k`` random inducing posteriors on 2-d inputs (6 inducing points per latent)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        kernels, Z, m, S = [], [], [], []
        for _ in range(latents):
            kern = make_kernel("rbf", 2)
            kern.set_params(lengthscale=float(rng.uniform(0.5, 2.0)))
            A = rng.normal(size=(6, 6)) * 0.3
            kernels.append(kern)
            Z.append(rng.normal(size=(6, 2)))
            m.append(2.0 * rng.normal(size=6))
            S.append(A @ A.T + 0.01 * np.eye(6))
        out.append(InducingPosterior(make_likelihood(likelihood), kernels, Z, m, S))
    return out


@pytest.mark.parametrize("likelihood,latents,classes", [("softmax", 3, 3), ("probit", 1, 2)])
def test_the_average_predicts_the_mean_of_its_members(likelihood, latents, classes):
    members = _members(likelihood, latents)
    avg = AveragedPosterior(members)
    X = np.random.default_rng(1).normal(size=(7, 2))
    y = np.arange(7) % classes
    P = avg.predict_proba(X)
    each = np.array([member.predict_proba(X) for member in members])
    assert P.shape == each.shape[1:] == (7, classes)
    np.testing.assert_allclose(P, each.mean(axis=0), rtol=1e-14, atol=0)
    lp = avg.log_predictive(X, y)
    member_lp = np.array([member.log_predictive(X, y) for member in members])
    assert lp.shape == (7,)
    np.testing.assert_allclose(lp, np.log(np.exp(member_lp).mean(axis=0)), rtol=1e-12)
    # the NLL of the average is at most the average NLL (Jensen), strictly here
    assert -lp.mean() < -member_lp.mean()
    # the mixture's latent moments: the law of total variance on the members' moments
    mean, var = avg.predict_f(X)
    moments = [member.predict_f(X) for member in members]
    assert mean.shape == var.shape == (7, latents)
    means = np.array([mu for mu, _ in moments])
    np.testing.assert_allclose(mean, means.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(var, np.mean([v for _, v in moments], axis=0) + means.var(axis=0),
                               rtol=1e-10)


def test_an_average_of_one_is_its_member_and_pickles():
    member = _members("softmax", 3, k=1)[0]
    avg = AveragedPosterior([member])
    X = np.random.default_rng(2).normal(size=(5, 2))
    np.testing.assert_allclose(avg.predict_proba(X), member.predict_proba(X), rtol=1e-15)
    for got, want in zip(avg.predict_f(X), member.predict_f(X)):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    again = pickle.loads(pickle.dumps(AveragedPosterior(_members("softmax", 3))))
    np.testing.assert_array_equal(again.predict_proba(X),
                                  AveragedPosterior(_members("softmax", 3)).predict_proba(X))
    assert set(avg.state()) == {f"member0_{key}" for key in member.state()}
    assert fitted_inducing_count(avg) == 6
    with pytest.raises(ValueError, match="at least one"):
        AveragedPosterior([])


def test_the_setting_is_checked_and_folds_as_the_refit():
    es = EarlyStopping.from_settings(0.2, 1, 10, "average")
    assert es is not None and es.refit == "average" and es.averages
    assert es.n_folds(500) == 5 and es.n_folds(5000) == 1  # as refit=True
    assert EarlyStopping.from_settings(0.2, 1, 10, "average", folds=3).n_folds(5000) == 3
    assert not EarlyStopping.from_settings(0.2, 1, 10, True).averages
    with pytest.raises(InputError, match="'average'"):
        EarlyStopping.from_settings(0.2, 1, 10, "averaged")


def test_the_fitted_model_averages_each_folds_best_validation_iterate():
    """End to end: K = 4 folds (90 points, fraction 0.25), each fold's model its own best
    validation iterate, the estimator's probabilities their mean; pickles; no refit."""
    X, y = _three_classes()
    reports = []
    est = gpinfer.GPClassifier(method="sep", M=8, max_iter=60, random_state=0,
                               validation_fraction=0.25, n_iter_no_change=3,
                               refit="average").fit(X, y, callback=reports.append)
    diag, state = est.fit_result_.diagnostics, est.fit_result_.state
    assert diag["validation_folds"] == 4.0 and diag["averaged"] == 4.0 and diag["refit"] == 0.0
    assert isinstance(est.posterior_, AveragedPosterior) and len(est.posterior_.members) == 4
    folds = [r.extra["fold_iteration"] for r in reports]  # every report is a fold's: no refit
    assert folds.count(1) == 4 and not any("refit_iteration" in r.extra for r in reports)
    assert est.n_iter_ == len(reports) and len(est.history_) == len(reports)
    # member f is fold f's best validation iterate: its NLL on fold f's rows is that minimum
    settings = EarlyStopping.from_settings(0.25, 1, 3, "average")
    splits = validation_splits(y, settings, np.random.default_rng(0), 3)
    Xs = est.scaler_.transform(X)
    curves = state["val_nll_folds"]
    last = [folds[i - 1] for i in range(1, len(folds)) if folds[i] == 1] + [folds[-1]]
    for f, (member, (_, val)) in enumerate(zip(est.posterior_.members, splits)):
        best = state["val_iteration"][np.nanargmin(curves[f])]
        assert state["member_iteration"][f] == best
        if best < last[f]:  # else the fit's final posterior, as refit=False keeps it
            nll = -np.mean(member.log_predictive(Xs[val], y[val]))
            assert nll == pytest.approx(np.nanmin(curves[f]), rel=1e-10)
    assert any(best < n for best, n in zip(state["member_iteration"], last))
    P = est.predict_proba(X)
    members = np.mean([m.predict_proba(Xs) for m in est.posterior_.members], axis=0)
    np.testing.assert_allclose(P, members, rtol=1e-14, atol=0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    assert est.predict(X).shape == (90,) and np.mean(est.predict(X) == y) > 0.8
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict_proba(X), P)


def test_one_hold_out_averages_its_one_model_the_best_iterate():
    X, y = _three_classes()
    kw = dict(method="sep", M=8, max_iter=60, random_state=0, validation_fraction=0.25,
              n_iter_no_change=3, validation_folds=1)
    avg = gpinfer.GPClassifier(refit="average", **kw).fit(X, y)
    best = gpinfer.GPClassifier(refit=False, **kw).fit(X, y)
    np.testing.assert_allclose(avg.predict_proba(X), best.predict_proba(X), rtol=1e-13)


def test_the_regressor_refuses_to_average_before_training():
    X = np.linspace(-1, 1, 40)[:, None]
    calls = []
    with pytest.raises(InputError, match="refit='average' is for classifiers"):
        gpinfer.GPRegressor(method="fitc", M=4, validation_fraction=0.2,
                            refit="average").fit(X, X[:, 0], callback=calls.append)
    assert calls == []


def test_the_averaged_model_saves_without_pickle(tmp_path):
    """``gpinfer.experiment.safe_model``: the skops file of an averaged model loads (its
    ``AveragedPosterior`` is a gpinfer class) and predicts the same probabilities."""
    pytest.importorskip("skops")
    from gpinfer.experiment.safe_model import load_skops, save_skops

    X, y = _three_classes(60)
    est = gpinfer.GPClassifier(method="sep", M=5, max_iter=15, random_state=0,
                               validation_fraction=0.25, n_iter_no_change=3,
                               refit="average").fit(X, y)
    loaded = load_skops(save_skops(est, tmp_path / "m.skops"))
    assert isinstance(loaded.posterior_, AveragedPosterior)
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
