"""Oracles of the operations that hold one computation in each namespace's form (issue 23
item 4: the array-type tests of the kernels, the hyper-parameters and the normal functions
moved into ``gpinfer.backend.ops``): numpy and torch's CPU build against written-out answers,
and where each form must keep its own bits (in place on numpy, a select on a device)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.backend import ops

torch = pytest.importorskip("torch")


def _namespaces():
    return [pytest.param(np.asarray, id="numpy"),
            pytest.param(lambda a: torch.as_tensor(np.asarray(a)), id="torch-cpu")]


def test_host_values_become_float64_numpy_and_backend_arrays_stay():
    assert ops.as_array([1, 2]).dtype == np.float64
    assert ops.as_array(np.arange(3)).dtype == np.float64
    x = np.zeros(3)
    assert ops.as_array(x) is x  # a float64 host array: no copy
    t = torch.zeros(2, dtype=torch.float32)
    assert ops.as_array(t) is t
    assert ops.as_array(2).shape == ()
    with pytest.raises(ValueError):
        ops.as_array(["a"])


def test_maybe_any_reads_a_host_mask_and_never_a_device_one():
    assert not ops.maybe_any(np.zeros(4, dtype=bool))
    assert ops.maybe_any(np.array([False, True]))
    assert ops.maybe_any(torch.zeros(4, dtype=torch.bool))  # no sync: "maybe"


def test_host_out_reuses_a_fitting_host_buffer_and_gives_none_on_a_device():
    out = np.empty(5)
    assert ops.is_host_buffer(out) and ops.is_host_buffer(out, ndim=1)
    assert not ops.is_host_buffer(out, ndim=2)
    assert ops.host_out(np.zeros(2), out, (5,)) is out
    for other in (np.empty(4), np.empty(5, dtype=np.float32), np.empty(10)[::2], None,
                  torch.empty(5, dtype=torch.float64)):
        got = ops.host_out(np.zeros(2), other, (5,))
        assert got is not other and got.shape == (5,) and got.dtype == np.float64
    frozen = np.empty(5)
    frozen.setflags(write=False)
    assert ops.host_out(np.zeros(2), frozen, (5,)) is not frozen
    assert ops.host_out(torch.zeros(2), out, (5,)) is None


def test_piecewise_or_whole_splits_on_numpy_and_takes_the_whole_formula_on_a_device():
    t = np.array([-2.0, -0.5, 0.0, 3.0])

    def negative(x):
        return x < 0

    def f_in(x):
        return x * 10.0

    def f_out(x):
        return x + 100.0

    def whole(x):
        return -x

    assert ops.piecewise_or_whole(negative, f_in, f_out, whole, t).tolist() == [
        -20.0, -5.0, 100.0, 103.0]
    assert ops.piecewise_or_whole(negative, f_in, f_out, whole,
                                  torch.as_tensor(t)).tolist() == [2.0, 0.5, 0.0, -3.0]


@pytest.mark.parametrize("shape", [(5,), ()])
@pytest.mark.parametrize("to", _namespaces())
def test_masked_entries_and_set_masked_write_the_masked_entries_only(to, shape):
    x = to(np.linspace(-3.0, 3.0, 5).reshape(shape) if shape else np.array(-3.0))
    mask = x < -1.0
    out = to(np.full(shape, 7.0))
    part = ops.masked_entries(mask, x, 1.0)
    got = ops.set_masked(mask, out, 2.0 * part)
    want = np.where(np.asarray(mask), 2.0 * np.asarray(x), 7.0)
    assert np.array_equal(np.asarray(got), want)
    if isinstance(x, np.ndarray) and x.ndim > 0:  # numpy: the masked entries only, in place
        assert part.shape == (int(np.sum(mask)),) and got is out
    else:  # every entry (1 where unmasked: finite), a new array
        assert tuple(part.shape) == shape and got is not out


@pytest.mark.parametrize("to", _namespaces())
def test_polyval_is_the_polynomial(to):
    coefs = (1.0, -1.0, 6.0, -50.0, 0.25)
    z = np.linspace(0.0, 0.01, 7)
    got = np.asarray(ops.polyval(coefs, to(z)))
    np.testing.assert_allclose(got, np.polynomial.polynomial.polyval(z, coefs), rtol=1e-15)


@pytest.mark.parametrize("to", _namespaces())
def test_products_means_and_traces_equal_their_written_out_forms(to):
    rng = np.random.default_rng(5)
    U, V, W = rng.normal(size=(3, 4, 6)), rng.normal(size=(3, 5, 6)), rng.normal(size=(5, 6))
    A, B, v = rng.normal(size=(3, 4, 4)), rng.normal(size=(3, 4, 4)), rng.normal(size=3)

    def close(got, want):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-14)

    close(ops.rows_matmul(to(U), to(W.T)), U @ W.T)
    close(ops.matmul_t(to(U), to(V)), U @ np.swapaxes(V, 1, 2))
    close(ops.matmul_t(to(U), to(W)), U @ W.T)
    close(ops.matmul_t(to(W), to(W)), W @ W.T)
    close(ops.mean_rows(to(U)), U.reshape(-1, 6).mean(axis=0))
    close(ops.trace(to(A)), np.trace(A, axis1=1, axis2=2))
    close(ops.scaled_inner(to(A), to(B), to(v)), v * np.sum(A * B, axis=(1, 2)))


def test_state_tokens_compare_host_values_by_value_and_tensors_by_version():
    assert ops.state_token([1.0, 2.0]) is None and ops.state_token(np.zeros(2)) is None
    t = torch.zeros(2)
    before = ops.state_token(t)
    t += 1.0
    assert before[0] == id(t) and ops.state_token(t) != before
