"""Guards every fit against failing silently (numbers that are finite but mean nothing).

Three checks, run by the estimators around any method's ``fit``:

1. **An objective past its mathematical limit.** A method whose objective is a lower bound on
   (or an approximation of) ``log p(y)`` for discrete labels declares
   ``Method.objective_limit = 0.0``: such a value can never be positive. A reported objective
   above the limit is a ``NumericalError``, like a failed Cholesky (``check_objective_limit``).
2. **A final iterate far below the best.** ``BestIterate`` watches the objectives the method
   reports; if training ends far below the best one (``FAR_BELOW_*``; over a moving window for
   mini-batch fits, whose objectives are noisy), the best iterate's posterior (each iteration's
   ``IterationInfo.posterior`` builds the posterior *as it was then*) is restored, with a
   ``ConvergenceWarning``.
3. **A fit no better than knowing nothing.** The training-set NLL of the fitted posterior (on at
   most ``NLL_CHECK_POINTS`` training points) is compared with predicting the class frequencies
   (regression: a Gaussian with the training mean and variance); not better (by
   ``BASELINE_TOLERANCE``) gets a ``ConvergenceWarning``. A model that learned nothing (for
   instance a kernel whose length-scale is far below the inputs' distances, so that every
   prediction is the prior's) ties with the baseline on balanced classes and is flagged too.

Each finding is a code in ``FitResult.warnings`` (``RESTORED_BEST``, ``WORSE_THAN_BASELINE``) and
its numbers are in ``FitResult.diagnostics``; the runner writes both to ``result.json`` and sets
the MLflow tag ``fit_warnings``.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, FitCallback, FitResult, IterationInfo
from gpinfer.posterior import Posterior

#: warning code: the final iterate was far below the best and the best one was restored
RESTORED_BEST = "restored_best_iterate"
#: warning code: the training NLL is no better than the class-frequency (or constant) predictor
WORSE_THAN_BASELINE = "no_better_than_baseline"

#: "far below the best": by more than this many nats ...
FAR_BELOW_ABSOLUTE = 1.0
#: ... and by more than this fraction of ``|best|``
FAR_BELOW_RELATIVE = 0.05
#: objectives averaged per comparison in a mini-batch fit (noisy per-iteration estimates)
MINIBATCH_WINDOW = 5
#: training points used for the training-NLL check (a fixed random subset beyond this)
NLL_CHECK_POINTS = 10_000
#: a fit must beat the baseline's training NLL by this fraction of it (``1 - 1e-3`` of it)
BASELINE_TOLERANCE = 1e-3


def objective_slack(n_points: int) -> float:
    """Round-off allowance of an objective that sums ``n_points`` terms (nats)."""
    return 1e-8 * (1.0 + float(n_points))


def check_objective_limit(value: float, limit: float | None, method: str, n_points: int,
                          iteration: int | None = None) -> None:
    """``NumericalError`` when ``value`` exceeds the objective's mathematical ``limit``."""
    if limit is None or not value > limit + objective_slack(n_points):
        return
    raise NumericalError(
        f"{method}: objective {value:.6g} is above {limit:g}, the largest value a bound on (or "
        "an approximation of) the log-likelihood of discrete labels can take; its evaluation "
        "has broken down numerically (try smaller kernel-parameter bounds or standardised "
        "inputs)",
        iteration=iteration, quantity="objective",
    )


@dataclass
class _Iterate:
    iteration: int
    objective: float
    posterior: Callable[[], Posterior] | None


class BestIterate:
    """A fit callback that checks each reported objective and remembers the best iterate.

    Wraps the user's ``callback`` (called unchanged). ``window`` > 1 compares moving averages
    of that many objectives (mini-batch fits); the best window's last iterate is kept.
    """

    def __init__(self, callback: FitCallback | None, method: str, limit: float | None,
                 n_points: int, window: int = 1):
        self.callback = callback
        self.method = method
        self.limit = limit
        self.n_points = n_points
        self.window = max(int(window), 1)
        self._recent: deque[float] = deque(maxlen=self.window)
        self.best: _Iterate | None = None
        self.best_level = -np.inf
        self.last_level = -np.inf

    def __call__(self, info: IterationInfo) -> bool | None:
        check_objective_limit(info.objective, self.limit, self.method, self.n_points,
                              info.iteration)
        self._recent.append(float(info.objective))
        if len(self._recent) == self.window:
            self.last_level = float(np.mean(self._recent))
            if self.last_level > self.best_level:
                self.best_level = self.last_level
                self.best = _Iterate(info.iteration, float(info.objective), info.posterior)
        if self.callback is not None:
            return self.callback(info)  # a stop request passes through
        return None

    def far_below_best(self) -> bool:
        """Whether the last level is far below the best one (both as defined by ``window``)."""
        if self.best is None or not np.isfinite(self.last_level):
            return False
        gap = self.best_level - self.last_level
        return gap > max(FAR_BELOW_ABSOLUTE, FAR_BELOW_RELATIVE * abs(self.best_level))


def posterior_kernel(posterior: Posterior, default: object) -> object:
    """The fitted kernel of ``posterior`` as ``FitResult.kernel`` holds it (one kernel, or a list
    of one per latent); ``default`` when the posterior does not carry its kernels."""
    kernels = getattr(posterior, "kernels", None)
    if kernels is not None:
        return kernels[0] if len(kernels) == 1 else list(kernels)
    kernel = getattr(posterior, "kernel", None)
    return default if kernel is None else kernel


def restore_best(result: FitResult, tracker: BestIterate) -> FitResult:
    """``result`` with the best iterate's posterior if the fit ended far below it (warns)."""
    best = tracker.best
    if not tracker.far_below_best() or best is None or best.posterior is None:
        return result
    posterior = best.posterior()
    kernel = posterior_kernel(posterior, result.kernel)
    warnings.warn(
        f"{tracker.method}: training ended with objective {tracker.last_level:.6g}, far below "
        f"its best {tracker.best_level:.6g}; the posterior of iteration {best.iteration} was "
        "restored", ConvergenceWarning, stacklevel=3)
    result.posterior, result.kernel = posterior, kernel
    result.log_evidence = best.objective
    result.warnings.append(RESTORED_BEST)
    result.diagnostics.update(restored_iteration=float(best.iteration),
                              final_objective=tracker.last_level)
    return result


def _check_subset(n: int, rng: np.random.Generator) -> Array:
    if n <= NLL_CHECK_POINTS:
        return np.arange(n)
    return np.sort(rng.choice(n, size=NLL_CHECK_POINTS, replace=False))


def classification_baseline_nll(y: Array, n_classes: int, rows: Array) -> float:
    """NLL ``[nats/point]`` on ``y[rows]`` of predicting the class frequencies of all of ``y``."""
    freq = np.bincount(y, minlength=n_classes) / y.size
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.log(freq[y[rows]])))


def regression_baseline_nll(y: Array, rows: Array) -> float:
    """NLL on ``y[rows]`` of a Gaussian with the mean and variance of all of ``y``."""
    var = max(float(np.var(y)), np.finfo(float).tiny)
    r = y[rows] - float(np.mean(y))
    return float(np.mean(0.5 * np.log(2.0 * np.pi * var) + 0.5 * r * r / var))


def check_against_baseline(result: FitResult, method: str, X: Array, y: Array,
                           n_classes: int, rng: np.random.Generator,
                           predict_nll: Callable[[Array, Array], float]) -> FitResult:
    """Flag (and warn about) a fit whose training NLL is no better than the baseline predictor.

    ``predict_nll(X_rows [n, D], y_rows [n])`` is the fitted model's mean NLL on those rows.
    """
    rows = _check_subset(X.shape[0], rng)
    if n_classes:
        baseline = classification_baseline_nll(np.asarray(y, dtype=np.int64), n_classes, rows)
    else:
        baseline = regression_baseline_nll(np.asarray(y, dtype=float), rows)
    train_nll = float(predict_nll(X[rows], y[rows]))
    result.diagnostics.update(train_nll=train_nll, baseline_nll=baseline)
    if train_nll < baseline - BASELINE_TOLERANCE * abs(baseline):
        return result
    what = "the class frequencies" if n_classes else "a constant Gaussian"
    warnings.warn(
        f"{method}: the fitted model's training NLL {train_nll:.4g} is no better than "
        f"predicting {what} ({baseline:.4g}); the fit has failed (look at its objective trace, "
        "the kernel parameters and the scaling of the inputs)",
        ConvergenceWarning, stacklevel=3)
    result.warnings.append(WORSE_THAN_BASELINE)
    return result
