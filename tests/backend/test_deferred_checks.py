"""Checks read once per computation on a device (``ops.deferred_checks``): the same errors as
immediate checks, in the same order, and no device sync before the read."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ep.state import TiedSites

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.sites.inducing import new_role_site, site_factor

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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bad", [0.0, -0.0, -1e-300, -2.0, float("nan"), float("inf"),
                                 float("-inf")])
def test_require_positive_on_a_device_rejects_what_numpy_rejects(bad, dtype):
    """The device form (minimum ``> 0`` and maximum finite, one ``aminmax``) accepts exactly
    the finite entries ``> 0``, the smallest subnormal included, deferred or not."""
    tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal
    good = torch.tensor([tiny, 1.0, torch.finfo(dtype).max], dtype=dtype)
    ops.require_positive(good, lambda: InputError("good"))
    with ops.deferred_checks():
        ops.require_positive(good, lambda: InputError("good"))
    x = torch.tensor([1.0, bad, 2.0], dtype=dtype)
    assert not ops.all_positive(x.numpy())
    with pytest.raises(InputError, match="bad"):
        ops.require_positive(x, lambda: InputError("bad"))
    with pytest.raises(InputError, match="bad"), ops.deferred_checks():
        ops.require_positive(x, lambda: InputError("bad"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_require_finite_on_a_device_rejects_what_numpy_rejects(bad, dtype):
    """The device form (the arrays' largest magnitudes finite: one ``_foreach_norm`` of
    order inf for all of them) accepts every finite entry, the largest and the most negative
    included, an empty array and integer or boolean ones (always finite); it rejects NaN and
    both infinities wherever they sit, deferred or not."""
    big = torch.finfo(dtype).max
    good = torch.tensor([[-big, 0.0], [big, -0.0]], dtype=dtype).T  # a strided view
    for arrays in ((good,), (good, torch.zeros((0, 3), dtype=dtype)),
                   (good, torch.arange(3), torch.ones(2, dtype=torch.bool))):
        ops.require_finite(lambda: InputError("good"), *arrays)
        with ops.deferred_checks():
            ops.require_finite(lambda: InputError("good"), *arrays)
    for where in range(3):
        x = torch.tensor([1.0, -2.0, 3.0], dtype=dtype)
        x[where] = bad
        assert not ops.all_finite(x.numpy())
        with pytest.raises(InputError, match="bad"):
            ops.require_finite(lambda: InputError("bad"), good, x)
        with pytest.raises(InputError, match="bad"), ops.deferred_checks():
            ops.require_finite(lambda: InputError("bad"), good, x)


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
            site_factor(Bm, h_w)
    h_w[0, 0] = float("inf")
    with pytest.raises(NumericalError, match="not finite"):
        with ops.deferred_checks():
            site_factor(Bm, h_w)


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


def test_sep_update_and_evaluate_leave_their_reads_to_the_caller():
    state, terms, idx = _sep_state()

    def step():
        with ops.deferred_checks() as checks:
            change = state.update(terms, idx, 0.5)
            value, _ = state.evaluate(terms, idx, 1.0)
            assert torch.is_tensor(change) and torch.is_tensor(value)  # device values
            return checks.flush(value, change)

    (value, change), syncs = _syncs(step)
    assert syncs == 1 and change > 0.0 and np.isfinite(value)
    good = state.snapshot()
    state.Lam = state.Lam * float("nan")
    state._whitened = None
    with pytest.raises(NumericalError, match="site sums are not finite"):
        state.update(terms, idx, 0.5)  # outside a context: at once, before the state moves
    assert torch.isnan(state.Lam).all()
    state._whitened = None
    # inside one: read at the flush; the update's check, the first to fail, names the problem
    with pytest.raises(NumericalError, match="site sums are not finite"):
        with ops.deferred_checks() as checks:
            change = state.update(terms, idx, 0.5)
            value, _ = state.evaluate(terms, idx, 1.0)
            checks.flush(value, change)
    assert torch.isnan(state.h).all()  # the state moved: the caller restores its snapshot
    state.restore(good)
    assert np.isfinite(ops.scalar(state.update(terms, idx, 0.5)))


def _fit(method="sep", max_iter=2, **options):
    from gpinfer.estimator import GPClassifier

    rng = np.random.default_rng(1)
    y = np.arange(48) % 3
    X = rng.normal(size=(48, 2)) + y[:, None]
    batches = {"batch_size": 16, "method_options": {"adam_learning_rate": 0.01, **options}}
    return GPClassifier(method=method, M=5, max_iter=max_iter, random_state=0,
                        backend="torch", device="cpu", dtype="float64",
                        **(batches if method == "sep" else {})).fit(X, y)


_PROBE = np.linspace(-2.0, 4.0, 14).reshape(7, 2)


@pytest.mark.parametrize(("method", "steps"), [("sep", 6), ("ep", 2)])
def test_a_training_step_reads_the_device_once(monkeypatch, method, steps):
    """One read at the step's end of every check (Kuu's Cholesky included: a failure redoes
    the step), the objective and the site change (sep mini-batch, ep full batch); the first
    step, before the loop knows its arrays are on a device, checks Kuu at once (two reads)."""
    from gpinfer.training.loop import TrainingLoop

    original, counts = TrainingLoop._step, []

    def counted(self, *args, **kwargs):
        out, syncs = _syncs(lambda: original(self, *args, **kwargs))
        counts.append(syncs)
        return out

    monkeypatch.setattr(TrainingLoop, "_step", counted)
    _fit(method)
    assert counts == [2] + [1] * (steps - 1)


def test_a_check_failed_inside_a_step_restores_the_last_good_state(monkeypatch):
    original, seen = TiedSites.update, {"calls": 0, "returned": False}

    def poisoned(self, *args, **kwargs):
        seen["calls"] += 1
        if seen["calls"] == 5:  # epoch 2: corrupt the sums; the check is read at the step's end
            self.Lam = self.Lam * float("nan")
            self._whitened = None
            out = original(self, *args, **kwargs)
            seen["returned"] = True
            return out
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TiedSites, "update", poisoned)
    est = _fit(max_iter=3)
    assert seen["returned"]  # deferred: the update itself did not raise
    assert est.history_[-1]["failures"] == 1.0
    assert np.all(np.isfinite(est.predict_proba(np.zeros((2, 2)))))


def test_sep_moves_a_batch_s_labels_once_and_counts_them_on_the_device():
    from gpinfer.sites.inducing import factor_counts

    state, terms, idx = _sep_state()
    first = state._labels(idx, terms.A)
    assert state._labels(idx.copy(), terms.A) is first  # update, then evaluate: one move
    np.testing.assert_array_equal(first.counts.numpy(), factor_counts(state.y[idx], 3))
    other = state._labels(idx[:6], terms.A)
    assert other is not first
    np.testing.assert_array_equal(other.counts.numpy(), factor_counts(state.y[:6], 3))


@pytest.mark.parametrize(("method", "nth"), [("sep", 4), ("ep", 2)])
def test_a_failed_deferred_kuu_factorisation_redoes_the_step(monkeypatch, method, nth):
    """A Kuu factorisation reported failed at the step's read: the step is redone from the
    sites' state before it (sep mini-batch: a copy per step; ep full batch: the state the
    loop keeps) with the factorisation checked at once; the fit is unchanged."""
    reference = _fit(method, max_iter=3).predict_proba(_PROBE)
    original, seen = ops.cholesky, {"deferred": 0, "failed": 0}

    def failing_once(K, *also, error=None, **options):
        L, failed = original(K, *also, error=error, **options)
        if error is not None and isinstance(error(), ops.RedoStep):  # Kuu's, deferred
            seen["deferred"] += 1
            if seen["deferred"] == nth:  # a later step: report the factorisation failed
                seen["failed"] += 1
                ops.pending_checks().require(torch.tensor(False), error)
                return L * float("nan"), failed  # what a failed factorisation may leave
        return L, failed

    monkeypatch.setattr(ops, "cholesky", failing_once)
    est = _fit(method, max_iter=3)
    assert seen["failed"] == 1
    assert est.history_[-1]["failures"] == 0.0  # redone, not backed off
    np.testing.assert_array_equal(est.predict_proba(_PROBE), reference)


@pytest.mark.parametrize("poison", [False, True])
def test_reading_every_k_steps_gives_the_same_fit(monkeypatch, poison):
    """read_every = 3: fewer reads, the same fit as one read per step, also when a step fails
    inside a window (the window is replayed one read per step)."""

    original, seen = TiedSites.update, {"steps": []}

    def poisoned(self, terms, idx, *args, **kwargs):
        step = (kwargs.get("iteration"), tuple(idx[:4].tolist()))  # the same in a replay
        if step not in seen["steps"]:
            seen["steps"].append(step)
        if poison and seen["steps"].index(step) == 4:  # epoch 2, its second batch
            self.Lam = self.Lam * float("nan")
            self._whitened = None
        return original(self, terms, idx, *args, **kwargs)

    monkeypatch.setattr(TiedSites, "update", poisoned)
    one = _fit(max_iter=3)
    reads = {"n": 0}
    flush = ops.DeferredChecks.flush

    def counted(self, *values):
        reads["n"] += 1
        return flush(self, *values)

    monkeypatch.setattr(ops.DeferredChecks, "flush", counted)
    three = _fit(max_iter=3, read_every=3)
    assert one.history_[-1]["failures"] == three.history_[-1]["failures"] == float(poison)
    np.testing.assert_array_equal(three.predict_proba(_PROBE), one.predict_proba(_PROBE))
    np.testing.assert_array_equal([h["objective"] for h in three.history_],
                                  [h["objective"] for h in one.history_])
    if not poison:  # 9 steps: the first alone (device not yet known), then windows of 3
        assert reads["n"] < 9


def test_read_every_is_for_mini_batches():
    from gpinfer.training.loop import Schedule

    with pytest.raises(InputError, match="mini-batch training only"):
        Schedule(read_every=2).check("sep", minibatch=False)
    with pytest.raises(InputError, match="integer >= 1"):
        Schedule(read_every=0).check("sep", minibatch=True)
