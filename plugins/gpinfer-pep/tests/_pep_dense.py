"""Independent dense reference computations for the Power-EP tests (spec power-ep §7).

Everything here forms the ``N x N`` matrices explicitly and uses textbook formulas, so that the
tests compare the plugin's whitened ``O(N M^2)`` algebra against something written differently.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_ndtr
from scipy.stats import multivariate_normal, norm
from threadpoolctl import threadpool_limits

from gpinfer.kernels import make_kernel


@pytest.fixture(autouse=True)
def single_thread():
    """BLAS threads fight over the shared cores; one thread keeps the tests fast."""
    with threadpool_limits(1):
        yield


def problem(n: int = 30, m: int = 7, d: int = 2, seed: int = 0, classification=False):
    """Kernel (ARD RBF), ``X [n, d]``, targets, ``Z [m, d]``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = (f + 0.3 * rng.normal(size=n) > 0).astype(int) if classification else \
        f + 0.2 * rng.normal(size=n)
    kern = make_kernel("rbf", input_dim=d, ard=True)
    kern.set_unconstrained(np.log(np.r_[np.full(d, 0.9), 1.3]))
    Z = X[:m] + 0.05 * rng.normal(size=(m, d))
    return kern, X, y, Z


def dense_q(kern, X, Z):
    Kuu, Kuf = kern.K(Z), kern.K(Z, X)
    return Kuf.T @ np.linalg.solve(Kuu, Kuf), kern.K(X)


def fitc_loglik(kern, X, y, Z, s2):
    Q, K = dense_q(kern, X, Z)
    C = Q + np.diag(np.diag(K - Q)) + s2 * np.eye(len(y))
    return multivariate_normal.logpdf(y, np.zeros(len(y)), C)


def pitc_loglik(kern, X, y, Z, s2, blocks):
    Q, K = dense_q(kern, X, Z)
    D = np.zeros_like(K)
    for b in blocks:
        D[np.ix_(b, b)] = (K - Q)[np.ix_(b, b)]
    return multivariate_normal.logpdf(y, np.zeros(len(y)), Q + D + s2 * np.eye(len(y)))


def titsias_bound(kern, X, y, Z, s2):
    Q, K = dense_q(kern, X, Z)
    return (multivariate_normal.logpdf(y, np.zeros(len(y)), Q + s2 * np.eye(len(y)))
            - np.trace(K - Q) / (2 * s2))


def exact_loglik(kern, X, y, s2):
    return multivariate_normal.logpdf(y, np.zeros(len(y)), kern.K(X) + s2 * np.eye(len(y)))


def gp_predict(kern, X, y, Xs, C):
    """Predictive latent mean/var with training covariance ``C`` of ``y`` and cross ``K(X, Xs)``
    replaced consistently by the caller (exact GP when ``C = K + s2 I``)."""
    Ks = kern.K(X, Xs)
    mean = Ks.T @ np.linalg.solve(C, y)
    var = kern.K_diag(Xs) - np.sum(Ks * np.linalg.solve(C, Ks), axis=0)
    return mean, var


def fitc_predict(kern, X, y, Z, s2, Xs):
    """FITC predictive (Snelson & Ghahramani): ``Sigma = (Kuu + Kuf Lam^-1 Kfu)^-1``."""
    Kuu, Kuf = kern.K(Z), kern.K(Z, X)
    Q, K = dense_q(kern, X, Z)
    lam = np.diag(K - Q) + s2
    S = np.linalg.inv(Kuu + (Kuf / lam) @ Kuf.T)
    Kus = kern.K(Z, Xs)
    mean = Kus.T @ S @ (Kuf @ (y / lam))
    var = kern.K_diag(Xs) - np.sum(Kus * np.linalg.solve(Kuu, Kus), axis=0) \
        + np.sum(Kus * (S @ Kus), axis=0)
    return mean, var


def standard_ep_probit(K, y01, tol=1e-12, max_sweeps=500):
    """Sequential EP for probit GP classification (R&W Alg. 3.5); returns energy, mean, var."""
    n = len(y01)
    y = 2.0 * y01 - 1.0
    tt, nt = np.zeros(n), np.zeros(n)
    Sigma, mu = K.copy(), np.zeros(n)
    for _ in range(max_sweeps):
        old = tt.copy()
        for i in range(n):
            tc = 1.0 / Sigma[i, i] - tt[i]
            nc = mu[i] / Sigma[i, i] - nt[i]
            mc, vc = nc / tc, 1.0 / tc
            z = y[i] * mc / np.sqrt(1 + vc)
            r = np.exp(norm.logpdf(z) - log_ndtr(z))
            mhat = mc + y[i] * vc * r / np.sqrt(1 + vc)
            vhat = vc - vc**2 * r * (z + r) / (1 + vc)
            dt = 1.0 / vhat - tc - tt[i]
            tt[i] += dt
            nt[i] = mhat / vhat - nc
            s = Sigma[:, i].copy()
            Sigma -= dt / (1 + dt * s[i]) * np.outer(s, s)
            mu = Sigma @ nt
        Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(tt))
        mu = Sigma @ nt
        if np.max(np.abs(tt - old)) < tol:
            break
    # log Z_EP = log int N(f|0,K) prod t_i + sum_i [log Zhat_i - log int q_cav_i t_i]
    tc = 1.0 / np.diag(Sigma) - tt
    nc = mu / np.diag(Sigma) - nt
    mc, vc = nc / tc, 1.0 / tc
    log_zhat = log_ndtr(y * mc / np.sqrt(1 + vc))
    log_cav_site = (-0.5 * np.log1p(tt * vc) + 0.5 * (nt + mc / vc) ** 2 / (tt + 1 / vc)
                    - 0.5 * mc**2 / vc)
    _, logdet_S = np.linalg.slogdet(Sigma)
    _, logdet_K = np.linalg.slogdet(K)
    log_prior_sites = 0.5 * mu @ nt + 0.5 * logdet_S - 0.5 * logdet_K
    return log_prior_sites + np.sum(log_zhat - log_cav_site), mu, np.diag(Sigma)


def hensman_elbo(lik, y, kern, X, Z, m, V, n_nodes=200):
    """``sum_n E_q[log p(y_n|f_n)] - KL(N(m, V) || N(0, Kuu))``, fine Gauss-Hermite."""
    Kuu, Kuf = kern.K(Z), kern.K(Z, X)
    Wm = np.linalg.solve(Kuu, Kuf)
    mean = Wm.T @ m
    var = kern.K_diag(X) - np.sum(Kuf * Wm, axis=0) + np.sum(Wm * (V @ Wm), axis=0)
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    F = mean[:, None] + np.sqrt(var)[:, None] * x
    ell = np.sum(log_ndtr((2.0 * y[:, None] - 1.0) * F) @ w)
    M = len(m)
    KinvV = np.linalg.solve(Kuu, V)
    kl = 0.5 * (np.trace(KinvV) + m @ np.linalg.solve(Kuu, m) - M
                - np.linalg.slogdet(KinvV)[1])
    return ell - kl
