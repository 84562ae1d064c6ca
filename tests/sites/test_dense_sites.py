"""DiagonalSiteAlgebra (B-trick) against naive dense formulas (spec binary §7.2 item 7)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import NumericalError
from gpinfer.kernels.stationary import RBF
from gpinfer.sites import DiagonalSiteAlgebra


def _problem(n=12, seed=0, lengthscale=1.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    K = RBF(lengthscale=lengthscale, variance=1.5).K(X) + 1e-3 * np.eye(n)
    w = rng.uniform(0.05, 0.9, n)
    return X, K, w


def test_matches_naive_formulas():
    X, K, w = _problem()
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
    n = len(w)
    W = np.diag(w)
    V = np.linalg.inv(np.linalg.inv(K) + W)
    R = np.linalg.inv(K + np.diag(1 / w))
    B = np.eye(n) + np.diag(np.sqrt(w)) @ K @ np.diag(np.sqrt(w))
    rtol = 1e-10
    np.testing.assert_allclose(alg.R(), R, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(alg.posterior_cov(), V, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(alg.posterior_var_diag(), np.diag(V), rtol=rtol)
    assert alg.log_det_B == pytest.approx(np.linalg.slogdet(np.eye(n) + K @ W)[1], rel=rtol)
    assert alg.trace_B_inv == pytest.approx(np.trace(V @ np.linalg.inv(K)), rel=1e-9)
    b = np.arange(n, dtype=float) - 3
    np.testing.assert_allclose(alg.solve_B(b), np.linalg.solve(B, b), rtol=rtol)
    np.testing.assert_allclose(alg.R_matvec(b), R @ b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(K @ alg.posterior_solve(b), V @ b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.eye(n) - K @ alg.R(), np.linalg.inv(np.eye(n) + K @ W),
                               rtol=1e-9, atol=1e-12)


def test_zero_sites_and_singular_K():
    X, K, w = _problem()
    w[[0, 3]] = 0.0
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
    assert np.all(alg.R()[[0, 3]] == 0.0)
    # SE with a huge lengthscale: K singular to machine precision, B-trick still fine
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 1))
    K = RBF(lengthscale=np.exp(5.0), variance=1.0).K(X)
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, np.full(50, 0.25))
    assert alg.jitter == 0.0
    lam = np.linalg.eigvalsh(alg.L @ alg.L.T)
    assert lam.min() >= 1 - 1e-10 and lam.max() <= 1 + 50 * 0.25 * np.abs(K).max() + 1e-8
    assert np.all(np.isfinite(alg.posterior_var_diag()))
    assert np.all(alg.posterior_var_diag() > -1e-10)


def test_bad_precisions_raise():
    _, K, w = _problem()
    w[2] = -0.5
    with pytest.raises(NumericalError, match="iteration 4"):
        DiagonalSiteAlgebra.from_kernel_matrix(K, w, iteration=4)
    w[2] = np.nan
    with pytest.raises(NumericalError, match="'w'"):
        DiagonalSiteAlgebra.from_kernel_matrix(K, w)


def test_posterior_predicts_training_marginals():
    X, K0, w = _problem()
    kern = RBF(lengthscale=1.0, variance=1.5)
    K = kern.K(X)
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, w)
    alpha = np.linspace(-1, 1, len(w))

    class _Lik:  # predict_f does not use the likelihood
        multiclass = False

    post = alg.posterior(_Lik(), kern, X, alpha)
    mean, var = post.predict_f(X)
    np.testing.assert_allclose(mean[:, 0], K @ alpha, rtol=1e-10)
    np.testing.assert_allclose(var[:, 0], alg.posterior_var_diag(), rtol=1e-8, atol=1e-12)
