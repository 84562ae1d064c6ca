"""The ``compile`` option (``gpinfer.backend.compile``): modes refused before training with
the fallback named, the eager fallback when compiling fails, fixed shapes (the last short
batch dropped, with a warning), and (``GPINFER_FULL_CHECKS=1``: inductor takes minutes on a
loaded CPU) the compiled fit equal to the eager one to float64 round-off."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gpinfer.backend.compile as compile_module
from gpinfer.backend.choice import NUMPY, resolve_backend
from gpinfer.backend.compile import check_compile
from gpinfer.errors import InputError

torch = pytest.importorskip("torch")

FULL = os.environ.get("GPINFER_FULL_CHECKS") == "1"


def _fit(mode, n=96, batch_size=32, max_iter=2):
    from gpinfer.estimator import GPClassifier
    from gpinfer.kernels import make_kernel

    rng = np.random.default_rng(1)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 4)) + 0.5 * y[:, None]
    return GPClassifier(method="sep", M=6, max_iter=max_iter, random_state=0,
                        batch_size=batch_size, kernel=make_kernel("rbf", 4, ard=True),
                        backend="torch", device="cpu", dtype="float64",
                        method_options={"adam_learning_rate": 0.01, "compile": mode}).fit(X, y)


def test_modes_the_backend_cannot_honour_are_refused_with_the_fallback():
    cpu = resolve_backend("torch", "cpu", "float64")
    assert check_compile("none", NUMPY, "sep") == "none"
    assert check_compile("default", cpu, "sep") == "default"
    with pytest.raises(InputError, match="needs backend='torch'.*compile='none'"):
        check_compile("default", NUMPY, "sep")
    with pytest.raises(InputError, match="CUDA device.*use compile='default'"):
        check_compile("reduce-overhead", cpu, "sep")
    with pytest.raises(InputError, match="compile must be one of"):
        check_compile("max-speed", cpu, "sep")


def test_the_option_is_checked_before_training():
    from gpinfer.estimator import GPClassifier

    X, y = np.arange(16.0).reshape(8, 2), np.arange(8) % 2  # features that vary
    with pytest.raises(InputError, match="reduce-overhead"):
        GPClassifier(method="sep", M=2, max_iter=1, batch_size=4, backend="torch",
                     device="cpu", method_options={"compile": "reduce-overhead"}).fit(X, y)


class _CompilerFailure(Exception):
    """Stands in for a dynamo/inductor failure (what ``_is_compile_failure`` recognises)."""


_CompilerFailure.__module__ = "torch._inductor.exc"


def test_a_failing_compiler_warns_once_and_the_step_runs_eagerly(monkeypatch):
    eager = _fit("none").predict_proba(np.zeros((3, 4)))

    def broken(fn, mode):
        def call(*args, **kwargs):
            raise _CompilerFailure("no C++ compiler")
        return call

    monkeypatch.setattr(compile_module, "_compiled", broken)
    monkeypatch.setattr(compile_module, "_FAILED", set())
    with pytest.warns(RuntimeWarning, match="failed, the step runs eagerly") as caught:
        est = _fit("default")
    assert sum("runs eagerly" in str(w.message) for w in caught) == 1
    np.testing.assert_array_equal(est.predict_proba(np.zeros((3, 4))), eager)


def test_an_error_of_the_computation_is_not_taken_for_a_compiler_failure(monkeypatch):
    def wrong(fn, mode):
        def call(*args, **kwargs):
            raise ValueError("a shape mistake")
        return call

    monkeypatch.setattr(compile_module, "_compiled", wrong)
    monkeypatch.setattr(compile_module, "_FAILED", set())
    with pytest.raises(ValueError, match="shape mistake"):
        _fit("default")


def test_fixed_shapes_drop_the_last_short_batch_with_a_warning(monkeypatch):
    from gpinfer.training.loop import TrainingLoop

    monkeypatch.setattr(compile_module, "_compiled", lambda fn, mode: fn)  # no inductor here
    sizes: list[int] = []
    original = TrainingLoop._unread_step

    def seen(self, batch, *args):
        sizes.append(len(batch))
        return original(self, batch, *args)

    monkeypatch.setattr(TrainingLoop, "_unread_step", seen)
    with pytest.warns(UserWarning, match="last 16 points of each epoch"):
        _fit("default", n=96, batch_size=40)
    assert sizes == [40, 40] * 2  # 96 = 2 x 40 + 16: the 16 dropped, every epoch
    sizes.clear()
    _fit("none", n=96, batch_size=40)
    assert sizes == [40, 40, 16] * 2  # eager keeps them


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="heavy: set GPINFER_FULL_CHECKS=1 to run (inductor "
                    "compiles C++: minutes on a loaded CPU)")
def test_the_compiled_fit_equals_the_eager_one():
    eager = _fit("none", max_iter=3)
    compiled = _fit("default", max_iter=3)
    probe = np.linspace(-1.0, 2.0, 20).reshape(5, 4)
    np.testing.assert_allclose(compiled.predict_proba(probe), eager.predict_proba(probe),
                               rtol=1e-10, atol=0.0)
    np.testing.assert_allclose([h["objective"] for h in compiled.history_],
                               [h["objective"] for h in eager.history_], rtol=1e-10)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="heavy: set GPINFER_FULL_CHECKS=1 to run (inductor)")
def test_a_compiled_region_hands_its_checks_to_the_step_in_order():
    from gpinfer.backend import ops
    from gpinfer.backend.compile import compilable, compiling
    from gpinfer.errors import NumericalError

    @compilable
    def region(x):
        y = 1.0 - x
        ops.require_positive(y, lambda: NumericalError("first"))
        ops.require_finite(lambda: NumericalError("second"), y.log())
        return 2.0 * y

    good = torch.full((3,), 0.5, dtype=torch.float64)
    with compiling("default"), ops.deferred_checks() as checks:
        out = region(good)
        assert checks.flush(out.sum()) == [3.0]
        with pytest.raises(NumericalError, match="first"):
            region(torch.full((3,), 2.0, dtype=torch.float64))  # y < 0, log(y) NaN
            checks.flush()
    assert not ops._TRACED  # handed over, nothing left behind


def test_kept_constants_trace_without_a_graph_break():
    """``ops.constant`` inside a compiled region (the step's 0-d factors and ``addcmul`` bases)
    builds its tensor in the graph: a numpy array's ``tolist()`` of floats broke the graph
    there (each region then fell back in pieces: 146 aten ops and 7 host reads per compiled
    sep step instead of about 99 and 3). Traced by dynamo alone (no inductor: quick)."""
    from gpinfer.backend import ops

    def region(x):
        half = ops.constant(x, (0.5,), ())
        column = ops.constant(x, (1.0, 2.0, 3.0), (-1, 1))
        return ops.add_product(1.0, x * half, column)

    x = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    explained = torch._dynamo.explain(region)(x)
    assert explained.graph_break_count == 0
    traced = torch.compile(region, backend="eager", fullgraph=True)(x)
    want = 1.0 + (0.5 * x) * torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    np.testing.assert_array_equal(traced.numpy(), want.numpy())
