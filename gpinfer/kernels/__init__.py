"""Kernels: covariance matrices and the vector-Jacobian products that give their gradients.

Built-in: ``RBF``, ``Matern32``, ``Matern52`` (isotropic or ARD lengthscales), ``Linear``
(shared or ARD variance), ``White`` (diagonal noise/jitter), ``Sum`` and ``Product``.
``make_kernel`` builds one from a config entry (a name plus natural parameter values).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from gpinfer.errors import InputError, PluginLoadError
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.checks import float_values
from gpinfer.kernels.combination import Product, Sum
from gpinfer.kernels.linear import Linear
from gpinfer.kernels.stationary import RBF, Matern32, Matern52, Stationary
from gpinfer.kernels.white import White

__all__ = [
    "Kernel",
    "Linear",
    "Matern32",
    "Matern52",
    "Product",
    "RBF",
    "Stationary",
    "Sum",
    "White",
    "make_kernel",
]

#: built-in kernels by config name, with the parameter that ``ard=True`` expands to ``[D]``
_BUILTIN: dict[str, tuple[type[Kernel], str | None]] = {
    "rbf": (RBF, "lengthscale"),
    "matern32": (Matern32, "lengthscale"),
    "matern52": (Matern52, "lengthscale"),
    "linear": (Linear, "variance"),
    "white": (White, None),
}


def _config_value(value: Any) -> Any:
    """Turn list-like config values (lists, tuples, OmegaConf ``ListConfig``) into float arrays."""
    if isinstance(value, str | bytes | numbers.Number) or not isinstance(value, Iterable):
        return value
    try:
        return float_values(value)
    except (TypeError, ValueError):
        raise InputError(f"kernel parameter value {value!r} is not a list of numbers") from None


def _expand_ard(
    name: str, param: str, params: dict[str, Any], input_dim: int, ard: bool
) -> None:
    """Expand ``params[param]`` to ``input_dim`` entries when ``ard``; check a list's length."""
    value = params.get(param, 1.0)
    if isinstance(value, str | bytes):
        return  # the constructor rejects it with a clear message
    size = np.size(value)
    if np.ndim(value) == 0:
        if ard:
            params[param] = np.full(input_dim, float(value))
    elif size != input_dim:
        raise InputError(
            f"kernel {name!r}: {param} has {size} entries but input_dim is {input_dim}"
        )


def make_kernel(
    name: str,
    input_dim: int,
    *,
    ard: bool = False,
    noise: float | None = None,
    **params: Any,
) -> Kernel:
    """Build a kernel from its config ``name`` and natural parameter values.

    ``name``: ``"rbf"``, ``"matern32"``, ``"matern52"``, ``"linear"``, ``"white"``, or a name
    registered by a plugin in the entry-point group ``gpinfer.kernels``.
    ``input_dim``: ``D``. With ``ard=True`` a scalar lengthscale (a scalar variance for
    ``linear``) becomes ``D`` equal entries; a list must have ``D`` entries either way.
    ``noise``: when given, a ``White(noise)`` term is added (the result is a ``Sum``).
    ``params``: constructor arguments, e.g. ``lengthscale=0.5, variance=2.0``; ``None`` values
    mean "use the default".
    """
    if isinstance(input_dim, bool) or not isinstance(input_dim, numbers.Integral) or input_dim < 1:
        raise InputError(f"input_dim must be a positive integer, got {input_dim!r}")
    input_dim = int(input_dim)
    params = {k: _config_value(v) for k, v in params.items() if v is not None}
    key = str(name).strip().lower()
    if key in _BUILTIN:
        cls, ard_param = _BUILTIN[key]
        known = sorted(inspect.signature(cls.__init__).parameters.keys() - {"self"})
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise InputError(
                f"kernel {key!r} got unknown parameter(s) {unknown}; known: {', '.join(known)}"
            )
        if ard_param is not None:
            _expand_ard(key, ard_param, params, input_dim, ard)
        elif ard:
            raise InputError(f"kernel {key!r} has no ARD parameter; drop ard=True")
        kernel: Kernel = cls(**params)
    else:
        from gpinfer import registry  # lazily: the registry scans entry points

        factory = registry.load("gpinfer.kernels", name)
        if ard:
            raise InputError(
                f"ard=True is understood by the built-in kernels only ({', '.join(_BUILTIN)}); "
                f"give the ARD values of kernel {name!r} directly"
            )
        kernel = factory(**params)
        if not isinstance(kernel, Kernel):
            raise PluginLoadError(
                f"kernel {name!r} from entry-point group 'gpinfer.kernels' built a "
                f"{type(kernel).__name__}, not a gpinfer.kernels.Kernel"
            )
    if noise is not None:
        kernel = Sum([kernel, White(variance=noise)])
    return kernel
