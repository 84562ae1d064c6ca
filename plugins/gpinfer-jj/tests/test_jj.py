"""Oracles T1-T10, T14 of spec jj-taylor-svi §7 for the collapsed JJ / Taylor bounds, and the
methods vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_jj.bound import CollapsedObjective
from gpinfer_jj.method import ViJJ, ViJJFull, ViJJHybrid, ViTaylor
from scipy.linalg import cholesky
from scipy.special import expit, log_expit
from scipy.stats import multivariate_normal

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, Matern52, White
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.sites.quadratic import (
    CollapsedBound,
    InducingFactors,
    jj_coefficients,
    jj_lambda,
    site_elbo,
    taylor_coefficients,
)
from gpinfer.sites.variational import binary_expectation, uncollapsed_elbo
from gpinfer.testing import MethodTestSuite
from gpinfer.testing.gradcheck import assert_gradient_close, numerical_gradient

RNG = np.random.default_rng(7)


def _problem_matrices(n=40, m=7, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    Z = X[:m] + 0.1
    s = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    k = RBF(lengthscale=1.2, variance=1.5) + White(0.05)
    return X, Z, s, k, k.K(Z), k.K(Z, X), k.K_diag(X)


def _coef(kind, xi, s):
    return jj_coefficients(xi, s) if kind == "jj" else taylor_coefficients(xi, s, LOGISTIC)


# -- T1 ----------------------------------------------------------------------------------------
def test_t1_jj_pointwise_bound_and_tightness():
    t = np.linspace(-20, 20, 4001)
    for xi in [0.01, 0.5, 1.0, 3.0, 10.0]:
        lam, _ = jj_lambda(np.array([xi]))
        h = t / 2 - xi / 2 + log_expit(xi) - lam[0] * (t**2 - xi**2)
        gap = log_expit(t) - h
        assert gap.min() >= -1e-12
        for tt in (xi, -xi):
            lam_t = lam[0]
            h_t = tt / 2 - xi / 2 + log_expit(xi) - lam_t * (tt**2 - xi**2)
            assert abs(log_expit(tt) - h_t) < 1e-12
    # the paper's printed lambda = tanh(xi)/(4 xi) violates the bound by ~0.07 at xi = 1
    lam_bad = np.tanh(1.0) / 4.0
    h_bad = t / 2 - 0.5 + log_expit(1.0) - lam_bad * (t**2 - 1.0)
    assert (log_expit(t) - h_bad).min() < -0.06
    assert jj_lambda(np.array([1.0]))[0][0] != pytest.approx(lam_bad)


# -- T2, T10 -----------------------------------------------------------------------------------
def _exact_elbo(Kuu, Kuf, Kd, s, mu, Sigma):
    fn = binary_expectation(LOGISTIC, s, 100)
    Lq = cholesky(Sigma, lower=True)
    return uncollapsed_elbo([Kuu], [Kuf], Kd[None], mu[None], Lq[None], fn).value


def test_t2_jj_elbo_below_exact_elbo_and_optimal_xi():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = InducingFactors(Kuu, Kuf, Kd)
    for _ in range(5):
        mu = RNG.normal(size=Z.shape[0])
        A = RNG.normal(size=(Z.shape[0],) * 2) * 0.3
        Sigma = A @ A.T + 0.1 * np.eye(Z.shape[0])
        xi = RNG.uniform(0.01, 3.0, X.shape[0])
        J = site_elbo(fac, jj_coefficients(xi, s), mu, Sigma)
        assert J <= _exact_elbo(Kuu, Kuf, Kd, s, mu, Sigma) + 1e-8
        # optimal xi^2 = m^2 + S^2 for fixed q; perturbing it lowers J
        mean, var = fac.marginals(mu, Sigma)
        xi_opt = np.sqrt(mean**2 + var)
        J_opt = site_elbo(fac, jj_coefficients(xi_opt, s), mu, Sigma)
        assert J_opt >= J
        for _ in range(3):
            pert = xi_opt * np.exp(0.1 * RNG.normal(size=xi.size))
            assert site_elbo(fac, jj_coefficients(pert, s), mu, Sigma) < J_opt


def test_t10_exact_elbo_at_vi_jj_posterior_above_bound():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = InducingFactors(Kuu, Kuf, Kd)
    for _ in range(3):
        b = CollapsedBound(fac, jj_coefficients(RNG.uniform(0.1, 3, X.shape[0]), s))
        assert _exact_elbo(Kuu, Kuf, Kd, s, b.mu_hat, b.Sigma_hat) >= b.value - 1e-10


# -- T3 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t3_closed_form_is_the_maximiser(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = InducingFactors(Kuu, Kuf, Kd)
    coef = _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s)
    b = CollapsedBound(fac, coef)
    mu, Sigma = b.mu_hat, b.Sigma_hat
    J = site_elbo(fac, coef, mu, Sigma)
    assert J == pytest.approx(b.value, abs=1e-10)
    A = np.linalg.solve(Kuu, Kuf)
    Kinv = np.linalg.inv(Kuu)
    P = (A * coef.gamma) @ A.T
    g_mu = A @ coef.beta - (Kinv + 2 * P) @ mu
    g_S = -P - 0.5 * Kinv + 0.5 * np.linalg.inv(Sigma)
    assert np.linalg.norm(g_mu) <= 1e-8 * np.linalg.norm(A @ coef.beta)
    assert np.linalg.norm(g_S) <= 1e-8 * np.linalg.norm(Kinv)
    for _ in range(3):
        assert site_elbo(fac, coef, mu + 0.05 * RNG.normal(size=mu.size), Sigma) < J
        E = 0.05 * RNG.normal(size=Sigma.shape)
        assert site_elbo(fac, coef, mu, Sigma + E @ E.T) < J
    # the paper's dense (inverse-based) form of eq. (14)
    Bm = Kuu + 2 * (Kuf * coef.gamma) @ Kuf.T
    kb = Kuf @ coef.beta
    Kt = Kd - np.sum(Kuf * (Kinv @ Kuf), axis=0)
    dense = (np.sum(coef.c) + 0.5 * kb @ np.linalg.solve(Bm, kb)
             + 0.5 * np.linalg.slogdet(Kuu)[1] - 0.5 * np.linalg.slogdet(Bm)[1]
             - coef.gamma @ Kt)
    assert dense == pytest.approx(b.value, abs=1e-9)


# -- T4 ----------------------------------------------------------------------------------------
def test_t4_taylor_matches_log_likelihood_to_second_order():
    xi = np.array([-2.0, -0.3, 0.0, 0.7, 3.0])
    for sign in (1.0, -1.0):
        s = np.full(xi.size, sign)
        c = taylor_coefficients(xi, s, LOGISTIC)
        val = c.c + c.beta * xi - c.gamma * xi**2
        np.testing.assert_allclose(val, log_expit(s * xi), atol=1e-14)
        np.testing.assert_allclose(c.beta - 2 * c.gamma * xi, s * expit(-s * xi), atol=1e-14)
        np.testing.assert_allclose(-2 * c.gamma, -expit(xi) * expit(-xi), atol=1e-14)
    # O(S^4) error of the expectation at xi = m = 0.7
    errs = []
    fn = binary_expectation(LOGISTIC, np.ones(1), 100)
    for S in [0.4, 0.2, 0.1, 0.05]:
        c = taylor_coefficients(np.array([0.7]), np.ones(1), LOGISTIC)
        surrogate = c.c + c.beta * 0.7 - c.gamma * (0.7**2 + S**2)
        exact = fn(np.array([[0.7]]), np.array([[S**2]]))[0]
        errs.append(abs(exact - surrogate)[0])
    slopes = np.diff(np.log(errs)) / np.diff(np.log([0.4, 0.2, 0.1, 0.05]))
    assert np.all((slopes > 3.7) & (slopes < 4.3))
    # not a bound: at m = 3, S = 1.5 the surrogate exceeds the exact expectation
    c = taylor_coefficients(np.array([3.0]), np.ones(1), LOGISTIC)
    surrogate = c.c + c.beta * 3.0 - c.gamma * (9.0 + 2.25)
    exact = fn(np.array([[3.0]]), np.array([[2.25]]))[0][0]
    assert surrogate[0] - exact == pytest.approx(0.0169, abs=5e-4)


# -- T5 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t5_matrix_gradients(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=12, m=4)
    coef = _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s)
    G = CollapsedBound(InducingFactors(Kuu, Kuf, Kd), coef).matrix_gradients()

    def f_uu(K):
        return CollapsedBound(InducingFactors(0.5 * (K + K.T), Kuf, Kd), coef).value

    assert_gradient_close(f_uu, G.Kuu, Kuu, rtol=1e-5, atol=1e-7, name="dF/dKuu")
    assert_gradient_close(lambda K: CollapsedBound(InducingFactors(Kuu, K, Kd), coef).value,
                          G.Kuf, Kuf, rtol=1e-5, atol=1e-7, name="dF/dKuf")
    assert_gradient_close(lambda K: CollapsedBound(InducingFactors(Kuu, Kuf, K), coef).value,
                          G.Kff_diag, Kd, rtol=1e-5, atol=1e-7, name="dF/dKff_diag")


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t5_theta_gradient_through_kernel_vjp_with_noise(kind):
    X, Z, s, k, *_ = _problem_matrices(n=30, m=6)
    lik = BernoulliLogit()
    hp = HyperParameters(k, Z=Z, optimize_inducing=True)
    obj = CollapsedObjective(kind, X, s, k, Z, lik, hp)
    xi = RNG.uniform(0.2, 2, X.shape[0])
    theta0 = hp.pack()
    assert_gradient_close(lambda t: obj.value_and_grad(t, xi)[0],
                          obj.value_and_grad(theta0, xi)[1], theta0, rtol=1e-5, atol=1e-6,
                          name=f"{kind} dF/d(log theta, Z)")


def test_t5_xi_gradient_including_series_branch_and_large_xi():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=20, m=5)
    fac = InducingFactors(Kuu, Kuf, Kd)
    xi = RNG.uniform(0.1, 3, X.shape[0])
    xi[:3] = [2e-4, -5e-4, 9e-4]
    xi[3] = 50.0
    b = CollapsedBound(fac, jj_coefficients(xi, s))
    num = numerical_gradient(lambda x: CollapsedBound(fac, jj_coefficients(x, s)).value, xi,
                             eps=1e-5)
    np.testing.assert_allclose(b.xi_gradient(), num, rtol=1e-5, atol=1e-8)


# -- T6 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t6_pseudo_data_identity(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=30, m=6)
    coef = _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s)
    F = CollapsedBound(InducingFactors(Kuu, Kuf, Kd), coef).value
    t = coef.beta / (2 * coef.gamma)
    D = 1 / (2 * coef.gamma)
    Q = Kuf.T @ np.linalg.solve(Kuu, Kuf)
    Kt = Kd - np.diag(Q)
    ref = (multivariate_normal(np.zeros(t.size), Q + np.diag(D)).logpdf(t) - 0.5 * np.sum(Kt / D)
           + np.sum(coef.c + coef.gamma * t**2 + 0.5 * np.log(np.pi / coef.gamma)))
    assert F == pytest.approx(ref, abs=1e-9)


# -- T7, T8, T9 --------------------------------------------------------------------------------
def _full_matrices(n=10, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    s = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    K = RBF(lengthscale=1.0, variance=2.0).K(X) + 1e-3 * np.eye(n)
    return K, s


def test_t7_m_equals_n_matches_dense_gibbs_mackay_and_t9_monotone():
    K, s = _full_matrices()
    n = s.size
    fac = InducingFactors(K, K, np.diag(K).copy())
    mean, var = fac.marginals(np.zeros(n), np.eye(n))
    values = []
    for _ in range(120):
        b = CollapsedBound(fac, jj_coefficients(np.sqrt(mean**2 + var), s))
        values.append(b.value)
        mean, var = b.m_hat, b.S2_hat
    assert np.all(np.diff(values) >= -1e-10)  # T9: monotone fixed-point iteration
    xi = np.sqrt(mean**2 + var)
    b = CollapsedBound(fac, jj_coefficients(xi, s))
    np.testing.assert_allclose(b.xi_gradient(), 0.0, atol=1e-8)
    # dense reference
    xi_d = np.ones(n)
    for _ in range(120):
        lam = jj_lambda(xi_d)[0]
        V = np.linalg.inv(np.linalg.inv(K) + 2 * np.diag(lam))
        f = 0.5 * V @ s
        xi_d = np.sqrt(f**2 + np.diag(V))
    lam = jj_lambda(xi_d)[0]
    V = np.linalg.inv(np.linalg.inv(K) + 2 * np.diag(lam))
    f = 0.5 * V @ s
    c = jj_coefficients(xi_d, s).c
    ref = np.sum(c) + s @ V @ s / 8 - 0.5 * np.linalg.slogdet(np.eye(n) + 2 * lam[:, None] * K)[1]
    np.testing.assert_allclose(b.mu_hat, f, atol=1e-9)
    np.testing.assert_allclose(b.Sigma_hat, V, atol=1e-9)
    assert b.value == pytest.approx(ref, abs=1e-9)
    # T9: even in xi, invariant to permuting data points
    perm = np.random.default_rng(0).permutation(n)
    flipped = CollapsedBound(fac, jj_coefficients(-xi, s)).value
    permuted = CollapsedBound(InducingFactors(K, K[:, perm], np.diag(K)[perm]),
                              jj_coefficients(xi[perm], s[perm])).value
    assert flipped == pytest.approx(b.value, abs=1e-10)
    assert permuted == pytest.approx(b.value, abs=1e-10)


def test_t8_taylor_m_equals_n_is_laplace():
    K, s = _full_matrices()
    n = s.size
    fac = InducingFactors(K, K, np.diag(K).copy())
    xi = np.zeros(n)
    for _ in range(50):
        xi = CollapsedBound(fac, taylor_coefficients(xi, s, LOGISTIC)).m_hat
    b = CollapsedBound(fac, taylor_coefficients(xi, s, LOGISTIC))
    f = np.zeros(n)  # Newton for the Laplace mode (R&W Alg. 3.1)
    for _ in range(50):
        W = expit(f) * expit(-f)
        g = s * expit(-s * f)
        f = np.linalg.solve(np.linalg.inv(K) + np.diag(W), W * f + g)
    W = expit(f) * expit(-f)
    sw = np.sqrt(W)
    ref = (-0.5 * f @ np.linalg.solve(K, f) + np.sum(log_expit(s * f))
           - 0.5 * np.linalg.slogdet(np.eye(n) + sw[:, None] * K * sw)[1])
    np.testing.assert_allclose(b.m_hat, f, atol=1e-9)
    np.testing.assert_allclose(b.Sigma_hat, np.linalg.inv(np.linalg.inv(K) + np.diag(W)),
                               atol=1e-8)
    assert b.value == pytest.approx(ref, abs=1e-9)


# -- T14 ---------------------------------------------------------------------------------------
def test_t14_edge_cases():
    lam, dlam = jj_lambda(np.array([0.0, 800.0, -800.0, 1e-4]))
    assert lam[0] == 0.125 and dlam[0] == 0.0
    assert np.all(np.isfinite(lam)) and np.all(np.isfinite(dlam))
    with pytest.raises(NumericalError, match="Kuu"):
        InducingFactors(np.full((3, 3), np.nan), np.zeros((3, 4)), np.ones(4))


def _method_problem(n=80, M=10, y=None, n_classes=2, max_iter=5, lik=None):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    y0 = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return Problem(X=X, y=y0 if y is None else y, n_classes=n_classes,
                   kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.01),
                   likelihood=lik or BernoulliLogit(), inducing=M, max_iter=max_iter)


def test_bad_input_errors():
    with pytest.raises(InputError, match="binary"):
        ViJJ().fit(_method_problem(y=np.arange(80) % 3, n_classes=3))
    with pytest.raises(InputError, match="both classes|binary"):
        ViJJ().fit(_method_problem(y=np.zeros(80, dtype=np.int64)))
    with pytest.raises(InputError, match="1..N"):
        ViJJ().fit(_method_problem(M=81))
    with pytest.raises(InputError, match="logistic"):
        ViJJ().fit(_method_problem(lik=BernoulliProbit()))
    with pytest.raises(ValueError, match="unknown option"):
        ViJJ(foo=1)


def test_non_finite_bound_is_a_clear_error(monkeypatch):
    def bad(self, theta, xi, with_xi=False):
        return float("nan"), np.zeros(theta.size + (xi.size if with_xi else 0))

    monkeypatch.setattr(CollapsedObjective, "value_and_grad", bad)
    with pytest.raises(NumericalError, match="not finite|nan"):
        ViJJ().fit(_method_problem())


def test_abnormal_lbfgs_end_is_reported(monkeypatch):
    original = CollapsedObjective.value_and_grad

    def wrong_gradient(self, theta, xi, with_xi=False):
        value, grad = original(self, theta, xi, with_xi)
        return value, -grad  # an ascent direction that is not: the line search fails

    monkeypatch.setattr(CollapsedObjective, "value_and_grad", wrong_gradient)
    seen = []
    with pytest.warns(RuntimeWarning, match="abnormally"):
        result = ViJJ(maxfun=60).fit(_method_problem(max_iter=2), callback=seen.append)
    assert int(result.state["lbfgs_abnormal"]) >= 1
    assert seen[-1].extra["lbfgs_abnormal"] >= 1
    assert any("ABNORMAL" in str(m) for m in result.state["lbfgs_messages"])


@pytest.mark.parametrize("cls", [ViJJ, ViTaylor, ViJJHybrid, ViJJFull])
def test_t13_methods_learn_and_report(cls):
    seen = []
    result = cls().fit(_method_problem(n=120, M=12, max_iter=5), callback=seen.append)
    assert seen and [i.iteration for i in seen] == list(range(1, len(seen) + 1))
    assert all(np.isfinite(i.objective) for i in seen)
    if cls is not ViJJFull:
        assert all(1 <= i.extra["nfev"] <= 25 for i in seen)
    X = _method_problem(n=120).X
    y = _method_problem(n=120).y
    acc = np.mean(np.argmax(result.posterior.predict_proba(X), axis=1) == y)
    assert acc > 0.85
    assert seen[-1].objective > seen[0].objective


def test_carry_xi_is_monotone_for_jj():
    seen = []
    ViJJ(carry="xi", tol=0.0).fit(_method_problem(n=80, M=8, max_iter=5), callback=seen.append)
    obj = [i.extra["stage1_bound"] for i in seen]
    assert np.all(np.diff(obj) >= -1e-8)


# -- the shared battery --------------------------------------------------------------------------
class _Suite(MethodTestSuite):
    likelihood = "logit"
    inducing = 6
    max_iter = 3
    kernel = "rbf"

    def objective_and_gradient(self, X, y):
        s = 2.0 * y - 1.0
        k = RBF(lengthscale=1.1, variance=1.4) + White(0.02)
        Z = X[:6] + 0.05
        hp = HyperParameters(k, Z=Z)
        obj = CollapsedObjective(self.kind, X, s, k, Z, BernoulliLogit(), hp)
        xi = np.linspace(0.2, 2.0, X.shape[0])
        return (lambda t: obj.value_and_grad(t, xi)[0],
                lambda t: obj.value_and_grad(t, xi)[1], hp.pack())


class TestViJJSuite(_Suite):
    method_name = "vi-jj"
    kind = "jj"


class TestViTaylorSuite(_Suite):
    method_name = "vi-taylor"
    kind = "taylor"
    permutation_atol = 1e-3


class TestViJJHybridSuite(_Suite):
    method_name = "vi-jj-hybrid"
    kind = "jj"


class TestViJJFullSuite(_Suite):
    method_name = "vi-jj-full"
    kind = "jj"


# -- the cached-distance kernel path used when Z is fixed ---------------------------------------


@pytest.mark.parametrize("kernel", [
    RBF(lengthscale=1.3, variance=0.7) + White(0.05),
    RBF(lengthscale=[0.8, 1.7], variance=1.4),
    White(0.1) + RBF(lengthscale=0.9, variance=2.0) + White(0.2),
    Matern52(lengthscale=1.1, variance=1.0) + White(0.1),  # generic fallback
])
def test_fixed_input_covariances_match_kernel_and_vjp(kernel):
    from gpinfer.hyper import HyperParameters, parameter_gradient
    from gpinfer.inducing import FixedInputCovariances
    from gpinfer.interfaces import MatrixGradients

    rng = np.random.default_rng(11)
    X, Z = rng.normal(size=(30, 2)) + 4.0, rng.normal(size=(6, 2)) + 4.0
    cov = FixedInputCovariances(kernel, Z, X)
    assert cov.fast is not any(isinstance(p, Matern52) for p in getattr(kernel, "parts", []))
    hp = HyperParameters(kernel, Z=Z, optimize_inducing=False)
    for cols in (None, np.array([2, 5, 11, 29])):
        Xb = X if cols is None else X[cols]
        Kuu, Kuf, Kd = cov.matrices(cols)
        np.testing.assert_allclose(Kuu, kernel.K(Z), atol=1e-14)
        np.testing.assert_allclose(Kuf, kernel.K(Z, Xb), atol=1e-14)
        np.testing.assert_allclose(Kd, kernel.K_diag(Xb), atol=1e-14)
        G = MatrixGradients(Kff_diag=rng.normal(size=len(Xb)), Kuf=rng.normal(size=Kuf.shape),
                            Kuu=(lambda A: A + A.T)(rng.normal(size=(6, 6))))
        np.testing.assert_allclose(cov.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag, cols),
                                   parameter_gradient(hp, Xb, G), rtol=1e-12, atol=1e-12)
