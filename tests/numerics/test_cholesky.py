"""The one Cholesky (``jittered_cholesky``: matrices and stacks, numpy and torch;
``cholesky_error``) and the one triangular solve (``tri_solve``, which is
``gpinfer.backend.ops.solve_triangular``) of ``gpinfer/numerics/cholesky.py``, and what reuses
the factor."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.linalg import cholesky, solve_triangular

from gpinfer.backend import ops
from gpinfer.errors import NumericalError
from gpinfer.numerics import settings
from gpinfer.numerics.cholesky import (
    chol_inverse,
    chol_solve,
    cholesky_error,
    jittered_cholesky,
    log_det_from_chol,
    tri_solve,
)


def _spd(n: int, seed: int = 0) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(n, n))
    return A @ A.T + n * np.eye(n)


def test_cholesky_without_jitter_on_spd_matrix():
    A = _spd(6)
    L, jitter = jittered_cholesky(A)
    assert jitter == 0.0
    np.testing.assert_allclose(L @ L.T, A, rtol=1e-12)
    np.testing.assert_allclose(L, np.tril(L))


def test_cholesky_jitter_escalation_is_recorded():
    x = np.linspace(0, 1, 30)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 10.0**2)  # numerically singular
    L, jitter = jittered_cholesky(K, name="Kuu")
    assert jitter > 0
    rel = jitter / np.mean(np.diag(K))
    ratio = math.log10(rel / settings.JITTER_START)
    assert ratio == pytest.approx(round(ratio), abs=1e-9)  # start x 10^k
    np.testing.assert_allclose(L @ L.T, K + jitter * np.eye(30), atol=1e-12)


def test_cholesky_escalation_factorises_the_failed_matrix_once(monkeypatch):
    """A float64 matrix that fails as it is goes on to the jitter: the escalation does not
    factorise it a second time (one ``potrf`` per try, as before the merge)."""
    tried: list[float] = []
    factorise = ops.cholesky

    def counted(K, *args, **kwargs):
        tried.append(float(K[0, 0]))
        return factorise(K, *args, **kwargs)

    monkeypatch.setattr(ops, "cholesky", counted)
    L, jitter = jittered_cholesky(np.ones((2, 2)), name="K")
    assert jitter == settings.JITTER_START and tried == [1.0, 1.0 + jitter]


def test_cholesky_jitter_warning_on_request():
    K = np.ones((5, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, jitter = jittered_cholesky(K, name="ones", warn=True)
    assert jitter > 0
    assert any("ones" in str(w.message) for w in caught)


def test_cholesky_errors_on_indefinite_and_nan():
    A = np.diag([1.0, -1.0, 2.0])
    with pytest.raises(NumericalError, match="not positive definite") as info:
        jittered_cholesky(A, name="S")
    assert info.value.quantity == "S"
    B = _spd(3)
    B[0, 1] = np.nan
    with pytest.raises(NumericalError, match="non-finite"):
        jittered_cholesky(B)
    with pytest.raises(ValueError, match="square"):
        jittered_cholesky(np.ones((2, 3)))


def test_cholesky_solves_and_determinants():
    A = _spd(5, seed=2)
    b = np.random.default_rng(1).normal(size=(5, 2))
    L, _ = jittered_cholesky(A)
    np.testing.assert_allclose(chol_solve(L, b), np.linalg.solve(A, b), rtol=1e-10)
    np.testing.assert_allclose(L @ tri_solve(L, b), b, rtol=1e-10)
    np.testing.assert_allclose(L.T @ tri_solve(L, b, transpose=True), b, rtol=1e-10)
    assert log_det_from_chol(L) == pytest.approx(np.linalg.slogdet(A)[1], rel=1e-12)
    np.testing.assert_allclose(chol_inverse(L), np.linalg.inv(A), rtol=1e-10)


def test_cholesky_is_scipys_factor_bit_for_bit():
    """``potrf`` called directly is the call ``scipy.linalg.cholesky`` makes: the same bits,
    for C- and Fortran-ordered input."""
    A = _spd(7, seed=3)
    for M in (A, np.asfortranarray(A)):
        assert np.array_equal(jittered_cholesky(M).L, cholesky(M, lower=True))
    assert jittered_cholesky(np.zeros((0, 0))).L.shape == (0, 0)


def test_cholesky_other_layouts_and_the_callers_array_untouched():
    """A strided view, Fortran order and ``1 x 1``: scipy's factor; float32: numpy's factor
    in float32 (the input's dtype, as ``ops.cholesky`` keeps it on every backend); the
    caller's array is never written, on the bare try or on the jitter steps."""
    big = _spd(10, seed=9)
    for M in (big[:6, :6].astype(np.float32), big[::2, ::2], np.asfortranarray(big[:4, :4]),
              np.array([[2.5]])):
        kept = M.copy()
        L = jittered_cholesky(M).L
        assert L.dtype == M.dtype
        expected = (np.linalg.cholesky(M) if M.dtype == np.float32
                    else cholesky(M, lower=True))
        assert np.array_equal(L, expected)
        assert np.array_equal(M, kept)
    jittered = jittered_cholesky(np.ones((4, 4), dtype=np.float32))  # on the host's float64
    assert jittered.L.dtype == np.float32 and jittered.jitter > 0
    ones = np.ones((4, 4))  # singular: factorised on the jitter steps only
    assert jittered_cholesky(ones).jitter > 0
    assert np.array_equal(ones, np.ones((4, 4)))


def test_cholesky_failure_carries_iteration_and_no_jitter_option():
    A = np.diag([1.0, 1e-30, -1.0])
    with pytest.raises(NumericalError, match="not positive definite") as info:
        jittered_cholesky(A, name="B", iteration=7)
    assert (info.value.quantity, info.value.iteration) == ("B", 7)
    assert "iteration 7" in str(info.value) and "even with jitter" in str(info.value)
    singular = np.diag([1.0, 0.0])  # one jitter step would do; max_jitter=0 allows none
    with pytest.raises(NumericalError, match="not positive definite") as info:
        jittered_cholesky(singular, name="W", max_jitter=0.0)
    assert "jitter" not in str(info.value)
    assert jittered_cholesky(singular, name="W").jitter > 0
    err = cholesky_error("E", iteration=2, nonfinite=True)
    assert (err.quantity, err.iteration) == ("E", 2) and "non-finite" in str(err)


def test_cholesky_absolute_jitter_without_the_bare_try():
    """``bare=False, scale=1``: ``K + r I`` for ``r = start, 10 start, ...`` (fv's ridge)."""
    K = np.ones((4, 4))  # singular: needs a ridge, and gets the first one tried
    L, ridge = jittered_cholesky(K, bare=False, start=1e-6, scale=1.0, max_jitter=1e5)
    assert ridge == 1e-6
    np.testing.assert_array_equal(L, cholesky(K + 1e-6 * np.eye(4), lower=True))
    A = _spd(4)  # positive definite, yet bare=False still adds the first ridge
    assert jittered_cholesky(A, bare=False, start=1e-3, scale=1.0, max_jitter=1.0).jitter == 1e-3
    with pytest.raises(ValueError, match="start > 0"):
        jittered_cholesky(K, bare=False, start=0.0, scale=1.0, max_jitter=1.0)


def test_cholesky_shift_along_a_diagonal():
    """A vector ``scale`` ``d``: ``A + r diag(d)`` (newton's Levenberg-Marquardt shift), ``r``
    growing by ``factor`` from ``start``; the jitter returned is ``r``."""
    d = np.array([1.0, 4.0, 0.5])
    A = np.diag([1.0, -1.0, 2.0])  # needs r d_2 > 1: r = 1e-8 4^k, the first above 1/4
    L, r = jittered_cholesky(A, start=1e-8, factor=4.0, max_jitter=1e12, scale=d)
    k = math.ceil(math.log(0.25 / 1e-8, 4))
    assert r == pytest.approx(1e-8 * 4.0**k, rel=1e-12)
    np.testing.assert_allclose(L @ L.T, A + r * np.diag(d), rtol=1e-12)


@pytest.mark.parametrize("order", ["C", "F", "view"])
@pytest.mark.parametrize("shape", [(6,), (6, 3), "F"])
def test_tri_solve_is_scipys_solve_bit_for_bit(order, shape):
    """``trtrs`` called directly, dispatched as ``scipy.linalg.solve_triangular`` does: the
    same bits for every layout of ``L`` and ``B``, both ``transpose`` settings."""
    rng = np.random.default_rng(5)
    big = np.linalg.cholesky(_spd(8, seed=4))
    L = {"C": big[:6, :6].copy(), "F": np.asfortranarray(big[:6, :6]), "view": big[:6, :6]}[order]
    B = rng.normal(size=(3, 6)).T if shape == "F" else rng.normal(size=shape)
    for t in (False, True):
        want = solve_triangular(L, B, lower=True, trans=int(t), check_finite=False)
        assert np.array_equal(tri_solve(L, B, transpose=t), want)
    np.testing.assert_allclose(tri_solve(L, B.T if B.ndim == 2 else B[None], right=True),
                               (B.T if B.ndim == 2 else B[None]) @ np.linalg.inv(L), rtol=1e-10)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("overwrite", [False, True])
def test_tri_solve_right_on_stacks_and_torch(transpose, overwrite):
    """``right`` dispatches stacks and torch arrays as the left solve does (to
    ``ops.solve_triangular``): ``B L^-1`` (``B L^-T``) per matrix of the stack."""
    rng = np.random.default_rng(8)
    L = np.stack([np.linalg.cholesky(_spd(5, seed=s)) for s in (1, 2)])  # [2, 5, 5]
    B = rng.normal(size=(2, 4, 5))
    want = np.stack([B[i] @ np.linalg.inv(L[i].T if transpose else L[i]) for i in range(2)])
    np.testing.assert_allclose(tri_solve(L, B.copy(), right=True, transpose=transpose,
                                         overwrite=overwrite), want, rtol=1e-10)
    torch = pytest.importorskip("torch")
    for Lt, Bt, w in ((L, B, want), (L[0], B[0], want[0])):
        got = tri_solve(torch.tensor(Lt), torch.tensor(Bt), right=True, transpose=transpose,
                        overwrite=overwrite)
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-10)


def test_tri_solve_rows_in_place_and_zero_diagonal():
    rng = np.random.default_rng(6)
    L = np.asfortranarray(np.linalg.cholesky(_spd(5, seed=6)))
    B = rng.normal(size=(4, 5))
    want = B @ np.linalg.inv(L).T
    out = tri_solve(L, B, right=True, transpose=True, overwrite=True)  # B <- B L^-T
    assert out is B
    np.testing.assert_allclose(B, want, rtol=1e-10)
    Bc = rng.normal(size=(4, 5))  # not overwritten without ``overwrite``: a new array
    kept = Bc.copy()
    np.testing.assert_allclose(tri_solve(L, Bc, right=True, transpose=True),
                               Bc @ np.linalg.inv(L).T, rtol=1e-10)
    np.testing.assert_array_equal(Bc, kept)
    Z = np.tril(np.ones((3, 3)))
    Z[1, 1] = 0.0
    with pytest.raises(NumericalError, match="zero on the factor's diagonal"):
        tri_solve(Z, np.ones(3))


@pytest.mark.parametrize("shape", [(2, 2), (2,), (4, 2), (4,)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_tri_solve_refuses_mismatched_shapes(shape, order):
    """A ``B`` whose rows do not match ``L [3, 3]`` is a ``ValueError`` (scipy's), not LAPACK's
    ``info < 0`` with ``B`` returned unsolved (or its first 3 rows solved)."""
    L = np.array(np.linalg.cholesky(_spd(3, seed=9)), order=order)
    with pytest.raises(ValueError, match="incompatible"):
        tri_solve(L, np.ones(shape))
    with pytest.raises(ValueError):
        tri_solve(np.ones((3, 2)), np.ones(3))  # L not square


def test_solve_rows_is_a_deprecated_alias():
    import gpinfer.numerics.cholesky as chol

    L = np.linalg.cholesky(_spd(4, seed=8))
    B = np.random.default_rng(8).normal(size=(3, 4))
    want = B @ np.linalg.inv(L).T
    with pytest.warns(DeprecationWarning, match="tri_solve"):
        solve_rows = chol.solve_rows
    solve_rows(L, B)
    np.testing.assert_allclose(B, want, rtol=1e-10)
    with pytest.raises(AttributeError):
        chol.no_such_name  # noqa: B018


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "torch-cpu"])
def test_stacks_escalate_per_matrix_and_name_the_failure(device):
    """A stack (numpy or torch): one factorisation, a failed matrix escalated on its own (the
    others' factors as the stack's factorisation gives them, the escalated one the
    single-matrix escalation's), the largest jitter reported; a non-finite matrix named with
    its position (``part``, ``first``), quantity ``name``, the iteration kept; without jitter
    the not-positive-definite error with ``detail``, and ``also_finite`` checked
    (``inputs``)."""
    torch = pytest.importorskip("torch") if device else None
    to = torch.as_tensor if device else np.asarray
    K = np.stack([_spd(4, seed=1), np.ones((4, 4)), _spd(4, seed=2)])  # matrix 1 singular
    L, jitter = jittered_cholesky(to(K), name="Kuu")
    Lh = ops.to_host(L)
    single = jittered_cholesky(np.ones((4, 4)))
    np.testing.assert_array_equal(Lh[1], single.L)
    assert jitter == single.jitter > 0
    np.testing.assert_allclose(Lh[[0, 2]] @ np.swapaxes(Lh[[0, 2]], 1, 2), K[[0, 2]],
                               rtol=1e-12)
    bad = K.copy()
    bad[2, 0, 0] = np.nan
    with pytest.raises(NumericalError, match=r"Kuu \(latent 7\) has non-finite") as info:
        jittered_cholesky(to(bad), name="Kuu", part="latent", first=5, iteration=3)
    assert (info.value.quantity, info.value.iteration) == ("Kuu", 3)
    with pytest.raises(NumericalError, match=r"B failed \(why\); the matrix is not") as info:
        jittered_cholesky(to(K), name="B", max_jitter=0.0, detail=" (why)")
    assert info.value.quantity == "B"
    with pytest.raises(NumericalError, match="sums are not finite"):
        jittered_cholesky(to(K[[0, 2]]), to(np.array([np.inf])), name="B", inputs="sums")
    with pytest.raises(ValueError, match="square"):
        jittered_cholesky(to(np.ones((2, 2, 3))))


def test_stack_again_formed_where_the_in_place_factorisation_failed():
    """``again`` (a caller that owns the stack): numpy factorises it in place (from order
    ``ops._POTRF_LOOP_FROM`` on, no copy); where a matrix fails, the escalation works on
    ``again()`` and gives the copying path's factors, bit for bit."""
    m = ops._POTRF_LOOP_FROM
    good = np.stack([_spd(m, seed=s) for s in range(3)])
    K = good.copy()
    L = jittered_cholesky(K, again=good.copy).L
    assert np.shares_memory(L, K) and np.array_equal(L, jittered_cholesky(good).L)
    bad = good.copy()
    bad[1] = np.ones((m, m))
    calls = []

    def again():
        calls.append(1)
        return bad.copy()

    assert np.array_equal(jittered_cholesky(bad.copy(), again=again).L,
                          jittered_cholesky(bad).L)
    assert calls == [1]


def test_the_solve_names_a_zero_on_the_diagonal_and_tri_solve_is_the_ops_solve():
    assert tri_solve is ops.solve_triangular
    L = np.array([[1.0, 0.0], [2.0, 0.0]])
    with pytest.raises(NumericalError, match="zero on the factor's diagonal") as info:
        tri_solve(L, np.ones(2))
    assert info.value.quantity == "triangular factor"


def test_the_old_names_work_one_more_release_with_a_warning():
    """``stacked_cholesky``, ``tri_solve_stack``, ``site_cholesky`` and
    ``ops.checked_cholesky``, merged into ``jittered_cholesky``, ``ops.solve_triangular`` and
    ``ops.cholesky``: the same results, each with a ``DeprecationWarning`` naming its
    successor."""
    import gpinfer.sites.inducing as inducing
    import gpinfer.sites.stacked as stacked

    K = np.stack([_spd(4, seed=1), np.ones((4, 4))])
    B = np.random.default_rng(0).normal(size=(2, 4, 3))
    with pytest.warns(DeprecationWarning, match="jittered_cholesky"):
        L = stacked.stacked_cholesky(K, "Kuu", unit="latent")
    np.testing.assert_array_equal(L, jittered_cholesky(K, name="Kuu").L)
    with (pytest.warns(DeprecationWarning),
          pytest.raises(NumericalError, match=r"Kuu \(latent 3\)") as err):
        stacked.stacked_cholesky(np.stack([K[0], K[0] * np.nan]), name="Kuu", iteration=7,
                                 unit="latent", first=2)  # the old keywords, the old naming
    assert (err.value.quantity, err.value.iteration) == ("Kuu", 7)
    with pytest.warns(DeprecationWarning, match="ops.solve_triangular"):
        assert stacked.tri_solve_stack is ops.solve_triangular
    with pytest.warns(DeprecationWarning, match="site_factor"):
        LB = inducing.site_cholesky(K[:1], B[:1, :, 0])
    np.testing.assert_array_equal(LB, ops.cholesky(K[:1])[0])
    with pytest.warns(DeprecationWarning, match="check=True"):
        assert ops.checked_cholesky(K) is None
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(ops.checked_cholesky(K[:1]), LB)
    with pytest.raises(AttributeError):
        stacked.no_such_name  # noqa: B018
