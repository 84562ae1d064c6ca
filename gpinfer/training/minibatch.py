"""The mini-batch schedule: the one loop over epochs and batches of every stochastic fit (sep/ep's
``TrainingLoop``, svi's AdaDelta/Adam steps, pep's Adam steps on batch energies).

``MiniBatchSchedule.run(steps, max_iter)`` owns

* **the batch order**: ``MiniBatches`` over the ``n`` points from the fit's generator,
  reshuffled every epoch and drawn lazily (a Monte-Carlo expectation drawing from the same
  generator sees the draws in the order of the steps); the last batch of an epoch is shorter
  unless ``drop_last`` (fixed shapes: compiled steps); ``batch_size=None``: every step on all
  points (``batch`` is ``None``);
* **the iteration**: an epoch (``steps_per_iteration=None``) or ``steps_per_iteration`` steps
  (svi's ``report_every``, pep's one step), up to ``max_iter`` iterations;
* **the reads** (``read_every = k``, on a device): ``k`` steps run inside one
  ``ops.deferred_checks(redo=True)`` context and are read once, after them; the state before
  them (``BatchSteps.save``, each step's batch and the generator's state before it) is kept
  that long, and when the read shows a failure (any check, a Kuu factorisation to redo) the
  state is restored and the steps are replayed one read each (``BatchSteps.read_step``, which
  also runs every step on numpy), so the fit is the one that reads every step;
* **the time budget** (the iteration ends after the step that spent it), **the report** of
  every iteration (``BatchSteps.payload``: objective, posterior, metrics) and the stop request
  after it (early stopping, the budget).

A method hands it ``BatchSteps``: its step on one batch (site update, objective and gradient, its
optimiser's step), the state a replay starts from, and its report payload; ``check_step`` is
the finiteness check of a step's objective and gradient before its optimiser step (deferred
inside a window, at once otherwise).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from gpinfer.backend import ops
from gpinfer.data.minibatch import MiniBatches
from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, Scalar
from gpinfer.optim.lbfgs import check_finite
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter

#: one step's values read on the host (the objective first)
Read = tuple[float, ...]
#: an iteration's report: ``(objective, posterior builder, metrics)``
Payload = tuple[float, Callable[[], Posterior] | None, Mapping[str, float]]


def check_step(value: Scalar, grad: Array, index: int, where: str) -> None:
    """A step's objective ``value`` and gradient ``grad [P]`` checked finite before its
    optimiser step: inside ``ops.deferred_checks`` on a device, left for the window's read
    (``ops.require_finite``); else at once, naming the entries (``NumericalError`` naming step
    ``index`` and ``where``)."""
    if ops.checks_for(grad) is None:
        check_finite(ops.scalar(value), grad, index, where)
    else:
        ops.require_finite(lambda: NumericalError(
            f"{where} value or gradient is not finite", iteration=index, quantity=where),
            value, grad)


class BatchSteps(abc.ABC):
    """What a method hands ``MiniBatchSchedule``: one step on a batch, the state a window's
    replay starts from, and an iteration's report."""

    #: True: a lone step on a device (a group of one) is ``read_step`` (the method reads it its
    #: own way); False: it runs as a window of one
    reads_lone_steps: bool = False

    def on_device(self) -> bool | None:
        """Whether the steps run on a device (``None``: not known before the first step;
        numpy's path until then)."""
        return False

    @abc.abstractmethod
    def step(self, batch: Array | None, iteration: int, index: int) -> tuple[Scalar, ...]:
        """One step on ``batch [B]`` (indices; ``None``: all points) of ``iteration``, the
        ``index``-th step of the fit (1-based), with the optimiser's update. Returns its values,
        the objective first: unread 0-d device arrays inside ``ops.deferred_checks`` (its
        checks left there too), floats on numpy."""

    def read_step(self, batch: Array | None, iteration: int, index: int) -> Read | None:
        """One step read at once (default: ``step`` with immediate checks). ``None``: the step
        failed and the method backed off from it (the schedule goes on)."""
        return tuple(ops.scalar(v) for v in self.step(batch, iteration, index))

    def save(self) -> object:
        """The state before a window of steps (what ``load`` brings back); needed by steps
        that run on a device only."""
        raise NotImplementedError(f"{type(self).__name__} runs on numpy only: no window")

    def load(self, saved: object) -> None:
        """Return to a state taken by ``save``."""
        raise NotImplementedError(f"{type(self).__name__} runs on numpy only: no window")

    @abc.abstractmethod
    def payload(self, iteration: int, reads: list[Read], steps: int) -> Payload:
        """The report of ``iteration``: ``reads`` of its steps that succeeded, ``steps`` the
        fit's steps so far."""


class MiniBatchSchedule:
    """Epochs of mini-batches, read in windows, reported per iteration (see the module doc).

    ``n`` points in batches of ``batch_size`` (``None``: full batch) drawn from ``rng``;
    ``steps_per_iteration`` (``None``: an epoch); ``read_every`` steps read together on a
    device; ``drop_last``: every batch of size ``batch_size``. After ``run``: ``steps``."""

    def __init__(self, n: int, batch_size: int | None, rng: np.random.Generator,
                 reporter: IterationReporter,
                 *, steps_per_iteration: int | None = None, read_every: int = 1,
                 drop_last: bool = False):
        self.batches = None if batch_size is None else MiniBatches(n, batch_size, rng,
                                                                   drop_last=drop_last)
        self.rng, self.reporter = rng, reporter
        #: steps per epoch (``len(MiniBatches)``; one for full batches)
        self.steps_per_epoch = 1 if self.batches is None else len(self.batches)
        self.per_iteration = int(steps_per_iteration or self.steps_per_epoch)
        self.read_every = int(read_every)
        self.steps = 0

    def run(self, steps: BatchSteps, max_iter: int) -> int:
        """Iterations of ``steps`` to ``max_iter``, the time budget or a stop request; returns
        the number run."""
        stream: Iterator[Array | None] = (itertools.repeat(None) if self.batches is None
                                          else self.batches.epochs(None))
        it = 0
        while it < max_iter and not self.reporter.should_stop():
            it += 1
            reads: list[Read] = []
            left = self.per_iteration
            while left:
                k = min(left, self.read_every if steps.on_device() else 1)
                group, stopped = self._group(steps, stream, k, it)
                reads += group
                left -= k
                if stopped:
                    break
            self.reporter.report(it, *steps.payload(it, reads, self.steps))
        return it

    def _group(self, steps: BatchSteps, stream: Iterator[Array | None], k: int, it: int
               ) -> tuple[list[Read], bool]:
        """``k`` steps: ``(reads of those that succeeded, out of time)``; a window read once on
        a device, replayed one read per step when the read showed a failure."""
        drawn: list[tuple[Array | None, Mapping[str, Any]]] = []
        if steps.on_device() and (k > 1 or not steps.reads_lone_steps):
            window = self._window(steps, stream, k, it)
            if isinstance(window, tuple):
                return window
            drawn = window
        reads: list[Read] = []
        for i in range(k):
            if i < len(drawn):  # a replay: the window's batch, the generator as it was
                batch, state = drawn[i]
                self.rng.bit_generator.state = state
            else:
                batch = next(stream)
            self.steps += 1
            read = steps.read_step(batch, it, self.steps)
            if read is None:
                continue
            reads.append(read)
            if self.reporter.out_of_time():
                return reads, True
        return reads, False

    def _window(self, steps: BatchSteps, stream: Iterator[Array | None], k: int, it: int
                ) -> tuple[list[Read], bool] | list[tuple[Array | None, Mapping[str, Any]]]:
        """``k`` steps read once at the end: ``(reads, out of time)``; when the read (or a step)
        failed, the state before them restored and their batches with the generator's state
        before each (what the replay needs)."""
        start = steps.save()
        drawn: list[tuple[Array | None, Mapping[str, Any]]] = []
        unread: list[tuple[Scalar, ...]] = []
        stopped = False
        try:
            with ops.deferred_checks(redo=True) as checks:
                for _ in range(k):
                    batch = next(stream)
                    drawn.append((batch, self.rng.bit_generator.state))
                    unread.append(steps.step(batch, it, self.steps + len(drawn)))
                    if self.reporter.out_of_time():
                        stopped = True
                        break
                flat = checks.flush(*(v for values in unread for v in values))
        except Exception:  # noqa: BLE001 - replayed with one read per step: the same outcome
            steps.load(start)
            return drawn
        self.steps += len(unread)
        width = len(unread[0])
        return [tuple(flat[i * width:(i + 1) * width]) for i in range(len(unread))], stopped
