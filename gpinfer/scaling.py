"""Input scales: a warning when they make the kernel's starting length-scale meaningless.

Kernels start with length-scale 1 (or the median heuristic), and the white noise, jitter and
optimiser bounds of the methods are absolute numbers; inputs whose distances are many orders of
magnitude away from 1, or whose features differ in scale by orders of magnitude (an isotropic
length-scale cannot suit them all), give near-chance predictions with no other sign. The
estimators call ``check_feature_scales`` before training unless ``standardize=True``, which
fits a ``gpinfer.data.Standardizer`` on the training inputs and keeps it with the model.

Shapes: ``X [N, D]``.
"""

from __future__ import annotations

import warnings

import numpy as np

from gpinfer.kernels.initialisation import median_distance

Array = np.ndarray

__all__ = ["DISTANCE_RANGE", "FEATURE_RATIO", "FeatureScaleWarning", "check_feature_scales",
           "scale_problem"]

#: median pairwise distances outside this range are far from a unit starting length-scale
DISTANCE_RANGE = (1e-3, 1e3)
#: largest ratio of feature standard deviations an isotropic length-scale can cope with
FEATURE_RATIO = 1e3


class FeatureScaleWarning(UserWarning):
    """The inputs' scale is far from the kernel's starting length-scale."""


def scale_problem(X: Array) -> str | None:
    """What is wrong with the scale of ``X [N, D]`` (one sentence), or ``None``.

    Looks at the median pairwise distance (at most 1000 rows, fixed seed) against
    ``DISTANCE_RANGE`` and at the spread of the non-constant features' standard deviations
    against ``FEATURE_RATIO``.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] < 2:
        return None
    std = X.std(axis=0)
    std = std[std > 0]
    if std.size == 0:
        return None
    dist = median_distance(X, np.random.default_rng(0))
    lo, hi = DISTANCE_RANGE
    ratio = float(std.max() / std.min())
    spread = f"feature standard deviations {std.min():.3g} .. {std.max():.3g}"
    if not lo <= dist <= hi:
        return (f"the median distance between inputs is {dist:.3g} ({spread}), far from the "
                f"kernel's starting length-scale of order 1")
    if ratio > FEATURE_RATIO:
        return (f"the {spread} differ by a factor {ratio:.3g}, more than one length-scale "
                "can serve")
    return None


def check_feature_scales(X: Array, owner: str) -> None:
    """Warn (``FeatureScaleWarning``) when ``scale_problem(X)`` finds something."""
    problem = scale_problem(X)
    if problem is not None:
        warnings.warn(
            f"{owner}: {problem}; predictions may be near chance. Pass standardize=True (the "
            "scaling is stored with the fitted model and applied at prediction) or rescale X",
            FeatureScaleWarning, stacklevel=3,
        )
