"""The hot loops' fast spellings change round-off only: a digits fit (10 classes, fixed kernel,
``ep_tol = 0``) with the plain-numpy reference spellings below patched in predicts the same
probabilities to 1e-10."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm import projection
from gpinfer_ivm.solid import SolidRepresentation

from gpinfer.estimator import GPClassifier
from gpinfer.testing.default_battery import sklearn_case

Array = np.ndarray


def reference_newton(A: Array, A_hat: Array, t0: Array) -> Array:
    """``projection.project_newton`` spelled with ``np.linalg.eigh``, ``np.clip``, ``np.max``
    and a full ``np.zeros_like`` step (the spelling before the LAPACK-direct rewrite)."""
    P = projection
    lo, hi = np.log(P.PI_FLOOR), np.log(P.PI_CEIL)
    t = np.clip(np.asarray(t0, dtype=float), lo, hi)
    if t.size == 2:
        exact = P._binary_minimiser(A, A_hat, t)
        if exact is not None:
            return exact
    cur = P._local(t, A, A_hat)
    for _ in range(P.NEWTON_MAXITER):
        free = ~(((t <= lo) & (cur.grad > 0)) | ((t >= hi) & (cur.grad < 0)))
        if not np.any(free) or np.max(np.abs(cur.grad[free])) <= P.NEWTON_GTOL:
            break
        lam, Q = np.linalg.eigh(cur.hess[np.ix_(free, free)])
        lam = np.maximum(np.abs(lam), P.NEWTON_EIG_FLOOR * max(float(np.max(np.abs(lam))), 1e-300))
        step = np.zeros_like(t)
        step[free] = -(Q @ ((Q.T @ cur.grad[free]) / lam))
        if -float(cur.grad @ step) <= P.NEWTON_FTOL * (1.0 + abs(cur.f)):
            break
        size, nxt = min(1.0, P.NEWTON_MAX_STEP / float(np.max(np.abs(step)))), None
        for _ in range(P.NEWTON_HALVINGS):
            trial = np.clip(t + size * step, lo, hi)
            cand = P._local(trial, A, A_hat)
            if cand.f <= cur.f + P.NEWTON_ARMIJO * float(cur.grad @ (trial - t)):
                nxt = (trial, cand)
                break
            size *= 0.5
        if nxt is None or np.array_equal(nxt[0], t):
            break
        gain = cur.f - nxt[1].f
        t, cur = nxt
        if gain <= P.NEWTON_FTOL * (1.0 + abs(cur.f)):
            break
    return t


def reference_cross_covariances(self, idx1: Array, idx2: Array) -> Array:
    """``SolidRepresentation.cross_covariances`` by ``np.einsum`` and one kernel evaluation
    per class (the spelling before the GEMM rewrite)."""
    idx1, idx2 = np.asarray(idx1, dtype=np.int64), np.asarray(idx2, dtype=np.int64)
    d = self.d
    if idx1.size == 0 or idx2.size == 0:
        return np.zeros((idx1.size, self.C, idx2.size, self.C))
    out = np.einsum("cdj,edk->jcke", self.q_stubs(idx1), self.q_stubs(idx2))
    for c in range(self.C):
        Mc = self.M[c, :d]
        out[:, c, :, c] += (self.kernels[c].K(self.X[idx1], self.X[idx2])
                            - Mc[:, idx1].T @ Mc[:, idx2])
    return out


def _digits_proba() -> Array:
    X, y, Xt, _ = sklearn_case("digits", True)
    est = GPClassifier(method="ivm", M=40, optimize=False, random_state=0,
                       method_options={"ep_tol": 0.0}).fit(X[:150], y[:150])
    return est.predict_proba(Xt[:60])


@pytest.fixture(scope="module")
def fast_proba() -> Array:
    return _digits_proba()


@pytest.mark.parametrize("module, name, reference", [
    (projection, "project_newton", reference_newton),
    (SolidRepresentation, "cross_covariances", reference_cross_covariances),
])
def test_fast_spelling_is_round_off_only(monkeypatch, fast_proba, module, name, reference):
    monkeypatch.setattr(module, name, reference)
    assert np.abs(fast_proba - _digits_proba()).max() <= 1e-10


def test_site_precision_and_sqrt_are_the_textbook_sums_exactly():
    pi = np.exp(3.0 * np.random.default_rng(1).normal(size=(3, 4, 10)))
    alpha = pi.sum(axis=-1)[..., None, None]
    textbook = pi[..., :, None] * np.eye(10) - pi[..., :, None] * pi[..., None, :] / alpha
    np.testing.assert_array_equal(projection.site_precision(pi), textbook)
    np.testing.assert_array_equal(projection.site_precision(pi[0, 0]), textbook[0, 0])
    xt = np.sqrt(pi / pi.sum(axis=-1, keepdims=True))
    root = np.sqrt(pi)[..., :, None] * (np.eye(10) - xt[..., :, None] * xt[..., None, :])
    np.testing.assert_array_equal(projection.site_sqrt(pi), root)
    np.testing.assert_array_equal(projection.site_sqrt(pi[0, 0]), root[0, 0])
