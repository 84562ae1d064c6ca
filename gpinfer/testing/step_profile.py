"""Per-step operation counts of a training step on torch (issue 25), with ``torch.profiler``.

``profile_steps(fit, owner, target, first, steps, cuda)`` runs ``fit()`` and profiles the
calls ``first .. first + steps - 1`` (1-based) of ``owner.target``
(``MiniBatchSchedule._group``: a group of ``read_every`` steps with their optimiser updates,
sep/ep's or svi's window; ``SVI._step`` for one svi step), and returns per-call means of

* ``aten_ops_top_level``: aten operators not called from another aten operator (on a CPU the
  proxy for kernel launches);
* ``aten_ops_all``: every aten operator event, nested ones included;
* ``host_syncs``: reads of a device value on the host (``aten::item`` /
  ``aten::_local_scalar_dense``, counted once per read, and ``gpinfer.backend.ops.to_host``'s
  ``HOST_READ`` ranges, which a CPU tensor's read leaves no aten event for);
* on CUDA also ``kernel_launches`` (``cudaLaunchKernel`` and friends) and ``gpu_busy_ms`` (the
  sum of the device kernels' times).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpinfer.backend.ops import HOST_READ

_SYNCS = ("aten::item", "aten::_local_scalar_dense")


def _inside(event: Any, name: str) -> bool:
    """Whether ``event`` runs inside a range called ``name``."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def _counts(prof: Any, cuda: bool) -> dict[str, float]:
    events = list(prof.events())
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten
           if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    syncs = [e for e in aten if e.name in _SYNCS
             and (e.cpu_parent is None or e.cpu_parent.name not in _SYNCS)
             and not _inside(e, HOST_READ)]
    syncs += [e for e in events if e.name == HOST_READ]
    out = {"aten_ops_top_level": float(len(top)), "aten_ops_all": float(len(aten)),
           "host_syncs": float(len(syncs))}
    if cuda:
        launches = [e for e in events if "LaunchKernel" in e.name or "cudaMemcpy" in e.name]
        device_us = sum(getattr(e, "device_time_total", 0.0) for e in events
                        if getattr(e, "device_type", None) is not None
                        and str(e.device_type).endswith("CUDA"))
        out.update(kernel_launches=float(len(launches)), gpu_busy_ms=device_us / 1e3)
    return out


def profile_steps(fit: Callable[[], object], owner: type, target: str, first: int,
                  steps: int = 3, cuda: bool = False) -> dict[str, float]:
    """Per-step means over calls ``first .. first + steps - 1`` of ``owner.target`` while
    ``fit()`` runs (see the module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    original = getattr(owner, target)
    seen = {"calls": 0}
    counts: list[dict[str, float]] = []

    def profiled(*args: Any, **kwargs: Any) -> Any:
        seen["calls"] += 1
        if not first <= seen["calls"] < first + steps:
            return original(*args, **kwargs)
        with profile(activities=activities) as prof:
            out = original(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
        counts.append(_counts(prof, cuda))
        return out

    setattr(owner, target, profiled)
    try:
        with torch.no_grad():
            fit()
    finally:
        setattr(owner, target, original)
    if not counts:
        raise RuntimeError(f"no step was profiled ({seen['calls']} calls of {target})")
    keys = counts[0].keys()
    result = {k: float(np.mean([c[k] for c in counts])) for k in keys}
    result["steps_profiled"] = float(len(counts))
    return result
