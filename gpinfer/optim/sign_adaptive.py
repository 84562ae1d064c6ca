"""Sign-adaptive gradient ascent with one step size per parameter (spec ep-sep §2.9).

After each gradient ``g_t``: where ``sign(g_t) == sign(g_{t-1})`` the step grows by
``increase`` (capped at ``max_step``), elsewhere it is multiplied by ``decrease``; then
``x += step * g_t``. No change at the first step. ``halve()`` halves every step size (used after
a failed EP update).
"""

from __future__ import annotations

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError
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
        try:  # a string (a config's typo) is as bad as a value out of range
            bad = bool(learning_rate <= 0 or increase < 1 or not 0 < decrease < 1 or max_step <= 0)
        except TypeError:
            bad = True
        if bad:  # an InputError (a ValueError): one line from gpinfer-run, not a traceback
            raise InputError(
                "SignAdaptiveAscent needs learning_rate > 0, increase >= 1, 0 < decrease < 1 "
                f"and max_step > 0; got {learning_rate}, {increase}, {decrease}, {max_step}"
            )
        self.learning_rate = learning_rate
        self.increase = increase
        self.decrease = decrease
        self.max_step = max_step
        self.reset(np.zeros(0))

    def reset(self, x0: Array) -> None:
        """Every step at ``learning_rate``, ``[P]`` where ``x0`` lives."""
        self.steps = ops.zeros_vector(x0) + float(self.learning_rate)
        self.last_grad: Array | None = None

    def halve(self) -> None:
        """Halve every step size (after a failed update, spec §2.5.4)."""
        self.steps *= 0.5

    def step(self, x: Array, grad: Array) -> Array:
        grad = ops.as_array(grad)
        if not ops.holds_like(self.steps, grad):
            self.reset(grad)
        xp = ops.namespace(grad)
        if self.last_grad is not None:
            same = xp.sign(grad) == xp.sign(self.last_grad)
            self.steps = xp.where(
                same, xp.clip(self.steps * self.increase, max=self.max_step),
                self.steps * self.decrease,
            )
        self.last_grad = ops.copy(grad)
        return ops.as_array(x) + self.steps * grad
