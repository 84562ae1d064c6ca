"""The mini-batch schedule (``gpinfer.training.minibatch``) with a scripted ``BatchSteps``: the
batch order and the generator's draws, iterations and reports, stop requests, the time budget,
failed steps, and a window's replay."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.backend import ops
from gpinfer.data.minibatch import MiniBatches
from gpinfer.errors import NumericalError
from gpinfer.reporting import IterationReporter
from gpinfer.training.minibatch import BatchSteps, MiniBatchSchedule, Payload, Read


class Scripted(BatchSteps):
    """A step whose value is the batch's first index plus a draw from the fit's generator (a
    Monte-Carlo rule's); ``device``: read in windows; ``fail_in_window``: these step indices
    fail inside a window (a failed deferred read); ``back_off``: these fail when read alone."""

    def __init__(self, rng: np.random.Generator, device: bool = False,
                 fail_in_window: tuple[int, ...] = (), back_off: tuple[int, ...] = ()):
        self.rng, self.device = rng, device
        self.fail_in_window, self.back_off = set(fail_in_window), set(back_off)
        self.total = 0.0  # the state a window's replay restores
        self.calls: list[tuple[int, int, int]] = []  # (iteration, index, first index of batch)
        self.payloads: list[tuple[int, list[Read], int]] = []

    def on_device(self) -> bool:
        return self.device

    def step(self, batch, iteration, index):
        self.calls.append((iteration, index, int(batch[0])))
        value = float(batch[0]) + self.rng.random()
        self.total += value
        if index in self.fail_in_window and ops.pending_checks() is not None:
            raise NumericalError("scripted failure of a deferred read", iteration=index)
        return (value, float(index))

    def read_step(self, batch, iteration, index):
        if index in self.back_off:
            self.calls.append((iteration, index, -1))
            return None
        return super().read_step(batch, iteration, index)

    def save(self):
        return self.total

    def load(self, saved):
        self.total = saved

    def payload(self, iteration, reads, steps) -> Payload:
        self.payloads.append((iteration, list(reads), steps))
        return float(np.mean([r[0] for r in reads])), None, {"steps": float(steps)}


def _run(steps_factory, n=10, batch_size=3, max_iter=3, seed=0, callback=None,
         time_limit_s=None, **kwargs) -> tuple[Scripted, list[dict[str, float]], int]:
    rng = np.random.default_rng(seed)
    steps = steps_factory(rng)
    reporter = IterationReporter(callback, "toy", time_limit_s)
    schedule = MiniBatchSchedule(n, batch_size, rng, reporter, **kwargs)
    n_iter = schedule.run(steps, max_iter)
    return steps, reporter.history, n_iter


def _expected_batches(n, batch_size, seed, n_steps):
    """The batches and the step values that drawing them lazily gives: each epoch's
    permutation drawn when its first batch is needed, a step's draw after its batch."""
    rng = np.random.default_rng(seed)
    out = []
    for batch in MiniBatches(n, batch_size, rng).epochs(None):
        out.append((int(batch[0]), float(batch[0]) + rng.random()))
        if len(out) == n_steps:
            return out
    raise AssertionError("unreachable")


def test_an_iteration_is_an_epoch_with_lazy_draws():
    steps, history, n_iter = _run(Scripted, max_iter=3)
    expected = _expected_batches(10, 3, 0, 12)  # four batches per epoch (the last of one)
    assert [c[2] for c in steps.calls] == [b for b, _ in expected]
    assert [c[0] for c in steps.calls] == [1] * 4 + [2] * 4 + [3] * 4
    assert [c[1] for c in steps.calls] == list(range(1, 13))
    assert n_iter == 3 and [h["iteration"] for h in history] == [1.0, 2.0, 3.0]
    values = [v for _, v in expected]
    assert [h["objective"] for h in history] == [np.mean(values[4 * i:4 * i + 4])
                                                 for i in range(3)]
    assert [p[2] for p in steps.payloads] == [4, 8, 12]


def test_steps_per_iteration_cross_epochs_and_full_batch():
    steps, history, _ = _run(Scripted, max_iter=2, steps_per_iteration=5)
    assert [c[0] for c in steps.calls] == [1] * 5 + [2] * 5
    assert [c[2] for c in steps.calls] == [b for b, _ in _expected_batches(10, 3, 0, 10)]
    full, _, _ = _run(lambda rng: _FullBatch(rng), batch_size=None, max_iter=2,
                      steps_per_iteration=2)
    assert full.batches == [None] * 4


class _FullBatch(Scripted):
    def __init__(self, rng):
        super().__init__(rng)
        self.batches: list[object] = []

    def step(self, batch, iteration, index):
        self.batches.append(batch)
        return (1.0,)


def test_a_stop_request_ends_the_fit_after_its_report():
    steps, history, n_iter = _run(Scripted, max_iter=5, callback=lambda info: info.iteration == 2)
    assert n_iter == 2 and len(history) == 2 and len(steps.calls) == 8


@pytest.mark.parametrize("device", [False, True])
def test_the_time_budget_ends_the_iteration_after_the_step(monkeypatch, device):
    """The budget is spent by step 2 (a scripted clock): the iteration ends there (inside a
    window too), is reported, and the fit stops."""
    made: list[Scripted] = []

    def factory(rng):
        made.append(Scripted(rng, device=device))
        return made[-1]

    monkeypatch.setattr(IterationReporter, "out_of_time", lambda self: len(made[0].calls) >= 2)
    steps, history, n_iter = _run(factory, max_iter=5, read_every=4)
    assert n_iter == 1 and len(steps.calls) == 2 and history[0]["steps"] == 2.0


def test_a_step_that_backs_off_is_left_out_of_the_report():
    steps, history, _ = _run(lambda rng: Scripted(rng, back_off=(2,)), max_iter=1)
    assert [len(p[1]) for p in steps.payloads] == [3]
    assert history[0]["steps"] == 4.0


@pytest.mark.parametrize(("read_every", "per_iteration"), [(1, None), (2, None), (4, None),
                                                          (5, 5)])
def test_windows_read_together_equal_one_read_per_step(read_every, per_iteration):
    """Windows (also across epochs: svi's ``report_every``) draw their batches when their steps
    need them, so a step's draws from the generator are the ones of one read per step."""
    one, h1, _ = _run(Scripted, max_iter=3, steps_per_iteration=per_iteration)
    windowed, hk, _ = _run(lambda rng: Scripted(rng, device=True), max_iter=3,
                           read_every=read_every, steps_per_iteration=per_iteration)
    assert windowed.calls == one.calls
    assert hk == [{**h, "elapsed": g["elapsed"]} for h, g in zip(h1, hk)]
    assert [p[1] for p in windowed.payloads] == [p[1] for p in one.payloads]


def test_a_failed_window_is_replayed_from_its_state_and_draws():
    """Step 6 fails inside the window of steps 5..8: the state before the window is restored
    and the four steps replayed with the batches and generator states they had, so the fit
    (batches, draws, values, state) is the one read step by step."""
    one, h1, _ = _run(Scripted, max_iter=3)
    replayed, hk, _ = _run(lambda rng: Scripted(rng, device=True, fail_in_window=(6,)),
                           max_iter=3, read_every=4)
    window = [c for c in replayed.calls if c[0] == 2]
    assert [c[1] for c in window] == [5, 6, 5, 6, 7, 8]  # two run and failed, then the replay
    assert [c for c in replayed.calls if c[0] != 2] == [c for c in one.calls if c[0] != 2]
    assert window[2:] == [c for c in one.calls if c[0] == 2]
    assert [h["objective"] for h in hk] == [h["objective"] for h in h1]
    assert replayed.total == one.total
