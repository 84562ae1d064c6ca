"""Incremental Cholesky primitives (spec ivm §2.3, §7 oracle 1)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.cholupdate import cholext, chollrup

from gpinfer.errors import NumericalError


def _spd(rng, C, scale=1.0):
    X = rng.standard_normal((C, C))
    return scale * (X @ X.T / C + 0.3 * np.eye(C))


# -- oracle 1: Cholesky primitives ---------------------------------------------------------------
def test_cholext_and_chollrup_match_numpy():
    rng = np.random.default_rng(0)
    S = _spd(rng, 6)
    L = np.linalg.cholesky(S[:5, :5])
    l, lam = cholext(L, S[:5, 5], S[5, 5])
    L6 = np.linalg.cholesky(S)
    np.testing.assert_allclose(np.r_[l, lam], L6[5], rtol=1e-12)
    r = rng.standard_normal(6) * 0.3
    X = rng.standard_normal((6, 4))
    for sign in (1.0, -1.0):
        Lp, Xp = chollrup(L6, r, sign, X)
        np.testing.assert_allclose(Lp, np.linalg.cholesky(S + sign * np.outer(r, r)), atol=1e-12)
        np.testing.assert_allclose(Lp @ Xp, L6 @ X, atol=1e-12)
    with pytest.raises(NumericalError):
        chollrup(L6, 10.0 * r / np.linalg.norm(r) * np.sqrt(np.linalg.eigvalsh(S).max()), -1.0)
