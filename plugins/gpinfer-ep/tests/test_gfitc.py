"""GFITC baseline (spec ep-sep §3.1): dense oracle, O11 (EP = GFITC at M = N), O12 gradient."""

from __future__ import annotations

import numpy as np
import pytest
from ep_helpers import InducingSuite, converge, dense, hyper, problem, subset_check
from gpinfer_ep.gfitc import FITCSites
from gpinfer_ep.model import all_terms
from gpinfer_ep.state import RankOneSites

from gpinfer.errors import InputError, NumericalError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Sum
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.posterior import InducingPosterior
from gpinfer.testing.method_suite import make_suite_data


def _converged(kernels, Zs, X, y, C):
    sites = FITCSites(y, C)
    sites.run(all_terms(kernels, Zs, X), tol=1e-12, max_sweeps=5000)
    return sites


def test_marginals_match_dense_fitc_posterior():
    X, y, kernels, Zs = problem(seed=20)
    sites = FITCSites(y, 3)
    terms = all_terms(kernels, Zs, X)
    for _ in range(3):
        sites.sweep(terms, 0.5)
    mu, S, _ = sites.marginals(terms)
    tau, nu = sites.tau_nu()
    for c, (k, Z) in enumerate(zip(kernels, Zs)):
        Kuu, Ups, s = dense(k, Z, X)
        Kt = Ups.T @ Kuu @ Ups + np.diag(s)
        Sig = np.linalg.inv(np.linalg.inv(Kt) + np.diag(tau[:, c]))
        np.testing.assert_allclose(S[:, c], np.diag(Sig), atol=1e-10)
        np.testing.assert_allclose(mu[:, c], Sig @ nu[:, c], atol=1e-10)


def test_gradient_matches_converged_evidence():
    """O12: FD of the re-converged GFITC evidence wrt every hyper-parameter (noise included)."""
    X, y, kernels, Zs = problem(N=10, C=3, M=3, seed=21)
    hp = hyper(kernels, Zs)
    sites = _converged(kernels, hp.Z, X, y, 3)
    theta0 = hp.pack()
    analytic = hp.gradient(X, sites.evidence(all_terms(kernels, hp.Z, X))[1])

    def f(theta):
        hp.unpack(theta)
        terms = all_terms(kernels, hp.Z, X)
        sites.run(terms, tol=1e-12, max_sweeps=5000)
        return sites.evidence(terms)[0]

    subset_check(hp, theta0, f, analytic, "GFITC evidence gradient",
                 eps=1e-5, rtol=1e-5, atol=1e-7)


def test_ep_equals_gfitc_at_M_equals_N_without_noise():
    """O11: Z_c = X, sigma_0 -> 0 (jitter-size white noise): same factors, same evidence."""
    rng = np.random.default_rng(22)
    X = rng.standard_normal((8, 2))
    y = np.arange(8) % 3
    kernels = [Sum([RBF(lengthscale=1.0 + 0.2 * c, variance=1.0 + c), White(1e-8)])
               for c in range(3)]
    Zs = [X.copy() for _ in range(3)]
    ep = RankOneSites(y, 3, 8)
    converge(ep, kernels, Zs, X)
    v_ep = ep.evaluate(all_terms(kernels, Zs, X), np.arange(8))[0]
    gf = _converged(kernels, Zs, X, y, 3)
    terms = all_terms(kernels, Zs, X)
    v_gf = gf.evidence(terms)[0]
    assert v_ep == pytest.approx(v_gf, rel=1e-5)
    mS = gf.posterior_moments(terms)
    post_gf = InducingPosterior(ArgmaxNoise(), kernels, Zs, [a for a, _ in mS], [b for _, b in mS])
    m_ep = [q.moments(t.L) for q, t in zip(ep.gaussians(terms), terms.latents())]
    post_ep = InducingPosterior(ArgmaxNoise(), kernels, Zs, [a for a, _ in m_ep],
                                [b for _, b in m_ep])
    Xs = rng.standard_normal((7, 2))
    # Kuu is nearly singular at sigma_0 = 1e-8: predictions agree to O(1e-5) (spec O11)
    np.testing.assert_allclose(post_ep.predict_proba(Xs), post_gf.predict_proba(Xs), atol=1e-4)


def test_gfitc_is_batch_only():
    X, y = make_suite_data(3, n=30)
    p = Problem(X=X, y=y, n_classes=3, kernel=RBF(), likelihood=ArgmaxNoise(), inducing=5,
                batch_size=10)
    from gpinfer_ep.gfitc import GFITC

    with pytest.raises(InputError, match="batch only"):
        GFITC().fit(p)


def test_training_increases_the_evidence():
    X, y = make_suite_data(3, n=45, seed=23)
    est = GPClassifier(method="gfitc", M=6, max_iter=10, random_state=0).fit(X, y)
    objective = [h["objective"] for h in est.history_]
    assert objective[-1] > objective[0]
    assert (est.predict(X) != y).mean() < 0.4


def test_failure_at_a_trial_point_keeps_the_last_iterate(monkeypatch):
    X, y = make_suite_data(3, n=45, seed=23)
    original, calls = FITCSites.run, {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise NumericalError("invalid cavity (1 - C1 v <= 0)", quantity="cavity")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FITCSites, "run", failing)
    with pytest.warns(RuntimeWarning, match="trial point of L-BFGS-B"):
        est = GPClassifier(method="gfitc", M=6, max_iter=10, random_state=0).fit(X, y)
    assert est.history_[-1]["stopped_on_failure"] == 1.0
    assert est.n_iter_ == len(est.history_) < 10
    assert np.all(np.isfinite(est.predict_proba(X)))
    assert est.log_evidence_ == pytest.approx(est.history_[-1]["objective"], abs=1e-2)  # EP tol
    assert (est.predict(X) != y).mean() < 0.4
    def always_failing(self, *args, **kwargs):
        raise NumericalError("invalid cavity", quantity="cavity")

    # a failure at the first evaluation has nothing to fall back on
    monkeypatch.setattr(FITCSites, "run", always_failing)
    with pytest.raises(NumericalError, match="invalid cavity"):
        GPClassifier(method="gfitc", M=6, max_iter=10, random_state=0).fit(X, y)


class TestGFITCSuite(InducingSuite):
    method_name = "gfitc"
    max_iter = 5
    permutation_atol = 1e-5
    gradient_eps = 1e-5

    def objective_and_gradient(self, X, y):
        """The converged GFITC evidence as a function of every hyper-parameter."""
        X, y = X[:10], y[:10]
        _, _, kernels, _ = problem(N=10, C=3, M=2, seed=24)
        Zs = [X[:2] + 0.05 * (c + 1) for c in range(3)]
        hp = hyper(kernels, Zs)
        sites = _converged(kernels, hp.Z, X, y, 3)

        def value(theta):
            hp.unpack(theta)
            terms = all_terms(kernels, hp.Z, X)
            sites.run(terms, tol=1e-12, max_sweeps=5000)
            return sites.evidence(terms)[0]

        def gradient(theta):
            value(theta)
            return hp.gradient(X, sites.evidence(all_terms(kernels, hp.Z, X))[1])

        return value, gradient, hp.pack()


def test_a_failed_sweep_is_restored_and_retried_at_half_the_damping(monkeypatch):
    """The inner schedule's failure policy (spec §3.1): the state from before the failed sweep,
    the damping halved, the failure counted; past ``MAX_SWEEP_FAILURES`` the error."""
    X, y, kernels, Zs = problem(seed=22)
    terms = all_terms(kernels, Zs, X)
    sites, calls = FITCSites(y, 3), []
    sweep = FITCSites.sweep

    def flaky(self, terms, rho):
        calls.append(rho)
        if len(calls) == 2:
            self.W1 = self.W1 + 1.0  # moved, then failed: the restore must undo it
            raise NumericalError("scripted", quantity="sites")
        return sweep(self, terms, rho)

    monkeypatch.setattr(FITCSites, "sweep", flaky)
    done = sites.run(terms, tol=0.0, max_sweeps=3)
    monkeypatch.setattr(FITCSites, "sweep", sweep)
    clean = FITCSites(y, 3)
    clean.sweep(terms, 0.5)
    clean.sweep(terms, 0.5 * 0.99 * 0.5)
    clean.sweep(terms, 0.5 * 0.99 * 0.5 * 0.99)
    assert (done, sites.failures) == (3, 1)
    assert calls == pytest.approx([0.5, 0.5 * 0.99, 0.5 * 0.99 * 0.5, 0.5 * 0.99**2 * 0.5])
    np.testing.assert_allclose(sites.W1, clean.W1, rtol=1e-12, atol=1e-14)

    def broken(self, terms, rho):
        raise NumericalError("scripted", quantity="sites")

    monkeypatch.setattr(FITCSites, "sweep", broken)
    with pytest.raises(NumericalError, match="scripted"):
        FITCSites(y, 3).run(terms, tol=0.0, max_sweeps=3)
