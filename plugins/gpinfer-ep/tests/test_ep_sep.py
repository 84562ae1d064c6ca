"""Sparse multi-class EP / SEP: the oracles of spec ep-sep §6 and behaviour of the fit loop."""

from __future__ import annotations

import time

import numpy as np
import pytest
from ep_helpers import (
    InducingSuite,
    converge,
    dense_ep_log_z,
    frozen_surrogate,
    hyper,
    problem,
    subset_check,
    u_space_cavities,
)
from gpinfer_ep.method import EP, SEP
from gpinfer_ep.model import all_terms
from gpinfer_ep.state import RankOneSites, TiedSites
from scipy.special import ndtr
from sklearn.exceptions import ConvergenceWarning

from gpinfer.errors import InputError, NumericalError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import FitResult, Problem
from gpinfer.likelihoods.bernoulli import BernoulliProbit
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.posterior import AveragedPosterior
from gpinfer.sites.inducing import new_role_site, pair_tilted
from gpinfer.testing import assert_gradient_close
from gpinfer.testing.method_suite import make_suite_data

STATES = {"ep": RankOneSites, "sep": TiedSites}


def _state(name, y, C, M):
    return STATES[name](y, C, M)


def _evaluate(state, kernels, Zs, X, idx=None, scale=1.0):
    idx = np.arange(X.shape[0]) if idx is None else idx
    return state.evaluate(all_terms(kernels, Zs, X[idx]), idx, scale)


# -- O1 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ep", "sep"])
def test_zero_sites_give_prior_and_half_per_factor(name):
    X, y, kernels, Zs = problem()
    value, _ = _evaluate(_state(name, y, 3, 4), kernels, Zs, X)
    assert value == pytest.approx(12 * 2 * np.log(0.5), abs=1e-12)


# -- O2 / O4 ----------------------------------------------------------------------------------
def test_ep_log_z_matches_dense_brute_force():
    X, y, kernels, Zs = problem()
    state = RankOneSites(y, 3, 4)
    terms = all_terms(kernels, Zs, X)
    for _ in range(3):  # unconverged, damped: arbitrary valid sites
        state.update(terms, np.arange(12), 0.5)
    value, _ = state.evaluate(terms, np.arange(12))
    assert value == pytest.approx(dense_ep_log_z(state, kernels, Zs, X), abs=1e-9)


def test_ep_fixed_point_matches_tilted_moments():
    """O4: at convergence an undamped sweep moves nothing, and q's projection on each
    direction equals the tilted moments (checked through log Z_q = dense value)."""
    X, y, kernels, Zs = problem()
    state = RankOneSites(y, 3, 4)
    converge(state, kernels, Zs, X)
    assert state.update(all_terms(kernels, Zs, X), np.arange(12), 1.0) < 1e-10


def test_damping_does_not_move_fixed_points():
    """O18: converged log Z_q is the same for damping 0.3 and 0.7."""
    X, y, kernels, Zs = problem()
    out = []
    for rho in (0.3, 0.7):
        state = RankOneSites(y, 3, 4)
        converge(state, kernels, Zs, X, rho=rho)
        out.append(_evaluate(state, kernels, Zs, X)[0])
    assert out[0] == pytest.approx(out[1], abs=1e-9)


# -- O5 / O6: gradients -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ep", "sep"])
def test_gradient_is_exact_for_the_frozen_cavity_surrogate(name):
    """O6 (any state): kernel parameters, inducing inputs and the noise of every class."""
    X, y, kernels, Zs = problem(seed=1)
    state = _state(name, y, 3, 4)
    terms = all_terms(kernels, Zs, X)
    for _ in range(4):
        state.update(terms, np.arange(12), 0.5)
    hp = hyper(kernels, Zs)
    theta0 = hp.pack()
    _, grads = _evaluate(state, kernels, hp.Z, X)
    analytic = hp.gradient(X, grads)
    Lam, h, cav = u_space_cavities(state, kernels, hp.Z, X)

    def f(theta):
        hp.unpack(theta)
        return frozen_surrogate(kernels, hp.Z, X, y, Lam, h, cav)

    assert_gradient_close(f, analytic, theta0, eps=1e-6, rtol=1e-5, atol=1e-7,
                          name=f"{name} frozen-cavity gradient")
    names = hp.names
    assert any("White" in n or "white" in n for n in names)  # the noise is checked too


def test_ep_gradient_matches_converged_evidence():
    """O5: FD of the re-converged EP log Z_q through the kernel VJP (all hyper-parameters)."""
    X, y, kernels, Zs = problem(N=10, C=3, M=3, seed=2)
    state = RankOneSites(y, 3, 3)
    hp = hyper(kernels, Zs)
    converge(state, kernels, hp.Z, X)
    theta0 = hp.pack()
    analytic = hp.gradient(X, _evaluate(state, kernels, hp.Z, X)[1])

    def f(theta):
        hp.unpack(theta)
        converge(state, kernels, hp.Z, X, rho=0.9)
        return _evaluate(state, kernels, hp.Z, X)[0]

    subset_check(hp, theta0, f, analytic, "EP converged-evidence gradient",
                 eps=1e-5, rtol=1e-5, atol=1e-7)


# -- O9 / O10: SEP vs EP ----------------------------------------------------------------------
@pytest.mark.parametrize("N, C", [(1, 2), (5, 2), (5, 3)])
def test_sep_equals_ep_when_tying_loses_nothing(N, C):
    X1, _, kernels, Zs = problem(N=4, C=C, M=3, seed=3, shared=True)
    X = np.repeat(X1[:1], N, axis=0)
    y = np.zeros(N, dtype=np.int64)
    values = []
    for name in ("ep", "sep"):
        state = _state(name, y, C, 3)
        converge(state, kernels, Zs, X)
        values.append(_evaluate(state, kernels, Zs, X)[0])
    assert values[0] == pytest.approx(values[1], abs=1e-10)
    if N == 1:
        assert values[0] == pytest.approx(np.log(0.5), abs=1e-10)


def test_sep_close_to_ep_predictions():
    X, y = make_suite_data(3, n=60, seed=4)
    P = [GPClassifier(method=m, M=10, max_iter=20, random_state=0).fit(X, y).predict_proba(X)
         for m in ("ep", "sep")]
    diff = np.abs(P[0] - P[1])
    assert diff.max() < 0.05 and diff.mean() < 0.01


# -- O14: C = 2 ---------------------------------------------------------------------------------
def test_two_classes_match_binary_probit():
    """O14 (a) predictive closed form; (c) the factor's tilted moments equal binary probit EP."""
    X, y = make_suite_data(2, n=30, seed=5)
    est = GPClassifier(method="sep", M=6, max_iter=10, random_state=0).fit(X, y)
    mean, var = est.predict_f(X)
    ref = ndtr((mean[:, 1] - mean[:, 0]) / np.sqrt(var.sum(axis=1)))
    np.testing.assert_allclose(est.predict_proba(X)[:, 1], ref, atol=1e-10)
    rng = np.random.default_rng(0)
    a_y, a_k = rng.normal(size=20), rng.normal(size=20)
    b_y, b_k = 0.5 + np.exp(rng.normal(size=20)), 0.5 + np.exp(rng.normal(size=20))
    t = pair_tilted(a_y, b_y, a_k, b_k, np.ones(20, bool))
    # binary probit Phi(f) integrates N(f | a_y - a_k, var) against Phi: total variance var + 1
    probit = BernoulliProbit().tilted(np.ones(20, np.int64), a_y - a_k, b_y + b_k - 1.0)
    np.testing.assert_allclose(t.log_z, probit.log_z, atol=1e-12)
    np.testing.assert_allclose(t.g_win, probit.dlogz_dmean, atol=1e-12)
    np.testing.assert_allclose(t.g_b, probit.dlogz_dvar, atol=1e-12)


# -- O16: label permutation ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ep", "sep"])
def test_permuting_labels_with_their_hyper_parameters(name):
    X, y, kernels, Zs = problem(seed=6)
    perm = np.array([2, 0, 1])  # class c becomes perm[c]
    inv = np.argsort(perm)
    out = []
    for yy, kk, zz in ((y, kernels, Zs), (perm[y], [kernels[c] for c in inv],
                                         [Zs[c] for c in inv])):
        state = _state(name, yy, 3, 4)
        converge(state, kk, zz, X)
        value, grads = _evaluate(state, kk, zz, X)
        out.append((value, grads, state))
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-10)
    for c in range(3):
        np.testing.assert_allclose(out[0][1][c].Kuf, out[1][1][perm[c]].Kuf, atol=1e-10)
        np.testing.assert_allclose(out[0][2].h[c], out[1][2].h[perm[c]], atol=1e-10)


# -- O19: tails ---------------------------------------------------------------------------------
def test_site_updates_stay_finite_in_the_tails():
    alpha = np.array([-40.0, 40.0, -1e4, -1e3])
    z = np.array([1.0, 2.0, 0.5, 3.0])
    t = pair_tilted(alpha * np.sqrt(z), 0.5 * z, 0.0 * z, 0.5 * z, np.ones(4, bool))
    C1, C2 = new_role_site(t.g_win, t.gamma, alpha * np.sqrt(z), 0.25 * z)
    for a in (*t, C1, C2):
        assert np.all(np.isfinite(a))
    assert np.all(C1 > 0)


def test_far_wrong_side_points_give_finite_fit():
    """A mislabelled point deep inside another class, tiny noise, large amplitude."""
    X, y = make_suite_data(3, n=45, seed=7)
    X[0] = 3.0 * X[y == 1].mean(axis=0)
    y[0] = 0
    for m in ("ep", "sep"):
        est = GPClassifier(method=m, M=10, max_iter=15, random_state=0,
                           method_options={"noise": 1e-6}).fit(X, y)
        assert np.all(np.isfinite(est.predict_proba(X)))
        assert all(np.isfinite(h["objective"]) for h in est.history_)


# -- O17: mini-batches --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ep", "sep"])
def test_minibatch_estimates_are_unbiased(name):
    X, y, kernels, Zs = problem(N=12, seed=8)
    state = _state(name, y, 3, 4)
    terms = all_terms(kernels, Zs, X)
    for _ in range(3):
        state.update(terms, np.arange(12), 0.5)
    full_v, full_g = _evaluate(state, kernels, Zs, X)
    parts = [np.arange(0, 6), np.arange(6, 12)]
    vals, kuf = [], np.zeros_like(full_g[1].Kuf)
    kuu = np.zeros_like(full_g[1].Kuu)
    for idx in parts:
        v, g = _evaluate(state, kernels, Zs, X, idx, scale=2.0)
        vals.append(v)
        kuf[:, idx] += g[1].Kuf / 2.0
        kuu += g[1].Kuu / 2.0
    assert np.mean(vals) == pytest.approx(full_v, abs=1e-10)
    np.testing.assert_allclose(kuu, full_g[1].Kuu, atol=1e-10)
    np.testing.assert_allclose(kuf, full_g[1].Kuf, atol=1e-10)


@pytest.mark.parametrize("name", ["ep", "sep"])
def test_minibatch_training_runs_and_predicts(name):
    X, y = make_suite_data(3, n=60, seed=9)
    est = GPClassifier(method=name, M=8, max_iter=5, batch_size=20, random_state=0,
                       method_options={"adam_learning_rate": 0.01}).fit(X, y)
    assert est.n_iter_ == 5
    assert (est.predict(X) != y).mean() < 0.4
    np.testing.assert_allclose(est.predict_proba(X).sum(axis=1), 1.0, atol=1e-8)


@pytest.mark.parametrize("name", ["ep", "sep"])
@pytest.mark.parametrize("batch_size", [None, 20])
def test_class_threads_give_bitwise_identical_fits(name, batch_size):
    """``n_jobs = 2`` runs the classes on threads; every class is computed as in the loop, so
    hyper-parameters, objectives and predictions agree exactly."""
    X, y = make_suite_data(4, n=60, seed=13)
    fits = [GPClassifier(method=name, M=6, max_iter=4, batch_size=batch_size, random_state=0,
                         method_options={"n_jobs": n_jobs}).fit(X, y) for n_jobs in (1, 2)]
    np.testing.assert_array_equal(fits[0].fit_result_.state["theta"],
                                  fits[1].fit_result_.state["theta"])
    assert [h["objective"] for h in fits[0].history_] == [h["objective"] for h in fits[1].history_]
    np.testing.assert_array_equal(fits[0].predict_proba(X), fits[1].predict_proba(X))


def test_class_threads_reraise_a_failed_update(monkeypatch):
    """A failure inside a worker thread (the per-class kernel VJPs run on ``n_jobs`` threads)
    reaches the failure policy as in the serial loop. (Threads serve the per-latent kernel
    path, taken when the classes' kernel families differ; forced here.)"""
    import threading

    from gpinfer import hyper
    from gpinfer.kernels.stacked import StackedKernels

    monkeypatch.setattr(StackedKernels, "of", classmethod(lambda cls, kernels: None))

    X, y = make_suite_data(3, n=30, seed=10)
    original = hyper._latent_gradients
    calls = {"n": 0, "threads": set()}

    def flaky(kern, X_, Z, G, latent, need_Z=True):
        calls["threads"].add(threading.current_thread().name)
        if latent == 1:
            calls["n"] += 1
            if calls["n"] == 3:
                raise NumericalError("injected in class 1", quantity="cavity")
        return original(kern, X_, Z, G, latent, need_Z)

    monkeypatch.setattr(hyper, "_latent_gradients", flaky)
    est = GPClassifier(method="ep", M=5, max_iter=5, random_state=0,
                       method_options={"n_jobs": 2}).fit(X, y)
    assert est.history_[-1]["failures"] == 1.0
    assert any(name.startswith("gpinfer") for name in calls["threads"])
    with pytest.raises(InputError, match="n_jobs"):
        GPClassifier(method="sep", M=5, max_iter=2, method_options={"n_jobs": 0}).fit(X, y)


def test_time_limit_and_elapsed_leave_out_the_callback():
    """Test metrics computed in the callback are not training time (spec jj-taylor-svi P19):
    a callback sleeping 0.2 s an iteration must not trip a 0.5 s training budget."""
    X, y = make_suite_data(3, n=30, seed=10)
    t0 = time.perf_counter()
    est = GPClassifier(method="sep", M=5, max_iter=10, random_state=0,
                       method_options={"time_limit_s": 0.5}).fit(
        X, y, callback=lambda info: time.sleep(0.2))
    wall = time.perf_counter() - t0
    assert est.n_iter_ == 10
    assert est.history_[-1]["elapsed"] < wall - 1.8


# -- failure policy and bad input ---------------------------------------------------------------
def test_failed_update_is_restored_and_reported(monkeypatch):
    X, y = make_suite_data(3, n=30, seed=10)
    original = TiedSites.update
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            # assigned, not written in place: sep keeps its sums whitened and Lam is formed
            # from them on read (a write into that array would not reach the next step)
            self.Lam = np.full_like(self.Lam, np.nan)
            raise NumericalError("injected", quantity="cavity")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TiedSites, "update", flaky)
    est = GPClassifier(method="sep", M=5, max_iter=6, random_state=0).fit(X, y)
    last = est.history_[-1]
    assert last["failures"] == 1.0
    assert np.all(np.isfinite(est.predict_proba(X)))
    assert last["damping"] < 0.5 * 0.99 ** 4  # halved once, decayed per iteration


def test_first_iteration_failure_is_fatal(monkeypatch):
    def broken(self, *args, **kwargs):
        raise NumericalError("injected", quantity="cavity")

    monkeypatch.setattr(TiedSites, "update", broken)
    X, y = make_suite_data(3, n=30, seed=10)
    with pytest.raises(NumericalError, match="sep: the first update failed"):
        GPClassifier(method="sep", M=5, max_iter=3, random_state=0).fit(X, y)


def test_rejects_noisy_likelihood_and_M_above_N():
    X, y = make_suite_data(3, n=30, seed=11)
    problem_ = Problem(X=X, y=y, n_classes=3, kernel=GPClassifier()._build_kernel(2),
                       likelihood=ArgmaxNoise(1.0), inducing=5)
    with pytest.raises(InputError, match="argmax"):
        SEP().fit(problem_)
    with pytest.raises(InputError, match="exceeds"):  # the core refuses M > N clearly
        GPClassifier(method="ep", M=50, max_iter=2, random_state=0).fit(X, y)
    good = Problem(X=X, y=y, n_classes=3, kernel=GPClassifier()._build_kernel(2),
                   likelihood=ArgmaxNoise(), inducing=50, max_iter=2)
    with pytest.raises(InputError, match="1..N=30"):  # direct use: the same core rule
        EP().fit(good)
    with pytest.raises(InputError, match="schedule"):
        EP(schedule="sideways").fit(good)


def test_outer_schedule_increases_the_evidence():
    X, y = make_suite_data(3, n=30, seed=12)
    est = GPClassifier(method="ep", M=6, max_iter=8, random_state=0,
                       method_options={"schedule": "outer", "outer_tol": 1e-6}).fit(X, y)
    objective = [h["objective"] for h in est.history_]
    assert objective[-1] > objective[0]


# -- the shared battery -------------------------------------------------------------------------
class _Suite(InducingSuite):
    max_iter = 8
    permutation_atol = 1e-6

    def objective_and_gradient(self, X, y):
        """The frozen-cavity surrogate (spec O6) on a sub-problem with per-class kernels."""
        X, y = X[:12], y[:12]
        _, _, kernels, Zs = problem(N=12, C=3, M=4, seed=13)
        Zs = [X[:4] + 0.05 * (c + 1) for c in range(3)]
        state = _state(self.method_name, y, 3, 4)
        terms = all_terms(kernels, Zs, X)
        for _ in range(3):
            state.update(terms, np.arange(12), 0.5)
        hp = hyper(kernels, Zs)
        theta0 = hp.pack()
        Lam, h, cav = u_space_cavities(state, kernels, hp.Z, X)

        def value(theta):
            hp.unpack(theta)
            return frozen_surrogate(kernels, hp.Z, X, y, Lam, h, cav)

        def gradient(theta):
            hp.unpack(theta)
            return hp.gradient(X, _evaluate(state, kernels, hp.Z, X)[1])

        return value, gradient, theta0


class TestEPSuite(_Suite):
    method_name = "ep"


class TestSEPSuite(_Suite):
    method_name = "sep"


def test_unseen_label_at_prediction_is_an_error():
    X, y = make_suite_data(3, n=30, seed=14)
    est = GPClassifier(method="sep", M=5, max_iter=3, random_state=0).fit(X, y)
    with pytest.raises(InputError, match="class indices"):
        est.posterior_.log_predictive(X[:3], np.array([0, 1, 3]))


@pytest.mark.parametrize("batch_size", [None, 10])
def test_optimiser_steps_in_log_squared_lengthscale(monkeypatch, batch_size):
    """Spec §2.9: the step sizes act on ``log l`` with ``l = ell^2``. With a unit gradient in the
    kernels' coordinates the first sign-adaptive step moves ``log ell`` by ``lr / 4`` and every
    other entry by ``lr``; Adam's first step moves them by ``lr / 2`` and ``lr``."""
    from gpinfer.training.loop import TrainingLoop

    X, y = make_suite_data(3, n=20, seed=4)
    seen = {}

    def fixed_gradient(self, batch, rho):
        seen.setdefault("theta0", self.hp.pack().copy())
        seen["names"] = list(self.hp.names)
        return -1.0, np.ones(self.hp.size), 0.0

    monkeypatch.setattr(TrainingLoop, "_step", fixed_gradient)
    lr = 0.01 if batch_size is None else 0.001
    est = GPClassifier(method="sep", M=4, max_iter=1, batch_size=batch_size, random_state=0,
                       method_options={"learning_rate": 0.01, "adam_learning_rate": 0.001},
                       baseline_failure="warn")  # the scripted step fits nothing, by design
    with pytest.warns(ConvergenceWarning, match="no better than"):
        est.fit(X, y)
    n_steps = 1 if batch_size is None else 2  # 20 points in batches of 10
    step = est.fit_result_.state["theta"] - seen["theta0"]
    is_ell = np.array(["lengthscale" in n for n in seen["names"]])
    assert is_ell.any() and (~is_ell).any()
    ell_factor = 0.25 if batch_size is None else 0.5
    np.testing.assert_allclose(step[is_ell], n_steps * ell_factor * lr, rtol=1e-6)
    np.testing.assert_allclose(step[~is_ell], n_steps * lr, rtol=1e-6)


def test_falling_log_zq_restores_the_best_state(monkeypatch):
    """Divergence policy: ``patience`` iterations below the best log Z_q (not necessarily falling
    in a row) restore the sites and hyper-parameters of the best, and halve damping and steps."""
    from gpinfer.training.loop import TrainingLoop

    X, y = make_suite_data(3, n=30, seed=10)
    scripted = [-50, -40, -30, -20, -10, -12, -11, -13, 0, 1, 2, 3]  # best at iteration 5
    seen = []
    original = TrainingLoop._step

    def scripted_step(self, batch, rho):
        seen.append((self.hp.pack().copy(), self.sites.state.Lam.copy()))
        value, grad, change = original(self, batch, rho)
        return float(scripted[self.iteration - 1]), grad, change

    monkeypatch.setattr(TrainingLoop, "_step", scripted_step)
    est = GPClassifier(method="sep", M=5, max_iter=10, random_state=0,
                       method_options={"patience": 3}).fit(X, y)
    raises = [h["damping_raises"] for h in est.history_]
    assert raises == [0.0] * 7 + [1.0] * 3  # three iterations below -10: iteration 8
    np.testing.assert_array_equal(seen[8][0], seen[4][0])  # hyper-parameters of iteration 5
    np.testing.assert_array_equal(seen[8][1], seen[5][1])  # sites as iteration 5 left them
    assert not np.array_equal(seen[8][0], seen[7][0])
    assert est.history_[7]["damping"] < 0.5 * est.history_[6]["damping"]


# -- refine: the tied sites at fixed hyper-parameters (early stopping's refine_iter) ------------


def _sep_problem(max_iter, optimize=True, inducing=6):
    rng = np.random.default_rng(4)
    y = np.arange(45) % 3
    X = rng.normal(size=(45, 2)) + 2.0 * np.stack([np.cos(2.1 * y), np.sin(2.1 * y)], axis=1)
    return Problem(X=X, y=y.astype(np.int64), n_classes=3,
                   kernel=GPClassifier()._build_kernel(2), likelihood=ArgmaxNoise(),
                   inducing=inducing, max_iter=max_iter, optimize=optimize)


def test_sep_refine_holds_the_hyper_parameters_and_continues_from_the_sites():
    """Kernel parameters and Z stay bit-identical; the sites start where the fit left them
    (zero refinement sweeps would be the fit: one sweep moves them by less than a sweep from
    zero sites would)."""
    fitted = SEP().fit(_sep_problem(30))
    refined = SEP().refine(_sep_problem(40), fitted)
    for a, b in zip(refined.posterior.kernels, fitted.posterior.kernels):
        np.testing.assert_array_equal(a.get_unconstrained(), b.get_unconstrained())
    for a, b in zip(refined.posterior.Z, fitted.posterior.Z):
        np.testing.assert_array_equal(a, b)
    one = SEP().refine(_sep_problem(1), fitted)
    fresh = {**fitted.state, "site_Lam": 0 * fitted.state["site_Lam"],
             "site_h": 0 * fitted.state["site_h"]}
    cold = SEP().refine(_sep_problem(1), FitResult(fitted.posterior, 0.0, fitted.kernel, 1,
                                                   state=fresh))
    moved = np.abs(one.state["site_h"] - fitted.state["site_h"]).max()
    assert moved < 0.5 * np.abs(cold.state["site_h"] - fitted.state["site_h"]).max()
    with pytest.raises(InputError, match="sep.refine needs a fit of sep"):
        SEP().refine(_sep_problem(1), FitResult(AveragedPosterior([fitted.posterior]), 0.0,
                                                fitted.kernel, 1))


def test_sep_refine_reaches_the_fixed_hyper_parameter_fixed_point_of_a_fit_from_zero_sites():
    """The limiting case: at fixed hyper-parameters (``optimize=False``) SEP's damped sweeps
    converge to one fixed point; refining a short fit reaches the sites of a long fit from
    zero sites (no damping decay: the same damping in both)."""
    Z = _sep_problem(1).X[::8]  # the same inducing inputs for both fits
    short = SEP(damping_decay=1.0).fit(_sep_problem(5, optimize=False, inducing=Z))
    refined = SEP(damping_decay=1.0).refine(_sep_problem(300, optimize=False, inducing=Z), short)
    long = SEP(damping_decay=1.0).fit(_sep_problem(305, optimize=False, inducing=Z))
    np.testing.assert_allclose(refined.state["site_Lam"], long.state["site_Lam"], atol=1e-7)
    np.testing.assert_allclose(refined.state["site_h"], long.state["site_h"], atol=1e-7)


def test_the_sites_of_a_sep_posterior_give_it_back():
    """``tied_sites_of`` inverts the posterior's site algebra: the state holding the sites
    recovered from a fitted posterior builds that posterior again (a refine from an iterate,
    e.g. an averaged fold model, starts from its own q(u))."""
    from gpinfer_ep.method import tied_sites_of

    fitted = SEP().fit(_sep_problem(20))
    sites = tied_sites_of(fitted.posterior, _sep_problem(1).X[:1])
    np.testing.assert_allclose(sites["Lam"], fitted.state["site_Lam"], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(sites["h"], fitted.state["site_h"], rtol=1e-6, atol=1e-8)
