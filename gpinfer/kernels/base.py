"""Kernel base class: covariance matrices and their vector-Jacobian products.

Every kernel turns matrix-level gradients (``dL/dK`` for a square, cross or diagonal block) into
gradients for its own parameters (in the unconstrained space) and for its first input (the
inducing inputs). This is how one hand-derived gradient per objective serves every kernel.

Conventions
-----------
* ``K(X, X2)`` is ``[N, N2]``; ``K(X)`` (``X2=None``) is the square ``[N, N]`` matrix, the only
  case in which additive noise/jitter terms (``White``) contribute.
* ``dK`` has the shape of the matrix; gradients are ``sum_ab dK_ab * d K_ab / d(.)``. For the
  square case both triangles count, and the input gradient accounts for ``X`` appearing in both
  arguments.
* Parameters are positive and stored as logarithms (``get_unconstrained`` / ``set_unconstrained``).
"""

from __future__ import annotations

import abc

import numpy as np

Array = np.ndarray


class Kernel(abc.ABC):
    """A positive-definite covariance function with parameters in an unconstrained space."""

    # -- parameters ------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def param_names(self) -> list[str]:
        """Names of the unconstrained parameters, one per entry of ``get_unconstrained()``."""

    @abc.abstractmethod
    def get_unconstrained(self) -> Array:
        """Parameters in the unconstrained space, ``[P]``."""

    @abc.abstractmethod
    def set_unconstrained(self, theta: Array) -> None:
        """Set parameters from an unconstrained vector ``[P]``."""

    @property
    def n_params(self) -> int:
        """``P``, the length of ``get_unconstrained()`` (without building the names)."""
        return int(np.size(self.get_unconstrained()))

    # -- covariances -----------------------------------------------------------------------
    @abc.abstractmethod
    def K(self, X: Array, X2: Array | None = None) -> Array:
        """Covariance matrix ``[N, N2]`` (square ``[N, N]`` when ``X2`` is None)."""

    @abc.abstractmethod
    def K_diag(self, X: Array) -> Array:
        """Diagonal of ``K(X)``, ``[N]``."""

    # -- vector-Jacobian products ----------------------------------------------------------
    @abc.abstractmethod
    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        """``sum_ab dK_ab dK(X, X2)_ab / dtheta``, ``[P]`` (``X2=None``: the square matrix)."""

    @abc.abstractmethod
    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        """``sum_a dK_diag_a dK_diag(X)_a / dtheta``, ``[P]``."""

    @abc.abstractmethod
    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        """Gradient with respect to the first input ``X``, ``[N, D]``.

        With ``X2=None`` (square matrix) ``X`` appears in both arguments and both count.
        """

    def vjp(
        self, X: Array, X2: Array | None, dK: Array, *, inputs: bool = True
    ) -> tuple[Array, Array | None]:
        """Both products for one matrix: ``(grad_params [P], grad_inputs [N, D] or None)``.

        ``inputs=False`` skips the input gradient. Kernels that can share work between the two
        (the distances of a stationary kernel) override this; the default calls both.
        """
        g_inputs = self.grad_inputs(X, X2, dK) if inputs else None
        return self.grad_params(X, X2, dK), g_inputs

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        """Gradient of ``sum_a dK_diag_a K_diag(X)_a`` wrt ``X``, ``[N, D]`` (0 if stationary)."""
        return np.zeros_like(np.asarray(X, dtype=float))

    # -- composition -----------------------------------------------------------------------
    def __add__(self, other: Kernel) -> Kernel:
        from gpinfer.kernels.combination import Sum

        return Sum([self, other])

    def __mul__(self, other: Kernel) -> Kernel:
        from gpinfer.kernels.combination import Product

        return Product([self, other])

    def copy(self) -> Kernel:
        """An independent deep copy (methods keep one kernel per latent function)."""
        import copy

        return copy.deepcopy(self)

    def describe(self) -> dict[str, float | list[float]]:
        """Parameters in natural (constrained) units, for logging."""
        theta = self.get_unconstrained()
        return {name: float(np.exp(t)) for name, t in zip(self.param_names, theta)}
