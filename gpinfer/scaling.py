"""Input scales: a warning when they make the kernel's starting length-scale meaningless.

Named kernels start with length-scale 1 (or the median heuristic), and the white noise, jitter
and optimiser bounds of the methods are absolute numbers; inputs whose distances are orders of
magnitude away from 1, or whose features differ in scale by orders of magnitude (an isotropic
length-scale cannot suit them all), give near-chance predictions with no other sign. The
estimators standardise their inputs by default (``standardize="auto"`` with a named kernel:
a ``gpinfer.data.Standardizer`` fitted on the training inputs and kept with the model) and call
``check_feature_scales`` only on inputs they use as given (``standardize=False``, or a
``Kernel`` object under ``"auto"``).

Only the non-constant training columns are judged: a column that is constant in the training
part (data standardised beforehand on another split, an unused pixel) carries no scale.

Shapes: ``X [N, D]``.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np

from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import leaf_kernels, median_distance
from gpinfer.kernels.stationary import Stationary

Array = np.ndarray

__all__ = ["DISTANCE_RANGE", "FEATURE_RATIO", "FeatureScaleWarning", "check_feature_scales",
           "kernel_lengthscale", "scale_problem"]

#: median pairwise distances per ``sqrt(number of non-constant features)`` outside this range
#: are far from a unit starting length-scale (standardised inputs give about ``sqrt(2)``;
#: pixels in [0, 1] about 0.4; the same inputs in units of 1/100 about 100 times more); under
#: a user's ``Kernel`` object, the median distance over its own length-scale
DISTANCE_RANGE = (1e-2, 1e2)
#: largest ratio of the largest feature standard deviation to the (lower) median one that an
#: isotropic length-scale can cope with: beyond it, most features are ignored by the distances
FEATURE_RATIO = 1e3

Kind = Literal["distance", "spread"]


class FeatureScaleWarning(UserWarning):
    """The inputs' scale is far from the kernel's starting length-scale."""


def _diagnose(X: Array, lengthscale: float | None = None) -> tuple[Kind, str, float] | None:
    """``(kind, sentence, median distance)`` of the scale problem of ``X [N, D]``, or None;
    ``lengthscale``: the kernel's own starting length-scale, when the user gave the kernel."""
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] < 2:
        return None
    varying = X[:, np.ptp(X, axis=0) > 0]  # constant columns (max == min) carry no scale
    if varying.shape[1] == 0:
        return None
    std = np.sort(varying.std(axis=0))
    typical = float(std[(std.size - 1) // 2])  # the lower median: the smaller of two
    ratio = float(std[-1] / typical)
    spread = (f"standard deviations of the {std.size} non-constant features "
              f"{std[0]:.3g} .. {std[-1]:.3g}")
    dist = median_distance(varying, np.random.default_rng(0))
    if ratio > FEATURE_RATIO:
        return "spread", (f"the {spread} differ by a factor {ratio:.3g} (largest over the "
                          "median), more than one length-scale can serve"), dist
    lo, hi = DISTANCE_RANGE
    if lengthscale is not None:  # the user's kernel: its own length-scale is the yardstick
        if not lo <= dist / lengthscale <= hi:
            return "distance", (f"the median distance between inputs is {dist:.3g} ({spread}), "
                                f"far from the kernel's length-scale {lengthscale:.3g}"), dist
        return None
    per_feature = dist / np.sqrt(std.size)
    if not lo <= per_feature <= hi:
        return "distance", (f"the median distance between inputs is {dist:.3g} "
                            f"({per_feature:.3g} per sqrt(feature); {spread}), far from the "
                            "kernel's starting length-scale of order 1"), dist
    return None


def scale_problem(X: Array) -> str | None:
    """What is wrong with the scale of ``X [N, D]`` (one sentence), or ``None``.

    Judges the non-constant columns only: the spread of their standard deviations (largest over
    the lower median) against ``FEATURE_RATIO``, then their median pairwise distance (at most
    1000 rows, fixed seed) per ``sqrt(D)`` against ``DISTANCE_RANGE`` (a named kernel starts at
    length-scale 1 whatever ``D``, or at the median heuristic).
    """
    found = _diagnose(X)
    return None if found is None else found[1]


def kernel_lengthscale(kernel: Kernel) -> float | None:
    """The typical starting length-scale of ``kernel``'s stationary parts (the geometric mean
    of all their length-scales, ARD ones included), or None when it has none."""
    scales = [np.ravel(np.asarray(part.lengthscale, dtype=float))
              for part in leaf_kernels(kernel) if isinstance(part, Stationary)]
    if not scales:
        return None
    return float(np.exp(np.mean(np.log(np.concatenate(scales)))))


def check_feature_scales(X: Array, owner: str, kernel: Kernel | None = None) -> None:
    """Warn (``FeatureScaleWarning``) when the scale of ``X [N, D]`` defeats the kernel, with
    the fix for that case. ``kernel``: the ``Kernel`` object the user passed (its length-scales
    are theirs, and the yardstick of the median distance); None for a kernel given by name
    (``scale_problem``)."""
    explicit_kernel = kernel is not None
    found = _diagnose(X, None if kernel is None else kernel_lengthscale(kernel))
    if found is None:
        return
    kind, problem, dist = found
    if kind == "spread":
        advice = ("Pass standardize=True (per-feature scaling, stored with the fitted model and "
                  "applied at prediction), rescale the large columns, or use an ARD kernel "
                  "(make_kernel(name, input_dim=D, ard=True)) with length-scales per feature")
    elif explicit_kernel:
        advice = (f"Give the kernel a length-scale of the order of the median distance "
                  f"({dist:.3g}), or pass standardize=True and set the kernel's length-scales "
                  "in standardised units")
    else:
        advice = ("Pass standardize=True or 'auto' (the default; the scaling is stored with the "
                  "fitted model and applied at prediction) or rescale X")
    warnings.warn(f"{owner}: {problem}; predictions may be near chance. {advice}",
                  FeatureScaleWarning, stacklevel=3)
