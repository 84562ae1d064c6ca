"""Sign-adaptive gradient ascent with one step size per parameter (spec ep-sep §2.9).

After each gradient ``g_t``: where ``sign(g_t) == sign(g_{t-1})`` the step grows by
``increase`` (capped at ``max_step``), elsewhere it is multiplied by ``decrease``; then
``x += step * g_t``. No change at the first step. ``halve()`` halves every step size (used after
a failed EP update).
"""

from __future__ import annotations

import numpy as np

from gpinfer.interfaces import Array
from gpinfer.optim.stochastic import StochasticAscent


class SignAdaptiveAscent(StochasticAscent):
    """Per-parameter adaptive steps ``eps_j``, initialised to ``learning_rate``."""

    def __init__(
        self,
        learning_rate: float = 1e-2,
        increase: float = 1.02,
        decrease: float = 0.5,
        max_step: float = 1.0,
    ):
        if learning_rate <= 0 or increase < 1 or not 0 < decrease < 1 or max_step <= 0:
            raise ValueError(
                "SignAdaptiveAscent needs learning_rate > 0, increase >= 1, 0 < decrease < 1 "
                f"and max_step > 0; got {learning_rate}, {increase}, {decrease}, {max_step}"
            )
        self.learning_rate = learning_rate
        self.increase = increase
        self.decrease = decrease
        self.max_step = max_step
        self.reset(np.zeros(0))

    def reset(self, x0: Array) -> None:
        n = np.size(x0)
        self.steps = np.full(n, float(self.learning_rate))
        self.last_grad: Array | None = None

    def halve(self) -> None:
        """Halve every step size (after a failed update, spec §2.5.4)."""
        self.steps *= 0.5

    def step(self, x: Array, grad: Array) -> Array:
        grad = np.asarray(grad, dtype=float)
        if self.steps.shape != grad.shape:
            self.reset(grad)
        if self.last_grad is not None:
            same = np.sign(grad) == np.sign(self.last_grad)
            self.steps = np.where(
                same, np.minimum(self.steps * self.increase, self.max_step),
                self.steps * self.decrease,
            )
        self.last_grad = grad.copy()
        return np.asarray(x, dtype=float) + self.steps * grad
