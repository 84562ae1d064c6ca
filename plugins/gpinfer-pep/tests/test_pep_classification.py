"""Iterative Power EP for binary classification against dense references (spec power-ep §7,
oracles 4, 6-9, 13, 14), the stochastic variant and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from _pep_dense import (  # noqa: F401  (single_thread is an autouse fixture)
    hensman_elbo,
    problem,
    single_thread,
    standard_ep_probit,
)
from gpinfer_pep.rank_one import RankOnePEPSites, matrix_geometry

from gpinfer import GPClassifier
from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.likelihoods import BernoulliProbit

PROBIT = BernoulliProbit()


def _sites(kern, X, y, Z, alpha, jitter=0.0, lik=PROBIT, **kw):
    kw.setdefault("site_step", "full")
    kw.setdefault("damping", 1.0 if kw.get("schedule") == "sequential" else 0.7)
    sites = RankOnePEPSites(lik, y, alpha, **kw)
    geo = matrix_geometry(kern.K(Z), kern.K(Z, X), kern.K_diag(X), jitter)
    sites.set_geometry(geo, kern, Z)
    return sites


def test_full_inducing_set_alpha_one_is_standard_ep():  # oracle 4
    kern, X, y, _ = problem(n=25, classification=True)
    jitter = 1e-8 * 1.3
    sites = _sites(kern, X, y, X.copy(), 1.0, jitter=jitter, schedule="sequential")
    sites.run(500, tol=1e-12)
    energy, mu, var = standard_ep_probit(kern.K(X) + jitter * np.eye(len(y)), y)
    mean_f, var_f = sites.marginals()
    np.testing.assert_allclose(sites.energy(with_gradients=False).value, energy, rtol=1e-6)
    np.testing.assert_allclose(mean_f, mu, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var_f, var, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 1.0])
def test_schedules_reach_the_same_fixed_point(alpha):  # oracle 6 and 14 (order, tau >= 0)
    kern, X, y, Z = problem(n=30, m=6, classification=True)
    runs = [
        dict(schedule="sequential", site_step="power", damping=1.0),
        dict(schedule="parallel", site_step="power", damping=0.5),
        dict(schedule="parallel", site_step="full", damping=0.5),
    ]
    taus, nus = [], []
    for kw in runs:
        sites = _sites(kern, X, y, Z, alpha, **kw)
        sites.run(3000, tol=1e-11)
        assert sites.converged
        assert np.all(sites.tau >= 0)
        assert np.all(sites.cavity(np.arange(30)).den > 0)
        taus.append(sites.tau)
        nus.append(sites.nu)
    for t, v in zip(taus[1:], nus[1:]):
        np.testing.assert_allclose(t, taus[0], atol=1e-8)
        np.testing.assert_allclose(v, nus[0], atol=1e-8)
    perm = np.random.default_rng(1).permutation(30)
    sites = _sites(kern, X[perm], y[perm], Z, alpha)
    sites.run(3000, tol=1e-11)
    np.testing.assert_allclose(sites.tau, taus[0][perm], atol=1e-8)


def _energy_fn(kern, X, y, Z, alpha, tol=1e-12):
    """(value and gradient over theta = kernel log-parameters and Z), sites re-converged with a
    warm start at every point (spec §7 oracle 7)."""
    hp = HyperParameters(kern, None, Z)
    sites = _sites(kern, X, y, Z, alpha)

    def value_grad(theta, converge=True):
        hp.unpack(theta)
        Zc = hp.Z[0]
        sites.set_geometry(matrix_geometry(kern.K(Zc), kern.K(Zc, X), kern.K_diag(X),
                                                  0.0), kern, Zc)
        if converge:
            sites.run(5000, tol=tol)
        out = sites.energy()
        return out.value, parameter_gradient(hp, X, out.gradients)

    return hp, sites, value_grad


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_gradient_at_convergence_matches_finite_differences(alpha):  # oracle 7
    kern, X, y, Z = problem(n=25, m=4, classification=True)
    hp, _, value_grad = _energy_fn(kern, X, y, Z, alpha)
    theta0 = hp.pack()
    grad = value_grad(theta0.copy())[1]
    rng = np.random.default_rng(0)
    for _ in range(3):
        d = rng.normal(size=theta0.size)
        e = 1e-5
        fd = (value_grad(theta0 + e * d)[0] - value_grad(theta0 - e * d)[0]) / (2 * e)
        np.testing.assert_allclose(grad @ d, fd, rtol=1e-5)


def test_gradient_before_convergence_does_not_match():  # oracle 7 (negative)
    kern, X, y, Z = problem(n=25, m=4, classification=True)
    hp, sites, value_grad = _energy_fn(kern, X, y, Z, 0.5)
    theta0 = hp.pack()
    sites.update()  # one sweep from tau = 0, far from the fixed point
    tau, nu = sites.tau.copy(), sites.nu.copy()
    grad = value_grad(theta0.copy(), converge=False)[1]
    d = np.random.default_rng(0).normal(size=theta0.size)
    e = 1e-5
    vals = []
    for s in (1, -1):
        sites.tau[:], sites.nu[:] = tau, nu
        vals.append(value_grad(theta0 + s * e * d, converge=False)[0])
    fd = (vals[0] - vals[1]) / (2 * e)
    assert abs(grad @ d - fd) > 1e-3 * abs(fd)


def test_small_alpha_energy_approaches_hensman_elbo():  # oracle 9
    kern, X, y, Z = problem(n=25, m=5, classification=True)
    sites = _sites(kern, X, y, Z, 0.5)
    sites.run(50)  # arbitrary (non-fixed-point) sites
    tau, nu = sites.tau.copy(), sites.nu.copy()
    m, V = sites.posterior().q_u()
    elbo = hensman_elbo(PROBIT, y, kern, X, Z, m, V)
    gaps = []
    for a in (0.0, 1e-3, 1e-4):
        s = _sites(kern, X, y, Z, a)
        s.tau[:], s.nu[:] = tau, nu
        s._rebuild()
        gaps.append(abs(s.energy(with_gradients=False).value - elbo))
    assert gaps[0] < 1e-8
    assert gaps[2] < gaps[1] < 1e-1
    np.testing.assert_allclose(gaps[2] / gaps[1], 0.1, rtol=0.1)


def test_minibatch_estimator_averages_to_full_energy():  # oracle 13
    kern, X, y, Z = problem(n=30, m=5, classification=True)
    sites = _sites(kern, X, y, Z, 0.5)
    sites.run(20)
    hp = HyperParameters(kern, None, Z)
    full = sites.energy()
    g_full = parameter_gradient(hp, X, full.gradients)
    batches = np.array_split(np.random.default_rng(0).permutation(30), 3)
    vals, grads = [], []
    for b in batches:
        out = sites.energy(b)
        vals.append(out.value)
        grads.append(parameter_gradient(hp, X[b], out.gradients))
    np.testing.assert_allclose(np.mean(vals), full.value, rtol=1e-12)
    np.testing.assert_allclose(np.mean(grads, axis=0), g_full, rtol=1e-10, atol=1e-12)


def test_per_point_alpha_equals_scalar():  # oracle 14
    kern, X, y, Z = problem(n=20, m=4, classification=True)
    a = _sites(kern, X, y, Z, 0.4)
    b = _sites(kern, X, y, Z, np.full(20, 0.4))
    a.run(2000, tol=1e-11)
    b.run(2000, tol=1e-11)
    np.testing.assert_allclose(a.energy().value, b.energy().value, rtol=1e-12)


def test_stochastic_variant_and_bad_input():
    kern, X, y, _ = problem(n=60, classification=True)
    est = GPClassifier(method="pep", M=6, kernel=kern, batch_size=20, max_iter=15,
                       random_state=0, method_options={"alpha": 0.5, "n_sweeps": 2}).fit(X, y)
    assert est.score(X, y) > 0.7
    assert len(est.history_) == 15
    y3 = np.arange(60) % 3
    with pytest.raises(InputError, match="binary"):
        GPClassifier(method="pep", M=5).fit(X, y3)
    with pytest.raises(InputError, match="alpha"):
        GPClassifier(method="pep", M=5, method_options={"alpha": -0.1}).fit(X, y)
    with pytest.raises(InputError, match="regression only"):
        GPClassifier(method="pep", M=5, method_options={"blocks": [np.arange(60)]}).fit(X, y)


def test_stochastic_non_finite_gradient_is_a_numerical_error(monkeypatch):
    """A non-finite batch gradient stops the fit at its step, before Adam moves the
    hyper-parameters (the mini-batch schedule's ``check_step``), instead of going on with NaN."""
    from gpinfer_pep.method import _Classification

    kern, X, y, _ = problem(n=60, classification=True)
    original = _Classification.step
    calls = {"n": 0}

    def poisoned(self, batch):
        value, grad = original(self, batch)
        calls["n"] += 1
        return value, grad * np.nan if calls["n"] == 3 else grad

    monkeypatch.setattr(_Classification, "step", poisoned)
    with pytest.raises(NumericalError, match="pep batch energy gradient") as info:
        GPClassifier(method="pep", M=6, kernel=kern, batch_size=20, max_iter=5,
                     random_state=0, method_options={"n_sweeps": 1}).fit(X, y)
    assert info.value.iteration == 3


def test_logit_likelihood_and_gauss_hermite_option():
    kern, X, y, _ = problem(n=40, classification=True)
    for lik, options in (("logit", {"alpha": 1.0}),
                         ("probit", {"alpha": 0.5, "quadrature": "gauss-hermite"})):
        est = GPClassifier(method="pep", M=5, kernel=kern, likelihood=lik, max_iter=3,
                           random_state=0, method_options=options).fit(X, y)
        assert np.isfinite(est.log_evidence_) and est.score(X, y) > 0.7


def test_converge_step_full_reaches_the_power_step_fixed_point_in_fewer_sweeps():
    """Running the sites to ``tol`` with the full step (the default ``converge_step``) ends at
    the fixed point of the power-step iteration (spec §2.6), in fewer sweeps for small alpha."""
    kern, X, y, Z = problem(n=40, classification=True)

    def fit(step):
        return GPClassifier(method="pep", M=Z, kernel=kern, likelihood="probit", optimize=False,
                            random_state=0,
                            method_options={"alpha": 0.2, "tol": 1e-10, "max_sweeps": 3000,
                                            "converge_step": step}).fit(X, y)

    fast, slow = fit("full"), fit(None)
    assert fast.history_[0]["sweeps"] < 0.5 * slow.history_[0]["sweeps"]
    assert fast.log_evidence_ == pytest.approx(slow.log_evidence_, rel=1e-8)
    np.testing.assert_allclose(fast.fit_result_.state["tau"], slow.fit_result_.state["tau"],
                               rtol=1e-7, atol=1e-10)
    with pytest.raises(InputError, match="converge_step"):
        GPClassifier(method="pep", method_options={"converge_step": "half"}).fit(X, y)


@pytest.mark.parametrize("method", ["vfe", "fitc"])
def test_fit_on_duplicated_rows_converges_every_evaluation(method, recwarn):
    """Issue 27: 30 distinct rows, each twice, M = 50 (every distinct row an inducing input).
    vfe's sites oscillated at the variances L-BFGS-B tried (12 evaluations stopped at 500
    sweeps, 17 698 sweeps and 51 s of CPU in all); now every evaluation converges."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=30) > 0).astype(int)
    est = GPClassifier(method=method, M=50, random_state=0).fit(np.vstack([X, X]),
                                                                  np.tile(y, 2))
    stuck = [str(w.message) for w in recwarn if "did not converge" in str(w.message)]
    assert not stuck, stuck
    assert max(h["sweeps"] for h in est.history_) < 500
    assert np.mean(est.predict(X) == y) > 0.8


def test_optimizer_for_names_the_optimiser_fit_runs():
    # gpinfer-run tags optimizer.applied from it: with mini-batches fit ran Adam for the
    # default optimizer=lbfgs group while the run said lbfgs, applied
    from gpinfer_pep.method import FITC, VFE, PowerEP

    for cls in (PowerEP, FITC, VFE):
        assert cls.optimizer_for({"optimizer": None}, None) == "lbfgs"
        assert cls.optimizer_for({"optimizer": "lbfgs"}, None) == "lbfgs"
        assert cls.optimizer_for({"optimizer": None}, 20) == "adam"
        assert cls.optimizer_for({"optimizer": "lbfgs"}, 20) == "adam"
        assert cls.optimizer_for({"optimizer": "adadelta"}, 20) == "adadelta"
        assert cls.optimizer_for({"optimizer": "adam"}, None) == "adam"
