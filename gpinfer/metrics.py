"""Evaluation measures: error rate, negative log predictive, information score, calibration.

Labels are class indices ``y [N]`` in ``0..C-1`` (what ``GPClassifier.classes_`` indexes), and
``P [N, C]`` holds predictive class probabilities (rows sum to one). For binary problems ``P``
may also be given as ``[N]``, the probability of class 1. Where a method gives log predictive
probabilities directly (``Posterior.log_predictive``, accurate in the tails), pass them as
``log_predictive [N]`` instead of ``P``. Definitions follow spec binary §4.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpinfer.errors import InputError

Array = np.ndarray

__all__ = [
    "ReliabilityCurve",
    "error_rate",
    "expected_calibration_error",
    "information_score_bits",
    "nll",
    "reliability_curve",
]

#: floor on probabilities before taking logarithms (as in ``Likelihood.log_predictive``)
PROBABILITY_FLOOR = 1e-300


def _as_proba(P: Array) -> Array:
    """``P`` as a float array ``[N, C]``; a vector ``[N]`` is ``p(class 1)`` of a binary problem."""
    P = np.asarray(P, dtype=np.float64)
    if P.ndim == 1:
        P = np.stack([1.0 - P, P], axis=1)
    if P.ndim != 2 or P.shape[1] < 2:
        raise InputError(f"P must be [N, C] class probabilities with C >= 2; got shape {P.shape}")
    return P


def _as_index(y: Array, n: int, n_classes: int | None) -> Array:
    """``y`` as int64 class indices ``[N]``, checked against ``n`` rows and ``n_classes``."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise InputError(f"y must be [N] class indices with N={n}; got shape {y.shape}")
    if y.size and (y.dtype.kind not in "iub" and not np.all(y == np.round(y))):
        raise InputError("y must hold integer class indices 0..C-1 (encode labels first)")
    yi = y.astype(np.int64)
    if yi.size and (yi.min() < 0 or (n_classes is not None and yi.max() >= n_classes)):
        raise InputError(
            f"y holds class indices outside 0..{(n_classes or 0) - 1}: "
            f"min {yi.min()}, max {yi.max()}"
        )
    return yi


def _log_true_class(y: Array | None, P: Array | None, log_predictive: Array | None) -> Array:
    """``log p(y_n | x_n)`` ``[N]`` from either ``P [N, C]`` or ``log_predictive [N]``."""
    if (P is None) == (log_predictive is None):
        raise InputError("pass exactly one of P (probabilities) and log_predictive")
    if log_predictive is not None:
        lp = np.asarray(log_predictive, dtype=np.float64)
        if lp.ndim != 1:
            raise InputError(f"log_predictive must be [N]; got shape {lp.shape}")
        if y is not None and np.shape(y)[0] != lp.shape[0]:
            raise InputError(f"y has {np.shape(y)[0]} entries but log_predictive has {lp.shape[0]}")
        return lp
    if y is None:
        raise InputError("y is needed with P")
    assert P is not None  # exactly one of the two is given (checked above)
    P = _as_proba(P)
    yi = _as_index(y, P.shape[0], P.shape[1])
    p_true = P[np.arange(P.shape[0]), yi]
    return np.log(np.maximum(p_true, PROBABILITY_FLOOR))


def error_rate(y: Array, P: Array) -> float:
    """Fraction of points whose true class does not have the strictly largest probability.

    ``y [N]`` class indices, ``P [N, C]`` (or ``[N]`` binary). A tie for the largest probability
    counts as an error (spec binary §4: ``p_i = 1/2`` is an error).
    """
    P = _as_proba(P)
    yi = _as_index(y, P.shape[0], P.shape[1])
    rows = np.arange(P.shape[0])
    p_true = P[rows, yi]
    others = P.copy()
    others[rows, yi] = -np.inf
    return float(np.mean(p_true <= others.max(axis=1))) if len(yi) else float("nan")


def nll(y: Array | None, P: Array | None = None, *, log_predictive: Array | None = None) -> float:
    """Mean negative log predictive probability, in nats: ``-(1/N) sum_n log p(y_n | x_n)``.

    Give either ``P [N, C]`` with ``y [N]``, or ``log_predictive [N]`` (``log p(y_n | x_n)``;
    ``y`` may then be ``None``). Probabilities are floored at ``1e-300`` before the logarithm.
    """
    return float(-np.mean(_log_true_class(y, P, log_predictive)))


def information_score_bits(
    y: Array,
    P: Array | None,
    prior: Array,
    *,
    log_predictive: Array | None = None,
) -> float:
    """Information score ``I`` in bits (spec binary §4), generalised to ``C`` classes.

    ``I = B - (1/N) sum_n (-log2 p(y_n | x_n))`` with the baseline entropy
    ``B = -sum_c (n_c^test / N) log2 prior_c``, that is
    ``I = mean_n [log2 p(y_n | x_n) - log2 prior_{y_n}]``.

    * ``y [N]``: test class indices; ``P [N, C]`` predictive probabilities (or ``None`` with
      ``log_predictive [N]``, natural-log ``log p(y_n | x_n)``).
    * ``prior [C]``: training class frequencies (proportions or counts; normalised here).

    ``I = 1`` for perfect confident predictions on balanced binary classes, ``0`` for
    ``p = 1/2`` there, negative for predictions worse than the baseline.
    """
    prior = np.asarray(prior, dtype=np.float64)
    if prior.ndim != 1 or prior.size < 2 or np.any(prior < 0) or prior.sum() <= 0:
        raise InputError(f"prior must be [C] non-negative class frequencies; got {prior!r}")
    prior = prior / prior.sum()
    log_p = _log_true_class(y, P, log_predictive)
    yi = _as_index(y, log_p.shape[0], prior.size)
    log_prior = np.log(np.maximum(prior[yi], PROBABILITY_FLOOR))
    return float(np.mean(log_p - log_prior) / np.log(2.0))


class ReliabilityCurve(NamedTuple):
    """Per-bin calibration summary, every field ``[B]`` except ``edges [B + 1]``.

    ``confidence``: mean predicted probability in the bin; ``accuracy``: observed frequency of
    the event (NaN for empty bins in both); ``count``: points in the bin; ``edges``: bin edges
    on ``[0, 1]``; bin ``b`` holds ``edges[b] < p <= edges[b+1]`` (the first also holds 0).
    """

    confidence: Array
    accuracy: Array
    count: Array  # type: ignore[assignment]  # the field shadows tuple.count (public API)
    edges: Array


def reliability_curve(
    y: Array, P: Array, n_bins: int = 10, *, class_index: int | None = None
) -> ReliabilityCurve:
    """Bin predictions by probability and compare with observed frequencies.

    ``y [N]`` class indices, ``P [N, C]`` (or ``[N]`` binary). With ``class_index=None`` this is
    the top-label curve: the probability of the predicted class (argmax) against whether the
    prediction is right. With ``class_index=c`` it is ``P[:, c]`` against ``y == c``. Bins are
    ``n_bins`` equal-width intervals of ``[0, 1]``.
    """
    if int(n_bins) != n_bins or n_bins < 1:
        raise InputError(f"n_bins must be a positive int; got {n_bins!r}")
    n_bins = int(n_bins)
    P = _as_proba(P)
    yi = _as_index(y, P.shape[0], P.shape[1])
    if class_index is None:
        pred = np.argmax(P, axis=1)
        prob = P[np.arange(P.shape[0]), pred]
        hit = (pred == yi).astype(np.float64)
    else:
        if not 0 <= class_index < P.shape[1]:
            raise InputError(f"class_index must be in 0..{P.shape[1] - 1}; got {class_index}")
        prob = P[:, class_index]
        hit = (yi == class_index).astype(np.float64)
    prob = np.clip(prob, 0.0, 1.0)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # right-closed bins (lo, hi]; 0 goes to the first bin
    which = np.clip(np.ceil(prob * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(which, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(which, weights=prob, minlength=n_bins) / count
        accuracy = np.bincount(which, weights=hit, minlength=n_bins) / count
    return ReliabilityCurve(confidence, accuracy, count, edges)


def expected_calibration_error(
    y: Array, P: Array, n_bins: int = 10, *, class_index: int | None = None
) -> float:
    """Expected calibration error ``sum_b (n_b / N) |accuracy_b - confidence_b|``.

    Bins and ``class_index`` as in ``reliability_curve`` (top-label ECE by default);
    ``y [N]`` class indices, ``P [N, C]`` (or ``[N]`` binary). Empty bins contribute nothing.
    """
    curve = reliability_curve(y, P, n_bins, class_index=class_index)
    n = curve.count.sum()
    if n == 0:
        return float("nan")
    used = curve.count > 0
    gap = np.abs(curve.accuracy[used] - curve.confidence[used])
    return float(np.sum(curve.count[used] * gap) / n)
