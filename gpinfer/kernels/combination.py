"""Sums and products of kernels; their vector-Jacobian products follow by the chain rule.

Parameters are the parts' parameters concatenated in order; names carry the part's index and
class, e.g. ``0_rbf.lengthscale``, ``1_white.variance`` (nested: ``0_product.1_linear.variance``).
Nested sums (and nested products) are flattened, so ``a + b + c`` has three parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.checks import matrix_gradient, unconstrained_vector


class Combination(Kernel):
    """A kernel made of ``parts``; subclasses say how the parts' matrices combine."""

    def __init__(self, kernels: Iterable[Kernel]):
        owner = type(self).__name__
        if isinstance(kernels, Kernel):
            kernels = [kernels]
        parts: list[Kernel] = []
        for k in kernels:
            if not isinstance(k, Kernel):
                raise InputError(f"{owner} takes kernels, got {type(k).__name__}: {k!r}")
            # flatten a + b + c into one sum (and a * b * c into one product)
            parts.extend(k.parts if type(k) is type(self) else [k])
        if not parts:
            raise InputError(f"{owner} needs at least one kernel")
        # the same object twice (k + k) would share parameters across two slots: copy it
        seen: set[int] = set()
        for i, part in enumerate(parts):
            if id(part) in seen:
                parts[i] = part.copy()
            seen.add(id(parts[i]))
        self.parts: list[Kernel] = parts

    # -- parameters --------------------------------------------------------------------------
    def _labels(self) -> list[str]:
        return [f"{i}_{type(p).__name__.lower()}" for i, p in enumerate(self.parts)]

    @property
    def param_names(self) -> list[str]:
        return [
            f"{label}.{name}"
            for label, part in zip(self._labels(), self.parts)
            for name in part.param_names
        ]

    def get_unconstrained(self) -> Array:
        return np.concatenate([p.get_unconstrained() for p in self.parts])

    def set_unconstrained(self, theta: Array) -> None:
        theta = unconstrained_vector(theta, self.n_params, type(self).__name__)
        start = 0
        for part in self.parts:
            part.set_unconstrained(theta[start : start + part.n_params])
            start += part.n_params

    def describe(self) -> dict[str, float | list[float]]:
        return {
            f"{label}.{key}": value
            for label, part in zip(self._labels(), self.parts)
            for key, value in part.describe().items()
        }

    # -- scikit-learn parameters: ``kernels`` as given, the parts' by index ------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """``{"kernels": ...}``: as given when that list holds the parts themselves, else the
        list of ``parts`` (a nested sum flattened, a repeated kernel copied, an iterator);
        ``deep``: also each part's parameters as ``i__param`` (``0__lengthscale``), ``i`` its
        index in ``parts``."""
        given = getattr(self, "_given", {}).get("kernels")
        if not (isinstance(given, list | tuple) and len(given) == len(self.parts)
                and all(g is p for g, p in zip(given, self.parts))):
            given = list(self.parts)
        params: dict[str, Any] = {"kernels": given}
        if deep:
            for i, part in enumerate(self.parts):
                params[str(i)] = part
                params.update({f"{i}__{k}": v for k, v in part.get_params().items()})
        return params

    def set_params(self, **params: Any) -> Kernel:
        """``kernels=[...]`` rebuilds the combination; ``i__param`` (or ``i=kernel``) sets
        part ``i``'s parameter (or replaces the part); ``InputError`` for anything else."""
        parts: dict[int, dict[str, Any]] = {}
        for key in list(params):
            index, _, sub = key.partition("__")
            if not index.isdigit():
                continue
            if int(index) >= len(self.parts):
                raise InputError(f"invalid parameter {key!r} for kernel {type(self).__name__}: "
                                 f"it has parts 0..{len(self.parts) - 1}")
            parts.setdefault(int(index), {})[sub] = params.pop(key)
        super().set_params(**params)
        for i, sub_params in parts.items():
            if "" in sub_params:  # ``i=kernel``: replace the part
                replaced = list(self.parts)
                replaced[i] = sub_params.pop("")
                self._rebuild({"kernels": replaced})
            self.parts[i].set_params(**sub_params)
        return self


class Sum(Combination):
    """``k(x, x') = sum_i k_i(x, x')``."""

    def K(self, X: Array, X2: Array | None = None) -> Array:
        return _add_all(p.K(X, X2) for p in self.parts)

    def K_diag(self, X: Array) -> Array:
        return _add_all(p.K_diag(X) for p in self.parts)

    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        return _concat([p.grad_params(X, X2, dK) for p in self.parts])

    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        return _concat([p.grad_params_diag(X, dK_diag) for p in self.parts])

    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        return _add_all(p.grad_inputs(X, X2, dK) for p in self.parts)

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        return _add_all(p.grad_inputs_diag(X, dK_diag) for p in self.parts)

    def vjp(
        self, X: Array, X2: Array | None, dK: Array, *, inputs: bool = True
    ) -> tuple[Array, Array | None]:
        return combine_vjps([p.vjp(X, X2, dK, inputs=inputs) for p in self.parts])


def _concat(arrays: list[Array]) -> Array:
    """The parts' parameter vectors joined (on their namespace)."""
    return ops.namespace(*arrays).concat(arrays)


def _add_all(arrays: Iterable[Array]) -> Array:
    """``sum(arrays)``: left to right from 0, exactly as Python's ``sum`` (typed as an array)."""
    return cast(Array, sum(arrays))


def combine_vjps(
    results: list[tuple[Array, Array | None]],
) -> tuple[Array, Array | None]:
    """The parts' ``(grad_params, grad_inputs)`` pairs as the combination's: parameters
    concatenated in part order, input gradients summed (``None`` when skipped)."""
    g_params = _concat([r[0] for r in results])
    g_inputs = [r[1] for r in results]
    if g_inputs[0] is None:
        return g_params, None
    return g_params, _add_all(g for g in g_inputs if g is not None)


def products_of_others(mats: list[Array]) -> list[Array]:
    """For each ``i``, the elementwise product of every matrix but ``mats[i]`` (no division).

    Uses prefix and suffix products, so zeros in a factor are handled exactly.
    """
    n = len(mats)
    ones = ops.namespace(mats[0]).ones_like(mats[0])
    prefix = [ones]
    for m in mats[:-1]:
        prefix.append(prefix[-1] * m)
    suffix = [ones]
    for m in reversed(mats[1:]):
        suffix.append(suffix[-1] * m)
    return [prefix[i] * suffix[n - 1 - i] for i in range(n)]


class Product(Combination):
    """``k(x, x') = prod_i k_i(x, x')`` (elementwise); part ``i`` sees ``dK`` times the others."""

    def K(self, X: Array, X2: Array | None = None) -> Array:
        out = self.parts[0].K(X, X2)
        for p in self.parts[1:]:
            out = out * p.K(X, X2)
        return out

    def K_diag(self, X: Array) -> Array:
        out = self.parts[0].K_diag(X)
        for p in self.parts[1:]:
            out = out * p.K_diag(X)
        return out

    def _scaled_gradients(self, X: Array, X2: Array | None, dK: Array) -> list[Array]:
        """``dK * prod_{j != i} K_j`` for each part ``i``, ``[N, N2]`` each."""
        others = products_of_others([p.K(X, X2) for p in self.parts])
        dK = matrix_gradient(dK, tuple(others[0].shape))
        return [dK * o for o in others]

    def _scaled_diag_gradients(self, X: Array, dK_diag: Array) -> list[Array]:
        """``dK_diag * prod_{j != i} K_diag_j`` for each part ``i``, ``[N]`` each."""
        others = products_of_others([p.K_diag(X) for p in self.parts])
        dK_diag = matrix_gradient(dK_diag, tuple(others[0].shape), "dK_diag")
        return [dK_diag * o for o in others]

    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        scaled = self._scaled_gradients(X, X2, dK)
        return _concat([p.grad_params(X, X2, g) for p, g in zip(self.parts, scaled)])

    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        scaled = self._scaled_diag_gradients(X, dK_diag)
        return _concat([p.grad_params_diag(X, g) for p, g in zip(self.parts, scaled)])

    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        scaled = self._scaled_gradients(X, X2, dK)
        return _add_all(p.grad_inputs(X, X2, g) for p, g in zip(self.parts, scaled))

    def vjp(
        self, X: Array, X2: Array | None, dK: Array, *, inputs: bool = True
    ) -> tuple[Array, Array | None]:
        scaled = self._scaled_gradients(X, X2, dK)
        return combine_vjps(
            [p.vjp(X, X2, g, inputs=inputs) for p, g in zip(self.parts, scaled)]
        )

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        scaled = self._scaled_diag_gradients(X, dK_diag)
        return _add_all(p.grad_inputs_diag(X, g) for p, g in zip(self.parts, scaled))
