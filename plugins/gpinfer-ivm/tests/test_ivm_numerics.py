"""Spec ivm §7 oracles 7-8: restricted projection and selection scores (1, 4-6: tests/numerics)."""

from __future__ import annotations

import numpy as np
from gpinfer_ivm.gaussian_cubature import (
    gaussian_kl,
    softmax_tilted,
)
from gpinfer_ivm.projection import (
    _local,
    initial_t,
    objective,
    project_direct,
    project_double_loop,
    project_newton,
    restricted_projection,
    site_precision,
    site_sqrt,
)
from ivm_test_data import spd, tilted_batch

from gpinfer.testing.gradcheck import numerical_gradient, relative_error


# -- oracle 7: restricted projection -------------------------------------------------------------
def test_projection_gradient_and_algorithms():
    rng = np.random.default_rng(3)
    C, y = 4, 2
    A = spd(rng, C)
    h = rng.standard_normal(C)
    T = softmax_tilted(np.array([y]), h[None], A[None], order=8)
    Ah = T.A_hat[0]
    t = rng.standard_normal(C)
    g = objective(t, A, Ah)[1]
    num = numerical_gradient(lambda tt: objective(tt, A, Ah)[0], t)
    assert relative_error(g, num) < 1e-6
    t0 = initial_t(y, np.full(C, 1.0 / C))
    td = project_direct(A, Ah, t0)
    tl, hist = project_double_loop(A, Ah, t0)
    assert np.all(np.diff(hist) <= 1e-12), "double loop increased f"
    assert objective(td, A, Ah)[0] <= objective(tl, A, Ah)[0] + 1e-8
    # dense f agrees with the stable evaluation
    Pi = site_precision(np.exp(td))
    dense = -np.linalg.slogdet(np.eye(C) + A @ Pi)[1] + np.trace(Ah @ Pi)
    np.testing.assert_allclose(objective(td, A, Ah)[0], dense, atol=1e-12)
    V = site_sqrt(np.exp(td))
    np.testing.assert_allclose(V @ V.T, Pi, atol=1e-14)
    # the new marginal mean equals h_hat
    pi, b = restricted_projection(A, T.g[0], T.h_hat[0], Ah, t0)
    Pi = site_precision(pi)
    new_mean = np.linalg.solve(np.linalg.inv(A) + Pi, np.linalg.solve(A, h) + b)
    np.testing.assert_allclose(new_mean, T.h_hat[0], atol=1e-10)
    assert abs(b.sum()) < 1e-12


def _projection_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """A marginal ``A [C, C]`` (scale 0.1-20), its tilted covariance ``A_hat`` and a label."""
    C = int(rng.integers(2, 7))
    y = int(rng.integers(C))
    A = spd(rng, C) * rng.uniform(0.1, 20)
    h = rng.standard_normal(C) * rng.uniform(0, 3)
    T = softmax_tilted(np.array([y]), h[None], A[None], order=5 if C < 6 else 3)
    return A, T.A_hat[0], y


def _check_newton_derivatives(A: np.ndarray, Ah: np.ndarray, t: np.ndarray) -> None:
    loc = _local(t, A, Ah)
    f, g = objective(t, A, Ah)
    np.testing.assert_allclose(loc.f, f, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(loc.grad, g, rtol=1e-9, atol=1e-12)
    assert relative_error(loc.grad, numerical_gradient(lambda tt: _local(tt, A, Ah).f, t)) < 1e-6
    num = np.array([numerical_gradient(lambda tt, c=c: _local(tt, A, Ah).grad[c], t)
                    for c in range(t.size)])  # fmt: skip
    # central differences of the gradient (noise ~1e-8 of the gradient's scale per entry)
    assert np.max(np.abs(loc.hess - num)) < 1e-6 * np.max(np.abs(loc.hess))


def test_newton_derivatives_match_finite_differences():
    rng = np.random.default_rng(11)
    for _ in range(20):
        A, Ah, _y = _projection_case(rng)
        _check_newton_derivatives(A, Ah, rng.standard_normal(A.shape[0]) * 1.5)


def test_newton_projection_matches_lbfgs():
    """The default Newton projection finds the L-BFGS-B site (spec §2.6 direct) on generated
    marginals: the same ``Pi`` to L-BFGS-B's own accuracy and never a higher ``f``. Cases where
    L-BFGS-B runs a component to its ceiling (``f`` flat towards ``pi_c -> inf``, the site at
    infinity) are left out of the comparison of ``Pi``: there ``f`` is compared only."""
    rng = np.random.default_rng(12)
    compared = 0
    for _ in range(150):
        A, Ah, y = _projection_case(rng)
        t0 = initial_t(y, np.full(A.shape[0], 1.0 / A.shape[0]))
        td, tn = project_direct(A, Ah, t0), project_newton(A, Ah, t0)
        fd, fn = objective(td, A, Ah)[0], objective(tn, A, Ah)[0]
        if np.exp(td).max() > 1e4 or np.exp(tn).max() > 1e4:
            assert fn <= fd + 2e-4 * (1.0 + abs(fd))  # fd: round-off of pi ~ 1e10
            continue
        compared += 1
        assert fn <= fd + 1e-11 * (1.0 + abs(fd))
        Pd, Pn = site_precision(np.exp(td)), site_precision(np.exp(tn))
        assert np.max(np.abs(Pn - Pd)) <= 1e-4 * np.max(np.abs(Pd))
    assert compared >= 120


def test_projection_c2_is_binary_adf():
    rng = np.random.default_rng(4)
    A = spd(rng, 2)
    h = rng.standard_normal(2)
    T = softmax_tilted(np.array([0]), h[None], A[None], order=40)
    dvec = np.array([1.0, -1.0])
    tau = 1.0 / (dvec @ T.A_hat[0] @ dvec) - 1.0 / (dvec @ A @ dvec)
    for algorithm in ("newton", "direct"):
        pi, _ = restricted_projection(A, T.g[0], T.h_hat[0], T.A_hat[0], np.zeros(2), algorithm)
        np.testing.assert_allclose(pi[0] * pi[1] / pi.sum(), tau, rtol=1e-6)


# -- oracle 8: scores ---------------------------------------------------------------------------
def test_simple_score_is_dense_kl_and_non_negative():
    rng = np.random.default_rng(5)
    C, B = 3, 20
    A, h, y = tilted_batch(rng, C, rng.uniform(0.5, 5, B))
    T = softmax_tilted(y, h, A, order=3)
    kl = gaussian_kl(T.h_hat, T.A_hat, h, A)
    assert np.all(kl > 0)
    for j in range(3):
        A1, A0, dm = T.A_hat[j], A[j], T.h_hat[j] - h[j]
        dense = 0.5 * (
            np.trace(np.linalg.solve(A0, A1))
            + dm @ np.linalg.solve(A0, dm)
            - C
            + np.linalg.slogdet(A0)[1]
            - np.linalg.slogdet(A1)[1]
        )
        np.testing.assert_allclose(kl[j], dense, rtol=1e-10)
