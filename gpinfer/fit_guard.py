"""Guards every fit against failing silently (numbers that are finite but mean nothing).

Four checks, run by the estimators around any method's ``fit``:

1. **An objective past its mathematical limit.** A method whose objective is a lower bound on
   (or an approximation of) ``log p(y)`` for discrete labels declares
   ``Method.objective_limit = 0.0``: such a value can never be positive. A reported objective
   above the limit is a ``NumericalError`` at the iteration that reported it, like a failed
   Cholesky (``check_objective_limit``; optimisers let it through, ``gpinfer.optim.lbfgs``).
2. **A final iterate far below the best.** ``BestIterate`` ranks the iterates the method
   reports; if training ends far below the best one (``FAR_BELOW_*``; over a moving window for
   mini-batch fits, whose objectives are noisy), the best iterate's posterior (each iteration's
   ``IterationInfo.posterior`` builds the posterior *as it was then*) is restored, with a
   ``ConvergenceWarning``. Iterates are ranked by the reported objective when it is a bound or
   an estimate of ``log p(y)`` (``Method.objective_kind``); a surrogate's iterates are ranked by
   their training NLL on a fixed subsample of ``NLL_RANK_POINTS`` points (``TrainingNLL``),
   never by the surrogate. With a held-out validation part, the estimators rank by its NLL
   instead (``gpinfer.training.early_stopping``).
3. **Predictions that are not finite, constant or of one class.** The fitted posterior's latent
   means and variances at the training points must be finite (else a ``NumericalError`` naming
   the quantity: an internal failure, never the user's input). Class probabilities that do not
   vary over the training inputs (``CONSTANT_PREDICTIONS``) or whose most probable class is the
   same everywhere (``SINGLE_CLASS_PREDICTIONS``) are flagged with a ``ConvergenceWarning``.
4. **A fit no better than knowing nothing.** The training-set NLL of the fitted posterior (on at
   most ``NLL_CHECK_POINTS`` training points) is compared with predicting the class frequencies
   (regression: a Gaussian with the training mean and variance). Not better (by
   ``BASELINE_TOLERANCE``) is a ``FitFailedError`` (a ``NumericalError``) with a summary of the
   objective trace; ``baseline_failure="warn"`` (an estimator parameter and Hydra key) makes it
   a ``ConvergenceWarning`` and keeps the model. A model that learned nothing (for instance a
   kernel whose length-scale is far below the inputs' distances, so that every prediction is
   the prior's) ties with the baseline on balanced classes and fails too. A classifier whose
   probabilities are bounded by construction (``Method.baseline_measure = "error"``: lr) is
   judged by its training error against predicting the majority class instead.

Each finding is a code in ``FitResult.warnings`` (``RESTORED_BEST``, ``WORSE_THAN_BASELINE``,
``CONSTANT_PREDICTIONS``, ``SINGLE_CLASS_PREDICTIONS``) and its numbers are in
``FitResult.diagnostics``; the runner writes both to ``result.json``, sets the MLflow tag
``fit_warnings`` and marks a run that failed the baseline FAILED.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import FitFailedError, InputError, NonFiniteError, NumericalError
from gpinfer.interfaces import (
    Array,
    BaselineMeasure,
    FitCallback,
    FitResult,
    IterationInfo,
    Method,
)
from gpinfer.posterior import Posterior, class_columns

#: warning code: the final iterate was far below the best and the best one was restored
RESTORED_BEST = "restored_best_iterate"
#: warning code: the training NLL is no better than the class-frequency (or constant) predictor
WORSE_THAN_BASELINE = "no_better_than_baseline"
#: warning code: the predictions do not vary over the training inputs
CONSTANT_PREDICTIONS = "constant_predictions"
#: warning code: the most probable class is the same at every training input
SINGLE_CLASS_PREDICTIONS = "single_class_predictions"

#: "far below the best": by more than this many nats ...
FAR_BELOW_ABSOLUTE = 1.0
#: ... and by more than this fraction of ``|best|``
FAR_BELOW_RELATIVE = 0.05
#: objectives averaged per comparison in a mini-batch fit (noisy per-iteration estimates)
MINIBATCH_WINDOW = 5
#: training points used for the training-NLL check (a fixed random subset beyond this)
NLL_CHECK_POINTS = 10_000
#: training points on which a surrogate's iterates are ranked (one NLL per iteration)
NLL_RANK_POINTS = 1_000
#: a fit must beat the baseline's training NLL by this fraction of it (``1 - 1e-3`` of it)
BASELINE_TOLERANCE = 1e-3
#: predictions that vary by less than this over the training inputs (probabilities; for
#: regression, in units of the targets' standard deviation) are constant
CONSTANT_SPREAD = 1e-6


def _convergence_warning() -> type[Warning]:
    """scikit-learn's ``ConvergenceWarning`` (the class users filter), imported when a warning
    is raised: the fit path (the runner's) does not import scikit-learn otherwise."""
    from sklearn.exceptions import ConvergenceWarning

    return ConvergenceWarning


#: what a fit no better than the baseline does: ``"raise"`` a ``FitFailedError`` (default) or
#: ``"warn"`` (``ConvergenceWarning``, the model kept)
BaselineFailure = Literal["raise", "warn"]
BASELINE_FAILURE_CHOICES: tuple[BaselineFailure, ...] = ("raise", "warn")


def check_baseline_failure(value: object, key: str = "baseline_failure") -> BaselineFailure:
    """``value`` as one of ``BASELINE_FAILURE_CHOICES``; ``InputError`` naming ``key`` otherwise."""
    for choice in BASELINE_FAILURE_CHOICES:
        if value == choice:
            return choice
    raise InputError(
        f"{key} must be 'raise' (a fit no better than the class frequencies is an error) or "
        f"'warn' (a ConvergenceWarning, and the model is kept); got {value!r}"
    )


@contextmanager
def internal_values(method: str) -> Iterator[None]:
    """Report a non-finite array found inside a fit as the ``NumericalError`` it is.

    Every user array is checked before training, so a ``NonFiniteError`` raised by a kernel's or
    likelihood's input check during ``fit`` (or the guard's predictions) is about a quantity the
    method computed, never the user's fault; the error names that quantity.
    """
    try:
        yield
    except NonFiniteError as err:
        raise NumericalError(
            f"{method}: {err}, a quantity computed during the fit (the inputs were checked "
            "before it): the fit broke down numerically (look at the objective trace and the "
            "kernel parameters; standardised inputs or tighter kernel-parameter bounds help)",
            quantity=err.quantity,
        ) from err


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


def check_subset(n: int, limit: int, rng: np.random.Generator) -> Array:
    """Sorted row indices ``[min(n, limit)]``: all of ``0..n-1``, or ``limit`` random ones."""
    if n <= limit:
        return np.arange(n)
    return np.sort(rng.choice(n, size=limit, replace=False))


def mean_nll(posterior: Posterior, X: Array, y: Array, weights: Array | None = None) -> float:
    """The posterior's mean negative log predictive density on ``X [n, D]``, ``y [n]`` (nats);
    ``weights [n]``: the weighted mean."""
    lp = np.asarray(ops.to_host(posterior.log_predictive(X, y)), dtype=float)
    return -float(np.mean(lp) if weights is None else np.average(lp, weights=weights))


class TrainingNLL:
    """The training NLL of a posterior on a fixed subsample: ``X [N, D]``, ``y [N]``, rows drawn
    once from ``rng`` (``points`` of them at most); ``sample_weight [N]``: a weighted mean (a row
    of weight ``k`` counts as the row ``k`` times)."""

    def __init__(self, X: Array, y: Array, rng: np.random.Generator,
                 points: int = NLL_RANK_POINTS, sample_weight: Array | None = None):
        rows = check_subset(X.shape[0], points, rng)
        self.X, self.y = X[rows], y[rows]
        self.weights = (None if sample_weight is None else
                        np.asarray(ops.to_host(sample_weight), dtype=float).reshape(-1)[rows])

    @property
    def n_points(self) -> int:
        return int(self.y.shape[0])

    def __call__(self, posterior: Posterior) -> float:
        """Mean NLL ``[nats/point]`` of ``posterior`` on the subsample (``inf`` if not finite)."""
        value = mean_nll(posterior, self.X, self.y, self.weights)
        return value if np.isfinite(value) else np.inf


@dataclass
class _Iterate:
    iteration: int
    objective: float
    posterior: Callable[[], Posterior] | None


class BestIterate:
    """A fit callback that checks each reported objective and remembers the best iterate.

    Wraps the user's ``callback`` (called unchanged). Iterates are ranked by their objective,
    or, with ``nll`` (for a surrogate objective), by their training NLL on ``nll``'s subsample
    (the posterior of every iteration is built for it). ``window`` > 1 compares moving averages
    of that many objectives (mini-batch fits); the best window's last iterate is kept.
    """

    def __init__(self, callback: FitCallback | None, method: str, limit: float | None,
                 n_points: int, window: int = 1, nll: TrainingNLL | None = None):
        self.callback = callback
        self.method = method
        self.limit = limit
        self.n_points = n_points
        self.nll = nll
        self.window = 1 if nll is not None else max(int(window), 1)
        self._recent: deque[float] = deque(maxlen=self.window)
        self.best: _Iterate | None = None
        self.best_level = -np.inf
        self.last_level = -np.inf

    def _level(self, info: IterationInfo) -> float | None:
        """What ranks ``info`` (higher is better): its objective, or minus its summed training
        NLL on the subsample; None for an iterate without a posterior when ranking by NLL."""
        if self.nll is None:
            return float(info.objective)
        if info.posterior is None:
            return None
        return -self.nll(info.posterior()) * self.nll.n_points

    def __call__(self, info: IterationInfo) -> bool | None:
        check_objective_limit(info.objective, self.limit, self.method, self.n_points,
                              info.iteration)
        level = self._level(info)
        if level is not None:
            self._recent.append(level)
        if level is not None and len(self._recent) == self.window:
            self.last_level = float(np.mean(self._recent))
            if self.last_level > self.best_level:
                self.best_level = self.last_level
                self.best = _Iterate(info.iteration, float(info.objective), info.posterior)
        if self.callback is not None:
            return self.callback(info)  # a stop request passes through
        return None

    def far_below_best(self) -> bool:
        """Whether the last level is far below the best one (both as defined by ``window``)."""
        if self.best is None or not np.isfinite(self.best_level):
            return False
        gap = self.best_level - self.last_level
        return gap > max(FAR_BELOW_ABSOLUTE, FAR_BELOW_RELATIVE * abs(self.best_level))

    def describe_fall(self) -> tuple[str, dict[str, float]]:
        """How far training fell (for the warning) and its numbers (for the diagnostics)."""
        if self.nll is None:
            return (f"objective {self.last_level:.6g}, far below its best {self.best_level:.6g}",
                    {"final_objective": self.last_level})
        n = self.nll.n_points
        last, best = -self.last_level / n, -self.best_level / n
        return (f"training NLL {last:.4g}, far above its best {best:.4g} (nats/point on a fixed "
                f"subsample of {n} training points; the surrogate objective does not rank "
                "iterates)", {"final_rank_nll": last, "best_rank_nll": best})


def tracker_for(method_cls: type[Method], callback: FitCallback | None, method: str,
                X: Array, y: Array, rng: np.random.Generator, minibatch: bool,
                ranks_iterates: bool = True, sample_weight: Array | None = None
                ) -> BestIterate:
    """The ``BestIterate`` for a fit of ``method_cls`` on ``X [N, D]``, ``y [N]``: ranking by
    training NLL on a fixed subsample (weighted by ``sample_weight [N]``, the fit's) when the
    method's objective is a surrogate, unless ``ranks_iterates`` is False (a validation monitor
    ranks them: no NLL is computed here)."""
    nll = None
    if method_cls.objective_kind == "surrogate" and ranks_iterates:
        nll = TrainingNLL(X, y, rng, sample_weight=sample_weight)
    return BestIterate(callback, method, method_cls.objective_limit, X.shape[0],
                       window=MINIBATCH_WINDOW if minibatch else 1, nll=nll)


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
    fall, numbers = tracker.describe_fall()
    warnings.warn(
        f"{tracker.method}: training ended with {fall}; the posterior of iteration "
        f"{best.iteration} was restored", _convergence_warning(), stacklevel=3)
    result.posterior, result.kernel = posterior, kernel
    result.log_evidence = best.objective
    result.warnings.append(RESTORED_BEST)
    result.diagnostics.update(restored_iteration=float(best.iteration), **numbers)
    return result


def classification_baseline_nll(y: Array, n_classes: int, rows: Array,
                                weights: Array | None = None) -> float:
    """NLL ``[nats/point]`` on ``y[rows]`` of predicting the class frequencies of all of ``y``;
    ``weights [N]``: weighted frequencies and a weighted mean."""
    counts = np.bincount(y, weights=weights, minlength=n_classes)
    freq = counts / counts.sum()
    with np.errstate(divide="ignore"):
        nll = -np.log(freq[y[rows]])
        return float(np.mean(nll) if weights is None else np.average(nll, weights=weights[rows]))


def classification_error(posterior: Posterior, X: Array, y: Array, n_classes: int,
                         weights: Array | None = None) -> float:
    """The posterior's error rate on ``X [n, D]``, ``y [n]`` (class indices): the share of
    rows whose most probable class is not ``y``; ``weights [n]``: a weighted share."""
    P = np.asarray(ops.to_host(class_columns(posterior.predict_proba(X), n_classes)),
                   dtype=float)
    wrong = (np.argmax(P, axis=1) != y).astype(float)
    return float(np.mean(wrong) if weights is None else np.average(wrong, weights=weights))


def majority_error(y: Array, n_classes: int, rows: Array, weights: Array | None = None
                   ) -> float:
    """Error rate on ``y[rows]`` of predicting the most frequent class of all of ``y [N]``
    (class indices); ``weights [N]``: the weighted majority and a weighted share."""
    majority = int(np.argmax(np.bincount(y, weights=weights, minlength=n_classes)))
    wrong = (y[rows] != majority).astype(float)
    return float(np.mean(wrong) if weights is None else np.average(wrong, weights=weights[rows]))


def regression_baseline_nll(y: Array, rows: Array, weights: Array | None = None) -> float:
    """NLL on ``y[rows]`` of a Gaussian with the mean and variance of all of ``y``;
    ``weights [N]``: weighted moments and a weighted mean."""
    mean = float(np.average(y, weights=weights))
    var = max(float(np.average((y - mean) ** 2, weights=weights)), np.finfo(float).tiny)
    r = y[rows] - mean
    nll = 0.5 * np.log(2.0 * np.pi * var) + 0.5 * r * r / var
    return float(np.mean(nll) if weights is None else np.average(nll, weights=weights[rows]))


def trace_summary(history: Sequence[dict[str, float]]) -> str:
    """One line on an objective trace (``FitResult.history``): how many iterations, the first,
    best and last objectives and where they were."""
    values = [(int(h.get("iteration", i + 1)), float(h["objective"]))
              for i, h in enumerate(history) if "objective" in h]
    if not values:
        return "no iterations reported"
    (i0, v0), (i1, v1) = values[0], values[-1]
    ib, vb = max(values, key=lambda p: p[1])
    return (f"{len(values)} iteration(s); objective {v0:.6g} at iteration {i0}, best {vb:.6g} at "
            f"{ib}, last {v1:.6g} at {i1}")


def _kernel_summary(kernel: object) -> str:
    """The fitted kernel's (or kernels', one per latent) parameters on one line."""
    kernels = kernel if isinstance(kernel, list) else [kernel]
    parts = []
    for k in kernels:
        describe = getattr(k, "describe", None)
        if describe is None:
            continue
        parts.append(", ".join(f"{name} {value:.4g}" for name, value in describe().items()
                               if isinstance(value, float)))
    return "; ".join(parts)


def _check_finite_prediction(values: Array, quantity: str, method: str) -> None:
    """``NumericalError`` naming ``quantity`` when ``values [n, ...]`` (at ``n`` training inputs)
    are not finite."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise NumericalError(
            f"{method}: the fitted posterior's {quantity} is not finite at "
            f"{int(np.any(bad.reshape(bad.shape[0], -1), axis=1).sum())} of {bad.shape[0]} "
            "training inputs: the fit broke down numerically (look at the objective trace and "
            "the kernel parameters; standardised inputs or tighter kernel-parameter bounds help)",
            quantity=quantity,
        )


def prediction_flags(posterior: Posterior, X: Array, y: Array, n_classes: int,
                     method: str) -> tuple[list[str], str]:
    """Codes and a description of degenerate predictions at ``X [n, D]``: constant ones
    (``CONSTANT_PREDICTIONS``), and, for classification (``n_classes > 0``), one class
    everywhere (``SINGLE_CLASS_PREDICTIONS``). ``NumericalError`` naming the quantity when
    the latent predictive mean or variance is not finite."""
    mean, var = (np.asarray(ops.to_host(a), dtype=float) for a in posterior.predict_f(X))
    _check_finite_prediction(mean, "latent predictive mean", method)
    _check_finite_prediction(var, "latent predictive variance", method)
    if n_classes:
        P = class_columns(posterior.predict_proba(X), n_classes)
        _check_finite_prediction(P, "class probabilities", method)
        if float(np.max(np.ptp(P, axis=0))) <= CONSTANT_SPREAD:
            return [CONSTANT_PREDICTIONS], (
                f"its class probabilities {np.round(P[0], 4).tolist()} are the same at every "
                "training input")
        top = np.unique(np.argmax(P, axis=1))
        if top.size == 1 and np.unique(y).size > 1:
            return [SINGLE_CLASS_PREDICTIONS], (
                f"it predicts class index {int(top[0])} at every training input")
        return [], ""
    scale = max(float(np.std(y)), np.finfo(float).tiny)
    if float(np.ptp(mean)) <= CONSTANT_SPREAD * scale:
        return [CONSTANT_PREDICTIONS], "its predictive mean is the same at every training input"
    return [], ""


def check_against_baseline(result: FitResult, method: str, X: Array, y: Array,
                           n_classes: int, rng: np.random.Generator,
                           on_failure: BaselineFailure = "raise",
                           sample_weight: Array | None = None,
                           measure: BaselineMeasure = "nll") -> FitResult:
    """Check the fitted ``result.posterior`` at the training data ``X [N, D]``, ``y [N]``
    (class indices, or real targets when ``n_classes`` is 0): finite and non-degenerate
    predictions (``prediction_flags``), and a training NLL better than the baseline predictor.

    A fit no better than the baseline raises ``FitFailedError`` naming the NLLs and the objective
    trace (``on_failure="raise"``) or warns and keeps the model (``"warn"``); degenerate
    predictions of a fit that beats it warn. Codes go to ``result.warnings``.
    ``sample_weight [N]`` (the fit's ``Problem.sample_weight``): both NLLs (and the class
    frequencies or the Gaussian's moments) are weighted, so that a row of weight ``k`` is
    judged as the row repeated ``k`` times. ``measure`` (the method's ``baseline_measure``):
    ``"error"`` judges a classifier by its training error against the majority class's
    (``train_error``, ``baseline_error`` in the diagnostics) instead of by the NLLs, which are
    recorded all the same.
    """
    rows = check_subset(X.shape[0], NLL_CHECK_POINTS, rng)
    w = (None if sample_weight is None
         else np.asarray(ops.to_host(sample_weight), dtype=float).reshape(-1))
    if n_classes:
        baseline = classification_baseline_nll(np.asarray(y, dtype=np.int64), n_classes, rows, w)
    else:
        baseline = regression_baseline_nll(np.asarray(y, dtype=float), rows, w)
    flags, degenerate = prediction_flags(result.posterior, X[rows], y[rows], n_classes, method)
    train_nll = _training_nll(result, method, X[rows], y[rows], None if w is None else w[rows])
    result.diagnostics.update(train_nll=train_nll, baseline_nll=baseline)
    result.warnings.extend(flags)
    judged = _judged(result, method, X, y, n_classes, rows, w, measure, (train_nll, baseline))
    failed = not judged.fitted < judged.reference - BASELINE_TOLERANCE * abs(judged.reference)
    if failed or flags:
        _report(result, method, judged, degenerate, failed, on_failure)
    return result


def _training_nll(result: FitResult, method: str, X: Array, y: Array, w: Array | None) -> float:
    """The fitted model's mean NLL at ``X [n, D]``, ``y [n]`` (weights ``w [n]``);
    ``NumericalError`` where it is not finite (the predictions were checked finite)."""
    train_nll = mean_nll(result.posterior, X, y, w)
    if not np.isfinite(train_nll):
        raise NumericalError(
            f"{method}: the fitted model's training NLL is {train_nll} though its predictions "
            "are finite: a predictive probability underflowed (look at the kernel parameters)",
            quantity="training NLL")
    return train_nll


class _Judged(NamedTuple):
    """The measure ``check_against_baseline`` judges (lower is better): how it is named in the
    message, the fit's value, the baseline's value and what the baseline predicts."""

    judged: str
    fitted: float
    reference: float
    what: str


def _judged(result: FitResult, method: str, X: Array, y: Array, n_classes: int, rows: Array,
            w: Array | None, measure: BaselineMeasure, nlls: tuple[float, float]) -> _Judged:
    """The training NLL against the baseline's (``nlls``: both), or for a classifier judged
    by ``measure="error"`` its training error at ``X[rows]`` against the majority class's
    (recorded in ``result.diagnostics``); ``w [N]`` the weights or ``None``."""
    train_nll, baseline = nlls
    if not (n_classes and measure == "error"):
        what = "the class frequencies" if n_classes else "a constant Gaussian"
        return _Judged(f"training NLL {train_nll:.4g}", train_nll, baseline, what)
    y_int = np.asarray(y, dtype=np.int64)
    fitted = classification_error(result.posterior, X[rows], y_int[rows], n_classes,
                                  None if w is None else w[rows])
    reference = majority_error(y_int, n_classes, rows, w)
    result.diagnostics.update(train_error=fitted, baseline_error=reference)
    judged = (f"training error {fitted:.4g} (judged by error: {method}'s class "
              f"probabilities are bounded by its construction; its training NLL "
              f"{train_nll:.4g}, the class frequencies' {baseline:.4g})")
    return _Judged(judged, fitted, reference, "the majority class")


def _report(result: FitResult, method: str, judged: _Judged, degenerate: str, failed: bool,
            on_failure: BaselineFailure) -> None:
    """``check_against_baseline``'s verdict on a fit that ``failed`` against the baseline or
    made ``degenerate`` predictions: a warning, or ``FitFailedError`` for a failed fit with
    ``on_failure="raise"`` (``WORSE_THAN_BASELINE`` added to ``result.warnings``)."""
    kernel = _kernel_summary(result.kernel)
    story = (f"{method}: the fitted model's {judged.judged} is "
             + ("no better than" if failed else "better than")
             + f" predicting {judged.what} ({judged.reference:.4g})"
             + (f"; {degenerate}" if degenerate else "")
             + f". Trace: {trace_summary(result.history)}"
             + (f"; kernel: {kernel}" if kernel else ""))
    if not failed:  # (stacklevel 4: the caller of check_against_baseline's caller)
        warnings.warn(f"{story}. The model may have learned little (look at the kernel "
                      "parameters and the scaling of the inputs)", _convergence_warning(),
                      stacklevel=4)
        return
    result.warnings.append(WORSE_THAN_BASELINE)
    advice = ("look at the objective trace, the kernel parameters and the scaling of the inputs "
              "(standardize=True)")
    if on_failure == "raise":
        raise FitFailedError(
            f"{story}. The fit has failed: {advice}; baseline_failure='warn' keeps such a model "
            "with a warning", result=result, quantity="training NLL")
    warnings.warn(f"{story}. The fit has failed ({advice}); kept because "
                  "baseline_failure='warn'", _convergence_warning(), stacklevel=4)
