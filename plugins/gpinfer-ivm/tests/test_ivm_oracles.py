"""Spec ivm §7 oracles 10b, 12a, 12e; the linear-in-C Sobol rule; bad input (issue 5)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.criterion import FrozenSites, criterion
from gpinfer_ivm.gaussian_cubature import (
    SoftmaxExpectation,
    sobol_rule,
    softmax_predictive,
    softmax_tilted,
)
from gpinfer_ivm.inference import IVMSettings, run_inference
from gpinfer_ivm.projection import initial_t, restricted_projection, site_precision
from ivm_dense_reference import dense_posterior, point_block, prior_cov
from ivm_test_data import spd, three_blobs, tilted_batch

from gpinfer.errors import InputError, NumericalError
from gpinfer.kernels.stationary import RBF


def _problem(C, n, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = np.arange(n) % C
    rng.shuffle(y)
    kernels = [RBF(lengthscale=rng.uniform(0.6, 1.6), variance=rng.uniform(0.5, 2.0))
               for _ in range(C)]  # fmt: skip
    return rng, X, y, kernels


# -- oracle 12a: matrix-level gradient with an exact quadratic surrogate --------------------------
def test_criterion_gradient_quadratic_surrogate_against_dense_fd():
    C, n, d = 3, 10, 5
    rng, X, y, kernels = _problem(C, n, seed=31)
    I = rng.permutation(n)[:d]
    pi = rng.uniform(0.1, 2.0, (d, C))
    b = rng.standard_normal((d, C))  # does not sum to zero
    sites = FrozenSites.from_restricted(I, pi, b)
    W = np.stack([spd(rng, C, 0.7) for _ in range(n)])  # log P_i = -u^T W_i u / 2 + a_i^T u
    a = rng.standard_normal((n, C))

    def surrogate(_y, h, A):
        value = -0.5 * (np.einsum("ic,icd,id->i", h, W, h) + np.einsum("icd,idc->i", W, A))
        value += np.sum(a * h, axis=1)
        return SoftmaxExpectation(value, a - np.einsum("icd,id->ic", W, h), -0.5 * W)

    def dense_G(theta):
        for c, k in enumerate(kernels):
            k.set_unconstrained(theta[2 * c : 2 * c + 2])
        h, A, _ = dense_posterior(kernels, X, I, pi, b)
        Ai = np.stack([point_block(A, n, C, j) for j in range(n)])
        g1 = -np.sum(surrogate(y, h, Ai).value)
        ix = (np.arange(C)[:, None] * n + I[None, :]).reshape(-1)
        K = prior_cov(kernels, X)
        KI, AI, mI = K[np.ix_(ix, ix)], A[np.ix_(ix, ix)], h.T.reshape(-1)[ix]
        kl = 0.5 * (np.trace(np.linalg.solve(KI, AI)) + mI @ np.linalg.solve(KI, mI) - ix.size
                    + np.linalg.slogdet(KI)[1] - np.linalg.slogdet(AI)[1])  # fmt: skip
        return g1 + kl

    theta0 = np.concatenate([k.get_unconstrained() for k in kernels])
    for c, k in enumerate(kernels):
        k.set_unconstrained(theta0[2 * c : 2 * c + 2])
    res = criterion(kernels, X, y, sites, np.zeros(C), expected_log_lik=surrogate)
    np.testing.assert_allclose(res.value, dense_G(theta0), rtol=1e-11)
    grad = np.concatenate(res.dkernel)
    eps = 1e-5
    fd = np.array([(dense_G(theta0 + eps * e) - dense_G(theta0 - eps * e)) / (2 * eps)
                   for e in np.eye(theta0.size)])  # fmt: skip
    np.testing.assert_allclose(grad, fd, rtol=1e-8, atol=1e-8)


# -- oracle 12e: G is an upper bound on -log p(y | theta) (AIS gold standard, C = 2) --------------
def test_criterion_upper_bounds_ais_evidence():
    ais = pytest.importorskip("gpinfer_mcmc.ais")
    n = 30
    rng, X, y, kernels = _problem(2, n, seed=33)
    beta = np.array([0.4, 0.0])
    s = IVMSettings(d_final=12, L=3, ep_sweeps=2, gh_order=20)
    res = run_inference(kernels, X, y, beta, s, np.random.default_rng(0))
    sites = FrozenSites.from_restricted(res.solid.active, res.solid.pi[:12], res.solid.b[:12])
    G = criterion(kernels, X, y, sites, beta, order=40, reduced=True, gradient=False).value
    # C = 2: p(y | u) = sigmoid(t (u1 - u2 + beta1 - beta2)), z = u1 - u2 ~ GP(0, K1 + K2)
    Kz = kernels[0].K(X) + kernels[1].K(X) + 1e-8 * np.eye(n)
    t = np.where(y == 0, 1.0, -1.0)

    def loglik(F):
        z = t[:, None] * (F + beta[0] - beta[1])
        return -np.sum(np.logaddexp(0.0, -z), axis=0), t[:, None] / (1.0 + np.exp(z))

    start = ais.GaussianStart(np.zeros(n), np.linalg.cholesky(Kz), np.zeros(n), np.zeros(n), 0.0)
    out = ais.run_ais(loglik, start, T=400, R=16, rng=np.random.default_rng(1), n_leapfrog=8,
                      step_sizes=np.full(40, 0.25))  # fmt: skip
    neg_log_evidence = -out.log_z
    assert G >= neg_log_evidence - 3.0 * out.se - 0.05
    assert G - neg_log_evidence < 0.25 * n  # a bound, but not a vacuous one


# -- oracle 10b: d = n = L with EP sweeps equals dense restricted EP -----------------------------
def _dense_restricted_ep(kernels, X, y, order, sweeps):
    """Dense restricted EP over all points (full Cn x Cn covariance) to a fixed point."""
    n, C = X.shape[0], len(kernels)
    pi = np.full((n, C), 1e-8)
    b = np.zeros((n, C))
    seen: set[int] = set()
    for _ in range(sweeps):
        for i in order:
            h, A, _ = dense_posterior(kernels, X, np.arange(n), pi, b)
            Ai, hi = point_block(A, n, C, i), h[i]
            # cavity: remove site i (precision Pi_i, linear term b_i) from the marginal
            Lam = np.linalg.inv(np.linalg.inv(Ai) - site_precision(pi[i]))
            hc = Lam @ (np.linalg.solve(Ai, hi) - b[i])
            T = softmax_tilted(y[[i]], hc[None], Lam[None], order=8, reduced=True)
            if i in seen:  # warm start, as in the IVM's EP phase
                t0 = np.log(pi[i])
            else:  # first visit: the IVM's initialisation from the predictive distribution
                p = softmax_predictive(hc[None], Lam[None], order=8, reduced=True)[0]
                t0 = initial_t(int(y[i]), p)
                seen.add(int(i))
            pi[i], b[i] = restricted_projection(Lam, T.g[0], T.h_hat[0], T.A_hat[0], t0)
    return dense_posterior(kernels, X, np.arange(n), pi, b)


def test_full_liquid_set_with_sweeps_equals_dense_restricted_ep():
    C, n = 3, 5
    rng, X, y, kernels = _problem(C, n, seed=35)
    order = rng.permutation(n)
    # ep_tol=0: the oracle is EP's fixed point to 1e-5, which the default early stop (marginals
    # moving by less than 0.03 standard deviations in a sweep) does not reach
    s = IVMSettings(d_final=n, L=n, ep_sweeps=15, ep_tol=0.0, gh_order=8, reduced=True,
                    order=order)
    res = run_inference(kernels, X, y, np.zeros(C), s, np.random.default_rng(0))
    assert res.n_improper == 0
    h, A, _ = _dense_restricted_ep(kernels, X, y, order, sweeps=25)
    np.testing.assert_allclose(res.solid.means(), h, atol=1e-5)
    Ad = np.stack([point_block(A, n, C, j) for j in range(n)])
    np.testing.assert_allclose(res.solid.covariances(np.arange(n)), Ad, atol=1e-5)
    # not the same as one ADF pass (so the sweeps matter)
    adf = run_inference(kernels, X, y, np.zeros(C),
                        IVMSettings(d_final=n, L=1, ep_sweeps=0, gh_order=8, reduced=True,
                                    order=order), np.random.default_rng(0))  # fmt: skip
    assert np.max(np.abs(adf.solid.means() - h)) > 1e-3


# -- the Sobol rule (cost linear in the number of nodes for any C) -------------------------------
@pytest.mark.parametrize("dim", [2, 4, 9])
def test_sobol_rule_is_positive_symmetric_and_exact_to_degree_three(dim):
    s, w = sobol_rule(dim)
    assert np.all(w > 0) and abs(w.sum() - 1.0) < 1e-14
    np.testing.assert_allclose(w @ s, 0.0, atol=1e-14)
    np.testing.assert_allclose((w[:, None] * s).T @ s, np.eye(dim), atol=1e-12)
    third = np.einsum("e,ei,ej,ek->ijk", w, s, s, s)
    np.testing.assert_allclose(third, 0.0, atol=1e-12)
    s2, _ = sobol_rule(dim)
    assert s2 is s  # cached and deterministic


def test_sobol_rule_tilted_moments_against_high_order_product_rule():
    rng = np.random.default_rng(41)
    C, B = 3, 12
    A, h, y = tilted_batch(rng, C, np.linspace(0.5, 5.0, B))
    ref = softmax_tilted(y, h, A, None, 40, True)
    sob = softmax_tilted(y, h, A, None, None, True, rule="sobol")
    gh3 = softmax_tilted(y, h, A, None, 3, True)
    err = {k: np.abs(getattr(sob, k) - getattr(ref, k)).max() for k in ("log_z", "h_hat")}
    err3 = {k: np.abs(getattr(gh3, k) - getattr(ref, k)).max() for k in ("log_z", "h_hat")}
    assert err["log_z"] < 0.01 and err["h_hat"] < 0.03
    assert err["log_z"] < err3["log_z"] and err["h_hat"] < err3["h_hat"]  # better than GH-3
    dA = np.abs((sob.A_hat - A) - (ref.A_hat - A)).max() / np.abs(ref.A_hat - A).max()
    assert dA < 0.15
    np.testing.assert_allclose(sob.g.sum(axis=1), 0.0, atol=1e-13)


def test_sobol_rule_against_monte_carlo_for_ten_classes():
    rng = np.random.default_rng(43)
    C = 10
    A = spd(rng, C, 1.0)
    h = 0.5 * rng.standard_normal(C)
    y = 3
    T = softmax_tilted([y], h[None], A[None], rule="sobol", reduced=True)
    P = softmax_predictive(h[None], A[None], rule="sobol", reduced=True)[0]
    U = h + rng.standard_normal((200_000, C)) @ np.linalg.cholesky(A).T
    E = np.exp(U - U.max(axis=1, keepdims=True))
    S = E / E.sum(axis=1, keepdims=True)
    lik = S[:, y]
    Z = lik.mean()
    se_logz = lik.std() / np.sqrt(lik.size) / Z
    assert abs(T.log_z[0] - np.log(Z)) < 4 * se_logz + 2e-3
    h_mc = (lik @ U) / lik.sum()
    assert np.max(np.abs(T.h_hat[0] - h_mc)) < 0.02
    np.testing.assert_allclose(P, S.mean(axis=0), atol=5e-3)
    np.testing.assert_allclose(P.sum(), 1.0, atol=1e-12)


def test_sobol_rule_run_behaves_like_product_rule():
    X, y, k = three_blobs(300)
    errs = {}
    for rule, order in (("sobol", None), ("product", 3)):
        s = IVMSettings(d_final=20, L=4, ep_sweeps=1, pool_size=32, gh_order=order, rule=rule)
        res = run_inference([k] * 3, X[:150], y[:150], np.zeros(3), s, np.random.default_rng(0))
        hs, As = res.solid.predict(X[150:])
        P = softmax_predictive(hs, As, order=order, rule=rule)
        assert res.min_score > 0 and res.n_improper == 0
        errs[rule] = np.mean(P.argmax(axis=1) != y[150:])
    assert errs["sobol"] < 0.12 and abs(errs["sobol"] - errs["product"]) < 0.05


# -- bad input (issue 5) --------------------------------------------------------------------------
def test_bad_settings_and_non_finite_quadrature_raise():
    rng, X, y, kernels = _problem(3, 12, seed=45)
    with pytest.raises(InputError, match="quadrature rule"):
        run_inference(kernels, X, y, np.zeros(3), IVMSettings(d_final=4, L=2, rule="mc"), rng)
    with pytest.raises(InputError, match="stub_update"):
        run_inference(kernels, X, y, np.zeros(3),
                      IVMSettings(d_final=4, L=2, stub_update="none"), rng)  # fmt: skip
    A = np.eye(3)[None]
    for rule in ("product", "sobol"):
        with pytest.raises(NumericalError, match="non-finite"):
            softmax_tilted([0], np.array([[np.nan, 0.0, 0.0]]), A, rule=rule)
        with pytest.raises(NumericalError, match="non-finite"):
            softmax_predictive(np.zeros((1, 3)), np.full((1, 3, 3), np.inf), rule=rule)
    # a kernel that overflows to inf gives a clear NumericalError, never NaN results
    huge = [RBF(lengthscale=1.0, variance=1e308) for _ in range(3)]
    X2 = X * 1.0
    with pytest.raises(NumericalError), np.errstate(over="ignore", invalid="ignore"):
        run_inference(huge, X2, y, np.zeros(3), IVMSettings(d_final=4, L=2, gh_order=3),
                      np.random.default_rng(0))  # fmt: skip
