"""Grid search over (a subset of) the hyper-parameters (spec binary §1.6, "Optimizer").

The paper evaluates every method on a fixed grid (16 x 16 in ``(log ell, log sigma_f)``).
``GridSearch(axes)`` evaluates the objective at every node of the Cartesian product of
``axes`` (one 1-D array per coordinate of ``x``, in the optimiser's unconstrained space), cold
or warm as the objective does it, and returns the best node. Every node's value is kept in
``self.values`` (shape ``[len(axes[0]), len(axes[1]), ...]``) for contour plots.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from gpinfer.errors import InputError
from gpinfer.interfaces import (
    Array,
    IterationCallback,
    OptimizationResult,
    Optimizer,
    ValueAndGrad,
)


class GridSearch(Optimizer):
    """Exhaustive search; ``axes``: one sequence of values per coordinate of ``x``.

    ``max_iter`` caps the number of nodes evaluated (row-major order). Non-finite values are
    recorded as NaN and never selected.
    """

    def __init__(self, axes: Sequence[Sequence[float]]):
        if not axes:
            raise InputError("GridSearch needs at least one axis")
        self.axes = [np.asarray(a, dtype=float).reshape(-1) for a in axes]
        if any(a.size == 0 for a in self.axes):
            raise InputError("GridSearch axes must be non-empty")
        self.values: Array = np.full([a.size for a in self.axes], np.nan)

    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None) -> OptimizationResult:
        x0 = np.asarray(x0, dtype=float).reshape(-1)
        if x0.size != len(self.axes):
            raise InputError(f"GridSearch has {len(self.axes)} axes but x has {x0.size} "
                             "coordinates (one axis per free hyper-parameter)")
        self.values[...] = np.nan
        best_x, best_v, it = x0.copy(), -np.inf, 0
        for index in itertools.product(*(range(a.size) for a in self.axes)):
            if it >= max_iter:
                break
            it += 1
            x = np.array([a[i] for a, i in zip(self.axes, index)])
            value = float(fun(x)[0])
            self.values[index] = value if np.isfinite(value) else np.nan
            if np.isfinite(value) and value > best_v:
                best_x, best_v = x, value
            if callback is not None and callback(it, x, value):
                break
        ok = np.isfinite(best_v)
        return OptimizationResult(x=best_x, value=float(best_v), n_iter=it, success=bool(ok),
                                  message="" if ok else "no finite objective on the grid")
