"""Oracles of the per-namespace operations (``gpinfer.backend.ops``) and of the normal-CDF
functions built on them, on numpy and on torch's CPU build (exact answers, scipy's reference
functions, and numpy == torch to round-off)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import special

from gpinfer.backend import ops
from gpinfer.numerics.normal import inv_mills, log_Phi_derivatives, probit_curvature

torch = pytest.importorskip("torch")


def _namespaces():
    return [pytest.param(np.asarray, id="numpy"),
            pytest.param(lambda a: torch.as_tensor(np.asarray(a)), id="torch-cpu")]


def _spd_stack(rng, C=3, M=6):
    A = rng.normal(size=(C, M, M))
    return A @ np.swapaxes(A, 1, 2) + M * np.eye(M)


@pytest.mark.parametrize("to", _namespaces())
def test_cholesky_solves_and_inverse_against_dense_answers(to):
    rng = np.random.default_rng(0)
    K = _spd_stack(rng)
    L, failed = ops.cholesky(to(K))
    assert not failed.any()
    Lh = ops.to_host(L)
    np.testing.assert_allclose(Lh @ np.swapaxes(Lh, 1, 2), K, rtol=1e-12, atol=1e-12)
    assert np.allclose(Lh, np.tril(Lh))
    B = rng.normal(size=(3, 6, 4))
    for transpose in (False, True):
        X = ops.to_host(ops.solve_triangular(L, to(B), transpose=transpose))
        T = np.swapaxes(Lh, 1, 2) if transpose else Lh
        np.testing.assert_allclose(T @ X, B, rtol=1e-10, atol=1e-12)
        # from the right: X op(L) = B for B [3, 4, 6], with and without a kept L^T view
        Br = np.swapaxes(B, 1, 2)
        for L_T in (None, ops.mT(L)):
            Xr = ops.to_host(ops.solve_triangular(L, to(Br), transpose=transpose, L_T=L_T,
                                                  right=True))
            assert Xr.shape == Br.shape
            np.testing.assert_allclose(Xr @ T, Br, rtol=1e-10, atol=1e-12)
    L_before = ops.to_host(L).copy()
    inv, bad = ops.cho_inverse(L)
    assert not bad
    np.testing.assert_allclose(ops.to_host(inv), np.linalg.inv(K), rtol=1e-10, atol=1e-13)
    np.testing.assert_array_equal(ops.to_host(L), L_before)  # the factors are read only
    if ops.is_numpy(inv):  # both triangles from the one LAPACK triangle: exactly symmetric
        np.testing.assert_array_equal(inv, np.swapaxes(inv, 1, 2))
        singular = np.array(L)
        singular[1, 2, 2] = 0.0
        assert ops.cho_inverse(singular)[1]
        # overwrite: the caller's own stack inverted in place, the same bits as from a copy
        own = L_before.copy()
        out, bad = ops.cho_inverse(own, overwrite=True)
        assert out is own and not bad
        np.testing.assert_array_equal(out, inv)
        # a stack it cannot write into (a transposed view) is copied and left alone
        view = np.swapaxes(np.swapaxes(L_before, 1, 2).copy(), 1, 2)
        out, _ = ops.cho_inverse(view, overwrite=True)
        assert not np.shares_memory(out, view)
        np.testing.assert_array_equal(view, L_before)
        np.testing.assert_array_equal(out, inv)
    # one 2-D factor as well
    x2 = ops.to_host(ops.solve_triangular(L[0], to(B[0])))
    np.testing.assert_allclose(Lh[0] @ x2, B[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("to", _namespaces())
@pytest.mark.parametrize("shared", [False, True])
def test_solve_triangular_with_solves_a_stack_and_a_vector_by_each_factor(to, shared):
    """``solve_triangular_with(L, A, v)``: ``L^-1 A`` (``A`` per factor or one shared) and
    ``L^-1 v``, against a dense inverse of each factor, on numpy and torch."""
    rng = np.random.default_rng(7)
    L, _ = ops.cholesky(_spd_stack(rng, C=3, M=6))
    A = rng.normal(size=(6, 5) if shared else (3, 6, 5))
    v = rng.normal(size=(3, 6))
    R, z = ops.solve_triangular_with(to(L), to(A), to(v))
    inv = np.linalg.inv(L)
    np.testing.assert_allclose(ops.to_host(R), inv @ A, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ops.to_host(z), np.einsum("cij,cj->ci", inv, v), rtol=1e-10,
                               atol=1e-12)
    assert tuple(R.shape) == (3, 6, 5) and tuple(z.shape) == (3, 6)


def test_solve_triangular_overwrite_solves_in_place_where_it_can():
    """numpy ``solve_triangular(overwrite=True)``: the same bits as a solve on a copy, in place
    on a writable C-ordered stack (the caller's array is the result), on a copy otherwise (a
    non-contiguous view or a read-only array is left as it was)."""
    rng = np.random.default_rng(4)
    L, _ = ops.cholesky(_spd_stack(rng, C=3, M=70))
    B = rng.normal(size=(3, 70, 9))
    for transpose in (False, True):
        expected = ops.solve_triangular(L, B, transpose=transpose)
        own = B.copy()
        out = ops.solve_triangular(L, own, transpose=transpose, overwrite=True)
        assert np.shares_memory(out, own)
        np.testing.assert_array_equal(out, expected)
        wide = np.concatenate([B, B], axis=-1)
        view = wide[..., ::2]  # not C-contiguous: solved on a copy
        before = wide.copy()
        out = ops.solve_triangular(L, view, transpose=transpose, overwrite=True)
        assert not np.shares_memory(out, wide)
        np.testing.assert_array_equal(wide, before)
        np.testing.assert_allclose(out, ops.solve_triangular(L, np.ascontiguousarray(view),
                                                             transpose=transpose))
        frozen = B.copy()
        frozen.flags.writeable = False
        out = ops.solve_triangular(L, frozen, transpose=transpose, overwrite=True)
        assert not np.shares_memory(out, frozen)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("to", _namespaces())
def test_cho_inverse_terms_are_what_the_inverses_give(to):
    """``cho_inverse_terms``: ``B_c^-1 v_c``, ``B_c^-1 X`` and ``sum_c B_c^-1`` without a
    stack of inverses: the sum the same bits as summing ``cho_inverse``'s stack, the products
    equal to products with it (round-off), a singular factor reported."""
    rng = np.random.default_rng(2)
    K = _spd_stack(rng, C=4, M=7)
    L, _ = ops.cholesky(to(K))
    v, X = rng.normal(size=(4, 7)), rng.normal(size=(7, 5))
    B_inv = ops.to_host(ops.cho_inverse(L)[0])
    w, Y, S, failed = ops.cho_inverse_terms(L, to(v), to(X), summed=True)
    assert not failed
    assert np.array_equal(ops.to_host(S), np.sum(B_inv, axis=0))
    np.testing.assert_allclose(ops.to_host(w), np.einsum("cmk,ck->cm", B_inv, v), rtol=1e-13)
    np.testing.assert_allclose(ops.to_host(Y), B_inv @ X, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ops.to_host(Y), np.linalg.solve(K, X), rtol=1e-10)
    w2, Y2, S2, _ = ops.cho_inverse_terms(L, to(v))
    assert Y2 is None and S2 is None and np.array_equal(ops.to_host(w2), ops.to_host(w))
    # one X per matrix; overwrite: the caller's own factors inverted in place (same values)
    Xc = rng.normal(size=(4, 7, 5))
    own = ops.copy(L)
    w3, Y3, S3, failed = ops.cho_inverse_terms(own, to(v), to(Xc), summed=True, overwrite=True)
    assert not failed
    assert np.array_equal(ops.to_host(w3), ops.to_host(w))
    assert np.array_equal(ops.to_host(S3), ops.to_host(S))
    np.testing.assert_allclose(ops.to_host(Y3), B_inv @ Xc, rtol=1e-12, atol=1e-15)
    if isinstance(L, np.ndarray):  # numpy reports a singular factor (a device never does)
        assert S.flags.c_contiguous  # summed in the inverses' order, handed back C-ordered
        assert not np.array_equal(own, L)  # inverted in its own memory
        L[2, 3, 3] = 0.0
        assert ops.cho_inverse_terms(L, v, X)[3]


@pytest.mark.parametrize("to", _namespaces())
def test_cholesky_reports_the_failing_matrix_instead_of_raising(to):
    rng = np.random.default_rng(1)
    K = _spd_stack(rng)
    K[1] = -np.eye(6)  # not positive definite
    _, failed = ops.cholesky(to(K))
    assert failed.tolist() == [False, True, False]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cholesky_of_large_numpy_stacks_by_potrf_in_place(dtype):
    """numpy stacks of order >= 64 (one ``potrf`` per matrix on a copy): numpy's factors
    to round-off, the upper triangle zero, the input unchanged, an indefinite matrix and one
    with a NaN reported as failed."""
    rng = np.random.default_rng(7)
    K = _spd_stack(rng, C=3, M=70).astype(dtype)
    kept = K.copy()
    L, failed = ops.cholesky(K)
    assert L.dtype == dtype and not failed.any()
    np.testing.assert_array_equal(K, kept)
    tol = 1e-13 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(L, np.linalg.cholesky(K), rtol=tol, atol=tol * 70)
    assert not np.triu(L, 1).any()
    K[1] = -np.eye(70, dtype=dtype)
    K[2, 5, 5] = np.nan
    assert ops.cholesky(K)[1].tolist() == [False, True, True]


def test_cholesky_overwrite_factorises_an_owned_stack_in_place():
    """``overwrite=True``: a writable C-ordered stack is factorised in place (the factors are
    ``K``'s own memory, the same values as from a copy); a transposed view is copied and left
    alone; failures are reported as without it."""
    rng = np.random.default_rng(8)
    K = _spd_stack(rng, C=3, M=70)
    expected, _ = ops.cholesky(K)
    own = K.copy()
    L, failed = ops.cholesky(own, overwrite=True)
    assert np.shares_memory(L, own) and not failed.any()
    np.testing.assert_array_equal(L, expected)
    view = np.swapaxes(K.copy(), -1, -2)  # symmetric: the same matrices, not C-ordered
    kept = view.copy()
    L, _ = ops.cholesky(view, overwrite=True)
    assert not np.shares_memory(L, view)
    np.testing.assert_array_equal(view, kept)
    np.testing.assert_allclose(L, expected, rtol=1e-13, atol=1e-13 * 70)
    bad = K.copy()
    bad[1] = -np.eye(70)
    assert ops.cholesky(bad, overwrite=True)[1].tolist() == [False, True, False]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tri_inverse_of_large_numpy_stacks_in_two_halves(dtype):
    """numpy factors of order >= 128 are inverted in two halves (``trtri`` of each, two
    ``gemm`` for the off-diagonal block): the inverse to round-off, zero above the diagonal;
    a singular factor is a ``ValueError``."""
    rng = np.random.default_rng(8)
    L = np.linalg.cholesky(_spd_stack(rng, C=2, M=131)).astype(dtype)
    inv = ops.tri_inverse(L)
    assert inv.dtype == dtype and not np.triu(inv, 1).any()
    tol = 1e-12 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(inv @ L, np.broadcast_to(np.eye(131), L.shape), atol=tol)
    L[1, 100, 100] = 0.0
    with pytest.raises(ValueError, match="matrix 1"):
        ops.tri_inverse(L)


@pytest.mark.parametrize("to", _namespaces())
def test_special_functions_match_scipy_in_both_tails(to):
    t = np.concatenate([np.linspace(-40, 10, 201), [-1e3, -60.0, 35.0]])
    np.testing.assert_allclose(ops.to_host(ops.log_ndtr(to(t))), special.log_ndtr(t),
                               rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(ops.to_host(ops.erfcx(to(t / 10))), special.erfcx(t / 10),
                               rtol=1e-13)
    x = np.random.default_rng(2).normal(size=(4, 7)) * 30
    np.testing.assert_allclose(ops.to_host(ops.logsumexp(to(x), 1)),
                               special.logsumexp(x, axis=1), rtol=1e-14)


def test_normal_cdf_functions_agree_between_numpy_and_torch():
    """The inverse Mills ratio and the derivatives of log Phi, written once: torch equals
    numpy to round-off from the far left tail (asymptotic series) to the right one."""
    t = np.concatenate([np.linspace(-80, 12, 400), [0.0, -1e4]])
    tt = torch.as_tensor(t)
    np.testing.assert_allclose(inv_mills(tt).numpy(), inv_mills(t), rtol=1e-12)
    np.testing.assert_allclose(probit_curvature(tt).numpy(), probit_curvature(t), rtol=1e-11)
    # the 3rd and 4th derivatives cancel where they cross zero: an absolute floor there
    for a, b in zip(log_Phi_derivatives(tt, 4), log_Phi_derivatives(t, 4)):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-10)
    # the exact value at 0: r(0) = 2 phi(0) = sqrt(2 / pi)
    assert float(inv_mills(torch.zeros(1, dtype=torch.float64))[0]) == pytest.approx(
        np.sqrt(2 / np.pi), rel=1e-15)


def test_moving_values_keeps_namespace_device_and_dtype():
    ref = torch.zeros(2, dtype=torch.float32)
    moved = ops.like(ref, np.arange(3.0))
    assert moved.dtype == torch.float32 and moved.device == ref.device
    assert ops.index_like(ref, [2, 0]).dtype == torch.int64
    assert ops.to_host(moved).tolist() == [0.0, 1.0, 2.0]
    assert ops.all_finite(moved) and not ops.all_finite(ops.like(ref, [np.nan]))
    assert isinstance(ops.like(np.zeros(2), [1, 2]), np.ndarray)


@pytest.mark.parametrize("to", _namespaces())
def test_checked_cholesky_says_failed_for_non_finite_or_indefinite_stacks(to):
    rng = np.random.default_rng(3)
    K = _spd_stack(rng)
    L, failed = ops.cholesky(to(K), to(np.ones(4)), check=True)
    assert failed is False
    Lh = ops.to_host(L)
    np.testing.assert_allclose(Lh @ np.swapaxes(Lh, 1, 2), K, rtol=1e-12, atol=1e-12)
    bad = K.copy()
    bad[1, 0, 0] = -100.0  # matrix 1 indefinite
    assert ops.cholesky(to(bad), check=True)[1]
    nan = K.copy()
    nan[2, 1, 1] = np.nan
    assert ops.cholesky(to(nan), check=True)[1]
    assert ops.cholesky(to(K), to(np.array([1.0, np.inf])), check=True)[1]
    assert ops.cholesky(to(K[0]), check=True)[1] is False  # one matrix
    assert ops.cholesky(to(bad[1]), check=True)[1]


@pytest.mark.parametrize("to", _namespaces())
def test_finiteness_positivity_and_diagonals_of_stacks(to):
    assert ops.all_finite(to(np.ones(3)), to(np.zeros((2, 2))))
    assert not ops.all_finite(to(np.ones(3)), to(np.array([0.0, np.nan])))
    assert ops.all_positive(to(np.array([1e-300, 2.0])))
    for bad in (0.0, -1.0, np.inf, np.nan):
        assert not ops.all_positive(to(np.array([1.0, bad])))
    X = to(np.zeros((2, 3, 3)))
    ops.add_diagonal(X, to(np.array([[1.0], [2.0]])))
    np.testing.assert_array_equal(ops.to_host(X), np.eye(3) * np.array([1.0, 2.0])[:, None, None])
    ops.fill_diagonal(X, 5.0)
    np.testing.assert_array_equal(ops.to_host(X), 5.0 * np.eye(3)[None].repeat(2, axis=0))
    np.testing.assert_array_equal(ops.to_host(ops.arange(X, 4)), np.arange(4))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_host_arrays_are_finite_exactly_when_every_entry_is(dtype):
    """The sum-of-squares test of large contiguous host arrays (``ops._host_finite``): one
    NaN or infinity anywhere, in C or Fortran order or in a strided view, says not finite;
    finite entries whose squares overflow still say finite (the entrywise test decides)."""
    A = np.random.default_rng(0).normal(size=(6, 40, 50)).astype(dtype)
    assert A.size >= ops._FINITE_BY_DOT_FROM
    assert ops.all_finite(A) and ops.all_finite(np.asfortranarray(A)) and ops.all_finite(A[:, ::2])
    for bad in (np.nan, np.inf, -np.inf):
        B = A.copy()
        B[5, 39, 49] = bad
        assert not ops.all_finite(B)
        assert not ops.all_finite(np.asfortranarray(B))
        assert not ops.all_finite(B[:, 1::2, 1:])
        assert not ops.all_finite(A, B)
    huge = A * dtype(np.finfo(dtype).max / 4)  # squares overflow, entries finite
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.all_finite(huge)
        huge[0, 0, 0] = np.inf
        assert not ops.all_finite(huge)
    tiny = A * dtype(np.finfo(dtype).smallest_subnormal * 8)  # squares underflow to 0
    with np.errstate(all="raise"):  # the sum of squares raises nothing for a caller
        assert ops.all_finite(tiny)
        tiny[0, 0, 0] = np.nan
        assert not ops.all_finite(tiny)
    masked = np.ma.masked_array(A, mask=np.zeros(A.shape, dtype=bool))  # ndarray subclasses:
    assert ops.all_finite(masked)  # the entrywise test (a masked NaN does not count)
    masked[1, 2, 3] = np.nan
    assert not ops.all_finite(masked)
    assert ops.all_finite(np.ma.masked_invalid(masked))


@pytest.mark.parametrize("to", _namespaces())
@pytest.mark.parametrize("value", [1.0, -1.0, 1e-6])
def test_scalar_diagonals_keep_every_other_entry_bit_for_bit(to, value):
    """A scalar on the diagonal (on a device: a kept diagonal matrix added in one operator)
    changes the diagonal only: off the diagonal signed zeros, infinities and NaN stay."""
    X0 = np.array([[[2.0, -0.0, 0.0], [np.inf, 3.0, np.nan], [-np.inf, 1e-300, 4.0]]] * 2)
    want = X0.copy()
    want[:, range(3), range(3)] += value
    X = to(X0.copy())
    new = ops.plus_diagonal(X, value)
    np.testing.assert_array_equal(ops.to_host(X), X0)  # left alone
    assert ops.to_host(ops.add_diagonal(X, value)).tobytes() == want.tobytes()
    assert ops.to_host(new).tobytes() == want.tobytes()
    single = ops.plus_diagonal(to(X0[0].copy()), value)  # one matrix [M, M]
    assert ops.to_host(single).tobytes() == want[0].tobytes()


@pytest.mark.parametrize("to", _namespaces())
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tri_matmul_equals_the_general_product(to, dtype):
    """``ops.tri_matmul``: ``op(T) X`` and ``X op(T)`` of lower factors equal ``@`` (stacks with
    two leading axes and single matrices, C- and Fortran-ordered ``X``); ``X`` is unchanged."""
    rng = np.random.default_rng(4)
    tol = 1e-13 if dtype == np.float64 else 1e-5
    for lead in ((2, 3), ()):
        T = np.tril(rng.normal(size=lead + (7, 7))).astype(dtype)
        T += 3.0 * np.eye(7, dtype=dtype)
        for transpose in (False, True):
            op = np.swapaxes(T, -1, -2) if transpose else T
            for right in (False, True):
                X = rng.normal(size=lead + ((4, 7) if right else (7, 4))).astype(dtype)
                if not lead:
                    X = np.asfortranarray(X)
                kept = X.copy()
                out = ops.to_host(ops.tri_matmul(to(T), to(X), transpose=transpose,
                                                 right=right))
                want = X @ op if right else op @ X
                assert out.dtype == dtype and out.shape == want.shape
                np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
                np.testing.assert_array_equal(X, kept)
                mine = to(X.copy(order="A"))  # overwrite: the same values, X may be the output
                out = ops.to_host(ops.tri_matmul(to(T), mine, transpose=transpose, right=right,
                                                 overwrite=True))
                np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
    T = np.tril(rng.normal(size=(3, 5, 5))).astype(dtype)  # one X for a stack: broadcast
    X = rng.normal(size=(5, 2)).astype(dtype)
    np.testing.assert_allclose(ops.to_host(ops.tri_matmul(to(T), to(X))), T @ X, rtol=tol,
                               atol=tol)


@pytest.mark.parametrize("to", _namespaces())
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matmul_add_accumulates_in_place(to, dtype):
    """``ops.matmul_add_``: ``out += alpha X @ Y`` written into ``out`` itself, for stacks
    (``Y`` per matrix or one ``Y`` for the stack), single matrices and transposed views of
    the operands; the operands are unchanged."""
    rng = np.random.default_rng(5)
    tol = 1e-13 if dtype == np.float64 else 1e-5
    cases = [((3, 4, 5), (3, 4, 6), (3, 6, 5)), ((3, 4, 5), (3, 4, 6), (6, 5)),
             ((4, 5), (4, 6), (6, 5))]
    for alpha in (1.0, -1.0, -2.0):
        for out_shape, x_shape, y_shape in cases:
            out0 = rng.normal(size=out_shape).astype(dtype)
            X = rng.normal(size=x_shape).astype(dtype)
            Y = rng.normal(size=y_shape).astype(dtype)
            if len(y_shape) == 2:  # a Fortran-ordered operand (a transposed view)
                Y = np.asfortranarray(Y)
            kept = (X.copy(), Y.copy())
            out = to(out0.copy())
            res = ops.matmul_add_(out, to(X), to(Y), alpha)
            assert res is out
            want = out0 + alpha * (X @ Y)
            np.testing.assert_allclose(ops.to_host(out), want, rtol=tol, atol=tol)
            np.testing.assert_array_equal(X, kept[0])
            np.testing.assert_array_equal(Y, kept[1])


@pytest.mark.parametrize("on_torch", [False, True])
def test_tri_inverse_and_the_terms_solved_by_products(on_torch):
    """``ops.tri_inverse`` inverts stacked lower factors; ``StackedTerms`` with ``L_inv``
    (products, numpy's choice) gives what its triangular solves give."""
    from gpinfer.sites.stacked import StackedTerms

    rng = np.random.default_rng(3)
    K = rng.normal(size=(3, 6, 9))
    K = K @ np.swapaxes(K, -1, -2) + 0.1 * np.eye(6)
    L = np.linalg.cholesky(K)
    S = rng.normal(size=(3, 6, 6))
    S = S + np.swapaxes(S, -1, -2)
    X = rng.normal(size=(3, 6, 4))
    if on_torch:
        L, S, X = (torch.as_tensor(a) for a in (L, S, X))
    inv = ops.tri_inverse(L)
    np.testing.assert_allclose(ops.to_host(inv), np.linalg.inv(ops.to_host(L)), rtol=1e-12,
                               atol=1e-12)
    solved = StackedTerms(L=L, A=X, s=X[:, 0, :])
    by_products = StackedTerms(L=L, A=X, s=X[:, 0, :], L_inv=inv)
    for f in ("sandwich", "unwhiten"):
        arg = S if f == "sandwich" else X
        np.testing.assert_allclose(ops.to_host(getattr(by_products, f)(arg)),
                                   ops.to_host(getattr(solved, f)(arg)), rtol=1e-11, atol=1e-12)
    # a sandwich that may write into its argument: the same values
    S_before = ops.to_host(S).copy()
    kept = ops.to_host(by_products.sandwich(S))
    np.testing.assert_array_equal(ops.to_host(S), S_before)  # without overwrite S is kept
    np.testing.assert_array_equal(
        ops.to_host(by_products.sandwich(ops.copy(S), overwrite=True)), kept)


@pytest.mark.parametrize("to", _namespaces())
@pytest.mark.parametrize("value", [1.0, -1.0, 2.0, -0.5])
def test_add_product_equals_the_written_out_expression(to, value):
    """``base + value x y`` for an array and a float ``base`` (broadcast), exact scalings:
    numpy's the same bits as the expression, torch's (one addcmul) within round-off."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(2, 5, 3))
    base = rng.normal(size=(5, 1))
    for b, b_host in ((to(base), base), (0.75, 0.75)):
        got = ops.to_host(ops.add_product(b, to(x), to(y), value))
        want = b_host + value * (x * y)
        assert got.shape == (5, 3)
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)
        if ops.is_numpy(to(x)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("to", _namespaces())
def test_scaled_plus_diagonal_is_a_new_array(to):
    """``a X + value I`` for per-matrix factors ``[C, 1, 1]``; ``X`` left alone."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3, 4, 4))
    a = rng.uniform(0.5, 1.0, size=(3, 1, 1))
    X_in = to(X)
    got = ops.to_host(ops.scaled_plus_diagonal(to(a), X_in, 1.5))
    np.testing.assert_allclose(got, a * X + 1.5 * np.eye(4), rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(ops.to_host(X_in), X)


def test_symmetrize_in_place_gives_symmetrize_s_values():
    """``symmetrize_``: numpy's C-ordered stack symmetrised in its own memory with the bits of
    ``symmetrize``; a transposed view (not C-ordered) gets a new array and is left alone."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((3, 7, 7))
    expected = ops.symmetrize(X)
    own = X.copy()
    out = ops.symmetrize_(own)
    assert out is own
    np.testing.assert_array_equal(out, expected)
    view = np.swapaxes(X, -1, -2)
    out = ops.symmetrize_(view)
    assert not np.shares_memory(out, X)
    np.testing.assert_array_equal(out, ops.symmetrize(view))
    np.testing.assert_array_equal(view, np.swapaxes(X, -1, -2))


@pytest.mark.parametrize("to", _namespaces())
def test_batched_vector_products_and_einsum_forms(to):
    """``vecmat``, ``matvec``: the batched row / column products (numpy's ``@`` bit for bit);
    ``einsum_transposed``: the spec's einsum as ``[b, a]``; ``scaled_einsum``: ``alpha`` times
    the einsum (an exact power of two)."""
    rng = np.random.default_rng(7)
    A, v, u = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4)), rng.normal(size=(3, 5))
    row = ops.to_host(ops.vecmat(to(v), to(A)))
    np.testing.assert_allclose(row, np.einsum("cm,cmk->ck", v, A), rtol=1e-13)
    col = ops.to_host(ops.matvec(to(A), to(u)))
    np.testing.assert_allclose(col, np.einsum("cmk,ck->cm", A, u), rtol=1e-13)
    lead2 = ops.to_host(ops.vecmat(to(v.reshape(3, 1, 4)), to(A.reshape(3, 1, 4, 5))))
    np.testing.assert_array_equal(lead2[:, 0], row)  # any leading axes
    if to is np.asarray:
        assert np.array_equal(row, (v[:, None, :] @ A)[:, 0, :])
        assert np.array_equal(col, (A @ u[..., None])[..., 0])
    out = ops.to_host(ops.einsum_transposed("cmn,cm->cn", to(A), to(v)))
    assert out.shape == (5, 3)
    np.testing.assert_allclose(out, np.einsum("cmn,cm->nc", A, v), rtol=1e-13)
    half = ops.to_host(ops.scaled_einsum(0.5, "cm,cm->c", to(v), to(v)))
    np.testing.assert_allclose(half, 0.5 * np.sum(v * v, axis=1), rtol=1e-13)


def test_host_values_reach_the_namespace_and_backend_arrays_stay():
    """``index_like`` takes labels already on the namespace as they are; ``as_array``,
    ``flat`` and ``zeros_vector`` turn host values into float64 numpy and leave a tensor
    where it lives (``flat(copy=True)``: a fresh array on both)."""
    ref = torch.zeros(2, dtype=torch.float32)
    labels = torch.tensor([1, 0])
    assert ops.index_like(ref, labels) is labels
    assert ops.index_like(np.zeros(2), [1, 0]).dtype == np.int64
    host = ops.as_array([1, 2])
    assert isinstance(host, np.ndarray) and host.dtype == np.float64
    assert ops.as_array(ref) is ref and ops.as_array(np.float32(2.0)).dtype == np.float64
    assert ops.as_array(torch.tensor([1, 2])).dtype == torch.float64  # integers as floats
    assert ops.as_array(torch.tensor([1, 2]), dtype=None).dtype == torch.int64
    x = np.arange(4.0).reshape(2, 2)
    v = ops.flat(x)
    v[0] = 9.0
    assert v.shape == (4,) and x[0, 0] == 0.0  # a copy of host values
    t = torch.arange(4.0).reshape(2, 2)
    assert ops.flat(t).data_ptr() == t.data_ptr()  # a view on the device
    c = ops.flat(t, copy=True)
    assert c.data_ptr() != t.data_ptr() and c.tolist() == [0.0, 1.0, 2.0, 3.0]
    z = ops.zeros_vector(torch.ones(3, dtype=torch.float32))
    assert z.dtype == torch.float32 and z.shape == (3,)
    assert ops.zeros_vector([1, 2, 3]).dtype == np.float64
    assert ops.backend_name(t) == "torch" and ops.backend_name([1.0]) == "numpy"


def test_holds_like_takes_state_of_the_same_library_and_shape_only():
    """``holds_like``: kept state takes a value in place only when it is an array of the
    value's library and shape (a move to a device, a new length or no state: made anew)."""
    host = np.zeros(3)
    assert ops.holds_like(host, np.ones(3))
    assert not ops.holds_like(host, np.ones(4))
    assert not ops.holds_like(host, torch.ones(3, dtype=torch.float64))
    assert not ops.holds_like(torch.zeros(3), np.ones(3))
    assert not ops.holds_like(None, np.ones(3))
    assert not ops.holds_like(host, [0.0, 0.0, 0.0])  # host values: made anew as an array


@pytest.mark.parametrize("to", _namespaces())
def test_class_counts_floored_and_torch_view(to):
    y = np.array([2, 0, 2, 2, 1, 0])
    counts = ops.class_counts(ops.index_like(to(np.zeros(1)), y), 4)
    assert ops.to_host(counts).tolist() == [2.0, 1.0, 3.0, 0.0]
    x = to(np.array([-1.0, 0.5, 2.0]))
    out = ops.floored(x, 1.0)
    assert ops.to_host(out).tolist() == [1.0, 1.0, 2.0]
    assert ops.to_host(x).tolist() == [-1.0, 0.5, 2.0]  # a new array
    view = ops.torch_view(x)
    view += 1.0  # the same memory
    assert ops.to_host(x).tolist() == [0.0, 1.5, 3.0]


def _halving_step(target, t, moves):
    """``t`` halfway to ``target`` per step, done where within 1e-3; ``moves`` counts each
    row's steps."""
    new = 0.5 * (t + target)
    return new, moves + 1.0, abs(new - target) <= 1e-3


@pytest.mark.parametrize("to", _namespaces())
def test_converge_rows_stops_each_row_on_numpy_and_all_at_once_on_a_device(to):
    target = to(np.array([0.0, 1.0, 64.0]))
    t, moves = ops.converge_rows(_halving_step, (target,),
                                 (to(np.zeros(3)), to(np.zeros(3))), 50)
    np.testing.assert_allclose(ops.to_host(t), [0.0, 1.0, 64.0], atol=1e-3)
    # numpy: each row stops at its own convergence; a device: every row until the last
    expected = [1.0, 10.0, 16.0] if ops.is_numpy(t) else [16.0, 16.0, 16.0]
    assert ops.to_host(moves).tolist() == expected


def test_require_tests_a_host_flag_at_once_even_inside_deferred_checks():
    with pytest.raises(ValueError, match="host flag"):
        with ops.deferred_checks():
            ops.require(np.bool_(False), lambda: ValueError("host flag"))
            raise AssertionError("not reached: the host flag raises at once")
