"""Small, fixed classification problems for tests."""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def ring_classes(n: int = 90, seed: int = 0, n_classes: int = 3, radius: float = 2.5
                 ) -> tuple[Array, Array]:
    """``X [n, 2]``, ``y [n]``: point ``i`` has class ``y_i = i mod n_classes`` and sits at unit
    Gaussian noise around ``radius * (cos 2.1 y_i, sin 2.1 y_i)`` (drawn with
    ``default_rng(seed)``): separable classes with some overlap, in a fixed order (the
    early-stopping and training-loop tests)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes
    X = rng.normal(size=(n, 2)) + radius * np.stack([np.cos(2.1 * y), np.sin(2.1 * y)], axis=1)
    return X, y
