"""AdaDelta in climin's form (spec jj-taylor-svi §3.5), written as an ascent step."""

from __future__ import annotations

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.interfaces import Array
from gpinfer.optim.stochastic import StochasticAscent


class AdaDelta(StochasticAscent):
    """AdaDelta with step rate and momentum (climin form, spec jj-taylor-svi §3.5).

    With ``g [P]`` the gradient of the objective being maximised, from ``G = S = Delta = 0``:

    1. the gradient is taken at the look-ahead point ``x + momentum * Delta``;
    2. ``G = rho G + (1 - rho) g^2``;
    3. ``d = learning_rate * sqrt(S + eps) / sqrt(G + eps) * g`` and ``x += d``;
    4. ``Delta = momentum * Delta + d``, ``S = rho S + (1 - rho) Delta^2``.

    Unlike Zeiler's original, the step rate multiplies the step before it enters ``S``.
    Defaults ``rho=0.9``, ``eps=1e-4``, ``momentum=0`` (climin's). No bounds are applied.
    """

    def __init__(
        self,
        rho: float = 0.9,
        eps: float = 1e-4,
        learning_rate: float = 1.0,
        momentum: float = 0.0,
    ):
        try:  # a string (a config's typo) is as bad as a value out of range
            bad = bool(not 0 <= rho < 1 or eps <= 0 or learning_rate <= 0 or not 0 <= momentum < 1)
        except TypeError:
            bad = True
        if bad:  # an InputError (a ValueError): one line from gpinfer-run, not a traceback
            raise InputError(
                "AdaDelta needs 0 <= rho < 1, eps > 0, learning_rate > 0 and 0 <= momentum < 1; "
                f"got {rho}, {eps}, {learning_rate}, {momentum}"
            )
        self.rho = rho
        self.eps = eps
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.reset(np.zeros(0))

    def reset(self, x0: Array) -> None:
        # the state lives where x0 lives (numpy, or a torch device: gpinfer.backend)
        self.G = ops.zeros_vector(x0)
        self.S = ops.zeros_vector(x0)
        self.delta = ops.zeros_vector(x0)

    def lookahead(self, x: Array) -> Array:
        if self.momentum == 0.0 or tuple(self.delta.shape) != tuple(np.shape(x)):
            return x
        return x + self.momentum * self.delta

    def step(self, x: Array, grad: Array) -> Array:
        """One step from the look-ahead point ``x`` (where ``grad`` was taken)."""
        if not ops.holds_like(self.G, grad):
            self.reset(grad)
        xp = ops.namespace(grad)
        self.G = self.rho * self.G + (1.0 - self.rho) * grad * grad
        d = self.learning_rate * xp.sqrt(self.S + self.eps) / xp.sqrt(self.G + self.eps) * grad
        self.delta = self.momentum * self.delta + d
        self.S = self.rho * self.S + (1.0 - self.rho) * self.delta * self.delta
        return x + d
