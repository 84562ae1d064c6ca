"""Host synchronisation inside a training step on torch (issue 25): counted with
``torch.profiler`` on torch-CPU (``gpinfer.testing.step_profile``: ``aten::item`` /
``aten::_local_scalar_dense`` and ``ops.to_host`` reads), a deterministic count, not a timing.

sep and svi read their values and checks once per window of ``k`` steps (sep's ``read_every``,
svi's ``report_every``) and nothing inside a step: not the hyper-parameters after the
optimiser's update (``HyperParameters(device_kernels=True)``), not the ELBO, not the
likelihood's input checks (deferred). The robust-max trapezoid rule still reads its per-row
node levels once per step (its grid depends on the data); Gauss-Hermite reads nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpinfer.errors import NumericalError  # noqa: E402
from gpinfer.estimator import GPClassifier  # noqa: E402
from gpinfer.kernels import make_kernel  # noqa: E402
from gpinfer.likelihoods import RobustMax  # noqa: E402
from gpinfer.testing.step_profile import profile_steps  # noqa: E402
from gpinfer.training.minibatch import MiniBatchSchedule  # noqa: E402

TORCH = {"backend": "torch", "device": "cpu", "dtype": "float64"}
N, D, C, M, B = 96, 3, 3, 6, 16  # six batches per epoch


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = np.argmax(X @ rng.normal(size=(D, C)), axis=1)
    return X, y


@pytest.mark.parametrize("k", [1, 3])
def test_sep_step_reads_nothing_but_once_per_window(k):
    X, y = _data()

    def fit() -> None:
        GPClassifier(method="sep", M=M, kernel=make_kernel("rbf", D, ard=True), max_iter=2,
                     batch_size=B, random_state=0, baseline_failure="warn",
                     method_options={"read_every": k}, **TORCH).fit(X, y)

    windows = 6 // k  # per epoch; the windows of epoch 2 (a step and its optimiser update)
    counts = profile_steps(fit, MiniBatchSchedule, "_group", first=windows + 1, steps=2)
    assert counts["steps_profiled"] == 2
    assert counts["host_syncs"] == 1.0  # the window's one read of values and checks


def _svi(likelihood: RobustMax, k: int, **settings) -> GPClassifier:
    return GPClassifier(method="svi", M=M, kernel=make_kernel("rbf", D, ard=True),
                        likelihood=likelihood, max_iter=2, batch_size=B, random_state=0,
                        baseline_failure="warn",
                        method_options={"optimizer": "adam", "report_every": k,
                                        "optimizer_options": {"learning_rate": 1e-2}},
                        **settings)


@pytest.mark.parametrize(("expectation", "per_step"), [("gauss_hermite", 0.0),
                                                        ("trapezoid", 1.0)])
def test_svi_step_reads_nothing_but_once_per_window(expectation, per_step):
    from gpinfer_svi.method import SVI

    X, y = _data()
    k = 3

    def fit() -> None:
        _svi(RobustMax(expectation=expectation), k, **TORCH).fit(X, y)

    steps = profile_steps(fit, SVI, "_step", first=k + 1, steps=k)  # the second window
    assert steps["steps_profiled"] == k
    assert steps["host_syncs"] == per_step  # trapezoid: its node levels, once per step
    window = profile_steps(fit, MiniBatchSchedule, "_group", first=2, steps=1)
    assert window["host_syncs"] == 1.0 + k * per_step  # one read of the k steps' values


def test_svi_failure_in_a_window_is_the_immediate_checks_error(monkeypatch):
    """A non-finite gradient at step 4 of a window read later: the window is replayed with
    immediate checks, so the error names step 4 and the gradient, as on numpy."""
    from gpinfer_svi.method import VariationalState

    X, y = _data()
    original = VariationalState.estimate
    seen: list[np.ndarray] = []  # the batches met, kept (their order is the steps')

    def poisoned(self, x, batch, natural=True):
        value, grad, est = original(self, x, batch, natural)
        if not any(b is batch for b in seen):
            seen.append(batch)
        if batch is seen[3] if len(seen) > 3 else False:  # the 4th batch, also in a replay
            grad = grad * float("nan")
        return value, grad, est

    monkeypatch.setattr(VariationalState, "estimate", poisoned)
    errors = []
    for settings in ({}, TORCH):
        seen.clear()
        with pytest.raises(NumericalError) as info:
            _svi(RobustMax(expectation="gauss_hermite"), 3, **settings).fit(X, y)
        errors.append((str(info.value), info.value.iteration))
    assert errors[0] == errors[1]
    assert errors[1][1] == 4 and "gradient has non-finite entries" in errors[1][0]


def test_svi_window_replays_a_kuu_factorisation_to_the_immediate_fit(monkeypatch):
    """Duplicated inducing inputs without noise: Kuu needs jitter every step. Inside a window
    the factorisation is checked with the others (``RedoStep`` at the read), the window is
    replayed from its kept state (point, optimiser, batches, generator) with immediate checks,
    and the fit equals the one whose every window runs immediate checks from the start."""
    import contextlib

    from gpinfer_svi.method import SVI

    from gpinfer.backend import ops

    X, y = _data()
    Z = np.repeat(X[:3], 2, axis=0)  # Kuu singular without noise
    calls = {"n": 0}
    original = SVI._step

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return original(self, *args, **kwargs)

    def fit() -> np.ndarray:
        est = GPClassifier(method="svi", M=Z, kernel=make_kernel("rbf", D, ard=True),
                           likelihood=RobustMax(expectation="gauss_hermite"), max_iter=2,
                           batch_size=B, random_state=0, baseline_failure="warn",
                           method_options={"optimizer": "adam", "report_every": 3,
                                           "noise": None, "init_q": "identity",
                                           "optimizer_options": {"learning_rate": 1e-2}},
                           **TORCH).fit(X, y)
        return est.predict_proba(X[:10])

    monkeypatch.setattr(SVI, "_step", counting)
    deferred = fit()
    assert calls["n"] == 2 * 6  # every window ran, failed its read, and was replayed

    @contextlib.contextmanager
    def refused(redo: bool = False):
        raise RuntimeError("no deferred checks: every step checks at once")
        yield  # pragma: no cover

    monkeypatch.setattr(ops, "deferred_checks", refused)
    calls["n"] = 0
    immediate = fit()
    assert calls["n"] == 6
    np.testing.assert_array_equal(deferred, immediate)
