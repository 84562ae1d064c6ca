"""Per-iteration reporting shared by iterative methods: history, callback, training-only clock,
stop requests.

``IterationReporter`` measures training time with ``time.perf_counter`` and excludes the time
spent inside the fit callback (where the runner evaluates test metrics), as spec jj-taylor-svi
P19 asks. It also checks the reported objective is finite.

A fit callback may return ``True`` to ask training to stop (early stopping on a validation set,
``gpinfer.training.early_stopping``, does); the reporter remembers the request and every
iterative method ends after the iteration it reported (``should_stop``), as it does when its
time budget (``time_limit_s``) is spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, FitCallback, IterationInfo
from gpinfer.posterior import Posterior
from gpinfer.validation import check_binary_labels


class IterationReporter:
    """Collects ``history`` (one dict per iteration) and calls ``callback`` per iteration."""

    def __init__(self, callback: FitCallback | None, method: str,
                 time_limit_s: float | None = None):
        self.callback = callback
        self.method = method
        self.time_limit_s = None if time_limit_s is None else float(time_limit_s)
        self.history: list[dict[str, float]] = []
        self.stop_requested = False
        self._start = time.perf_counter()
        self._excluded = 0.0

    def out_of_time(self) -> bool:
        """Whether the training-time budget ``time_limit_s`` is spent."""
        return self.time_limit_s is not None and self.elapsed() > self.time_limit_s

    def should_stop(self) -> bool:
        """Whether training should end now: the callback asked for it or the budget is spent."""
        return self.stop_requested or self.out_of_time()

    def elapsed(self) -> float:
        """Training seconds so far (callback time excluded)."""
        return time.perf_counter() - self._start - self._excluded

    def report(
        self,
        iteration: int,
        objective: float,
        posterior: Callable[[], Posterior] | None,
        extra: Mapping[str, float] | None = None,
    ) -> bool:
        """Record one iteration; ``NumericalError`` if ``objective`` is not finite. Returns
        whether the callback asked training to stop (also kept in ``stop_requested``)."""
        if not np.isfinite(objective):
            raise NumericalError(
                f"{self.method}: objective is {objective}", iteration=iteration,
                quantity="objective",
            )
        extra = {k: float(v) for k, v in (extra or {}).items()}
        elapsed = self.elapsed()
        self.history.append({"iteration": float(iteration), "objective": float(objective),
                             "elapsed": elapsed, **extra})
        if self.callback is not None:
            t0 = time.perf_counter()
            stop = self.callback(IterationInfo(iteration, float(objective), elapsed, posterior,
                                               extra))
            self._excluded += time.perf_counter() - t0
            self.stop_requested = self.stop_requested or stop is True
        return self.stop_requested


def binary_signs(y: Array, n_classes: int, method: str) -> Array:
    """Labels ``[N]`` (class indices 0/1) as signs ``-1/+1``; ``InputError`` unless binary."""
    labels = check_binary_labels(y, n_classes, method, require_both=True)
    return 2.0 * labels.astype(float) - 1.0
