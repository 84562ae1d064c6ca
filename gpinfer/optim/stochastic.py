"""Common loop of the stochastic (one-step-at-a-time) ascent optimisers.

The optimisers step on arrays of any array-API namespace (numpy, or torch on a CPU or GPU:
``gpinfer.backend``): their state lives where ``x0`` lives.
"""

from __future__ import annotations

from gpinfer.backend import ops
from gpinfer.interfaces import (
    Array,
    IterationCallback,
    OptimizationResult,
    StochasticOptimizer,
    ValueAndGrad,
)
from gpinfer.optim.lbfgs import STOPPED_BY_CALLBACK, check_finite


class StochasticAscent(StochasticOptimizer):
    """``StochasticOptimizer`` with a checked loop: non-finite values/gradients raise.

    Subclasses implement ``reset`` and ``step``; ``lookahead(x)`` (the interface's identity by
    default) gives the point at which the next gradient is taken (momentum methods override it).
    """

    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None) -> OptimizationResult:
        """``max_iter`` ascent steps; ``callback(iteration, x, value)`` may return True to stop.

        ``value`` is the objective at the point where the step's gradient was taken.
        """
        x = ops.flat(x0)
        self.reset(x)
        value = float("nan")
        message = "maximum number of iterations reached"
        it = 0
        for it in range(1, int(max_iter) + 1):
            x_eval = self.lookahead(x)
            value, grad = fun(ops.copy(x_eval))
            value = float(value)
            grad = ops.flat(grad)
            check_finite(value, grad, it)
            x = self.step(x_eval, grad)
            if callback is not None and callback(it, ops.copy(x), value):
                message = STOPPED_BY_CALLBACK
                break
        return OptimizationResult(x=x, value=value, n_iter=it, success=True, message=message)
