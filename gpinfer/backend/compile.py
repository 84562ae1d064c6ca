"""Compiled regions of a torch step (issue 25): ``torch.compile`` of the step's pure tensor
functions, chosen by the ``compile`` option of a fit.

The step's kernel covariances, site algebra, matrix gradients, kernel VJPs and Adam update are
functions of device arrays only (the kernels' parameters enter as one ``[C, P]`` array, the
optimiser's scalars as arguments). Each is marked ``@compilable``: inside ``compiling(mode)``
(the training loop enters it for a fit with ``compile != "none"``) a call with torch arrays
runs the function's ``torch.compile``d form (one per function and mode, fixed shapes:
``dynamic=False``), elsewhere the function itself. What stays eager between the regions is
host bookkeeping (batch indices, labels). The checks a region meets (``ops.require_positive``,
``require_finite``, ``cholesky(check=True, error=)``) are collected while it runs and handed to
the step's ``deferred_checks`` context after it, in order (``ops.hand_over_traced_checks``).

Modes (``COMPILE_MODES``): ``none`` (eager, the default), ``default`` (inductor: fused
element-wise kernels, C++ on a CPU), ``reduce-overhead`` (CUDA graphs on top: CUDA devices
only). ``check_compile`` refuses, before training, a mode the backend cannot honour
(``InputError`` naming the fallback): any mode but ``none`` on numpy, ``reduce-overhead`` off
CUDA. When compiling itself fails at run time (no C++ compiler, an unsupported Python), the
first failure warns once and the function runs eagerly from then on (same values: a region
has no side effects before its compiled form runs).

Fixed shapes: a compiled mini-batch fit drops the last, short batch of each epoch (the
``N mod B`` points at the end of that epoch's shuffled order; ``MiniBatches(drop_last=True)``,
a warning says so) instead of compiling a second shape.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from gpinfer.backend import ops
from gpinfer.backend.choice import Backend
from gpinfer.errors import InputError

#: the ``compile`` option's values
COMPILE_MODES = ("none", "default", "reduce-overhead")

F = TypeVar("F", bound=Callable[..., Any])

_MODE: contextvars.ContextVar[str] = contextvars.ContextVar("gpinfer_compile", default="none")
_COMPILED: dict[tuple[str, str], Callable[..., Any]] = {}
_FAILED: set[str] = set()


def check_compile(mode: str, backend: Backend, owner: str) -> str:
    """``mode`` when ``backend`` can honour it, else an ``InputError`` naming ``owner`` and the
    fallback to ask for instead."""
    if mode not in COMPILE_MODES:
        raise InputError(f"{owner}: compile must be one of {list(COMPILE_MODES)}, got {mode!r}")
    if mode == "none":
        return mode
    if backend.is_numpy:
        raise InputError(f"{owner}: compile={mode!r} needs backend='torch'; numpy runs eagerly "
                         "(use compile='none')")
    if mode == "reduce-overhead" and not backend.device.startswith("cuda"):
        raise InputError(f"{owner}: compile='reduce-overhead' (CUDA graphs) needs a CUDA device, "
                         f"not {backend.device!r}; use compile='default' (inductor without CUDA "
                         "graphs) or 'none' (eager)")
    return mode


@contextlib.contextmanager
def compiling(mode: str) -> Iterator[None]:
    """A context in which ``@compilable`` functions called with torch arrays run compiled with
    ``mode`` (``"none"``: eagerly)."""
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def active() -> bool:
    """Whether ``@compilable`` regions run compiled here (inside ``compiling`` with a mode
    other than ``"none"``)."""
    return _MODE.get() != "none"


def _compiled(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    key = (f"{fn.__module__}.{fn.__qualname__}", mode)
    out = _COMPILED.get(key)
    if out is None:
        import torch

        out = _COMPILED[key] = torch.compile(fn, mode=mode, dynamic=False)
    return out


def _device_call(args: tuple[Any, ...]) -> bool:
    """Whether a call's arguments hold no numpy array (a torch region)."""
    return not any(ops.is_numpy(a) and not isinstance(a, float | int) for a in args)


def compilable(fn: F) -> F:
    """Mark ``fn`` (a function of device arrays, no host reads) as a compiled region of the
    step (see the module doc)."""

    @functools.wraps(fn)
    def region(*args: Any, **kwargs: Any) -> Any:
        if ops.tracing():  # inside another region: traced as part of it
            return fn(*args, **kwargs)
        mode = _MODE.get()
        if mode == "none" or mode in _FAILED or not _device_call(args):
            return fn(*args, **kwargs)
        try:
            with warnings.catch_warnings():  # tracing array_api_compat's cached helpers
                warnings.filterwarnings("ignore", message="Dynamo detected a call to a "
                                        "`functools.lru_cache`", category=UserWarning)
                out = _compiled(fn, mode)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any compiler failure: warn, then eager
            if not _is_compile_failure(err):
                raise
            ops.hand_over_traced_checks(discard=True)
            _FAILED.add(mode)
            warnings.warn(f"torch.compile (mode {mode!r}) failed, the step runs eagerly: "
                          f"{type(err).__name__}: {str(err).splitlines()[0][:200]}",
                          RuntimeWarning, stacklevel=2)
            return fn(*args, **kwargs)
        ops.hand_over_traced_checks()  # its checks, in order, as if it had run eagerly
        return out

    return region  # type: ignore[return-value]


def _is_compile_failure(err: Exception) -> bool:
    """Whether ``err`` comes from the compiler stack (dynamo, inductor, the C++ toolchain)
    rather than from the computation (a ``NumericalError``, a shape mistake)."""
    module = type(err).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "subprocess")) or isinstance(
        err, OSError | ImportError)
