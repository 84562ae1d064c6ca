"""Full-covariance softmax expectations (spec ivm §2.5, §7 oracles 4-6)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.gaussian_cubature import gauss_rule, softmax_predictive, softmax_tilted

from gpinfer.errors import NumericalError


def _spd(rng, C, scale=1.0):
    X = rng.standard_normal((C, C))
    return scale * (X @ X.T / C + 0.3 * np.eye(C))


# -- oracle 4 and 6: rules and predictive ---------------------------------------------------------
@pytest.mark.parametrize("order", [3, 5])
def test_product_rule_weights_and_exactness(order):
    C = 3
    rule = gauss_rule(np.zeros((1, C)), np.eye(C)[None], order, reduced=False)
    np.testing.assert_allclose(rule.weights.sum(), 1.0, atol=1e-14)
    s = rule.nodes[0].T
    for a in [(2, 0, 0), (2, 2, 0), (order * 2 - 2, 2, 0), (1, 1, 1), (4, 0, 2)]:
        if max(a) > 2 * order - 1:
            continue
        exact = np.prod([0 if k % 2 else np.prod(np.arange(k - 1, 0, -2)) for k in a])
        np.testing.assert_allclose(rule.weights @ np.prod(s**a, axis=1), exact, atol=1e-10)


@pytest.mark.parametrize("reduced", [False, True])
def test_predictive_rows_sum_to_one(reduced):
    rng = np.random.default_rng(1)
    C = 4
    A = np.stack([_spd(rng, C, 3.0) for _ in range(5)])
    P = softmax_predictive(rng.standard_normal((5, C)), A, rng.normal(size=C), 3, reduced)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert np.all((P >= 0) & (P <= 1))
    ent = -np.sum(P * np.log(P), axis=1)
    assert np.all(ent <= np.log(C) + 1e-12)


# -- oracle 5: tilted moments against Monte Carlo ------------------------------------------------
def test_tilted_moments_against_monte_carlo():
    rng = np.random.default_rng(2)
    C, y = 3, 1
    A = _spd(rng, C, 0.8)
    h = rng.standard_normal(C)
    beta = np.array([0.2, -0.1, 0.0])
    T = softmax_tilted(np.array([y]), h[None], A[None], beta, order=20, reduced=True)
    U = h + rng.standard_normal((400_000, C)) @ np.linalg.cholesky(A).T
    V = U + beta
    w = np.exp(V[:, y] - np.log(np.exp(V).sum(axis=1)))
    Z = w.mean()
    se = w.std() / np.sqrt(w.size)
    assert abs(np.exp(T.log_z[0]) - Z) < 4 * se
    wn = w / w.sum()
    mean = wn @ U
    cov = (U - mean).T @ ((U - mean) * wn[:, None])
    se_mean = np.sqrt(np.sum(wn**2 * (U - mean).T ** 2, axis=1))
    assert np.all(np.abs(T.h_hat[0] - mean) < 4 * se_mean)
    np.testing.assert_allclose(T.A_hat[0], cov, atol=5e-3)
    assert abs(T.g.sum()) < 1e-14
    # full-rule and reduced-rule results agree with a high order
    F = softmax_tilted(np.array([y]), h[None], A[None], beta, order=16, reduced=False)
    np.testing.assert_allclose(F.h_hat, T.h_hat, atol=1e-5)
    np.testing.assert_allclose(F.A_hat, T.A_hat, atol=1e-4)


def test_tilted_rejects_non_finite_input():
    with pytest.raises(NumericalError):
        softmax_tilted(np.array([0]), np.array([[np.nan, 0.0]]), np.eye(2)[None])


def test_expected_log_prob_derivatives_against_finite_differences():
    from gpinfer_ivm.gaussian_cubature import softmax_expected_log_prob

    from gpinfer.testing.gradcheck import numerical_gradient

    rng = np.random.default_rng(7)
    C, y = 3, np.array([2])
    A = _spd(rng, C)
    h = rng.standard_normal(C)
    beta = np.array([0.1, 0.0, -0.2])
    out = softmax_expected_log_prob(y, h[None], A[None], beta, order=20, reduced=True)

    def val_h(m):
        return softmax_expected_log_prob(y, m[None], A[None], beta, 20, True).value[0]

    def val_A(a):
        S = a.reshape(C, C)
        return softmax_expected_log_prob(y, h[None], 0.5 * (S + S.T)[None], beta, 20, True).value[0]

    np.testing.assert_allclose(out.dmean[0], numerical_gradient(val_h, h), atol=1e-7)
    np.testing.assert_allclose(
        out.dcov[0].reshape(-1), numerical_gradient(val_A, A.reshape(-1)), atol=1e-6
    )
    np.testing.assert_allclose(out.dmean.sum(), 0.0, atol=1e-14)


# -- the class-major evaluation equals a plain node-major one (round-off) ------------------------
def _node_major_reference(y, h, A, beta, order, reduced, rule):
    """Point by point, nodes ``[E, C]``, scipy's ``log_softmax``: ``(log_z, g, h_hat, A_hat)``,
    the predictive probabilities and ``(value, dmean, dcov)`` of the expected log-likelihood."""
    from gpinfer_ivm.gaussian_cubature import product_rule, sobol_rule
    from scipy.special import log_softmax, logsumexp

    from gpinfer.numerics.quadrature import ones_complement_basis

    C = h.shape[1]
    W = ones_complement_basis(C) if reduced else np.eye(C)
    D = W.shape[1]
    s, w = product_rule(D, order) if rule == "product" else sobol_rule(D, order)
    out = []
    for yb, hb, Ab in zip(y, h, A):
        lam, V = np.linalg.eigh(W.T @ Ab @ W)
        WR, WR_inv = W @ V @ np.diag(np.sqrt(lam)) @ V.T, W @ V @ np.diag(lam**-0.5) @ V.T
        lp = log_softmax(hb + s @ WR.T + beta, axis=1)  # [E, C]
        log_z = logsumexp(lp[:, yb], b=w)
        om = w * np.exp(lp[:, yb] - log_z)
        mu = om @ s
        Sig = (s * om[:, None]).T @ s - np.outer(mu, mu)
        g = WR_inv @ mu
        g -= g.mean()
        A_hat = Ab + Ab @ WR_inv @ (Sig - np.eye(D)) @ WR_inv.T @ Ab
        p = np.exp(lp)
        Ep = w @ p
        dcov = -0.5 * (np.diag(Ep) - (p * w[:, None]).T @ p)
        out.append((log_z, g, hb + Ab @ g, A_hat, Ep, w @ lp[:, yb], np.eye(C)[yb] - Ep, dcov))
    return [np.array(v) for v in zip(*out)]


@pytest.mark.parametrize(("C", "order", "reduced", "rule"),
                         [(3, 5, False, "product"), (5, 3, True, "product"),
                          (10, 1024, True, "sobol")])  # fmt: skip
def test_class_major_evaluation_equals_node_major_reference(C, order, reduced, rule):
    from gpinfer_ivm.gaussian_cubature import softmax_expected_log_prob

    rng = np.random.default_rng(C)
    B = 4
    h = 3.0 * rng.standard_normal((B, C))
    A = np.stack([_spd(rng, C, scale) for scale in (0.1, 1.0, 10.0, 100.0)])
    y, beta = rng.integers(0, C, B), rng.standard_normal(C)
    ref = _node_major_reference(y, h, A, beta, order, reduced, rule)
    got = [*softmax_tilted(y, h, A, beta, order, reduced, rule),
           softmax_predictive(h, A, beta, order, reduced, rule),
           *softmax_expected_log_prob(y, h, A, beta, order, reduced, rule)]
    for name, a, b in zip(("log_z", "g", "h_hat", "A_hat", "p", "E log p", "dmean", "dcov"),
                          got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * max(1.0, np.abs(b).max()),
                                   err_msg=name)
