"""Adam (Kingma & Ba 2015) as an ascent step; spec jj-taylor-svi §3.6."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.compile import active as compile_active
from gpinfer.backend.compile import compilable
from gpinfer.errors import InputError
from gpinfer.interfaces import Array
from gpinfer.optim.stochastic import StochasticAscent

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
        try:  # a string (a config's typo) is as bad as a value out of range
            bad = bool(learning_rate <= 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1 or eps <= 0)
        except TypeError:
            bad = True
        if bad:  # an InputError (a ValueError): one line from gpinfer-run, not a traceback
            raise InputError(
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
        self.m = ops.zeros_vector(x0)
        self.v = ops.zeros_vector(x0)
        # scratch, made by the first step (``_scratch``): P can be millions, so no
        # temporaries (and no fresh pages) per step
        self._work: Array | None = None
        self._delta: Array | None = None

    def _scratch(self, n: int) -> tuple[Array, Array]:
        """The update's two scratch vectors of ``n`` entries where the moments live (made
        once after each ``reset``: one piece of the vector on the host, whose update runs
        piece by piece, the whole vector on a device)."""
        if self._work is None or self._delta is None:
            self._work, self._delta = ops.zeros(self.m, (n,)), ops.zeros(self.m, (n,))
        return self._work, self._delta

    def snapshot(self) -> tuple[int, Array, Array]:
        """``(t, m, v)``: copies of the moments (``restore`` brings them back)."""
        return self.t, ops.copy(self.m), ops.copy(self.v)

    def restore(self, snap: tuple[int, Array, Array]) -> None:
        """The state of ``snap`` (from ``snapshot``), written into the moments in place."""
        t, m, v = snap
        if not ops.holds_like(self.m, m):
            self.reset(m)
        self.t = t
        self.m[...] = m
        self.v[...] = v

    def step(self, x: Array, grad: Array) -> Array:
        return self.step_into(ops.flat(x, copy=True), ops.as_array(grad))

    def step_into(self, x: Array, grad: Array) -> Array:
        """``step`` written into ``x [P]`` (an array the caller owns; returned), the same
        values to the last bit; ``grad [P]`` is read only. On the host the vector is updated
        in cache-sized pieces (each entry sees the same operations: memory is read once)."""
        if not ops.holds_like(self.m, grad):
            self.reset(grad)
        self.t += 1
        inv_bias2 = 1.0 / math.sqrt(1.0 - self.beta2**self.t)
        step: float | Array = self.learning_rate / (1.0 - self.beta1**self.t)
        P = int(grad.shape[0])
        if ops.is_numpy(grad):  # numpy's update in cache-sized pieces, its own rounding
            work, delta = self._scratch(min(P, _HOST_PIECE))
            _host_update(x, grad, self.m, self.v, work, delta, self.beta1, self.beta2,
                         self.eps, inv_bias2, float(step))
            return x
        # the device update's scalars: x += step' m / (sqrt(v) + eps') with
        # step' = step / inv_bias2 and eps' = eps / inv_bias2 (the same quotient)
        shift, scaled_step = self.eps / inv_bias2, float(step) / inv_bias2
        if compile_active():  # inputs of the compiled graph, not constants (one per step)
            scalars = ops.like(x, np.array([shift, scaled_step]))
            shift, scaled_step = scalars[0], scalars[1]
        work, delta = self._scratch(P)
        _adam_update(x, grad, self.m, self.v, work, delta, self.beta1, self.beta2, shift,
                     scaled_step)
        return x


def _host_update(x: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
                 work: np.ndarray, delta: np.ndarray, beta1: float, beta2: float, eps: float,
                 inv_bias2: float, step: float) -> None:
    """``_adam_update`` on numpy vectors ``[P]``, one piece of ``_HOST_PIECE`` entries at a
    time: every operation of the chain runs on a piece while it is in a core's cache (the
    same operations in the same order on every entry: the same bits as whole-vector
    operations; a full-size pass would stream all six vectors through memory 13 times).
    ``work``, ``delta``: scratch of at least ``min(P, _HOST_PIECE)`` entries. The ufuncs are
    called directly: the pieces are many and small, per-call dispatch shows."""
    mul, add, c1, c2 = np.multiply, np.add, 1.0 - beta1, 1.0 - beta2
    P = grad.shape[0]
    for lo in range(0, P, _HOST_PIECE):
        hi = min(lo + _HOST_PIECE, P)
        xs, gs, ms, vs = x[lo:hi], grad[lo:hi], m[lo:hi], v[lo:hi]
        w, d = work[: hi - lo], delta[: hi - lo]
        mul(ms, beta1, out=ms)
        mul(gs, c1, out=w)
        add(ms, w, out=ms)
        mul(vs, beta2, out=vs)
        mul(gs, gs, out=w)
        mul(w, c2, out=w)
        add(vs, w, out=vs)
        np.sqrt(vs, out=w)
        mul(w, inv_bias2, out=w)  # sqrt(v_hat)
        add(w, eps, out=w)
        mul(ms, step, out=d)
        np.divide(d, w, out=d)
        add(xs, d, out=xs)


@compilable
def _adam_update(x: Array, grad: Array, m: Array, v: Array, work: Array, delta: Array,
                 beta1: float, beta2: float, shift: float | Array,
                 step: float | Array) -> None:
    """Adam's update of torch ``x``, ``m``, ``v`` ``[P]`` in place (``work``, ``delta``:
    scratch ``[P]``): ``x += step m / (sqrt(v) + shift)`` with ``shift = eps / inv_bias2``
    and ``step = learning_rate / (1 - beta1^t) / inv_bias2`` (``inv_bias2 =
    1 / sqrt(1 - beta2^t)``: the quotient ``lr m_hat / (sqrt(v_hat) + eps)`` of the host's
    ``_host_update``); 0-d arrays when compiled (they change every step; a compiled region
    of the step).

    Fused operators (7 eager aten ops instead of 13): ``m = beta1 m + (1 - beta1) g``
    (``add_(alpha=)``), ``v = beta2 v + (1 - beta2) g^2`` (``addcmul_``), ``x`` by
    ``addcdiv_`` (``x + (step m) / w``, in that order: with 0-d scalars, which it does not
    take, the same three steps one by one give the same bits). Products inside the fused
    operators are not rounded apart: values differ from the host's by round-off (about
    1e-16 relative per step)."""
    tm, tv, tx = cast(Any, m), cast(Any, v), cast(Any, x)  # torch tensors: fused methods
    tm.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    tv.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    ops.sqrt_into(v, work)
    work += shift
    if isinstance(step, float):
        tx.addcdiv_(m, work, value=step)
        return
    ops.multiply_into(m, step, delta)
    delta /= work
    x += delta
