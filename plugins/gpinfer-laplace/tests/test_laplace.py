"""Laplace approximation: sklearn oracle, spec reference values, gradients, fit behaviour."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gpinfer_laplace.evidence import LaplaceEvidence
from gpinfer_laplace.method import Laplace
from gpinfer_laplace.sites import LaplaceSites
from sklearn.datasets import load_breast_cancer

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import FitResult, IterationInfo, Problem
from gpinfer.kernels import RBF, Matern52
from gpinfer.likelihoods.bernoulli import BernoulliLogit, BernoulliProbit
from gpinfer.testing import MethodTestSuite, assert_gradient_close

LIKELIHOODS = {"logit": BernoulliLogit, "probit": BernoulliProbit}


def _breast_cancer(n: int | None = None):
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    if n is not None:
        idx = np.random.default_rng(0).permutation(len(y))[:n]
        X, y = X[idx], y[idx]
    return X, y.astype(np.int64)


def _mode(kernel, X, y, lik, tol=1e-13, alpha0=None) -> LaplaceSites:
    sites = LaplaceSites(kernel.K(X), y, lik, tol=tol, max_newton=200, alpha0=alpha0,
                         kernel=kernel, X=X)
    sites.run()
    assert sites.converged
    return sites


# --------------------------------------------------------------------------------------------
# Oracle: scikit-learn's GaussianProcessClassifier (logistic Laplace, GPML Alg. 3.1/3.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("c, ell", [(1.0, 5.0), (50.0, 8.0)])
def test_matches_sklearn_on_breast_cancer(c, ell):
    """Fixed hyper-parameters, all 569 points: log ML and mode agree with sklearn to 1e-6.

    (Measured: |delta log ML| <= 1e-11, max |delta f| <= 1e-12.)
    """
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF as SkRBF
    from sklearn.gaussian_process.kernels import ConstantKernel

    X, y = _breast_cancer()
    sk_kernel = ConstantKernel(c, "fixed") * SkRBF(ell, "fixed")
    base = GaussianProcessClassifier(kernel=sk_kernel, optimizer=None).fit(X, y).base_estimator_
    problem = Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=ell, variance=c),
                      likelihood=BernoulliLogit(), optimize=False)
    result = Laplace(newton_tol=1e-12).fit(problem)
    d_lml = abs(result.log_evidence - base.log_marginal_likelihood_value_)
    d_f = np.max(np.abs(result.state["f_hat"] - base.f_cached))
    assert d_lml < 1e-6, d_lml
    assert d_f < 1e-6, d_f
    assert bool(result.state["newton_converged"])


# --------------------------------------------------------------------------------------------
# Reference values of the spec (binary §7.6, §7.7, §7.3)
# --------------------------------------------------------------------------------------------

TOY_REGIMES = [  # (ln ell, ln sigma_f, ln Z_LA, LA m_1, LA V_11), spec §7.6, probit
    (0.0, 1.5, -1.69500, 1.75522, 4.67356),
    (1.0, 1.5, -2.08577, 1.38972, 3.05879),
    (2.5, 1.5, -2.83329, 0.32280, 1.05937),
    (0.0, 0.0, -1.40720, 0.49989, 0.66052),
    (1.0, 0.0, -1.60563, 0.26610, 0.58288),
    (2.5, 0.0, -1.78284, 0.02087, 0.45214),
    (0.0, -1.5, -1.38692, 0.03783, 0.04828),
    (1.0, -1.5, -1.40409, 0.01639, 0.04778),
    (2.5, -1.5, -1.41620, 0.00106, 0.04690),
]


@pytest.mark.parametrize("ln_ell, ln_sf, lnz, m1, v11", TOY_REGIMES)
def test_two_point_toy_reference_values(ln_ell, ln_sf, lnz, m1, v11):
    X = np.array([[np.sqrt(2.0)], [-np.sqrt(2.0)]])
    y = np.array([1, 0])
    kern = RBF(lengthscale=np.exp(ln_ell), variance=np.exp(2 * ln_sf))
    sites = _mode(kern, X, y, BernoulliProbit())
    assert sites.log_evidence() == pytest.approx(lnz, abs=1e-4)
    assert sites.f[0] == pytest.approx(m1, abs=1e-4)
    assert sites.f[1] == pytest.approx(-sites.f[0], abs=1e-10)  # symmetry
    assert sites.algebra.posterior_var_diag()[0] == pytest.approx(v11, abs=1e-4)


N10_ROWS = [  # (likelihood, ln ell, ln sigma_f, ln Z_LA), spec §7.7
    ("probit", 0.0, 0.0, -6.2517),
    ("probit", 0.0, 2.0, -7.8254),
    ("probit", 1.0, 3.0, -9.1070),
    ("logit", 0.0, 0.0, -6.4578),
    ("logit", 0.0, 2.0, -7.4435),
    ("logit", 1.0, 3.0, -8.1115),
]


@pytest.mark.parametrize("lik, ln_ell, ln_sf, lnz", N10_ROWS)
def test_n10_reference_values(lik, ln_ell, ln_sf, lnz):
    X = np.linspace(-3, 3, 10)[:, None]
    y = (X[:, 0] > 0).astype(np.int64)
    y[3] = 1  # the outlier at x = -1
    kern = RBF(lengthscale=np.exp(ln_ell), variance=np.exp(2 * ln_sf))
    sites = _mode(kern, X, y, LIKELIHOODS[lik]())
    assert sites.log_evidence() == pytest.approx(lnz, abs=1e-3)


def test_single_point_probit_below_exact_evidence():
    """n = 1: exact ln Z = -ln 2; LA is below it (spec §7.3 item 10: k=100 gives -0.296)."""
    X = np.zeros((1, 1))
    for k, expected in [(100.0, -0.296), (1.0, None)]:
        sites = _mode(RBF(lengthscale=1.0, variance=k), X, np.array([1]), BernoulliProbit())
        gap = sites.log_evidence() + np.log(2.0)
        assert gap < 0.0
        if expected is not None:
            assert gap == pytest.approx(expected, abs=1e-3)


# --------------------------------------------------------------------------------------------
# Mode and gradient
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lik", ["logit", "probit"])
def test_stationarity_and_label_symmetry(lik):
    X, y = _breast_cancer(120)
    kern = RBF(lengthscale=4.0, variance=5.0)
    sites = _mode(kern, X, y, LIKELIHOODS[lik]())
    assert sites.stationarity() < 1e-8
    flipped = _mode(kern, X, 1 - y, LIKELIHOODS[lik]())
    assert flipped.log_evidence() == pytest.approx(sites.log_evidence(), abs=1e-9)
    np.testing.assert_allclose(flipped.alpha, -sites.alpha, atol=1e-8)


def _value_and_gradient(kernel, X, y, lik):
    """``(value(theta), gradient(theta), theta0)`` of log Z_LA over the kernel's log-parameters."""
    hp = HyperParameters(kernel)
    theta0 = hp.pack()
    alpha_hat = _mode(kernel, X, y, lik).alpha

    def value(theta):
        hp.unpack(theta)
        return LaplaceEvidence(with_gradient=False).evaluate(
            _mode(kernel, X, y, lik, alpha0=alpha_hat)).value

    def gradient(theta):
        hp.unpack(theta)
        return parameter_gradient(hp, X, LaplaceEvidence().evaluate(
            _mode(kernel, X, y, lik, alpha0=alpha_hat)).gradients)

    return value, gradient, theta0


@pytest.mark.parametrize("lik", ["logit", "probit"])
@pytest.mark.parametrize("kernel_name", ["rbf_ard", "matern52"])
def test_evidence_gradient_matches_finite_differences(kernel_name, lik):
    X, y = _breast_cancer(150)
    X = X[:, :8]
    if kernel_name == "rbf_ard":
        kern = RBF(lengthscale=np.linspace(1.5, 4.0, 8), variance=np.exp(2.0))  # ln sf = 1
    else:
        kern = Matern52(lengthscale=3.0, variance=np.exp(3.0))
    value, gradient, theta0 = _value_and_gradient(kern, X, y, LIKELIHOODS[lik]())
    assert_gradient_close(value, gradient(theta0), theta0, eps=1e-5, rtol=1e-5, atol=1e-6,
                          name=f"log Z_LA gradient ({kernel_name}, {lik})")


def test_implicit_term_matters():
    """Without the implicit term (pitfall P2) the gradient is wrong in a non-Gaussian regime."""
    X, y = _breast_cancer(80)
    X = X[:, :3]
    lik = BernoulliProbit()
    kern = RBF(lengthscale=2.0, variance=np.exp(3.0))
    sites = _mode(kern, X, y, lik)
    R = sites.algebra.R()
    explicit = 0.5 * np.outer(sites.alpha, sites.alpha) - 0.5 * R
    full = LaplaceEvidence().evaluate(sites).gradients.Kff
    g_exp = kern.grad_params(X, None, explicit)
    g_full = kern.grad_params(X, None, full)
    assert np.max(np.abs(g_exp - g_full)) > 1e-2 * np.max(np.abs(g_full))


# --------------------------------------------------------------------------------------------
# Sites behaviour
# --------------------------------------------------------------------------------------------


def test_warm_start_saves_newton_steps():
    X, y = _breast_cancer(100)
    kern = RBF(lengthscale=3.0, variance=4.0)
    sites = _mode(kern, X, y, BernoulliLogit(), tol=1e-10)
    cold = sites.n_steps
    kern.set_unconstrained(kern.get_unconstrained() + 0.01)
    sites.set_kernel_matrix(kern.K(X))
    sites.run()
    assert sites.converged and sites.n_steps < cold


def test_newton_steps_on_the_inner_schedule():
    """``run`` is the hand loop of steps to ``|Delta Psi| <= tol``; a step's first trial length
    is its ``damping``; ``restore`` returns to a snapshot's mode and ``Psi``."""
    X, y = _breast_cancer(40)
    K = RBF(lengthscale=3.0, variance=4.0).K(X)
    ran = LaplaceSites(K, y, BernoulliLogit(), tol=1e-10)
    steps = ran.run()
    hand, count = LaplaceSites(K, y, BernoulliLogit(), tol=1e-10), 0
    while True:
        count += 1
        if hand.update() <= 1e-10:
            break
    assert ran.converged and steps == count == ran.n_steps
    np.testing.assert_array_equal(ran.alpha, hand.alpha)
    assert ran.run() == 0
    full, half = LaplaceSites(K, y, BernoulliLogit()), LaplaceSites(K, y, BernoulliLogit())
    full.update(1.0)
    half.update(0.5)
    assert half.last_step_size == 0.5
    np.testing.assert_allclose(half.alpha, 0.5 * full.alpha, rtol=1e-12)
    snap, psi = full.snapshot(), full.psi
    full.update()
    full.restore(snap)
    np.testing.assert_array_equal(full.alpha, snap)
    assert full.psi == psi


def test_sites_errors():
    X, y = _breast_cancer(20)
    K = RBF(lengthscale=3.0, variance=4.0).K(X)
    sites = LaplaceSites(K, y, BernoulliLogit())
    with pytest.raises(InputError, match="mini-batch"):
        sites.update(batch=np.arange(3))
    with pytest.raises(InputError, match="mini-batch"):
        LaplaceEvidence().evaluate(sites, batch=np.arange(3))
    K[0, 1] = np.nan
    with pytest.raises(NumericalError, match="non-finite"):
        LaplaceSites(K, y, BernoulliLogit())
    with pytest.raises(NumericalError, match="Psi|latent"), np.errstate(all="ignore"):
        LaplaceSites(np.full((20, 20), 1e307), y, BernoulliLogit(), alpha0=np.ones(20))


# --------------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------------


def _problem(n=150, optimize=True, max_iter=15, lik="logit", y=None, n_classes=2):
    X, y0 = _breast_cancer(n)
    X = X[:, :5]
    return Problem(X=X, y=y0 if y is None else y, n_classes=n_classes,
                   kernel=RBF(lengthscale=1.0, variance=1.0), likelihood=LIKELIHOODS[lik](),
                   optimize=optimize, max_iter=max_iter)


def test_hyper_parameter_learning_increases_evidence():
    problem = _problem()
    initial = _mode(problem.kernel, problem.X, problem.y, problem.likelihood).log_evidence()
    seen: list[IterationInfo] = []
    result = Laplace().fit(problem, callback=seen.append)
    assert isinstance(result, FitResult)
    assert result.log_evidence > initial + 1.0
    assert [info.iteration for info in seen] == list(range(1, result.n_iter + 1))
    assert len(result.history) == result.n_iter >= 2
    objectives = [h["objective"] for h in result.history]
    assert all(b >= a - 1e-9 for a, b in zip(objectives, objectives[1:]))
    assert objectives[-1] == pytest.approx(result.log_evidence, abs=1e-8)
    assert {"newton_steps", "grad_norm"} <= set(seen[0].extra)
    # the problem's kernel is untouched; the fitted one moved
    assert problem.kernel.get_unconstrained() == pytest.approx([0.0, 0.0])
    assert not np.allclose(result.kernel.get_unconstrained(), 0.0)
    # the snapshot posterior of iteration 1 predicts with iteration-1 parameters
    mean1, _ = seen[0].posterior().predict_f(problem.X[:5])
    mean, var = result.posterior.predict_f(problem.X)
    np.testing.assert_allclose(mean[:, 0], result.state["f_hat"], atol=1e-8)
    assert np.all(var > 0) and not np.allclose(mean1[:, 0], mean[:5, 0])
    P = result.posterior.predict_proba(problem.X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert np.mean(np.argmax(P, axis=1) == problem.y) > 0.9
    # the fitted evidence's gradient is near zero when the optimiser converged
    if bool(result.state["optimizer_success"]) and result.n_iter < problem.max_iter:
        assert seen[-1].extra["grad_norm"] < 1e-2


def test_fixed_hyper_parameters_one_iteration_per_newton_step():
    problem = _problem(optimize=False, max_iter=100, lik="probit")
    seen: list[IterationInfo] = []
    result = Laplace().fit(problem, callback=seen.append)
    assert len(seen) == result.n_iter == len(result.history) >= 2
    assert result.kernel.get_unconstrained() == pytest.approx([0.0, 0.0])
    objs = [info.objective for info in seen]
    assert objs[-1] == pytest.approx(result.log_evidence)
    assert seen[-1].extra["delta_psi"] <= 1e-9
    assert bool(result.state["newton_converged"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Laplace().fit(_problem(optimize=False, max_iter=100))
    with pytest.warns(RuntimeWarning, match="did not converge"):
        Laplace().fit(_problem(optimize=False, max_iter=1))


def test_other_optimizer_and_options():
    result = Laplace(optimizer="adam", optimizer_options={"learning_rate": 0.05}).fit(
        _problem(n=60, max_iter=5))
    assert result.n_iter == 5
    with pytest.raises(ValueError, match="unknown option"):
        Laplace(newton_tolerance=1e-3)
    result = Laplace(optimizer_options={"bounds": (-0.5, 0.5)}).fit(_problem(n=60, max_iter=10))
    assert np.all(np.abs(result.kernel.get_unconstrained()) <= 0.5 + 1e-12)


def test_rejects_non_binary_labels():
    y = np.arange(150) % 3
    with pytest.raises(InputError, match="Multi-class methods"):
        Laplace().fit(_problem(y=y, n_classes=3))
    with pytest.raises(InputError, match="binary"):
        Laplace().fit(_problem(y=np.where(np.arange(150) % 2, 1, 2), n_classes=2))


def test_method_metadata_and_entry_point():
    from gpinfer import registry

    assert registry.load_method("laplace") is Laplace
    assert Laplace.tasks == ("classification",) and Laplace.likelihoods == ("logit", "probit")
    assert not Laplace.multiclass and not Laplace.uses_inducing_points
    assert not Laplace.supports_minibatch


# --------------------------------------------------------------------------------------------
# The shared method battery
# --------------------------------------------------------------------------------------------


class TestLaplaceSuite(MethodTestSuite):
    method_name = "laplace"
    likelihood = "logit"
    max_iter = 10

    def objective_and_gradient(self, X, y):
        kern = RBF(lengthscale=1.3, variance=np.exp(2.0))
        return _value_and_gradient(kern, X, y, BernoulliLogit())


class TestLaplaceSuiteProbit(TestLaplaceSuite):
    likelihood = "probit"

    def objective_and_gradient(self, X, y):
        kern = Matern52(lengthscale=[0.8, 1.5], variance=np.exp(3.0))
        return _value_and_gradient(kern, X, y, BernoulliProbit())
