"""Checks read once per computation on a device (``ops.deferred_checks``): the same errors as
immediate checks, in the same order, and no device sync before the read."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ep.state import TiedSites

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.sites.inducing import new_role_site, site_cholesky

torch = pytest.importorskip("torch")


def _syncs(fn):
    """``fn()``'s result and the number of host reads of device values it made."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    names = ("aten::item", "aten::_local_scalar_dense", ops.HOST_READ)
    reads = [e for e in prof.events() if e.name in names
             and (e.cpu_parent is None or e.cpu_parent.name not in names)]
    return out, len(reads)


def test_flush_reads_flags_and_values_once():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)

    def run():
        with ops.deferred_checks() as checks:
            ops.require_positive(x, lambda: InputError("x"))
            ops.require_finite(lambda: InputError("y"), x, 2 * x)
            return checks.flush(x.sum(), x.max())

    values, syncs = _syncs(run)
    assert values == [3.0, 2.0]
    assert syncs == 1


def test_the_first_failed_check_names_the_problem():
    good = torch.ones(3, dtype=torch.float64)
    bad = torch.tensor([1.0, -1.0, float("nan")], dtype=torch.float64)
    with pytest.raises(NumericalError, match="second"):
        with ops.deferred_checks() as checks:
            ops.require_positive(good, lambda: NumericalError("first"))
            ops.require_positive(bad, lambda: NumericalError("second"))
            ops.require_finite(lambda: NumericalError("third"), bad)
            checks.flush()
    # what is pending at the end of the context is read there
    with pytest.raises(NumericalError, match="third"):
        with ops.deferred_checks():
            ops.require_finite(lambda: NumericalError("third"), bad)


@pytest.mark.parametrize("device_array", [False, True])
def test_outside_a_context_and_on_numpy_checks_run_at_once(device_array):
    bad = np.array([1.0, 0.0])
    x = torch.as_tensor(bad) if device_array else bad
    with pytest.raises(NumericalError, match="site denominator"):
        new_role_site(x, x, x, x)  # 1 - gamma v = 0 at the second entry
    if not device_array:
        with pytest.raises(InputError, match="now"), ops.deferred_checks():
            ops.require_positive(bad, lambda: InputError("now"))
            raise AssertionError("numpy checks are never deferred")


def test_deferred_cholesky_failure_is_diagnosed_at_the_read():
    Bm = torch.tensor([[[1.0, 2.0], [2.0, 1.0]]], dtype=torch.float64)  # indefinite
    h_w = torch.zeros((1, 2), dtype=torch.float64)
    with pytest.raises(NumericalError, match="not positive definite"):
        with ops.deferred_checks():
            site_cholesky(Bm, h_w)
    h_w[0, 0] = float("inf")
    with pytest.raises(NumericalError, match="not finite"):
        with ops.deferred_checks():
            site_cholesky(Bm, h_w)


def _sep_state(C=3, M=4, n=12, seed=0):
    from gpinfer.backend.choice import resolve_backend
    from gpinfer.kernels import RBF
    from gpinfer.sites.stacked import stacked_terms

    backend = resolve_backend("torch", "cpu", "float64")
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    X = rng.normal(size=(n, 2))
    kernels = [RBF(1.0, 1.0) for _ in range(C)]
    Zs = backend.asarray(np.stack([X[:M] for _ in range(C)]))
    terms = stacked_terms(kernels, Zs, backend.asarray(X))
    return TiedSites(y, C, M, backend=backend), terms, np.arange(n)


def test_sep_update_and_evaluate_read_once_and_keep_their_errors():
    state, terms, idx = _sep_state()
    change, syncs = _syncs(lambda: state.update(terms, idx, 0.5))
    assert syncs == 1 and change > 0.0
    (value, _), syncs = _syncs(lambda: state.evaluate(terms, idx, 1.0))
    assert syncs == 1 and np.isfinite(value)
    Lam = ops.copy(state.Lam)
    state.Lam = state.Lam * float("nan")
    state._whitened = None
    with pytest.raises(NumericalError, match="site sums are not finite"):
        state.update(terms, idx, 0.5)
    assert torch.isnan(state.Lam).all()  # a failed check stops the update before the state
    state.Lam = Lam
    state._whitened = None
    state.update(terms, idx, 0.5)


def test_sep_moves_a_batch_s_labels_once_and_counts_them_on_the_device():
    from gpinfer.sites.inducing import factor_counts

    state, terms, idx = _sep_state()
    first = state._labels(idx, terms.A)
    assert state._labels(idx.copy(), terms.A) is first  # update, then evaluate: one move
    np.testing.assert_array_equal(first.counts.numpy(), factor_counts(state.y[idx], 3))
    other = state._labels(idx[:6], terms.A)
    assert other is not first
    np.testing.assert_array_equal(other.counts.numpy(), factor_counts(state.y[:6], 3))
