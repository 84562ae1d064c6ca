"""What a user asks for (``backend``, ``device``, ``dtype``) and the ``Backend`` a fit runs on.

``resolve_backend`` checks the three settings before any training and turns them into a
``Backend``: ``device="cuda"`` alone implies ``backend="torch"``; ``backend="torch"`` alone runs
on the CPU; ``float64`` is the default. Every mistake (torch not installed, no CUDA, an unknown
device or dtype, float32 on numpy) is an ``InputError`` that names the fix.

A ``Backend`` moves host arrays to its device (``asarray``, ``as_index``) and back
(``to_host``); training data stay on the host and are moved per mini-batch, so ``N`` is bounded
by host memory, not the device's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from gpinfer.errors import InputError

#: array backends of the scalable methods
BACKENDS = ("numpy", "torch")
#: floating-point types (float64 the default)
DTYPES = ("float64", "float32")
#: what to install for the torch backend
TORCH_INSTALL = "pip install 'gpinfer[torch]' (or pip install torch)"


def torch_module(reason: str) -> ModuleType:
    """``import torch``, or an ``InputError`` saying what to install for ``reason``."""
    try:
        return importlib.import_module("torch")
    except ImportError as err:
        raise InputError(f"{reason} needs PyTorch, which is not installed: {TORCH_INSTALL}"
                         ) from err


@dataclass(frozen=True)
class Backend:
    """An array backend: ``name`` (``"numpy"`` or ``"torch"``), ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``; numpy: ``"cpu"``) and ``dtype`` (``"float64"``/``"float32"``)."""

    name: str = "numpy"
    device: str = "cpu"
    dtype: str = "float64"

    @property
    def is_numpy(self) -> bool:
        return self.name == "numpy"

    def _torch_dtype(self) -> Any:
        return getattr(torch_module("backend='torch'"), self.dtype)

    def asarray(self, x: Any) -> Any:
        """``x`` (host array, list, scalar or a tensor) as a floating array of this backend."""
        if self.is_numpy:
            return np.asarray(x, dtype=self.dtype)
        torch = torch_module("backend='torch'")
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=self._torch_dtype())
        host = np.asarray(x)
        if not host.flags.writeable:  # torch warns on read-only buffers (memory-mapped data)
            host = np.array(host)
        return torch.as_tensor(host, dtype=self._torch_dtype(), device=self.device)

    def as_index(self, idx: Any) -> Any:
        """Integer indices (or labels) ``[n]`` as an int64 array of this backend."""
        if self.is_numpy:
            return np.asarray(idx, dtype=np.int64)
        torch = torch_module("backend='torch'")
        return torch.as_tensor(np.asarray(idx, dtype=np.int64), device=self.device)

    def as_mask(self, mask: Any) -> Any:
        """A boolean array (host) on this backend."""
        if self.is_numpy:
            return np.asarray(mask, dtype=bool)
        torch = torch_module("backend='torch'")
        return torch.as_tensor(np.asarray(mask, dtype=bool), device=self.device)

    def params(self) -> dict[str, str]:
        """The settings as logged (MLflow params, ``FitResult.state``)."""
        return {"backend": self.name, "device": self.device, "dtype": self.dtype}

    def __str__(self) -> str:
        return f"{self.name}:{self.device}:{self.dtype}"


#: the default backend
NUMPY = Backend()


def _checked_device(torch: ModuleType, device: str) -> str:
    """``device`` as torch spells it, or an ``InputError`` (unknown, or CUDA missing)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as err:
        raise InputError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise InputError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        build = ("a CPU-only build" if torch.version.cuda is None
                 else f"built for CUDA {torch.version.cuda}")
        raise InputError(
            f"device={device!r} but torch {torch.__version__} ({build}) sees no CUDA GPU: "
            "install a CUDA build of torch on a machine with an NVIDIA GPU, or use device='cpu'")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise InputError(f"device={device!r} but only {count} CUDA device(s) are visible")
    return str(dev)


def resolve_backend(backend: str | None = None, device: str | None = None,
                    dtype: str | None = None) -> Backend:
    """The ``Backend`` for a user's settings, checked (``InputError`` naming the fix).

    ``backend``: ``"numpy"``, ``"torch"`` or None (numpy, unless ``device`` is a GPU);
    ``device``: None or ``"cpu"``, ``"cuda"``, ``"cuda:N"``; ``dtype``: ``"float64"`` (None)
    or ``"float32"`` (torch only).
    """
    dtype = "float64" if dtype is None else dtype
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use one of {list(DTYPES)}")
    if backend is not None and backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}: use one of {list(BACKENDS)}")
    if device is not None and not isinstance(device, str):
        raise InputError(f"device must be a string such as 'cpu' or 'cuda'; got {device!r}")
    on_cpu = device is None or device == "cpu"
    name = backend if backend is not None else ("numpy" if on_cpu else "torch")
    if name == "numpy":
        if not on_cpu:
            raise InputError(f"backend='numpy' runs on the CPU only; for device={device!r} use "
                             "backend='torch' (or leave backend unset)")
        if dtype != "float64":
            raise InputError("dtype='float32' needs backend='torch' (numpy runs in float64)")
        return NUMPY
    torch = torch_module("backend='torch'" if on_cpu else f"device={device!r}")
    return Backend("torch", _checked_device(torch, device or "cpu"), dtype)

