"""White noise / jitter: ``variance * I`` on the diagonal of a square ``K(X)`` only."""

from __future__ import annotations

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.checks import (
    input_pair,
    matrix_gradient,
    natural_values,
    unconstrained_vector,
)

#: default variance of a White term: a small jitter rather than a noise model
WHITE_DEFAULT_VARIANCE = 1e-6


class White(Kernel):
    """``K(X) = variance * I``; ``K(X, X2) = 0`` for any given ``X2``; ``K_diag = variance``.

    The term belongs to the square matrix of one set of inputs: cross-covariances (e.g. ``Kuf``)
    get nothing, even when ``X2`` holds the same points. Parameter: log ``variance``.
    """

    #: whether the term sits on the diagonal of square matrices ``K(X)`` (``Kuu``); a subclass
    #: that only adds to ``K_diag`` says False (the stacked path, ``gpinfer.kernels.stacked``)
    on_square: bool = True

    def __init__(self, variance: float = WHITE_DEFAULT_VARIANCE):
        v = natural_values(variance, "variance", "White")
        if v.ndim:
            raise InputError(f"White variance must be a scalar, got {v.tolist()}")
        self._log_variance = float(np.log(v))

    @property
    def variance(self) -> float:
        """The diagonal term."""
        return float(np.exp(self._log_variance))

    # -- parameters --------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return ["variance"]

    def get_unconstrained(self) -> Array:
        return np.array([self._log_variance])

    def set_unconstrained(self, theta: Array) -> None:
        self._log_variance = float(unconstrained_vector(theta, 1, "White")[0])

    # -- covariances -------------------------------------------------------------------------
    def K(self, X: Array, X2: Array | None = None) -> Array:
        X, X2 = input_pair(X, X2, None, "White")
        if X2 is None:
            return self.variance * ops.eye(X, X.shape[0])
        return ops.zeros(X, (X.shape[0], X2.shape[0]))

    def K_diag(self, X: Array) -> Array:
        X, _ = input_pair(X, None, None, "White")
        return ops.full(X, (X.shape[0],), self.variance)

    # -- vector-Jacobian products ------------------------------------------------------------
    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        X, X2 = input_pair(X, X2, None, "White")
        if X2 is None:
            dK = matrix_gradient(dK, (X.shape[0], X.shape[0]))
            xp = ops.namespace(dK)
            return xp.reshape(self.variance * xp.sum(ops.diagonal(dK)), (1,))
        matrix_gradient(dK, (X.shape[0], X2.shape[0]))
        return ops.zeros(X, (1,))

    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = input_pair(X, None, None, "White")
        dK_diag = matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        xp = ops.namespace(dK_diag)
        return xp.reshape(self.variance * xp.sum(dK_diag), (1,))

    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        X, X2 = input_pair(X, X2, None, "White")
        matrix_gradient(dK, (X.shape[0], X.shape[0] if X2 is None else X2.shape[0]))
        return ops.namespace(X).zeros_like(X)

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = input_pair(X, None, None, "White")
        matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        return ops.namespace(X).zeros_like(X)
