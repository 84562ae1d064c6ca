"""Noise off ``Kuu`` (spec ep-sep P10, ``noise_in_Kuu = false``) and oracle O11b: at ``Z_c = X`` the
sparse EP is a naive dense EP with one ``N``-dimensional Gaussian per class."""

from __future__ import annotations

import numpy as np
import pytest
from ep_helpers import converge, hyper, subset_check
from gpinfer_ep.model import all_terms, class_kernels
from gpinfer_ep.noise import LatentNoise, latent_noise
from gpinfer_ep.state import RankOneSites
from scipy.linalg import solve_triangular
from scipy.special import log_ndtr, ndtr
from scipy.stats import norm

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Product, Sum
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.posterior import InducingPosterior
from gpinfer.sites.inducing import INDUCING_JITTER
from gpinfer.sites.stacked import StackedTerms, latent_terms
from gpinfer.testing import assert_gradient_close
from gpinfer.testing.method_suite import make_suite_data

#: per-class noise variances sigma_0 (different per class on purpose)
SIGMA0 = (0.3, 0.2, 0.45)


def _setup(N=8, C=3, seed=30, noise=LatentNoise):
    """Inputs, labels and per-class kernels ``RBF + noise(sigma_0c)``."""
    rng = np.random.default_rng(seed)
    X = 1.5 * rng.standard_normal((N, 2))
    y = np.arange(N) % C
    rng.shuffle(y)
    kernels = [Sum([RBF(lengthscale=0.8 + 0.2 * c, variance=1.0 + 0.5 * c), noise(SIGMA0[c])])
               for c in range(C)]
    return X, y.astype(np.int64), kernels


def _noise_free(kernel):
    """The RBF part of ``RBF + noise``."""
    return kernel.parts[0]


# -- the naive dense EP (explicit inverses, one Gaussian over f_c [N] per class) --------------
class DenseEP:
    """EP on ``p(f) prod_i prod_{k != y_i} Phi((f_{i,y_i} - f_{i,k}) / sqrt(s0_{y_i} + s0_k))``,
    prior ``f_c ~ N(0, K_c)``, one 1-D Gaussian site per (factor, class) on ``f_{i,c}``:
    ``tw, nw [N, C]`` (winner, on class ``y_i``; column = loser ``k``), ``tl, nl [N, C]``
    (loser, on class ``k``). Sequential updates, tilted moments by the textbook formulas."""

    def __init__(self, K, y, sigma0):
        self.K, self.y, self.s0 = [np.asarray(k) for k in K], y, np.asarray(sigma0)
        N, C = y.shape[0], len(K)
        self.tw, self.nw, self.tl, self.nl = (np.zeros((N, C)) for _ in range(4))
        self.factors = [(i, k) for i in range(N) for k in range(C) if k != y[i]]

    def site_sums(self, c):
        """``(tau [N], nu [N])``: the sites on ``f_c`` summed per point."""
        own = self.y == c
        tau = np.where(own, self.tw.sum(axis=1), self.tl[:, c])
        nu = np.where(own, self.nw.sum(axis=1), self.nl[:, c])
        return tau, nu

    def q(self, c):
        """``(mean [N], cov [N, N])`` of ``q(f_c)``."""
        tau, nu = self.site_sums(c)
        S = np.linalg.inv(np.linalg.inv(self.K[c]) + np.diag(tau))
        return S @ nu, S

    def _cavity(self, i, k):
        """Cavity means/variances of ``f_{i,y_i}`` and ``f_{i,k}`` for factor ``(i, k)``."""
        out = []
        for c, t, n in ((self.y[i], self.tw[i, k], self.nw[i, k]),
                        (k, self.tl[i, k], self.nl[i, k])):
            m, S = self.q(c)
            v = 1.0 / (1.0 / S[i, i] - t)
            out.append((v * (m[i] / S[i, i] - n), v))
        return out

    def _tilted(self, i, k):
        (a_y, v_y), (a_k, v_k) = self._cavity(i, k)
        z = v_y + v_k + self.s0[self.y[i]] + self.s0[k]
        alpha = (a_y - a_k) / np.sqrt(z)
        beta = np.exp(norm.logpdf(alpha) - log_ndtr(alpha))
        shrink = beta * (beta + alpha) / z
        mean = (a_y + v_y * beta / np.sqrt(z), a_k - v_k * beta / np.sqrt(z))
        var = (v_y - v_y**2 * shrink, v_k - v_k**2 * shrink)
        return log_ndtr(alpha), ((a_y, v_y), (a_k, v_k)), mean, var

    def run(self, tol=1e-12, max_sweeps=500):
        for _ in range(max_sweeps):
            change = 0.0
            for i, k in self.factors:
                _, cav, mean, var = self._tilted(i, k)
                new = [1.0 / var[j] - 1.0 / cav[j][1] for j in (0, 1)]
                new += [mean[j] / var[j] - cav[j][0] / cav[j][1] for j in (0, 1)]
                old = (self.tw[i, k], self.tl[i, k], self.nw[i, k], self.nl[i, k])
                change = max(change, *(abs(a - b) for a, b in zip(new, old)))
                self.tw[i, k], self.tl[i, k], self.nw[i, k], self.nl[i, k] = new
            if change < tol:
                return self
        raise AssertionError("dense EP did not converge")

    def log_z(self):
        """``log int p(f) prod_r t_r(f) df`` with each factor's two sites normalised so that the
        cavity times them integrates to the factor's ``Z_ik``."""
        value = 0.0
        for c, K in enumerate(self.K):
            tau, nu = self.site_sums(c)
            _, S = self.q(c)
            value += -0.5 * np.linalg.slogdet(np.eye(len(tau)) + K * tau)[1] + 0.5 * nu @ S @ nu
        for i, k in self.factors:
            log_z, cav, _, _ = self._tilted(i, k)
            value += log_z
            for (a, v), t, n in zip(cav, (self.tw[i, k], self.tl[i, k]),
                                    (self.nw[i, k], self.nl[i, k])):
                # log int N(f | a, v) exp(-t f^2 / 2 + n f) df
                value -= -0.5 * np.log1p(t * v) + 0.5 * (n + a / v) ** 2 / (t + 1.0 / v) \
                    - 0.5 * a * a / v
        return value

    def predict_f(self, rbfs, X, Xs):
        """Latent means and variances ``[N*, C]`` at ``Xs``; the variance includes ``sigma_0``."""
        means, variances = [], []
        for c, (rbf, K) in enumerate(zip(rbfs, self.K)):
            m, S = self.q(c)
            Ks = rbf.K(X, Xs)
            W = np.linalg.inv(K) @ Ks
            means.append(W.T @ m)
            v = rbf.K_diag(Xs) - np.sum(Ks * W, axis=0) + np.sum(W * (S @ W), axis=0)
            variances.append(v + self.s0[c])
        return np.stack(means, axis=1), np.stack(variances, axis=1)


def dense_proba(mean, var):
    """``p(y* = c) = E_t[prod_{k != c} Phi((m_c + sqrt(v_c) t - m_k) / sqrt(v_k))]``,
    ``t ~ N(0, 1)``, by a fine trapezoid on [-12, 12] (not the library's adaptive rule)."""
    t = np.linspace(-12.0, 12.0, 4801)
    w = norm.pdf(t) * (t[1] - t[0])
    w[[0, -1]] *= 0.5
    n, C = mean.shape
    out = np.zeros((n, C))
    for c in range(C):
        f = mean[:, c, None] + np.sqrt(var[:, c, None]) * t  # [N*, T]
        prod = np.ones_like(f)
        for k in range(C):
            if k != c:
                prod *= ndtr((f - mean[:, k, None]) / np.sqrt(var[:, k, None]))
        out[:, c] = prod @ w
    return out


def _sparse_posterior(state, kernels, Zs, terms):
    m, S = zip(*(q.moments(t.L) for q, t in zip(state.gaussians(terms), terms.latents())))
    return InducingPosterior(ArgmaxNoise(), kernels, Zs, list(m), list(S))


def _run_sparse(state, terms, rho=0.5, tol=1e-12, max_sweeps=3000):
    idx = np.arange(terms.A.shape[-1])
    for _ in range(max_sweeps):
        if state.update(terms, idx, rho) < tol:
            return state
    raise AssertionError("sparse EP did not converge")


def _assert_same_sites(state, dense, **tol):
    """Sparse role-site scalars ``(C1, C2)`` along ``e_i`` = dense site precisions and shifts
    (entries ``k == y_i`` are zero in both)."""
    for got, want in ((state.W1, dense.tw), (state.W2, dense.nw),
                      (state.L1, dense.tl), (state.L2, dense.nl)):
        np.testing.assert_allclose(got, want, **tol)


# -- LatentNoise and the option --------------------------------------------------------------
def test_latent_noise_kernel_is_diagonal_only():
    X = np.random.default_rng(31).standard_normal((5, 2))
    k = Sum([RBF(lengthscale=0.7), LatentNoise(0.3)])
    np.testing.assert_array_equal(k.K(X), RBF(lengthscale=0.7).K(X))
    np.testing.assert_array_equal(k.K(X, X), RBF(lengthscale=0.7).K(X, X))
    np.testing.assert_allclose(k.K_diag(X), 1.0 + 0.3)
    assert k.param_names[-1] == "1_latentnoise.variance"
    noise = LatentNoise(0.3)
    dK = np.random.default_rng(32).standard_normal((5, 5))
    assert noise.grad_params(X, None, dK) == 0.0 and noise.grad_params(X, X[:3], dK[:, :3]) == 0.0
    assert noise.grad_params_diag(X, np.arange(5.0)) == pytest.approx(0.3 * 10.0)
    assert not np.any(noise.grad_inputs(X, None, dK))
    assert not np.any(noise.grad_inputs_diag(X, dK[0]))
    # kernel-level VJP of K_diag against finite differences of log variance
    assert_gradient_close(lambda th: (noise.set_unconstrained(th), noise.K_diag(X) @ dK[0])[1],
                          noise.grad_params_diag(X, dK[0]), noise.get_unconstrained(),
                          eps=1e-6, rtol=1e-7, atol=1e-10, name="LatentNoise K_diag VJP")
    # at Z = X: Kuu has no noise, the FITC variances are the noise (+ O(jitter))
    t = latent_terms(k, X, X)
    np.testing.assert_allclose(t.L @ t.L.T, RBF(lengthscale=0.7).K(X) + INDUCING_JITTER * np.eye(5),
                               atol=1e-14)
    np.testing.assert_allclose(t.s, 0.3, rtol=1e-7)


def test_class_kernels_option():
    X, y = make_suite_data(3, n=12, seed=33)
    p = Problem(X=X, y=y, n_classes=3, kernel=RBF(), likelihood=ArgmaxNoise())
    on = class_kernels(p, 0.3, "kernel")
    off = class_kernels(p, 0.3, "kernel", noise_in_Kuu=False)
    assert [type(q) for q in on[0].parts] == [RBF, White]
    assert [type(q) for q in off[0].parts] == [RBF, LatentNoise] and len(off) == 3
    assert off[1].parts[1].variance == pytest.approx(0.3)
    np.testing.assert_allclose(on[0].K(X) - off[0].K(X), 0.3 * np.eye(12), atol=1e-15)
    np.testing.assert_array_equal(on[0].K_diag(X), off[0].K_diag(X))
    # the problem's own White terms move off Kuu too, at any depth; the input is not modified
    own = Sum([Product([RBF(), White(0.2)]), White(0.1)])
    p2 = Problem(X=X, y=y, n_classes=3, kernel=own, likelihood=ArgmaxNoise())
    moved = class_kernels(p2, 1.0, "kernel", noise_in_Kuu=False)[0]
    assert isinstance(moved.parts[0].parts[1], LatentNoise)
    assert isinstance(moved.parts[1], LatentNoise)
    assert type(own.parts[1]) is White
    np.testing.assert_array_equal(moved.K(X), 0.0 * X @ X.T)
    np.testing.assert_allclose(moved.K_diag(X), 0.2 + 0.1)
    assert type(latent_noise(White(0.5))) is LatentNoise
    with pytest.raises(InputError, match="noise_in_Kuu"):
        class_kernels(p, 0.3, "kernel", noise_in_Kuu="no")


def test_noise_gradient_matches_converged_evidence():
    """The noise (only in kappa) learns through ``Kff_diag``: FD of the re-converged EP log Z_q
    wrt every kernel parameter (noise included) and one inducing coordinate per class, M < N."""
    X, y, kernels = _setup(N=8, seed=34)
    rng = np.random.default_rng(35)
    Zs = [X[rng.choice(8, 3, replace=False)] + 0.1 * rng.standard_normal((3, 2))
          for _ in range(3)]
    state = RankOneSites(y, 3, 3)
    hp = hyper(kernels, Zs)
    converge(state, kernels, hp.Z, X)
    theta0 = hp.pack()
    analytic = hp.gradient(X, state.evaluate(all_terms(kernels, hp.Z, X), np.arange(8))[1])
    noise = [j for j, n in enumerate(hp.names) if "latentnoise" in n]
    assert len(noise) == 3 and np.all(np.abs(analytic[noise]) > 1e-3)  # not a vacuous check

    def f(theta):
        hp.unpack(theta)
        converge(state, kernels, hp.Z, X, rho=0.9)
        return state.evaluate(all_terms(kernels, hp.Z, X), np.arange(8))[0]

    subset_check(hp, theta0, f, analytic, "EP gradient, noise off Kuu",
                 eps=1e-5, rtol=1e-5, atol=1e-7)


# -- O11b ------------------------------------------------------------------------------------
def test_o11b_same_jittered_matrix_gives_dense_ep_to_rounding():
    """``Kuu = Kuf = K_c`` (jittered RBF): directions ``e_i``, ``s = sigma_0``; sparse EP (parallel,
    damped) and the dense sequential EP reach the same sites, q, log Z_q to rounding."""
    X, y, kernels = _setup()
    N, C = X.shape[0], 3
    K = [_noise_free(k).K(X) + INDUCING_JITTER * np.eye(N) for k in kernels]
    latents = []
    for c, Kc in enumerate(K):
        L = np.linalg.cholesky(Kc)
        A = solve_triangular(L, Kc, lower=True)
        latents.append(StackedTerms(L=L, A=A, s=np.diag(Kc) + SIGMA0[c] - np.sum(A * A, axis=0)))
    terms = StackedTerms.stack(latents)
    np.testing.assert_allclose(terms.s.T, np.tile(SIGMA0, (N, 1)), atol=1e-14)
    state = _run_sparse(RankOneSites(y, C, N), terms)
    np.testing.assert_allclose(state.U, np.broadcast_to(np.eye(N), (C, N, N)), atol=1e-12)
    dense = DenseEP(K, y, SIGMA0).run()
    _assert_same_sites(state, dense, rtol=1e-9, atol=1e-11)
    for c, (q, t) in enumerate(zip(state.gaussians(terms), terms.latents())):
        m, V = q.moments(t.L)
        m_d, V_d = dense.q(c)
        np.testing.assert_allclose(m, m_d, atol=1e-11)
        np.testing.assert_allclose(V, V_d, atol=1e-11)
    value = state.evaluate(terms, np.arange(N))[0]
    assert value == pytest.approx(dense.log_z(), rel=1e-12, abs=1e-11)


def test_o11b_plugin_kernels_give_dense_ep_to_jitter():
    """Through ``latent_terms`` with ``RBF + LatentNoise``: ``Kuf`` lacks the jitter that ``Kuu``
    has, so directions and ``s`` are off by O(jitter * ||K^-1||); log Z_q, sites and predictive
    probabilities then agree to that order. With the noise on Kuu (White) they do not."""
    X, y, kernels = _setup()
    N, C = X.shape[0], 3
    Zs = [X.copy() for _ in range(C)]
    rbfs = [_noise_free(k) for k in kernels]
    K = [r.K(X) + INDUCING_JITTER * np.eye(N) for r in rbfs]
    # O(jitter) here: every direction and FITC variance is off by at most jitter * ||K_c^-1||
    # (2e-9 for this draw), and log Z_q sums N (C - 1) factors (measured: 3e-10 for log Z_q,
    # 1e-10 for the sites, 3e-10 for the predictive variances)
    gap = INDUCING_JITTER * max(np.linalg.norm(np.linalg.inv(k), 2) for k in K)
    assert gap < 1e-8
    tol = N * (C - 1) * gap
    state = RankOneSites(y, C, N)
    converge(state, kernels, Zs, X)
    terms = all_terms(kernels, Zs, X)
    dense = DenseEP(K, y, SIGMA0).run()
    value = state.evaluate(terms, np.arange(N))[0]
    assert abs(value - dense.log_z()) < tol
    _assert_same_sites(state, dense, rtol=0, atol=tol)
    Xs = np.random.default_rng(36).standard_normal((6, 2))
    post = _sparse_posterior(state, kernels, Zs, terms)
    mean, var = post.predict_f(Xs)
    mean_d, var_d = dense.predict_f(rbfs, X, Xs)
    np.testing.assert_allclose(mean, mean_d, atol=tol)
    np.testing.assert_allclose(var, var_d, atol=tol)
    P, P_d = post.predict_proba(Xs), dense_proba(mean_d, var_d)
    np.testing.assert_allclose(P, P_d, atol=max(tol, 1e-10))
    # negative control: the default model (noise on diag Kuu) is a different model
    _, _, white = _setup(noise=White)
    other = RankOneSites(y, C, N)
    converge(other, white, Zs, X)
    assert abs(other.evaluate(all_terms(white, Zs, X), np.arange(N))[0] - dense.log_z()) > 1e-2


def test_fit_with_noise_off_kuu_ep_and_sep_at_M_equals_N():
    """Both methods train with ``noise_in_Kuu=False`` at M = N; SEP's predictions are within the
    spec's O10 bounds of EP's (0.05 max, 0.01 mean; measured 0.015 and 0.003 here)."""
    X, y = make_suite_data(3, n=60, seed=4)
    P = []
    for method in ("ep", "sep"):
        est = GPClassifier(method=method, M=60, max_iter=20, random_state=0,
                           method_options={"noise_in_Kuu": False}).fit(X, y)
        assert all(type(k.parts[1]) is LatentNoise for k in est.kernel_)
        assert np.all(np.isfinite([h["objective"] for h in est.history_]))
        P.append(est.predict_proba(X))
        assert np.all(np.isfinite(P[-1])) and np.allclose(P[-1].sum(axis=1), 1.0, atol=1e-6)
    diff = np.abs(P[0] - P[1])
    assert diff.max() < 0.05 and diff.mean() < 0.01
