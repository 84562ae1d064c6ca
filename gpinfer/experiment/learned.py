"""What a fit learned, as flat MLflow metrics: kernel and likelihood parameters, inducing inputs.

``learned_metrics(kernel, likelihood, posterior)`` returns ``{"learned.<name>": value}`` with

* every kernel parameter in natural units (``Kernel.describe``): one kernel gives
  ``learned.kernel.<param>``, one kernel per latent ``learned.kernel.c<j>.<param>``; a vector
  parameter (ARD length-scales ``[D]``) gives one value per entry up to ``MAX_VECTOR`` entries,
  else its ``min``, ``median`` and ``max``;
* likelihood parameters (``learned.likelihood.<name>``; ``log_`` parameters exponentiated);
* per latent's inducing inputs ``Z [M, D]``: their count, mean row norm and mean per-dimension
  spread (``learned.inducing[.c<j>].{M,norm_mean,spread}``), which move when Z is optimised.

Parameter names are sanitised for MLflow (letters, digits, ``_ - . /`` and spaces).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: vectors longer than this are summarised (min, median, max) instead of logged entry by entry
MAX_VECTOR = 10
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


def _key(*parts: str) -> str:
    return _UNSAFE.sub("_", ".".join(p for p in parts if p))


def _vector(prefix: str, values: Sequence[float] | np.ndarray) -> dict[str, float]:
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size == 1:
        return {prefix: float(arr[0])}
    if arr.size <= MAX_VECTOR:
        return {f"{prefix}.{i}": float(v) for i, v in enumerate(arr)}
    return {f"{prefix}.min": float(arr.min()), f"{prefix}.median": float(np.median(arr)),
            f"{prefix}.max": float(arr.max())}


def _per_latent(obj: Any) -> list[Any]:
    return list(obj) if isinstance(obj, list | tuple) else [obj]


def kernel_metrics(kernel: Any) -> dict[str, float]:
    """``learned.kernel[.c<j>].<param>`` for one kernel or a list of them (one per latent)."""
    kernels = [k for k in _per_latent(kernel) if hasattr(k, "describe")]
    out: dict[str, float] = {}
    for j, k in enumerate(kernels):
        latent = f"c{j}" if len(kernels) > 1 else ""
        for name, value in k.describe().items():
            out.update(_vector(_key("learned.kernel", latent, str(name)), value))
    return out


def likelihood_metrics(likelihood: Any) -> dict[str, float]:
    """``learned.likelihood.<param>`` in natural units (``log_x`` parameters as ``x``)."""
    try:
        names = list(likelihood.param_names)
        theta = np.asarray(likelihood.get_unconstrained(), dtype=float).reshape(-1)
    except (AttributeError, NotImplementedError, TypeError):
        return {}
    out: dict[str, float] = {}
    for name, value in zip(names, theta):
        if name.startswith("log_"):
            name, value = name[4:], math.exp(float(value))
        out[_key("learned.likelihood", name)] = float(value)
    return out


def inducing_metrics(posterior: Any) -> dict[str, float]:
    """Count, mean row norm and mean per-dimension std of each latent's inducing inputs."""
    Z = getattr(posterior, "Z", None)
    if Z is None:
        return {}
    blocks = [np.asarray(z, dtype=float) for z in _per_latent(Z)]
    out: dict[str, float] = {}
    for j, z in enumerate(blocks):
        if z.ndim != 2 or z.shape[0] == 0:
            continue
        prefix = _key("learned.inducing", f"c{j}" if len(blocks) > 1 else "")
        out[f"{prefix}.M"] = float(z.shape[0])
        out[f"{prefix}.norm_mean"] = float(np.mean(np.linalg.norm(z, axis=1)))
        out[f"{prefix}.spread"] = float(np.mean(np.std(z, axis=0)))
    return out


def learned_metrics(kernel: Any, likelihood: Any, posterior: Any) -> dict[str, float]:
    """Every learned quantity above, finite values only."""
    out: dict[str, float] = {}
    for part in (kernel_metrics(kernel), likelihood_metrics(likelihood),
                 inducing_metrics(posterior)):
        out.update({k: v for k, v in part.items() if math.isfinite(v)})
    return out


def as_text(metrics: Mapping[str, float]) -> str:
    """``name = value`` lines (for the run log)."""
    return "\n".join(f"{k} = {v:.6g}" for k, v in sorted(metrics.items()))
