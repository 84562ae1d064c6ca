"""Adam (Kingma & Ba 2015) as an ascent step; spec jj-taylor-svi §3.6."""

from __future__ import annotations

import math

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.compile import active as compile_active
from gpinfer.backend.compile import compilable
from gpinfer.interfaces import Array
from gpinfer.optim.stochastic import StochasticAscent, as_vector, zeros_like_vector

#: entries per piece of a host update (six float64 arrays of it stay in a core's cache)
_HOST_PIECE = 16384


class Adam(StochasticAscent):
    """Adam ascent: ``x += lr * m_hat / (sqrt(v_hat) + eps)`` with bias-corrected moments.

    ``m_t = beta1 m + (1 - beta1) g``, ``v_t = beta2 v + (1 - beta2) g^2``,
    ``m_hat = m_t / (1 - beta1^t)``, ``v_hat = v_t / (1 - beta2^t)``; ``g [P]`` is the gradient
    of the objective being maximised. The moments live where ``x`` lives (host or a backend
    device: ``gpinfer.backend``).
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
        """Zero moments ``[P]`` where ``x0`` lives (host, or its backend device)."""
        self.t = 0
        self.m = zeros_like_vector(x0)
        self.v = zeros_like_vector(x0)
        # scratch: P can be millions, so no temporaries (and no fresh pages) per step
        self._work = zeros_like_vector(x0)
        self._delta = zeros_like_vector(x0)

    def snapshot(self) -> tuple[int, Array, Array]:
        """``(t, m, v)``: copies of the moments (``restore`` brings them back)."""
        return self.t, ops.copy(self.m), ops.copy(self.v)

    def restore(self, snap: tuple[int, Array, Array]) -> None:
        """The state of ``snap`` (from ``snapshot``), written into the moments in place."""
        t, m, v = snap
        if tuple(self.m.shape) != tuple(m.shape) or type(self.m) is not type(m):
            self.reset(m)
        self.t = t
        self.m[...] = m
        self.v[...] = v

    def step(self, x: Array, grad: Array) -> Array:
        grad = as_vector(grad) if not ops.is_array(grad) else grad
        on_device = ops.is_array(x) and not ops.is_numpy(x)
        x_new = ops.copy(as_vector(x)) if on_device else as_vector(x)  # host: float64 copy
        return self.step_into(x_new, grad)

    def step_into(self, x: Array, grad: Array) -> Array:
        """``step`` written into ``x [P]`` (an array the caller owns; returned), the same
        values to the last bit; ``grad [P]`` is read only. On the host the vector is updated
        in cache-sized pieces (each entry sees the same operations: memory is read once)."""
        if tuple(self.m.shape) != tuple(grad.shape) or type(self.m) is not type(grad):
            self.reset(grad)
        self.t += 1
        arrays = (x, grad, self.m, self.v, self._work, self._delta)
        P = int(grad.shape[0])
        if not ops.is_numpy(grad) or P <= 2 * _HOST_PIECE:
            self._update(*arrays)
            return x
        for lo in range(0, P, _HOST_PIECE):
            piece = slice(lo, min(lo + _HOST_PIECE, P))
            self._update(*(a[piece] for a in arrays))
        return x

    def _update(self, x: Array, grad: Array, m: Array, v: Array, work: Array, delta: Array
                ) -> None:
        """The moments ``m``, ``v`` and ``x`` updated in place (``work``, ``delta``: scratch),
        all ``[n]`` (views of one piece of the vectors)."""
        inv_bias2 = 1.0 / math.sqrt(1.0 - self.beta2**self.t)
        step: float | Array = self.learning_rate / (1.0 - self.beta1**self.t)
        if compile_active() and not ops.is_numpy(x):  # inputs of the compiled graph, not
            scalars = ops.like(x, np.array([inv_bias2, step]))  # constants (one per step)
            inv_bias2, step = scalars[0], scalars[1]
        _adam_update(x, grad, m, v, work, delta, self.beta1, self.beta2, self.eps,
                     inv_bias2, step)


@compilable
def _adam_update(x: Array, grad: Array, m: Array, v: Array, work: Array, delta: Array,
                 beta1: float, beta2: float, eps: float, inv_bias2: float | Array,
                 step: float | Array) -> None:
    """``Adam._update`` with its scalars as arguments: ``inv_bias2 = 1 / sqrt(1 - beta2^t)``,
    ``step = learning_rate / (1 - beta1^t)`` (0-d arrays when compiled: they change every
    step; a compiled region of the step)."""
    m *= beta1
    ops.multiply_into(grad, 1.0 - beta1, work)
    m += work
    v *= beta2
    ops.multiply_into(grad, grad, work)
    work *= 1.0 - beta2
    v += work
    ops.sqrt_into(v, work)
    work *= inv_bias2  # sqrt(v_hat)
    work += eps
    ops.multiply_into(m, step, delta)
    delta /= work
    x += delta
