"""``gpinfer_jj.quadratic``: the Jaakkola-Jordan and Taylor quadratic sites and the collapsed
bound (spec jj-taylor-svi §2; tests T1-T10, T14), against pointwise bounds, the exact ELBO,
the dense Gibbs-MacKay and Laplace references and finite differences. Moved here from the
vi-jj plugin's tests: they test the core."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_jj.quadratic import (
    CollapsedBound,
    inducing_factors,
    jj_coefficients,
    jj_lambda,
    marginals,
    site_elbo,
    taylor_coefficients,
)
from scipy.linalg import cholesky
from scipy.special import expit, log_expit
from scipy.stats import multivariate_normal

from gpinfer.errors import NumericalError
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.testing.gradcheck import assert_gradient_close, numerical_gradient

RNG = np.random.default_rng(7)


def _svi_elbo():
    """The svi plugin's uncollapsed ELBO module, the oracle of these bounds (skips without it)."""
    return pytest.importorskip("gpinfer_svi.variational",
                               reason="the svi plugin's uncollapsed ELBO is the oracle")


def _logistic_gh(s):
    """The logistic expectation (100-node Gauss-Hermite, the likelihood's default ELBO rule)
    for signs ``s [B]``, as an ``ExpectationFn`` on ``[B, 1]`` columns."""
    return _svi_elbo().likelihood_expectation(BernoulliLogit(),
                                              (np.asarray(s) > 0).astype(np.int64))


def _problem_matrices(n=40, m=7, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    Z = X[:m] + 0.1
    s = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    k = RBF(lengthscale=1.2, variance=1.5) + White(0.05)
    return X, Z, s, k, k.K(Z), k.K(Z, X), k.K_diag(X)


def _coef(kind, xi, s):
    return jj_coefficients(xi, s) if kind == "jj" else taylor_coefficients(xi, s, LOGISTIC)


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


def _exact_elbo(Kuu, Kuf, Kd, s, mu, Sigma):
    fn = _logistic_gh(s)
    Lq = cholesky(Sigma, lower=True)
    return _svi_elbo().uncollapsed_elbo([Kuu], [Kuf], Kd[None], mu[None], Lq[None], fn).value


def test_t2_jj_elbo_below_exact_elbo_and_optimal_xi():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = inducing_factors(Kuu, Kuf, Kd)
    for _ in range(5):
        mu = RNG.normal(size=Z.shape[0])
        A = RNG.normal(size=(Z.shape[0],) * 2) * 0.3
        Sigma = A @ A.T + 0.1 * np.eye(Z.shape[0])
        xi = RNG.uniform(0.01, 3.0, X.shape[0])
        J = site_elbo(fac, jj_coefficients(xi, s), mu, Sigma)
        assert J <= _exact_elbo(Kuu, Kuf, Kd, s, mu, Sigma) + 1e-8
        # optimal xi^2 = m^2 + S^2 for fixed q; perturbing it lowers J
        mean, var = marginals(fac, mu, Sigma)
        xi_opt = np.sqrt(mean**2 + var)
        J_opt = site_elbo(fac, jj_coefficients(xi_opt, s), mu, Sigma)
        assert J_opt >= J
        for _ in range(3):
            pert = xi_opt * np.exp(0.1 * RNG.normal(size=xi.size))
            assert site_elbo(fac, jj_coefficients(pert, s), mu, Sigma) < J_opt


def test_t10_exact_elbo_at_vi_jj_posterior_above_bound():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = inducing_factors(Kuu, Kuf, Kd)
    for _ in range(3):
        b = CollapsedBound(fac, jj_coefficients(RNG.uniform(0.1, 3, X.shape[0]), s))
        assert _exact_elbo(Kuu, Kuf, Kd, s, b.mu_hat, b.Sigma_hat) >= b.value - 1e-10


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t3_closed_form_is_the_maximiser(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = inducing_factors(Kuu, Kuf, Kd)
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
    fn = _logistic_gh(np.ones(1))
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


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t5_matrix_gradients(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=12, m=4)
    coef = _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s)
    G = CollapsedBound(inducing_factors(Kuu, Kuf, Kd), coef).matrix_gradients()

    def f_uu(K):
        return CollapsedBound(inducing_factors(0.5 * (K + K.T), Kuf, Kd), coef).value

    assert_gradient_close(f_uu, G.Kuu, Kuu, rtol=1e-5, atol=1e-7, name="dF/dKuu")
    assert_gradient_close(lambda K: CollapsedBound(inducing_factors(Kuu, K, Kd), coef).value,
                          G.Kuf, Kuf, rtol=1e-5, atol=1e-7, name="dF/dKuf")
    assert_gradient_close(lambda K: CollapsedBound(inducing_factors(Kuu, Kuf, K), coef).value,
                          G.Kff_diag, Kd, rtol=1e-5, atol=1e-7, name="dF/dKff_diag")


def test_t5_xi_gradient_including_series_branch_and_large_xi():
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=20, m=5)
    fac = inducing_factors(Kuu, Kuf, Kd)
    xi = RNG.uniform(0.1, 3, X.shape[0])
    xi[:3] = [2e-4, -5e-4, 9e-4]
    xi[3] = 50.0
    b = CollapsedBound(fac, jj_coefficients(xi, s))
    num = numerical_gradient(lambda x: CollapsedBound(fac, jj_coefficients(x, s)).value, xi,
                             eps=1e-5)
    np.testing.assert_allclose(b.xi_gradient(), num, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t6_pseudo_data_identity(kind):
    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices(n=30, m=6)
    coef = _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s)
    F = CollapsedBound(inducing_factors(Kuu, Kuf, Kd), coef).value
    t = coef.beta / (2 * coef.gamma)
    D = 1 / (2 * coef.gamma)
    Q = Kuf.T @ np.linalg.solve(Kuu, Kuf)
    Kt = Kd - np.diag(Q)
    ref = (multivariate_normal(np.zeros(t.size), Q + np.diag(D)).logpdf(t) - 0.5 * np.sum(Kt / D)
           + np.sum(coef.c + coef.gamma * t**2 + 0.5 * np.log(np.pi / coef.gamma)))
    assert F == pytest.approx(ref, abs=1e-9)


def _full_matrices(n=10, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    s = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    K = RBF(lengthscale=1.0, variance=2.0).K(X) + 1e-3 * np.eye(n)
    return K, s


def test_t7_m_equals_n_matches_dense_gibbs_mackay_and_t9_monotone():
    K, s = _full_matrices()
    n = s.size
    fac = inducing_factors(K, K, np.diag(K).copy())
    mean, var = marginals(fac, np.zeros(n), np.eye(n))
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
    permuted = CollapsedBound(inducing_factors(K, K[:, perm], np.diag(K)[perm]),
                              jj_coefficients(xi[perm], s[perm])).value
    assert flipped == pytest.approx(b.value, abs=1e-10)
    assert permuted == pytest.approx(b.value, abs=1e-10)


def test_t8_taylor_m_equals_n_is_laplace():
    K, s = _full_matrices()
    n = s.size
    fac = inducing_factors(K, K, np.diag(K).copy())
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


def test_t14_edge_cases():
    lam, dlam = jj_lambda(np.array([0.0, 800.0, -800.0, 1e-4]))
    assert lam[0] == 0.125 and dlam[0] == 0.0
    assert np.all(np.isfinite(lam)) and np.all(np.isfinite(dlam))
    with pytest.raises(NumericalError, match="Kuu"):
        inducing_factors(np.full((3, 3), np.nan), np.zeros((3, 4)), np.ones(4))


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_closed_form_kl_matches_dense_kl(kind):
    """``CollapsedBound.kl`` (whitened, no data pass) equals the dense Gaussian KL of
    ``(mu_hat, Sigma_hat)`` against ``N(0, Kuu)``."""
    from gpinfer_jj.quadratic import gaussian_kl

    X, Z, s, k, Kuu, Kuf, Kd = _problem_matrices()
    fac = inducing_factors(Kuu, Kuf, Kd)
    b = CollapsedBound(fac, _coef(kind, RNG.uniform(-2, 2, X.shape[0]), s))
    assert b.kl() == pytest.approx(gaussian_kl(fac.L, b.mu_hat, b.Sigma_hat), rel=1e-10)


def test_factors_are_the_inducing_geometry_and_release_makes_them_unusable():
    """jj's factors are the one inducing geometry over one latent (``L``, ``A = L^-1 Kuf``
    stored row-major in ``work``, ``s = Kt``); ``release`` drops the data-sized arrays and the
    closed-form link (a later read fails); ``InducingFactors`` works one release, deprecated."""
    import gpinfer_jj.quadratic as quadratic

    from gpinfer.sites.stacked import StackedTerms

    _, _, s, _, Kuu, Kuf, Kd = _problem_matrices(12, 5)
    work = np.empty((12, 5))
    fac = inducing_factors(Kuu, Kuf, Kd, work=work)
    assert isinstance(fac, StackedTerms) and np.shares_memory(fac.A_T, work)
    assert fac.A_T.flags.c_contiguous and fac.A_T.shape == (12, 5)  # row-major, in ``work``
    np.testing.assert_allclose(fac.L @ fac.A, Kuf, atol=1e-12)
    np.testing.assert_allclose(fac.s, np.maximum(Kd - np.sum(fac.A**2, axis=0), 0.0))
    b = CollapsedBound(fac, jj_coefficients(np.ones(12), s))
    mean, var = marginals(fac, b.mu_hat, b.Sigma_hat)  # the bound's own q(u): its marginals
    assert mean is b.m_hat and var is b.S2_hat
    quadratic.release(fac)
    assert fac.A is None and fac.Kuf is None
    with pytest.raises((TypeError, AttributeError)):
        marginals(fac, b.mu_hat, b.Sigma_hat)
    with pytest.warns(DeprecationWarning, match="inducing_factors"):
        assert quadratic.InducingFactors is inducing_factors
