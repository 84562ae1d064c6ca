"""svi: oracles T5 (svi part), T11, T12 of spec jj-taylor-svi §7, multi-class gradients,
bad input, and the shared battery."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState
from gpinfer_svi.variational import (
    likelihood_expectation,
)

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import FitResult, Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit, RobustMax, Softmax
from gpinfer.posterior import AveragedPosterior
from gpinfer.testing import MethodTestSuite
from gpinfer.testing.gradcheck import assert_gradient_close


def _logistic_gh(s):
    """svi's logistic expectation (100-node Gauss-Hermite, the likelihood's default rule) for
    signs ``s [B]``, as an ``ExpectationFn`` on ``[B, 1]`` columns."""
    return likelihood_expectation(BernoulliLogit(), (np.asarray(s) > 0).astype(np.int64))

def _state(lik, n=30, M=5, C=1, seed=0, learn_Z=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = rng.integers(0, max(C, 2), n).astype(float if C == 1 else np.int64)
    kernels = [RBF(lengthscale=1.0 + 0.2 * c, variance=1.3) + White(0.03) for c in range(C)]
    Z = X[:M] + 0.1
    hp = HyperParameters(kernels, Z=[Z] * C, optimize_inducing=learn_Z)
    st = VariationalState(X, y, lik, hp, C, M)
    mu = rng.normal(size=(C, M)) * 0.5
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.2) + np.eye(M)
    return st, st.pack(mu, Lq)


@pytest.mark.parametrize("learn_Z", [True, False])
@pytest.mark.parametrize("lik", [BernoulliLogit(), BernoulliProbit()])
def test_t5_svi_gradients_binary(lik, learn_Z):
    """``learn_Z=False`` runs the cached-distance kernel path (``gpinfer.kernels.fixed``)."""
    st, x = _state(lik, learn_Z=learn_Z)
    assert st._fast is not learn_Z
    batch = np.arange(0, 30, 3)
    assert_gradient_close(lambda z: st.elbo(z, batch)[0], st.elbo(x, batch)[1], x,
                          rtol=1e-5, atol=1e-6, name="svi ELBO gradient")


@pytest.mark.parametrize(("lik", "rtol"), [(RobustMax(1e-3), 1e-4), (Softmax(gh_order=12), 2e-3)])
def test_t5_svi_gradients_multiclass(lik, rtol):
    """Softmax: the likelihood's product rule moves with the variance, so its dvar is exact only
    up to the quadrature error (~7e-4 relative at 12 nodes per dimension)."""
    st, x = _state(lik, n=12, M=3, C=3)
    assert_gradient_close(lambda z: st.elbo(z, None)[0], st.elbo(x, None)[1], x,
                          rtol=rtol, atol=1e-6, name="svi multi-class ELBO gradient")


def test_t11_minibatch_estimate_unbiased_over_a_partition():
    st, x = _state(BernoulliLogit(), n=30)
    full_v, full_g = st.elbo(x, None)
    perm = np.random.default_rng(1).permutation(30)
    parts = [st.elbo(x, b) for b in np.split(perm, 5)]
    assert np.mean([p[0] for p in parts]) == pytest.approx(full_v, rel=1e-12)
    np.testing.assert_allclose(np.mean([p[1] for p in parts], axis=0), full_g, rtol=1e-10,
                               atol=1e-12)
    # Monte Carlo over random batches: within 4 standard errors
    rng = np.random.default_rng(2)
    vals = [st.elbo(x, rng.choice(30, 7, replace=False))[0] for _ in range(200)]
    assert abs(np.mean(vals) - full_v) < 4 * np.std(vals) / np.sqrt(len(vals))


def _problem(n=60, y=None, n_classes=2, lik=None, batch=None, M=8, max_iter=5):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    y0 = (X[:, 0] > 0).astype(np.int64)
    return Problem(X=X, y=y0 if y is None else y, n_classes=n_classes,
                   kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.01),
                   likelihood=lik or BernoulliLogit(), inducing=M, max_iter=max_iter,
                   batch_size=batch)


def test_bad_input_and_options():
    with pytest.raises(InputError, match="binary"):
        SVI().fit(_problem(y=np.arange(60) % 3, n_classes=3))
    with pytest.raises(InputError, match="1..N"):
        SVI().fit(_problem(M=61))
    with pytest.raises(InputError, match="full-batch"):
        SVI(optimizer="lbfgs").fit(_problem(batch=10))
    with pytest.raises(InputError, match="scale"):
        SVI(scale="nope").fit(_problem())


def test_optimizer_for_names_the_optimizer_fit_runs():
    # optimizer None: L-BFGS-B for a full batch (its result in the state), AdaDelta for
    # mini-batches; a named one is run as named
    assert SVI.optimizer_for({"optimizer": None}, None) == "lbfgs"
    assert SVI.optimizer_for({"optimizer": None}, 10) == "adadelta"
    assert SVI.optimizer_for({"optimizer": "adam"}, None) == "adam"
    assert "lbfgs_success" in SVI().fit(_problem(max_iter=2)).state
    assert "lbfgs_success" not in SVI().fit(_problem(batch=20, max_iter=1)).state


@pytest.mark.parametrize("options, batch, pattern", [
    ({"learning_rate": -1}, 10, r"AdaDelta needs .*learning_rate > 0"),  # the mini-batch default
    ({"nope": 1}, None, r"optimizer 'lbfgs' got unknown option\(s\) \['nope'\]"),  # full batch
    ({"learning_rate": 0.1}, None, r"optimizer 'lbfgs' got unknown option"),  # AdaDelta's key
], ids=["adadelta-negative-rate", "lbfgs-unknown-key", "adadelta-key-to-lbfgs"])
def test_bad_optimizer_options_refused_before_any_set_up(monkeypatch, options, batch, pattern):
    # optimizer None: the optimiser svi picks for the problem's shape is built first, in fit and
    # refine alike, before K-means or any ELBO (and from the estimator, before training)
    def no_set_up(*args, **kwargs):
        raise AssertionError("set-up reached")

    monkeypatch.setattr(SVI, "_setup", no_set_up)
    monkeypatch.setattr(SVI, "_data", no_set_up)
    with pytest.raises(InputError, match=pattern):
        SVI(optimizer_options=options).fit(_problem(batch=batch))
    with pytest.raises(InputError, match=pattern):
        SVI(optimizer_options=options).refine(_problem(batch=batch), FitResult(
            posterior=None, log_evidence=0.0, kernel=None, n_iter=0))
    p = _problem(batch=batch)
    est = GPClassifier(method="svi", M=8, batch_size=batch, random_state=0,
                       method_options={"optimizer_options": options})
    with pytest.raises(InputError, match=pattern):
        est.fit(p.X, p.y)


def test_minibatch_training_improves_and_reports_epochs():
    seen = []
    res = SVI(optimizer="adam", optimizer_options={"learning_rate": 0.05}, report_every=6).fit(
        _problem(n=120, batch=20, max_iter=10), callback=seen.append)
    assert seen[-1].extra["epoch"] == pytest.approx(10.0)
    assert seen[-1].objective > seen[0].objective
    X = _problem(n=120).X
    acc = np.mean(np.argmax(res.posterior.predict_proba(X), 1) == _problem(n=120).y)
    assert acc > 0.85


def test_multiclass_robustmax_learns():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.5]).astype(np.int64)
    p = Problem(X=X, y=y, n_classes=3, kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.01),
                likelihood=RobustMax(1e-3), inducing=6, max_iter=25)
    res = SVI(optimizer="lbfgs").fit(p)
    assert res.posterior.predict_proba(X).shape == (60, 3)
    assert np.mean(np.argmax(res.posterior.predict_proba(X), 1) == y) > 0.8


class TestSVISuite(MethodTestSuite):
    method_name = "svi"
    likelihood = "logit"
    inducing = 6
    max_iter = 5
    method_options = {"optimizer": "adam", "optimizer_options": {"learning_rate": 0.05}}

    def objective_and_gradient(self, X, y):
        k = RBF(lengthscale=1.1, variance=1.4) + White(0.02)
        hp = HyperParameters([k], Z=[X[:5] + 0.05])
        st = VariationalState(X, y.astype(float), BernoulliLogit(), hp, 1, 5)
        x0 = st.pack(np.full((1, 5), 0.1), np.eye(5)[None] * 0.8)
        return (lambda z: st.elbo(z, None)[0], lambda z: st.elbo(z, None)[1], x0)


# -- natural gradients in svi (the core oracles: tests/sites/test_variational.py) ---------------


def test_svi_natural_gradient_full_batch_reaches_fixed_theta_optimum():
    """svi with ``natural_gradient`` at fixed theta, full batch, converges to the same ELBO as
    svi with L-BFGS-B."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] + 0.4 * rng.normal(size=40) > 0).astype(float)

    def fit(**opts):
        p = Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=1.0, variance=1.0)
                    + White(0.01), likelihood=BernoulliLogit(), inducing=X[:8].copy(),
                    optimize=False, max_iter=60)
        return SVI(**opts).fit(p)

    ngd = fit(natural_gradient=1.0, report_every=1)
    ref = fit(optimizer="lbfgs")
    assert ngd.log_evidence == pytest.approx(ref.log_evidence, abs=1e-5)
    with pytest.raises(InputError, match="natural_gradient"):
        fit(natural_gradient=1.5)


def test_fast_multiclass_expectations_match_the_likelihood():
    """The robust-max ``"gauss_hermite"`` rule (in ``f_y``) and the softmax ``"monte_carlo"``
    rule against the likelihoods' accurate rules (equal variances: the
    robust-max integrand is smooth)."""
    rng = np.random.default_rng(9)
    B, C = 40, 4
    mean, var, y = rng.normal(size=(B, C)), np.full((B, C), 0.6), rng.integers(0, C, B)
    ref = RobustMax(1e-3).expected_log_prob(y, mean, var)
    gh = RobustMax(1e-3, expectation="gauss_hermite", quadrature_points=40)
    E, dm, dv = gh.variational_expectations(y, mean, var)
    np.testing.assert_allclose(E, ref.value, atol=1e-7)
    np.testing.assert_allclose(dm, ref.dmean, atol=1e-6)
    np.testing.assert_allclose(dv, ref.dvar, atol=1e-6)
    ref = Softmax(gh_order=12).expected_log_prob(y[:5], mean[:5], var[:5])
    mc = Softmax(expectation="monte_carlo", mc_samples=200_000)
    E, dm, dv = mc.variational_expectations(y[:5], mean[:5], var[:5], rng=np.random.default_rng(0))
    np.testing.assert_allclose(E, ref.value, atol=5e-3)
    np.testing.assert_allclose(dm, ref.dmean, atol=5e-3)
    np.testing.assert_allclose(dv, ref.dvar, atol=5e-3)


def test_non_finite_elbo_is_a_clear_error(monkeypatch):
    """Bad input list of the issue: a non-finite bound during L-BFGS-B (and during stochastic
    steps) raises ``NumericalError`` naming it, never a silent NaN."""
    from gpinfer.errors import NumericalError

    def bad(self, x, batch, natural=True):
        value, grad, est = original(self, x, batch, natural)
        return float("nan"), grad, est

    original = VariationalState.estimate
    monkeypatch.setattr(VariationalState, "estimate", bad)
    with pytest.raises(NumericalError, match="nan"):
        SVI(optimizer="lbfgs").fit(_problem())
    with pytest.raises(NumericalError, match="svi ELBO"):
        SVI(optimizer="adam").fit(_problem(batch=20))


def test_abnormal_lbfgs_end_is_in_the_metrics(monkeypatch):
    original = VariationalState.estimate

    def wrong_gradient(self, x, batch, natural=True):
        value, grad, est = original(self, x, batch, natural)
        return value, -grad, est  # not an ascent direction: the line search fails

    monkeypatch.setattr(VariationalState, "estimate", wrong_gradient)
    seen = []
    with pytest.warns(RuntimeWarning, match="abnormally"):
        res = SVI(optimizer="lbfgs").fit(_problem(max_iter=20), callback=seen.append)
    assert seen[-1].extra["lbfgs_abnormal"] == 1.0
    assert not bool(res.state["lbfgs_success"])
    assert "ABNORMAL" in str(res.state["lbfgs_message"])


# -- refine: q(u) at fixed hyper-parameters (early stopping's refine_iter) ----------------------


def _q(result):
    return np.array(result.state["mu"]), np.array(result.state["Lq"])


def test_refine_holds_the_kernel_and_inducing_inputs_and_starts_from_the_fit():
    """The refinement moves q(u) only: kernel parameters and Z stay bit-identical, and
    L-BFGS-B from the fit's q(u) never ends below the fit's ELBO (its start)."""
    fitted = SVI(learn_inducing=True).fit(_problem(max_iter=8))
    refined = SVI(learn_inducing=True).refine(_problem(max_iter=50), fitted)
    np.testing.assert_array_equal(refined.state["kernel_params_0"],
                                  fitted.state["kernel_params_0"])
    np.testing.assert_array_equal(refined.posterior.Z[0], fitted.posterior.Z[0])
    assert refined.log_evidence >= fitted.log_evidence - 1e-9
    # one step: from the fit's q(u) (a start at the prior's would be far below the fit)
    one = SVI(learn_inducing=True).refine(_problem(max_iter=1), fitted)
    assert fitted.log_evidence - 1e-9 <= one.log_evidence <= refined.log_evidence + 1e-9
    assert not np.allclose(refined.state["mu"], fitted.state["mu"])  # q(u) did move


def test_refine_reaches_the_fixed_hyper_parameter_optimum_of_a_fit_from_the_prior():
    """The limiting case: at fixed hyper-parameters (``optimize=False``) the ELBO has one
    optimum in q(u); refining a short fit converges to the same q(u) as a long fit from the
    prior start."""
    fixed = _problem(max_iter=3)
    fixed.optimize = False
    short = SVI().fit(fixed)
    fixed.max_iter, fixed.inducing = 400, short.posterior.Z[0]  # the same Z for the long fit
    refined = SVI().refine(fixed, short)
    long = SVI().fit(fixed)
    assert refined.log_evidence == pytest.approx(long.log_evidence, rel=1e-8)
    np.testing.assert_allclose(refined.posterior.m[0], long.posterior.m[0], atol=1e-4)
    np.testing.assert_allclose(refined.posterior.S[0], long.posterior.S[0], atol=1e-4)


def test_refine_needs_a_fit_of_svi_and_starts_from_its_posterior_alone_too():
    """Without ``mu`` and ``Lq`` in its state (a fold model's iterate), the refine starts from
    the posterior's means and covariances: the same q(u), the same first step's ELBO."""
    fitted = SVI().fit(_problem(max_iter=4))
    own = SVI().refine(_problem(max_iter=1), fitted)
    bare = FitResult(fitted.posterior, fitted.log_evidence, fitted.kernel, fitted.n_iter)
    alone = SVI().refine(_problem(max_iter=1), bare)
    assert alone.log_evidence == pytest.approx(own.log_evidence, rel=1e-9)
    with pytest.raises(InputError, match="svi.refine needs a fit of svi"):
        SVI().refine(_problem(), FitResult(AveragedPosterior([fitted.posterior]), 0.0,
                                           fitted.kernel, 1))
