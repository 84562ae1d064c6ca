"""Per-iteration reporting shared by iterative methods: history, callback, training-only clock.

``IterationReporter`` measures training time with ``time.perf_counter`` and excludes the time
spent inside the fit callback (where the runner evaluates test metrics), as spec jj-taylor-svi
P19 asks. It also checks the reported objective is finite.
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

    def __init__(self, callback: FitCallback | None, method: str):
        self.callback = callback
        self.method = method
        self.history: list[dict[str, float]] = []
        self._start = time.perf_counter()
        self._excluded = 0.0

    def elapsed(self) -> float:
        """Training seconds so far (callback time excluded)."""
        return time.perf_counter() - self._start - self._excluded

    def report(
        self,
        iteration: int,
        objective: float,
        posterior: Callable[[], Posterior] | None,
        extra: Mapping[str, float] | None = None,
    ) -> None:
        """Record one iteration; ``NumericalError`` if ``objective`` is not finite."""
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
            self.callback(IterationInfo(iteration, float(objective), elapsed, posterior, extra))
            self._excluded += time.perf_counter() - t0


def binary_signs(y: Array, n_classes: int, method: str) -> Array:
    """Labels ``[N]`` (class indices 0/1) as signs ``-1/+1``; ``InputError`` unless binary."""
    labels = check_binary_labels(y, n_classes, method, require_both=True)
    return 2.0 * labels.astype(float) - 1.0
