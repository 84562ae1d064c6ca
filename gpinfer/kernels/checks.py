"""Parameter, input and gradient-shape checks shared by the built-in kernels."""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError, NonFiniteError
from gpinfer.kernels.base import Array


def float_values(value: Any) -> np.ndarray:
    """A user's number, array or sequence (list, tuple, OmegaConf ``ListConfig``) or other
    iterable of numbers (a set, a generator: its items in their order) as a float64 array;
    numpy's ``TypeError`` / ``ValueError`` for anything else (ragged or not numbers)."""
    try:
        return np.asarray(value, dtype=float)
    except TypeError:  # an iterable numpy does not read as a sequence
        if not isinstance(value, Iterable) or isinstance(value, str | bytes):
            raise
        return np.asarray(list(value), dtype=float)


def natural_values(value: object, name: str, owner: str) -> Array:
    """A positive, finite natural parameter as a float array: shape ``()`` or ``[D]``.

    Accepts a number, a sequence (lists, tuples, OmegaConf ``ListConfig``) or an array.
    Raises ``InputError`` naming ``owner`` and ``name`` otherwise.
    """
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real | Iterable):
        raise InputError(
            f"{owner} {name} must be a positive number or a list of them, got {value!r}"
        )
    try:
        arr = float_values(value)
    except (TypeError, ValueError):
        raise InputError(
            f"{owner} {name} must be a positive number or a list of them, got {value!r}"
        ) from None
    if arr.ndim > 1 or arr.size == 0:
        raise InputError(
            f"{owner} {name} must be a scalar or a non-empty 1-D list, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0.0):
        raise InputError(f"{owner} {name} must be positive and finite, got {arr.tolist()}")
    return arr


#: True inside ``checked_inputs()``: the caller has checked the inputs' values already
_VALUES_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("gpinfer_values_checked",
                                                                       default=False)


@contextlib.contextmanager
def checked_inputs() -> Iterator[None]:
    """A context in which kernels skip the scan for NaN and infinite input values (shapes are
    still checked). The training loop enters it around each step: the training inputs were
    checked once before training, and inducing inputs stay finite because every step's gradient
    is checked; a kernel call would otherwise scan the same ``[n, D]`` arrays a dozen times per
    step (once per call, per class, per summed part)."""
    token = _VALUES_CHECKED.set(True)
    try:
        yield
    finally:
        _VALUES_CHECKED.reset(token)


def as_inputs(X: object, name: str = "X") -> Array:
    """A finite float input array ``[N, D]`` (host values as float64 numpy; an array of another
    array-API namespace, a torch tensor, as it is); ``InputError`` naming ``name`` otherwise."""
    try:
        arr: Array = ops.as_array(X)  # a backend array as it is
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a numeric array [N, D]") from None
    if arr.ndim != 2:
        raise InputError(f"{name} must be a 2-D array [N, D], got shape {tuple(arr.shape)}")
    if not _VALUES_CHECKED.get() and not ops.all_finite(arr):
        raise NonFiniteError(f"{name} contains NaN or infinite values", quantity=name)
    return arr


def input_pair(
    X: object, X2: object | None, input_dim: int | None, owner: str
) -> tuple[Array, Array | None]:
    """Check ``X [N, D]`` and ``X2 [N2, D]`` (or None) against each other and ``input_dim``."""
    X = as_inputs(X, "X")
    if input_dim is not None and X.shape[1] != input_dim:
        raise InputError(
            f"{owner} has {input_dim} ARD entries but X has {X.shape[1]} columns "
            f"(input dimensions); they must match"
        )
    if X2 is None:
        return X, None
    X2 = as_inputs(X2, "X2")
    if X2.shape[1] != X.shape[1]:
        raise InputError(
            f"X has {X.shape[1]} columns but X2 has {X2.shape[1]}; they must match"
        )
    return X, X2


def matrix_gradient(dK: object, shape: tuple[int, ...], name: str = "dK") -> Array:
    """Check that the incoming gradient ``dK`` has the ``shape`` of the matrix it belongs to."""
    arr = ops.as_array(dK)
    if tuple(arr.shape) != shape:
        raise InputError(
            f"{name} must have shape {shape} (that of the kernel matrix), got {tuple(arr.shape)}"
        )
    return arr


def unconstrained_vector(theta: object, n_params: int, owner: str) -> Array:
    """Check a finite unconstrained parameter vector ``[P]`` of the expected length."""
    arr = np.asarray(theta, dtype=float).reshape(-1)
    if arr.size != n_params:
        raise InputError(f"{owner} has {n_params} parameters, got a vector of {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{owner} unconstrained parameters must be finite, got {arr.tolist()}")
    return arr


def indexed_names(name: str, log_values: Array, ard: bool) -> list[str]:
    """``[name]`` for a shared value, ``[name[0], ..., name[D-1]]`` for ARD values."""
    return [f"{name}[{d}]" for d in range(log_values.size)] if ard else [name]


def natural_output(log_values: Array, ard: bool) -> float | list[float]:
    """Natural value(s) for ``describe()``: a float, or a list of floats for ARD values."""
    values = np.exp(log_values)
    return values.tolist() if ard else float(values[0])


# --------------------------------------------------------------------------------------------
# The stationary base
# --------------------------------------------------------------------------------------------
