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

Kernels are also scikit-learn parameter containers (``get_params``, ``set_params``, ``clone``):
``get_params`` returns the constructor's arguments exactly as given while the parameters are
unchanged, and the current (learned) natural values once training has moved them, so
``GPClassifier(kernel=RBF(lengthscale=5.0))`` prints ``lengthscale=5.0`` and a fitted
``kernel_`` its learned values; nested names (``kernel__lengthscale`` in a grid search) reach a
kernel's constructor arguments, and a ``Sum`` or ``Product``'s parts by index
(``kernel__0__lengthscale``).
"""

from __future__ import annotations

import abc
import functools
import inspect
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

Array = np.ndarray

#: significant digits of parameter values in a kernel's ``repr``
REPR_DIGITS = 6


def _recording(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` that also keeps its arguments (``_given``) and the unconstrained parameters they
    gave (``_given_theta``), for ``get_params``. Nested calls (a subclass's ``__init__`` calling
    its base's) end with the outermost's record."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Kernel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        given.pop(next(iter(signature.parameters)))  # self
        self._given = given
        self._given_theta = np.array(self.get_unconstrained(), dtype=float)

    wrapper._records_arguments = True  # type: ignore[attr-defined]
    return wrapper


def _short(value: Any) -> str:
    """``repr`` of a parameter value with floats at ``REPR_DIGITS`` significant digits."""
    if callable(getattr(value, "tolist", None)):  # arrays and numpy scalars: Python values
        value = value.tolist()
    if isinstance(value, bool) or not isinstance(value, numbers.Real | list | tuple):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(f"{float(value):.{REPR_DIGITS}g}"))
    items = ", ".join(_short(v) for v in value)
    return f"({items},)" if isinstance(value, tuple) and len(value) == 1 else (
        f"({items})" if isinstance(value, tuple) else f"[{items}]")


def _same(a: Any, b: Any) -> bool:
    """Whether two parameter values are equal: kernels by ``==``, numbers and arrays by value
    (shapes included), lists element by element."""
    if isinstance(a, Kernel) or isinstance(b, Kernel):
        return bool(a == b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and not (
        all(isinstance(v, numbers.Real) for v in (*a, *b))
    ):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float)))
    except (TypeError, ValueError):
        return bool(a == b)


class Kernel(abc.ABC):
    """A positive-definite covariance function with parameters in an unconstrained space."""

    #: constructor arguments as given (set by the recording ``__init__``; see ``get_params``)
    _given: dict[str, Any]
    #: the unconstrained parameters right after construction, ``[P]``
    _given_theta: Array

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_records_arguments", False):
            cls.__init__ = _recording(init)  # type: ignore[method-assign]

    # -- scikit-learn parameter container -------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The constructor's named arguments (``*args`` and ``**kwargs`` excepted)."""
        if cls.__init__ is object.__init__:
            return []
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
        return [p.name for p in parameters
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def _unchanged(self) -> bool:
        """Whether the parameters are still those the constructor's arguments gave."""
        given_theta = getattr(self, "_given_theta", None)
        theta = np.asarray(self.get_unconstrained(), dtype=float)
        return given_theta is not None and np.array_equal(theta, given_theta)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments: as given while the parameters are unchanged, else the
        current natural values (``lengthscale`` a float or ``[D]``, ...). ``deep``: also the
        parameters of kernels among them, as ``name__param``."""
        given = getattr(self, "_given", {})
        unchanged = self._unchanged()
        params: dict[str, Any] = {}
        for name in self._get_param_names():
            if name in given and (unchanged or not hasattr(self, name)):
                params[name] = given[name]
            else:
                params[name] = getattr(self, name)
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Kernel):
                    params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params: Any) -> Kernel:
        """Set constructor arguments (``lengthscale=2.0``; nested: ``name__param``) and
        rebuild the kernel from them; ``InputError`` for a name the kernel does not have, or a
        value its constructor rejects (the kernel is then unchanged). Returns ``self``."""
        from gpinfer.errors import InputError

        if not params:
            return self
        current = self.get_params(deep=False)
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, sep, sub = key.partition("__")
            if name not in current:
                valid = ", ".join(self._get_param_names()) or "none"
                raise InputError(f"invalid parameter {key!r} for kernel {type(self).__name__} "
                                 f"(its parameters: {valid})")
            if sep:
                if not isinstance(current[name], Kernel):
                    raise InputError(f"invalid parameter {key!r} for kernel "
                                     f"{type(self).__name__}: {name} is not a kernel")
                nested.setdefault(name, {})[sub] = value
            else:
                own[name] = value
        for name, sub_params in nested.items():
            current[name].set_params(**sub_params)
        if own:
            self._rebuild({**current, **own})
        return self

    def _rebuild(self, arguments: dict[str, Any]) -> None:
        """Become ``type(self)(**arguments)`` (built first, so a rejected value changes
        nothing)."""
        fresh = type(self)(**arguments)
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    def __eq__(self, other: object) -> bool:
        """The same class and the same ``get_params(deep=False)`` (arrays by value), as
        scikit-learn's kernels; so ``clone(k) == k``. Kernels are not hashable."""
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self.get_params(deep=False), other.get_params(deep=False)
        return mine.keys() == theirs.keys() and all(
            _same(mine[key], theirs[key]) for key in mine)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable

    def __repr__(self) -> str:
        """``Name(param=value, ...)``, floats at ``REPR_DIGITS`` significant digits (so a
        learned ``4.999999999999999`` shows as ``5.0``)."""
        shown = ", ".join(f"{name}={_short(value)}"
                          for name, value in self.get_params(deep=False).items())
        return f"{type(self).__name__}({shown})"

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
