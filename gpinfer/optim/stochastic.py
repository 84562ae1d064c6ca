"""Common loop of the stochastic (one-step-at-a-time) ascent optimisers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpinfer.interfaces import Array, OptimizationResult, StochasticOptimizer, ValueAndGrad
from gpinfer.optim.lbfgs import STOPPED_BY_CALLBACK, check_finite


class StochasticAscent(StochasticOptimizer):
    """``StochasticOptimizer`` with a checked loop: non-finite values/gradients raise.

    Subclasses implement ``reset`` and ``step``; ``lookahead(x)`` (the interface's identity by
    default) gives the point at which the next gradient is taken (momentum methods override it).
    """

    def maximize(
        self,
        fun: ValueAndGrad,
        x0: Array,
        max_iter: int,
        callback: Callable[[int, Array, float], bool | None] | None = None,
    ) -> OptimizationResult:
        """``max_iter`` ascent steps; ``callback(iteration, x, value)`` may return True to stop.

        ``value`` is the objective at the point where the step's gradient was taken.
        """
        x = np.array(x0, dtype=float).reshape(-1)
        self.reset(x)
        value = float("nan")
        message = "maximum number of iterations reached"
        it = 0
        for it in range(1, int(max_iter) + 1):
            x_eval = self.lookahead(x)
            value, grad = fun(x_eval.copy())
            value = float(value)
            grad = np.asarray(grad, dtype=float).reshape(-1)
            check_finite(value, grad, it)
            x = self.step(x_eval, grad)
            if callback is not None and callback(it, x.copy(), value):
                message = STOPPED_BY_CALLBACK
                break
        return OptimizationResult(x=x, value=value, n_iter=it, success=True, message=message)
