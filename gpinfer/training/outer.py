"""The outer optimiser schedule: an optimiser moves the hyper-parameters ``theta [P]`` over a
method's solve at ``theta``, the same way for every method.

A method hands ``OuterSchedule.run`` its solve at ``theta`` (``fun``: the objective and its
gradient ``[P]``, leaving the method's state at ``theta``) and an optimiser; it keeps only what
is unique to it (its solve, its gradient, its report payload). The schedule does the rest:

* **one memo**: the ``theta`` of the last solve that succeeded. A solve that fails leaves no
  memo (its hyper-parameters are in the method's state, not the memo's), so the re-solves below
  see it as elsewhere.
* **reports on accepted iterates only**: ``report(iteration, theta, value)`` once per iterate
  the optimiser accepts (never at a trial point of a line search), after a re-solve at it when
  ``refresh`` and the memo is elsewhere (the report then reads the method's state at the
  iterate); a True return (a stop request) ends the run there.
* **one trial-failure rule**: an optimiser built to stop at its last accepted iterate when a
  trial point fails numerically (``LBFGSB(stop_on_trial_failure=True)``) returns with
  ``trial_failure``; the schedule warns naming the iteration it stopped at and marks the last
  entry of ``history`` with ``stopped_on_failure = 1``. A failure at the starting point, or
  with the rule off, propagates as the ``NumericalError`` it is.
* **after the run**: a ``RuntimeWarning`` on an abnormal end (``warn``), a
  ``ConvergenceWarning`` naming the log parameters that ended on the default box's upper bound
  (``upper_names``), and a solve at the returned ``theta`` (``finish``: ``"moved"`` when the
  memo is elsewhere, ``"always"``, or ``"never"`` for a method that reads the result itself).

``refresh=False`` and ``finish="never"`` keep no memo (a method whose report and result are
built from ``theta`` alone): its evaluations are the optimiser's and no more.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpinfer.interfaces import Array, OptimizationResult, Optimizer, ValueAndGrad
from gpinfer.numerics.settings import LOG_PARAMETER_BOUNDS

#: ``report(iteration, theta [P], value)`` at an accepted iterate; True asks to stop
OuterReport = Callable[[int, Array, float], Any]

#: when the schedule solves at the returned ``theta`` (see the module doc)
FINISHES = ("moved", "always", "never")

#: the ``warnings.warn`` stack level that points at the method's caller (the estimator)
_STACKLEVEL = 5


class _Memo:
    """The ``theta [P]`` of the last solve that succeeded (host float64 copy), or ``None``."""

    def __init__(self, fun: ValueAndGrad, solve: Callable[[Array], Any], keep: bool):
        self.fun, self.solve, self.keep = fun, solve, keep
        self.theta: Array | None = None

    def evaluate(self, theta: Array) -> tuple[float, Array]:
        """The optimiser's evaluation: ``fun(theta)``, remembered once it succeeded."""
        self.theta = None
        out = self.fun(theta)
        self._remember(theta)
        return out

    def resolve(self, theta: Array) -> None:
        """Solve at ``theta`` (the method's state there), remembered once it succeeded."""
        self.theta = None
        self.solve(theta)
        self._remember(theta)

    def _remember(self, theta: Array) -> None:
        if self.keep:
            self.theta = np.array(theta, dtype=float)

    def at(self, theta: Array) -> bool:
        """Whether the last successful solve was at ``theta``."""
        return self.theta is not None and np.array_equal(theta, self.theta)


@dataclass
class OuterSchedule:
    """How one method's outer loop runs (see the module doc).

    * ``owner``: the method's name, in warnings;
    * ``report``: called at every accepted iterate (``None``: no reports);
    * ``refresh``: re-solve an accepted iterate the memo is not at before reporting it;
    * ``finish``: ``"moved"``, ``"always"`` or ``"never"`` (``FINISHES``);
    * ``warn``: warn on an abnormal end and on a trial failure (False: the method records
      ``OptimizationResult.success`` and ``message`` itself);
    * ``label``: the optimiser's name in warnings;
    * ``history``: the run's history (its last entry is marked on a trial failure);
    * ``upper_names [P]``: the names of ``theta``'s log parameters, when the optimiser runs
      in the default box (upper bound ``LOG_PARAMETER_BOUNDS[1]``): those that end on it are
      named in a warning.
    """

    owner: str
    report: OuterReport | None = None
    refresh: bool = True
    finish: str = "moved"
    warn: bool = True
    label: str = "L-BFGS-B"
    history: list[dict[str, float]] | None = None
    upper_names: list[str] | None = None

    def run(self, optimizer: Optimizer, fun: ValueAndGrad, theta0: Array, max_iter: int,
            solve: Callable[[Array], Any] | None = None) -> OptimizationResult:
        """Maximise ``fun`` from ``theta0 [P]`` with ``optimizer`` for at most ``max_iter``
        iterations; ``solve(theta)`` re-solves without the gradient (``None``: ``fun``).
        Returns the optimiser's result; the method's state is at ``result.x`` unless
        ``finish="never"``."""
        if self.finish not in FINISHES:
            raise ValueError(f"finish must be one of {FINISHES}, got {self.finish!r}")
        memo = _Memo(fun, fun if solve is None else solve,
                     keep=self.refresh or self.finish == "moved")
        callback = None if self.report is None else self._on_iteration(memo)
        result = optimizer.maximize(memo.evaluate, theta0, max_iter, callback)
        self._warn_end(result)
        if self.finish == "always" or (self.finish == "moved" and not memo.at(result.x)):
            memo.resolve(result.x)
        return result

    def _on_iteration(self, memo: _Memo) -> Callable[[int, Array, float], bool]:
        report = self.report
        assert report is not None

        def on_iteration(iteration: int, theta: Array, value: float) -> bool:
            if self.refresh and not memo.at(theta):
                memo.resolve(theta)  # the accepted iterate was not the last solve
            return bool(report(iteration, theta, value))

        return on_iteration

    def _warn_end(self, result: OptimizationResult) -> None:
        """The warnings and history mark of an abnormal end, a trial failure, the box."""
        if result.trial_failure and self.history:
            self.history[-1]["stopped_on_failure"] = 1.0
        if self.warn and result.trial_failure:
            warnings.warn(f"{self.owner}: numerical failure at a trial point of {self.label}; "
                          f"training stopped at iteration {result.n_iter}, the last accepted "
                          f"one ({result.message})", RuntimeWarning, stacklevel=_STACKLEVEL)
        elif self.warn and not result.success:
            warnings.warn(f"{self.owner}: {self.label} ended abnormally: {result.message}",
                          RuntimeWarning, stacklevel=_STACKLEVEL)
        if self.upper_names is not None:
            warn_at_upper_bound(self.owner, self.upper_names, np.asarray(result.x, dtype=float))


def warn_at_upper_bound(owner: str, names: list[str], theta: Array) -> None:
    """A ``ConvergenceWarning`` naming the log parameters of ``theta [P]`` (``names [P]``) that
    ended on (within 1e-4 of; L-BFGS-B stops a hair inside) the upper end of
    ``LOG_PARAMETER_BOUNDS``: the evidence still rose there."""
    from sklearn.exceptions import ConvergenceWarning

    hi = LOG_PARAMETER_BOUNDS[1]
    at_high = [n for n, v in zip(names, theta) if v >= hi - 1e-4]
    if not at_high:
        return
    separable = any("variance" in n for n in at_high)
    cause = (" The evidence still rises with the signal variance: the classes look separable, "
             "so the model is as confident as the bound allows." if separable else "")
    warnings.warn(f"{owner}: {', '.join(at_high)} ended on the upper bound e^{hi:g} of the log "
                  f"parameters.{cause} Pass optimizer_options={{'bounds': ...}} to change it.",
                  ConvergenceWarning, stacklevel=_STACKLEVEL + 1)
