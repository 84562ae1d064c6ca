"""Adam (Kingma & Ba 2015) as an ascent step; spec jj-taylor-svi §3.6."""

from __future__ import annotations

import numpy as np

from gpinfer.interfaces import Array
from gpinfer.optim.stochastic import StochasticAscent


class Adam(StochasticAscent):
    """Adam ascent: ``x += lr * m_hat / (sqrt(v_hat) + eps)`` with bias-corrected moments.

    ``m_t = beta1 m + (1 - beta1) g``, ``v_t = beta2 v + (1 - beta2) g^2``,
    ``m_hat = m_t / (1 - beta1^t)``, ``v_hat = v_t / (1 - beta2^t)``; ``g [P]`` is the gradient
    of the objective being maximised.
    """

    def __init__(
        self,
        learning_rate: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ):
        if learning_rate <= 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1 or eps <= 0:
            raise ValueError(
                "Adam needs learning_rate > 0, 0 <= beta1, beta2 < 1 and eps > 0; got "
                f"{learning_rate}, {beta1}, {beta2}, {eps}"
            )
        self.learning_rate = learning_rate
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.reset(np.zeros(0))

    def reset(self, x0: Array) -> None:
        n = np.size(x0)
        self.t = 0
        self.m = np.zeros(n)
        self.v = np.zeros(n)
        self._work = np.empty(n)  # scratch: P can be millions, so no temporaries per step

    def step(self, x: Array, grad: Array) -> Array:
        if self.m.shape != np.shape(grad):
            self.reset(grad)
        self.t += 1
        grad = np.asarray(grad, dtype=float)
        work = self._work
        self.m *= self.beta1
        np.multiply(grad, 1.0 - self.beta1, out=work)
        self.m += work
        self.v *= self.beta2
        np.square(grad, out=work)
        work *= 1.0 - self.beta2
        self.v += work
        np.sqrt(self.v, out=work)
        work *= 1.0 / np.sqrt(1.0 - self.beta2**self.t)  # sqrt(v_hat)
        work += self.eps
        step = np.multiply(self.m, self.learning_rate / (1.0 - self.beta1**self.t))
        step /= work
        step += x
        return step
