"""The linear kernel ``k(x, x') = sum_d v_d x_d x'_d`` with a shared or ARD variance ``v``."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.checks import (
    indexed_names,
    input_pair,
    matrix_gradient,
    natural_output,
    natural_values,
    unconstrained_vector,
)


class Linear(Kernel):
    """``K(X, X2) = X diag(v) X2^T``; ``v`` is a scalar (shared) or ``[D]`` (ARD).

    Parameters (unconstrained, logs): ``variance`` or ``variance[0..D-1]``. Not stationary:
    ``K_diag`` depends on ``X``, so ``grad_inputs_diag`` is non-zero.
    """

    def __init__(self, variance: float | Iterable[float] = 1.0):
        v = natural_values(variance, "variance", type(self).__name__)
        self._ard = v.ndim == 1
        self._log_variance = np.log(np.atleast_1d(v))

    # -- natural values ----------------------------------------------------------------------
    @property
    def ard(self) -> bool:
        """Whether there is one variance per input dimension."""
        return self._ard

    @property
    def input_dim(self) -> int | None:
        """``D`` for ARD variances, None when shared (any ``D``)."""
        return self._log_variance.size if self._ard else None

    @property
    def variance(self) -> float | Array:
        """The variance: a float, or ``[D]`` for ARD."""
        v = np.exp(self._log_variance)
        return v.copy() if self._ard else float(v[0])

    # -- parameters --------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return indexed_names("variance", self._log_variance, self._ard)

    def get_unconstrained(self) -> Array:
        return self._log_variance.copy()

    def set_unconstrained(self, theta: Array) -> None:
        self._log_variance = unconstrained_vector(theta, self.n_params, "Linear").copy()

    def describe(self) -> dict[str, float | list[float]]:
        return {"variance": natural_output(self._log_variance, self._ard)}

    # -- helpers -----------------------------------------------------------------------------
    def _inputs(self, X: object, X2: object | None = None) -> tuple[Array, Array | None]:
        return input_pair(X, X2, self.input_dim, "Linear")

    def _log_grad(self, per_dim: Array) -> Array:
        """Turn ``sum dK_ab x_ad x2_bd`` per dimension ``[D]`` into the gradient wrt log ``v``."""
        v = np.exp(self._log_variance)
        return v * per_dim if self._ard else v * np.sum(per_dim, keepdims=True)

    # -- covariances -------------------------------------------------------------------------
    def K(self, X: Array, X2: Array | None = None) -> Array:
        X, X2 = self._inputs(X, X2)
        v = np.exp(self._log_variance)
        return (X * v) @ (X if X2 is None else X2).T

    def K_diag(self, X: Array) -> Array:
        X, _ = self._inputs(X)
        return (X * X) @ np.broadcast_to(np.exp(self._log_variance), (X.shape[1],))

    # -- vector-Jacobian products ------------------------------------------------------------
    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        X, X2 = self._inputs(X, X2)
        X2m = X if X2 is None else X2
        dK = matrix_gradient(dK, (X.shape[0], X2m.shape[0]))
        return self._log_grad(np.einsum("nd,nd->d", X, dK @ X2m))

    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = self._inputs(X)
        dK_diag = matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        return self._log_grad(dK_diag @ (X * X))

    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        X, X2 = self._inputs(X, X2)
        X2m = X if X2 is None else X2
        dK = matrix_gradient(dK, (X.shape[0], X2m.shape[0]))
        if X2 is None:  # X is both arguments
            dK = dK + dK.T
        return (dK @ X2m) * np.exp(self._log_variance)

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = self._inputs(X)
        dK_diag = matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        return 2.0 * dK_diag[:, None] * X * np.exp(self._log_variance)
