"""Spec ivm §7 oracles 2, 3, 9-14: representation, liquid set, limits, criterion, baseline."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.baseline import BaselineRepresentation, run_baseline
from gpinfer_ivm.criterion import FrozenSites, criterion
from gpinfer_ivm.gaussian_cubature import softmax_predictive, softmax_tilted
from gpinfer_ivm.inference import IVMSettings, run_inference
from gpinfer_ivm.liquid import EPRepresentation
from gpinfer_ivm.projection import initial_t, restricted_projection
from gpinfer_ivm.solid import SolidRepresentation
from ivm_dense_reference import dense_posterior, point_block, prior_cov
from ivm_test_data import three_blobs

from gpinfer.errors import InputError
from gpinfer.kernels.stationary import RBF
from gpinfer.numerics.quadrature import gauss_hermite
from gpinfer.testing.gradcheck import assert_gradient_close


def _problem(C=3, n=12, seed=0, shared=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = np.arange(n) % C
    rng.shuffle(y)
    if shared:
        kernels = [RBF(lengthscale=1.2, variance=1.5)] * C
    else:
        kernels = [RBF(lengthscale=rng.uniform(0.6, 1.6), variance=rng.uniform(0.5, 2.0))
                   for _ in range(C)]  # fmt: skip
    return rng, X, y, kernels


# -- oracle 2: compact representation = dense algebra ------------------------------------------
@pytest.mark.parametrize("C", [2, 3, 4])
def test_representation_equals_dense(C):
    rng, X, y, kernels = _problem(C, n=12, seed=C)
    n, d = 12, 8
    I = rng.permutation(n)[:d]
    pi = rng.uniform(0.05, 2.0, (d, C))
    pi[2, 0] = 1e-6
    b = rng.standard_normal((d, C))  # does not sum to zero
    assert np.all(np.abs(b.sum(axis=1)) > 1e-3)
    drag = SolidRepresentation(kernels, X, d, "drag")
    resolve = SolidRepresentation(kernels, X, d, "resolve")
    lazy = SolidRepresentation(kernels, X, d, "lazy")
    for a in range(d):
        drag.include(I[a], pi[a], b[a])
        resolve.include(I[a], pi[a], b[a])
        lazy.include(I[a], pi[a], b[a])
        np.testing.assert_allclose(lazy.q_stubs(np.arange(n)), drag.Q[:, : a + 1], atol=1e-12)
        np.testing.assert_allclose(lazy.means_eta(), drag.means_eta(), atol=1e-10)
        h, A, Phi = dense_posterior(kernels, X, I[: a + 1], pi[: a + 1], b[: a + 1])
        np.testing.assert_allclose(drag.means(), h, atol=1e-10)
        np.testing.assert_allclose(drag.means_eta(), h, atol=1e-10)
        Ad = np.stack([point_block(A, n, C, j) for j in range(n)])
        np.testing.assert_allclose(drag.covariances(np.arange(n)), Ad, atol=1e-10)
        cross = drag.cross_covariances(np.arange(n), np.arange(n)).reshape(n * C, n * C)
        perm = (np.arange(n)[:, None] + n * np.arange(C)[None, :]).reshape(-1)
        np.testing.assert_allclose(cross, A[np.ix_(perm, perm)], atol=1e-10)
        ix = (np.arange(C)[:, None] * n + I[: a + 1][None, :]).reshape(-1)
        np.testing.assert_allclose(drag.phi_active(), Phi[np.ix_(ix, ix)], atol=1e-10)
    np.testing.assert_allclose(drag.Q[:, :d], resolve.Q[:, :d], atol=1e-12)
    block = SolidRepresentation.from_sites(kernels, X, I, pi, b)
    for name in ("L", "Bm", "LH", "M", "Q"):
        got, want = getattr(drag, name), getattr(block, name)
        np.testing.assert_allclose(got[..., :d, :d] if name != "M" and name != "Q" else got,
                                   want, atol=1e-12, err_msg=name)  # fmt: skip
    hs, As = drag.predict(X)
    np.testing.assert_allclose(hs, h, atol=1e-10)
    np.testing.assert_allclose(As, Ad, atol=1e-10)


# -- oracle 3: identical kernels ----------------------------------------------------------------
def test_identical_kernels_leave_ones_direction_uninformed():
    rng, X, y, kernels = _problem(3, n=10, seed=5, shared=True)
    d = 6
    I = rng.permutation(10)[:d]
    pi = rng.uniform(0.1, 2.0, (d, 3))
    b = rng.standard_normal((d, 3))
    b -= b.mean(axis=1, keepdims=True)
    rep = SolidRepresentation.from_sites(kernels, X, I, pi, b)
    Xs = rng.standard_normal((4, 2))
    h, A = rep.predict(Xs)
    kss = kernels[0].K_diag(Xs)
    np.testing.assert_allclose(A @ np.ones(3), kss[:, None] * np.ones(3), atol=1e-12)
    np.testing.assert_allclose(rep.means().sum(axis=1), 0.0, atol=1e-12)


# -- oracle 11: liquid set ----------------------------------------------------------------------
def test_liquid_representation_equals_dense():
    C, n = 3, 12
    rng, X, y, kernels = _problem(C, n=n, seed=7)
    I = rng.permutation(n)[:8]
    pi = rng.uniform(0.1, 2.0, (8, C))
    b = rng.standard_normal((8, C))
    solid = SolidRepresentation.from_sites(kernels, X, I[:5], pi[:5], b[:5])
    ep = EPRepresentation(solid, I[5:], pi[5:], b[5:])
    h, A, _ = dense_posterior(kernels, X, I, pi, b)
    for a in range(3):
        hm, Am = ep.liquid_marginal(a)
        np.testing.assert_allclose(hm, h[I[5 + a]], atol=1e-10)
        np.testing.assert_allclose(Am, point_block(A, n, C, I[5 + a]), atol=1e-10)
    others = np.setdiff1d(np.arange(n), I[5:])
    hm, Am = ep.marginals(others)
    np.testing.assert_allclose(hm, h[others], atol=1e-10)
    np.testing.assert_allclose(Am, np.stack([point_block(A, n, C, j) for j in others]), atol=1e-10)
    # the cavity equals the dense posterior without that site
    keep = np.r_[np.arange(6), 7]
    h_c, A_c, _ = dense_posterior(kernels, X, I[keep], pi[keep], b[keep])
    hcav, Acav = ep.cavity(1)
    np.testing.assert_allclose(hcav, h_c[I[6]], atol=1e-10)
    np.testing.assert_allclose(Acav, point_block(A_c, n, C, I[6]), atol=1e-10)


# -- oracle 10: d = n with L = 1 equals dense sequential restricted ADF --------------------------
def test_full_active_set_equals_dense_sequential_adf():
    C, n = 3, 8
    rng, X, y, kernels = _problem(C, n=n, seed=9)
    order = rng.permutation(n)
    s = IVMSettings(d_final=n, L=1, ep_sweeps=0, gh_order=5, order=order)
    res = run_inference(kernels, X, y, np.zeros(C), s, np.random.default_rng(0))
    # dense sequential ADF with the same projection code
    sites_pi, sites_b = [], []
    for a, i in enumerate(order):
        h, A, _ = dense_posterior(kernels, X, order[:a], np.array(sites_pi).reshape(a, C),
                                  np.array(sites_b).reshape(a, C))  # fmt: skip
        hi, Ai = h[i], point_block(A, n, C, i)
        T = softmax_tilted(y[[i]], hi[None], Ai[None], order=5)
        p = softmax_predictive(hi[None], Ai[None], order=5)[0]
        pi, b = restricted_projection(Ai, T.g[0], T.h_hat[0], T.A_hat[0], initial_t(y[i], p))
        sites_pi.append(pi)
        sites_b.append(b)
    h, A, _ = dense_posterior(kernels, X, order, np.array(sites_pi), np.array(sites_b))
    np.testing.assert_allclose(res.solid.means(), h, atol=1e-6)
    np.testing.assert_allclose(res.solid.pi[:n], np.array(sites_pi), rtol=1e-5, atol=1e-8)


# -- oracle 9: C = 2 equals a binary IVM on z = u1 - u2 -------------------------------------------
def _binary_adf(Kz, t, order, dbeta, Ks, kss, gh=80):
    """Dense sequential binary ADF with logistic sigma(s (z + dbeta)), s = +1 for class 0."""
    x, w = gauss_hermite(gh)
    n = Kz.shape[0]
    tau, nu = np.zeros(n), np.zeros(n)
    for i in order:
        Sig = np.linalg.inv(np.linalg.inv(Kz) + np.diag(tau))
        mu = Sig @ nu
        m, v = mu[i], Sig[i, i]
        z = m + np.sqrt(v) * x
        lik = 1.0 / (1.0 + np.exp(-t[i] * (z + dbeta)))
        Z = w @ lik
        mh = (w * lik) @ z / Z
        vh = (w * lik) @ (z - mh) ** 2 / Z
        tau[i] = 1.0 / vh - 1.0 / v
        nu[i] = mh / vh - m / v
    B = np.linalg.inv(Kz + np.diag(1.0 / np.maximum(tau, 1e-300)))
    ms = Ks.T @ np.linalg.solve(Kz + np.diag(1.0 / tau), nu / tau)
    vs = kss - np.sum(Ks * (B @ Ks), axis=0)
    z = ms[:, None] + np.sqrt(vs)[:, None] * x
    return (1.0 / (1.0 + np.exp(-(z + dbeta)))) @ w


def test_two_classes_equal_binary_ivm():
    n = 10
    rng, X, y, kernels = _problem(2, n=n, seed=11)
    beta = np.array([0.3, 0.0])
    order = rng.permutation(n)[:7]
    s = IVMSettings(d_final=7, L=1, ep_sweeps=0, gh_order=40, order=order)
    res = run_inference(kernels, X, y, beta, s, np.random.default_rng(0))
    Xs = rng.standard_normal((5, 2))
    h, A = res.solid.predict(Xs)
    P = softmax_predictive(h, A, beta, order=40)
    XI = X[order]
    Kz = kernels[0].K(XI) + kernels[1].K(XI)
    Ks = kernels[0].K(XI, Xs) + kernels[1].K(XI, Xs)
    kss = kernels[0].K_diag(Xs) + kernels[1].K_diag(Xs)
    t = np.where(y[order] == 0, 1.0, -1.0)
    p0 = _binary_adf(Kz, t, np.arange(7), beta[0] - beta[1], Ks, kss)
    np.testing.assert_allclose(P[:, 0], p0, atol=1e-6)


# -- oracle 12: criterion value and gradient ------------------------------------------------------
@pytest.mark.parametrize("coupled", [True, False])
def test_criterion_gradient_and_kl(coupled):
    C, n, d = 3, 12, 5
    rng, X, y, kernels = _problem(C, n=n, seed=13)
    if coupled:
        I = rng.permutation(n)[:d]
        pi = rng.uniform(0.1, 2.0, (d, C))
        b = rng.standard_normal((d, C))
        sites = FrozenSites.from_restricted(I, pi, b)
    else:
        sites = FrozenSites([rng.permutation(n)[: d - c] for c in range(C)],
                            [rng.uniform(0.1, 2.0, d - c) for c in range(C)],
                            [rng.standard_normal(d - c) for c in range(C)], False)  # fmt: skip
    beta = rng.normal(0.0, 0.3, C)

    def value(theta):
        for c, k in enumerate(kernels):
            k.set_unconstrained(theta[2 * c : 2 * c + 2])
        return criterion(kernels, X, y, sites, theta[2 * C :], order=20, reduced=True).value

    theta0 = np.concatenate([k.get_unconstrained() for k in kernels] + [beta])
    res = criterion(kernels, X, y, sites, beta, order=20, reduced=True)
    grad = np.concatenate(res.dkernel + [res.dbeta])
    assert_gradient_close(value, grad, theta0, rtol=1e-5, atol=1e-7, name="G gradient")
    assert abs(res.dbeta.sum()) < 1e-10
    assert res.g2 > 0
    if coupled:
        h, A, _ = dense_posterior(kernels, X, I, pi, b)
        ix = (np.arange(C)[:, None] * n + I[None, :]).reshape(-1)
        K = prior_cov(kernels, X)
        KI, AI, mI = K[np.ix_(ix, ix)], A[np.ix_(ix, ix)], h.T.reshape(-1)[ix]
        kl = 0.5 * (np.trace(np.linalg.solve(KI, AI)) + mI @ np.linalg.solve(KI, mI) - ix.size
                    + np.linalg.slogdet(KI)[1] - np.linalg.slogdet(AI)[1])  # fmt: skip
        np.testing.assert_allclose(res.g2, kl, rtol=1e-10)


# -- oracle 13: baseline -------------------------------------------------------------------------
def test_baseline_update_matches_dense_and_tilted_mean():
    C, n = 3, 12
    rng, X, y, kernels = _problem(C, n=n, seed=17)
    rep = BaselineRepresentation(kernels, X)
    picks = [(0, 0), (3, 1), (0, 2), (5, 0), (3, 0)]
    for j, c in picks:
        rep.include(j, c, float(rng.uniform(0.2, 2.0)), float(rng.normal()))
        # h_j equals the tilted mean passed in; maintained h, a equal predictions
    for c in range(C):
        st = rep.classes[c]
        K = kernels[c].K(X)
        W = np.zeros(n)
        nu = np.zeros(n)
        W[st.I] = st.pi
        nu[st.I] = st.b
        S = np.linalg.inv(np.linalg.inv(K) + np.diag(W))
        np.testing.assert_allclose(rep.h[:, c], S @ nu, atol=1e-10)
        np.testing.assert_allclose(rep.a[:, c], np.diag(S), atol=1e-10)
    h, A = rep.predict(X)
    np.testing.assert_allclose(h, rep.h, atol=1e-10)
    rep2 = BaselineRepresentation(kernels, X)
    rep2.include(4, 1, 0.7, 0.42)
    assert abs(rep2.h[4, 1] - 0.42) < 1e-12


def test_baseline_run_scores_positive_and_rows_sum_to_one():
    C, n = 3, 30
    rng, X, y, kernels = _problem(C, n=n, seed=19, shared=True)
    rep = run_baseline(kernels, X, y, np.zeros(C), 6, np.random.default_rng(0))
    assert all(1 <= rep.size(c) <= 6 for c in range(C))
    h, A = rep.predict(X)
    P = softmax_predictive(h, A, order=3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)


# -- oracle 14 (reduced to one data seed) and bad input ------------------------------------------
def test_behavioural_three_blobs():
    X, y, k = three_blobs(540)
    s = IVMSettings(d_final=40, L=5, ep_sweeps=2, pool_size=80, n_init=2, gh_order=3)
    res = run_inference([k] * 3, X[:240], y[:240], np.zeros(3), s, np.random.default_rng(0))
    h, A = res.solid.predict(X[240:])
    P = softmax_predictive(h, A, order=3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert res.min_score > 0 and res.n_improper == 0
    assert np.mean(P.argmax(axis=1) != y[240:]) < 0.10


def test_bad_input_gives_clear_errors():
    rng, X, y, kernels = _problem(3, n=12, seed=21)
    with pytest.raises(InputError, match="d_final"):
        run_inference(kernels, X, y, np.zeros(3), IVMSettings(d_final=13, L=1), rng)
    with pytest.raises(InputError, match="liquid size"):
        run_inference(kernels, X, y, np.zeros(3), IVMSettings(d_final=5, L=6), rng)
    y_missing = np.where(y == 2, 0, y)
    with pytest.raises(InputError, match="no training points"):
        run_inference(kernels, X, y_missing, np.zeros(3), IVMSettings(d_final=5, L=2), rng)
    with pytest.raises(InputError, match="no points"):
        run_baseline(kernels, X, y_missing, np.zeros(3), 4, rng)
