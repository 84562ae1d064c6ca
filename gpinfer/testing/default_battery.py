"""The default-fit battery (issue 27): every method at its defaults on ill-scaled inputs.

One small binary problem, shipped in several transforms of its features (``TRANSFORMS``: the
inputs as given, times 1e-6, 1e2 or 1e6, one column times 1e6, an added constant column, every
row duplicated), is fitted by a method at the estimator's defaults (``max_iter`` aside) and
judged on held-out points against the class-frequency baseline: ``run_case`` returns a
``CaseResult`` (accuracy, NLL, baseline NLL, warnings, error, wall and CPU seconds), and
``CaseResult.verdict`` says whether the fit beat the baseline by ``NLL_MARGIN`` nats, or else
failed loudly, with an error or a warning that names the cause.

``tests/test_default_battery.py`` runs it over every registered method in CI;
``benchmarks/default_battery.py`` prints the table, and also runs scikit-learn's own data sets
as shipped (``sklearn_case``).

Shapes: ``X [N, D]``, ``y [N]``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpinfer.errors import GPInferError

Array = np.ndarray

__all__ = ["NLL_MARGIN", "TRANSFORMS", "CaseResult", "battery_data", "class_frequency_nll",
           "run_case", "sklearn_case", "SKLEARN_SETS"]

#: nats per held-out point by which a fit must beat the class-frequency baseline's NLL
NLL_MARGIN = 0.1


def _one_column(X: Array) -> Array:
    out = X.copy()
    out[:, 0] *= 1e6
    return out


def _constant_column(X: Array) -> Array:
    return np.hstack([X, np.full((X.shape[0], 1), 3.0)])


#: name -> feature transform ``X [N, D] -> X' [N, D']``, applied to training and test inputs
#: alike (``"duplicated rows"`` is a transform of the training set only: see ``battery_data``)
TRANSFORMS: dict[str, Callable[[Array], Array]] = {
    "as given": lambda X: X,
    "x1e-6": lambda X: X * 1e-6,
    "x1e2": lambda X: X * 1e2,
    "x1e6": lambda X: X * 1e6,
    "one column x1e6": _one_column,
    "constant column": _constant_column,
    "duplicated rows": lambda X: X,
}


def _blobs(n: int, rng: np.random.Generator) -> tuple[Array, Array]:
    """Two overlapping classes in 3-D, class 1 about a third of the points: ``X [n, 3]``,
    ``y [n]`` (the third feature carries no signal)."""
    y = (rng.random(n) < 0.35).astype(np.int64)
    centres = np.array([[-1.0, -0.5, 0.0], [1.0, 1.0, 0.0]])
    X = centres[y] + rng.standard_normal((n, 3))
    return X, y


def battery_data(transform: str, n_train: int = 100, n_test: int = 300,
                 seed: int = 0) -> tuple[Array, Array, Array, Array]:
    """``(X_train [N, D], y_train [N], X_test [N*, D], y_test [N*])`` under ``transform`` (a key
    of ``TRANSFORMS``); ``"duplicated rows"`` gives every training row twice (``N = 2 n_train``)."""
    rng = np.random.default_rng(seed)
    X, y = _blobs(n_train, rng)
    Xt, yt = _blobs(n_test, rng)
    if transform == "duplicated rows":
        X, y = np.vstack([X, X]), np.concatenate([y, y])
    f = TRANSFORMS[transform]
    return f(X), y, f(Xt), yt


def class_frequency_nll(y_train: Array, y_test: Array, n_classes: int) -> float:
    """Mean NLL of ``y_test [N*]`` under the training class frequencies (the baseline every
    model must beat)."""
    freq = np.bincount(y_train, minlength=n_classes) / len(y_train)
    return float(-np.mean(np.log(np.maximum(freq[y_test], 1e-300))))


@dataclass
class CaseResult:
    """One method on one data set: what the fit gave, on the held-out points."""

    method: str
    data: str
    accuracy: float = float("nan")
    nll: float = float("nan")
    baseline_nll: float = float("nan")
    majority: float = float("nan")
    seconds: float = 0.0
    #: CPU seconds of the fitting process (less inflated than ``seconds`` on a loaded machine)
    cpu_seconds: float = float("nan")
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def beats_baseline(self) -> bool:
        """Held-out NLL at least ``NLL_MARGIN`` nats below the class frequencies'."""
        return bool(np.isfinite(self.nll) and self.nll <= self.baseline_nll - NLL_MARGIN)

    @property
    def verdict(self) -> str:
        """``"beats"``, ``"error"`` (a gpinfer error naming its cause), ``"warned"`` (a
        warning came with a fit that does not beat the baseline) or ``"SILENT FAILURE"``."""
        if self.beats_baseline:
            return "beats"
        if self.error is not None and not self.error.startswith("crash"):
            return "error"
        if self.warnings:
            return "warned"
        return "SILENT FAILURE"

    def row(self) -> str:
        """One line of the battery table."""
        what = self.error or "; ".join(self.warnings) or "-"
        return (f"{self.method:14s} {self.data:18s} acc {self.accuracy:5.3f} "
                f"(maj {self.majority:5.3f}) nll {self.nll:7.3f} (base {self.baseline_nll:5.3f}) "
                f"{self.seconds:6.1f}s ({self.cpu_seconds:6.1f}s cpu)  {self.verdict:14s} "
                f"{what[:150]}")


def _short(w: warnings.WarningMessage) -> str:
    return f"{w.category.__name__}: {str(w.message)[:200]}"


def run_case(method: str, data: str, X: Array, y: Array, Xt: Array, yt: Array,
             **params: Any) -> CaseResult:
    """Fit ``GPClassifier(method=method, random_state=0, **params)`` on ``X [N, D]``,
    ``y [N]`` (integer labels ``0..C-1``) and judge it on ``Xt [N*, D]``, ``yt [N*]``."""
    from gpinfer.estimator import GPClassifier

    n_classes = int(max(y.max(), yt.max())) + 1
    out = CaseResult(method, data, baseline_nll=class_frequency_nll(y, yt, n_classes),
                     majority=float(np.mean(yt == np.argmax(np.bincount(y)))))
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            est = GPClassifier(method=method, random_state=0, **params).fit(X, y)
            P = est.predict_proba(Xt)
        except GPInferError as exc:
            out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported as such
            out.error = f"crash {type(exc).__name__}: {str(exc)[:300]}"
        else:
            cols = np.searchsorted(est.classes_, yt)
            p = np.clip(P[np.arange(len(yt)), cols], 1e-300, None)
            out.nll = float(-np.mean(np.log(p)))
            out.accuracy = float(np.mean(est.classes_[np.argmax(P, axis=1)] == yt))
    out.seconds = time.perf_counter() - start
    out.cpu_seconds = time.process_time() - cpu
    seen: set[str] = set()
    for w in caught:
        if issubclass(w.category, DeprecationWarning | ResourceWarning):
            continue
        text = _short(w)
        if text not in seen:
            seen.add(text)
            out.warnings.append(text)
    return out


#: scikit-learn's data sets as shipped: name -> loader of ``(X, y)`` (digits: a 500-point
#: subset, as in issue 27)
SKLEARN_SETS = ("iris", "wine", "breast_cancer", "digits", "moons")


def sklearn_case(name: str, multiclass: bool, seed: int = 0) -> tuple[Array, Array, Array, Array]:
    """A scikit-learn data set as shipped, unscaled, split 70/30 (stratified, ``seed``):
    ``(X_train, y_train, X_test, y_test)``. ``multiclass=False`` keeps two classes: the first
    ``C // 2`` classes against the rest (digits: 0-4 against 5-9)."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if name == "moons":
        X, y = datasets.make_moons(1000, noise=0.2, random_state=seed)
    else:
        X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    if name == "digits":
        keep = np.random.default_rng(seed).choice(len(y), 500, replace=False)
        X, y = X[keep], y[keep]
    n_classes = int(y.max()) + 1
    if not multiclass and n_classes > 2:
        y = (y >= n_classes // 2).astype(np.int64)
    X_train, X_test, y_train, y_test = train_test_split(
        np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64), test_size=0.3,
        stratify=y, random_state=seed)
    return X_train, y_train, X_test, y_test
