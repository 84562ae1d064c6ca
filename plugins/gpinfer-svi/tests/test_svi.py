"""svi: oracles T5 (svi part), T11, T12 of spec jj-taylor-svi §7, multi-class gradients,
bad input, and the shared battery."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState
from scipy.integrate import quad
from scipy.special import log_expit

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit, RobustMax, Softmax
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.sites.quadratic import (
    CollapsedBound,
    InducingFactors,
    jj_coefficients,
    taylor_coefficients,
)
from gpinfer.sites.variational import (
    binary_expectation,
    natural_gradient_step,
    robustmax_expectation,
    softmax_expectation,
    uncollapsed_elbo,
)
from gpinfer.testing import MethodTestSuite
from gpinfer.testing.gradcheck import assert_gradient_close


def _state(lik, n=30, M=5, C=1, seed=0, learn_Z=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = rng.integers(0, max(C, 2), n).astype(float if C == 1 else np.int64)
    kernels = [RBF(lengthscale=1.0 + 0.2 * c, variance=1.3) + White(0.03) for c in range(C)]
    Z = X[:M] + 0.1
    hp = HyperParameters(kernels, Z=[Z] * C, optimize_inducing=learn_Z)
    st = VariationalState(X, y, lik, hp, C, M, 100)
    mu = rng.normal(size=(C, M)) * 0.5
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.2) + np.eye(M)
    return st, st.pack(mu, Lq)


@pytest.mark.parametrize("learn_Z", [True, False])
@pytest.mark.parametrize("lik", [BernoulliLogit(), BernoulliProbit()])
def test_t5_svi_gradients_binary(lik, learn_Z):
    """``learn_Z=False`` runs the cached-distance kernel path (``FixedInputCovariances``)."""
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


def test_t12_gauss_hermite_matches_adaptive_quadrature():
    fn = binary_expectation(LOGISTIC, np.ones(1), 100)
    for m in [-10.0, -1.0, 0.0, 2.5, 10.0]:
        for v in [0.01, 1.0, 10.0]:
            def integrand(f, m=m, v=v):
                return log_expit(f) * np.exp(-(f - m) ** 2 / (2 * v)) / np.sqrt(2 * np.pi * v)

            ref = quad(integrand, m - 40 * np.sqrt(v), m + 40 * np.sqrt(v),
                       epsabs=1e-13, epsrel=1e-12, limit=200)[0]
            E = fn(np.array([[m]]), np.array([[v]]))[0][0]
            assert E == pytest.approx(ref, rel=1e-8)
    E, dm, dv = fn(np.array([[0.7]]), np.array([[0.5]]))
    h = 1e-6
    num_m = (fn(np.array([[0.7 + h]]), np.array([[0.5]]))[0] - fn(np.array([[0.7 - h]]),
             np.array([[0.5]]))[0]) / (2 * h)
    num_v = (fn(np.array([[0.7]]), np.array([[0.5 + h]]))[0] - fn(np.array([[0.7]]),
             np.array([[0.5 - h]]))[0]) / (2 * h)
    assert dm[0, 0] == pytest.approx(num_m[0], rel=1e-6)
    assert dv[0, 0] == pytest.approx(num_v[0], rel=1e-6)


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
        st = VariationalState(X, y.astype(float), BernoulliLogit(), hp, 1, 5, 100)
        x0 = st.pack(np.full((1, 5), 0.1), np.eye(5)[None] * 0.8)
        return (lambda z: st.elbo(z, None)[0], lambda z: st.elbo(z, None)[1], x0)


# -- natural gradients and T7 (full-batch svi at m = n) ---------------------------------------


def _quadratic_expectation(coef):
    """Fixed quadratic sites ``c + beta f - gamma f^2`` as an svi expectation (conjugate)."""

    def fn(mean, var):
        m, v = mean[:, 0], var[:, 0]
        E = coef.c + coef.beta * m - coef.gamma * (m**2 + v)
        return E, (coef.beta - 2.0 * coef.gamma * m)[:, None], -coef.gamma[:, None]

    return fn


def _matrices(n=25, M=6, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    kern = RBF(lengthscale=1.1, variance=1.5) + White(0.05)
    Z = X[:M] + 0.05
    s = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return kern.K(Z), kern.K(Z, X), kern.K_diag(X), s


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_natural_gradient_unit_step_lands_on_closed_form_optimum(kind):
    """Conjugate case: fixed JJ / Taylor sites make the data term quadratic, so one natural
    step of size 1 from any ``q(u)`` gives the closed-form ``(mu_hat, Sigma_hat)`` of §2.5."""
    Kuu, Kuf, Kdiag, s = _matrices()
    xi = np.abs(np.random.default_rng(4).normal(size=s.size)) + 0.3
    coef = jj_coefficients(xi, s) if kind == "jj" else taylor_coefficients(xi, s, LOGISTIC)
    closed = CollapsedBound(InducingFactors(Kuu, Kuf, Kdiag), coef)
    rng = np.random.default_rng(5)
    M = Kuu.shape[0]
    mu, Lq = rng.normal(size=M), np.tril(rng.normal(size=(M, M)) * 0.3) + 2.0 * np.eye(M)
    fn = _quadratic_expectation(coef)
    est = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], Lq[None], fn)
    mu1, Lq1 = natural_gradient_step(mu, Lq, est.dmu[0], est.dSigma[0], 1.0)
    np.testing.assert_allclose(mu1, closed.mu_hat, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Lq1 @ Lq1.T, closed.Sigma_hat, rtol=1e-8, atol=1e-10)
    after = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu1[None], Lq1[None], fn)
    assert after.value == pytest.approx(closed.value, abs=1e-8)
    np.testing.assert_allclose(after.dmu, 0.0, atol=1e-8)
    np.testing.assert_allclose(after.dSigma, 0.0, atol=1e-8)


def test_dsigma_matches_finite_differences():
    Kuu, Kuf, Kdiag, s = _matrices(n=12, M=4)
    rng = np.random.default_rng(6)
    mu, Lq = rng.normal(size=4), np.tril(rng.normal(size=(4, 4)) * 0.3) + np.eye(4)
    fn = binary_expectation(LOGISTIC, s, 100)
    Sigma = Lq @ Lq.T
    est = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], Lq[None], fn)

    def value(S):
        L = np.linalg.cholesky(0.5 * (S + S.T))
        return uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], L[None], fn).value

    G = est.dSigma[0]
    for j, k in [(0, 0), (1, 2), (3, 1)]:
        E = np.zeros((4, 4))
        E[j, k] = E[k, j] = 1e-6
        fd = (value(Sigma + E) - value(Sigma - E)) / 2e-6
        assert fd == pytest.approx(G[j, k] + G[k, j] if j != k else G[j, j], rel=1e-5, abs=1e-7)


def _converged_svi(K, s, steps=200, step=0.7):
    """Full-batch svi at ``Z = X`` (``Kuu = Kuf = K``) by natural-gradient steps."""
    n = s.size
    fn = binary_expectation(LOGISTIC, s, 100)
    mu, Lq = np.zeros(n), np.linalg.cholesky(K)
    for _ in range(steps):
        est = uncollapsed_elbo([K], [K], np.diag(K)[None], mu[None], Lq[None], fn)
        mu, Lq = natural_gradient_step(mu, Lq, est.dmu[0], est.dSigma[0], step)
    est = uncollapsed_elbo([K], [K], np.diag(K)[None], mu[None], Lq[None], fn)
    return est


def _jj_converged(K, s):
    fac = InducingFactors(K, K, np.diag(K).copy())
    mean, var = fac.marginals(np.zeros(s.size), np.eye(s.size))
    for _ in range(200):
        b = CollapsedBound(fac, jj_coefficients(np.sqrt(mean**2 + var), s))
        mean, var = b.m_hat, b.S2_hat
    return b


def test_t7_vi_jj_below_full_batch_svi_below_log_marginal():
    """T7 (second part): at ``m = n``, ``Z = X``, ``J_hat <= max_q L(q) <= log p(y)``; ``n = 2``
    so that ``log p(y)`` is a 2-D Gauss-Hermite integral; plus ``n = 20`` for the first step."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(2, 1))
    K = (RBF(lengthscale=0.8, variance=2.0) + White(0.05)).K(X)
    s = np.array([1.0, -1.0])
    est = _converged_svi(K, s)
    np.testing.assert_allclose(est.dmu, 0.0, atol=1e-9)
    np.testing.assert_allclose(est.dSigma, 0.0, atol=1e-9)
    J = _jj_converged(K, s).value
    x, w = np.polynomial.hermite_e.hermegauss(120)
    w = w / w.sum()
    L = np.linalg.cholesky(K)
    F = L @ np.stack(np.meshgrid(x, x, indexing="ij")).reshape(2, -1)  # [2, K^2]
    log_py = np.log(np.exp(log_expit(s[:, None] * F).sum(axis=0)) @ np.outer(w, w).ravel())
    assert J < est.value < log_py
    assert log_py - est.value < 0.5  # sanity: the Gaussian VI gap is small here
    X = rng.normal(size=(20, 2))
    K = (RBF(lengthscale=1.0, variance=1.5) + White(0.05)).K(X)
    s = np.where(X[:, 0] + 0.3 * rng.normal(size=20) > 0, 1.0, -1.0)
    est = _converged_svi(K, s)
    np.testing.assert_allclose(est.dmu, 0.0, atol=1e-8)
    assert _jj_converged(K, s).value < est.value


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
    """``robustmax_expectation`` (Gauss-Hermite in ``f_y``) and the Monte-Carlo
    ``softmax_expectation`` against the likelihoods' accurate rules (equal variances: the
    robust-max integrand is smooth)."""
    rng = np.random.default_rng(9)
    B, C = 40, 4
    mean, var, y = rng.normal(size=(B, C)), np.full((B, C), 0.6), rng.integers(0, C, B)
    ref = RobustMax(1e-3).expected_log_prob(y, mean, var)
    E, dm, dv = robustmax_expectation(1e-3, y, 40)(mean, var)
    np.testing.assert_allclose(E, ref.value, atol=1e-7)
    np.testing.assert_allclose(dm, ref.dmean, atol=1e-6)
    np.testing.assert_allclose(dv, ref.dvar, atol=1e-6)
    ref = Softmax(gh_order=12).expected_log_prob(y[:5], mean[:5], var[:5])
    E, dm, dv = softmax_expectation(y[:5], 200_000, np.random.default_rng(0))(mean[:5], var[:5])
    np.testing.assert_allclose(E, ref.value, atol=5e-3)
    np.testing.assert_allclose(dm, ref.dmean, atol=5e-3)
    np.testing.assert_allclose(dv, ref.dvar, atol=5e-3)


def test_non_finite_elbo_is_a_clear_error(monkeypatch):
    """Bad input list of the issue: a non-finite bound during L-BFGS-B (and during stochastic
    steps) raises ``NumericalError`` naming it, never a silent NaN."""
    from gpinfer.errors import NumericalError

    def bad(self, x, batch):
        value, grad, est = original(self, x, batch)
        return float("nan"), grad, est

    original = VariationalState.estimate
    monkeypatch.setattr(VariationalState, "estimate", bad)
    with pytest.raises(NumericalError, match="nan"):
        SVI(optimizer="lbfgs").fit(_problem())
    with pytest.raises(NumericalError, match="svi ELBO"):
        SVI(optimizer="adam").fit(_problem(batch=20))


def test_abnormal_lbfgs_end_is_in_the_metrics(monkeypatch):
    original = VariationalState.estimate

    def wrong_gradient(self, x, batch):
        value, grad, est = original(self, x, batch)
        return value, -grad, est  # not an ascent direction: the line search fails

    monkeypatch.setattr(VariationalState, "estimate", wrong_gradient)
    seen = []
    with pytest.warns(RuntimeWarning, match="abnormally"):
        res = SVI(optimizer="lbfgs").fit(_problem(max_iter=20), callback=seen.append)
    assert seen[-1].extra["lbfgs_abnormal"] == 1.0
    assert not bool(res.state["lbfgs_success"])
    assert "ABNORMAL" in str(res.state["lbfgs_message"])
