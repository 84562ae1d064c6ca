"""``gpinfer.sites.jensen``: the Jensen lower bound ``J(q)`` against its dense definition
(expected log-likelihood minus ``KL(q || p)``), the general form against the diagonal-site form,
the bound below the exact ``log Z`` (a 2-point quadrature), and ``G = 1/2 (alpha alpha^T - R)``
against its dense formula (spec binary §1.4)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.kernels import RBF
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit
from gpinfer.sites import DiagonalSiteAlgebra
from gpinfer.sites.jensen import gaussian_site_gradient, jensen_bound, jensen_bound_general


def _problem(n=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 1))
    K = RBF(lengthscale=1.1, variance=1.8).K(X) + 1e-6 * np.eye(n)
    return K, rng.integers(0, 2, n), rng.uniform(0.1, 2.0, n), rng.normal(size=n) * 0.4


def _dense_kl(m, V, K):
    """``KL(N(m, V) || N(0, K))``."""
    n = m.size
    Kinv = np.linalg.inv(K)
    return 0.5 * (np.trace(Kinv @ V) + m @ Kinv @ m - n
                  + np.linalg.slogdet(K)[1] - np.linalg.slogdet(V)[1])


@pytest.mark.parametrize("lik", [BernoulliProbit(), BernoulliLogit()])
def test_jensen_bound_is_expected_log_likelihood_minus_kl(lik):
    K, y, w, alpha = _problem()
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
    V = np.linalg.inv(np.linalg.inv(K) + np.diag(w))
    m = K @ alpha
    ref = np.sum(lik.expected_log_prob(y, m, np.diag(V)).value) - _dense_kl(m, V, K)
    assert jensen_bound(lik, y, alg, alpha) == pytest.approx(ref, abs=1e-9)
    general = jensen_bound_general(
        lik, y, m, np.diag(V), float(m @ np.linalg.solve(K, m)),
        float(np.linalg.slogdet(V @ np.linalg.inv(K))[1]), float(np.trace(V @ np.linalg.inv(K))))
    assert general == pytest.approx(ref, abs=1e-9)


def test_jensen_bound_is_below_the_exact_log_marginal():
    """n = 2: ``log Z`` by a 120 x 120 Gauss-Hermite product rule; ``J <= log Z`` for any q."""
    lik = BernoulliProbit()
    K, y, _, _ = _problem(n=2, seed=3)
    x, wts = np.polynomial.hermite_e.hermegauss(120)
    wts = wts / wts.sum()
    F = np.linalg.cholesky(K) @ np.stack(np.meshgrid(x, x, indexing="ij")).reshape(2, -1)
    logp = lik.log_prob(np.repeat(y, F.shape[1]), F.ravel()).reshape(2, -1).sum(axis=0)
    log_z = np.log(np.exp(logp) @ np.outer(wts, wts).ravel())
    rng = np.random.default_rng(4)
    for _ in range(10):
        w, alpha = rng.uniform(0.01, 3.0, 2), rng.normal(size=2)
        alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
        assert jensen_bound(lik, y, alg, alpha) < log_z


def test_gaussian_site_gradient_dense_formula():
    K, _, w, alpha = _problem()
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
    R = np.linalg.inv(K + np.diag(1.0 / w))
    np.testing.assert_allclose(gaussian_site_gradient(alg, alpha),
                               0.5 * (np.outer(alpha, alpha) - R), atol=1e-10)
