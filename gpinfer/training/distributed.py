"""Data-parallel training over ``torch.distributed`` (issue 24 item 2): the process group a fit
runs in, each rank's rows of a global batch, and sums across the ranks.

A fit in a process group of ``K`` ranks (``torchrun --nproc-per-node K``, or any
``torch.distributed.init_process_group`` before the fit) draws the same global batch order on
every rank (the same seed); rank ``r`` evaluates its part of each global batch
(``Group.rows``: ``numpy.array_split`` of the batch, part ``r``), the ranks' per-row sums are
added with one ``all_reduce`` per step (``Group.all_reduce_sum``: value and gradient in one flat
buffer) and every rank takes the same optimiser step, so the parameters stay equal on every rank
and the fit is the one-process fit on the union batch (to round-off).

With no process group nothing changes: ``current()`` is ``None`` and the methods take their
one-process path. ``current`` never imports torch: a group can only be active when
``torch.distributed`` is already imported (the numpy path stays free of torch).
``init_from_env`` starts the group that ``torchrun``'s environment describes (gloo on the CPU,
nccl on CUDA) with a timeout on its collectives.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Array

T = TypeVar("T")

#: the environment ``torchrun`` sets for every rank
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: default timeout of a collective (s): a rank that died ends the others' wait
DEFAULT_TIMEOUT_S = 300.0
#: the environment variable of ``gpinfer-run``'s collective timeout (s)
TIMEOUT_ENV = "GPINFER_COLLECTIVE_TIMEOUT_S"


def _dist() -> Any:
    """``torch.distributed`` when already imported and usable, else ``None`` (no import)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return None
    return dist


def attempt(compute: Callable[[], T]) -> tuple[T | None, NumericalError | None]:
    """``compute()``, this rank's part of a step, with its deferred checks
    (``ops.pending_checks``) read before the collective that follows: ``(result, None)``, or
    ``(None, error)`` when it or a check raised a ``NumericalError`` (the caller then sends
    zeros with the failure flag: ``Group.agreed_sums``)."""
    try:
        out = compute()
        pending = ops.pending_checks()
        if pending is not None:
            pending.flush()
        return out, None
    except NumericalError as err:
        return None, err


def smallest_batch(n: int, batch_size: int | None) -> int:
    """The fewest points of any batch of an epoch of ``n`` points in batches of ``batch_size``
    (``None``: one batch of all; the last, partial batch included): a process group needs at
    least one point per rank in each."""
    bs = n if batch_size is None else min(int(batch_size), n)
    return min(bs, n % bs or bs)


@dataclass(frozen=True)
class Group:
    """The process group of a data-parallel fit: this process's ``rank`` of ``size``."""

    rank: int
    size: int

    def rows(self, batch: Array) -> Array:
        """This rank's part of the global ``batch [B]`` (indices): part ``rank`` of
        ``numpy.array_split(batch, size)`` (``[B_r]``, possibly empty when ``B < size``); the
        parts of all ranks, in rank order, are ``batch``."""
        return np.array_split(np.asarray(batch), self.size)[self.rank]

    def all_reduce_sum(self, buffer: Array) -> Array:
        """The element-wise sum over the ranks of the flat ``buffer [P]`` (a numpy array or a
        torch tensor; one collective). Returns an array of ``buffer``'s kind, shape and dtype
        (a numpy buffer is summed through a torch view of a copy; a tensor in place on a
        copy)."""
        dist = _dist()
        import torch  # a group is active: torch is imported

        if isinstance(buffer, np.ndarray):
            out = np.array(buffer, dtype=buffer.dtype, order="C", copy=True)
            dist.all_reduce(torch.from_numpy(out), op=dist.ReduceOp.SUM)
            return out
        t = buffer.detach().clone().contiguous()
        if dist.get_backend() == "nccl" or t.device.type == "cpu":
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return t
        host = t.cpu()  # gloo on a device tensor: through the host
        dist.all_reduce(host, op=dist.ReduceOp.SUM)
        return host.to(t.device)

    def agreed_sums(self, parts: list[Array], failure: NumericalError | None) -> list[Array]:
        """The sums over the ranks of ``parts`` (arrays of one backend and dtype, any shapes),
        in one ``all_reduce`` together with a failure flag, so that every rank reaches the same
        decision: when some rank's part failed (``failure``: its ``NumericalError``; its parts
        are then ignored and may be zeros), every rank raises a ``NumericalError`` (its own, or
        one naming the other ranks), and no rank is left waiting in a collective. Returns the
        summed arrays in ``parts``' shapes."""
        xp = ops.namespace(parts[0])
        flat = [xp.reshape(p, (-1,)) for p in parts]
        flag = xp.zeros_like(flat[0][:1]) + (0.0 if failure is None else 1.0)
        total = self.all_reduce_sum(xp.concat([*flat, flag]))
        if float(total[-1]) > 0:
            if failure is not None:
                raise failure
            raise NumericalError(f"a numerical failure on another rank of {self.size} "
                                 f"(rank {self.rank} of the process group)")
        out, start = [], 0
        for p, f in zip(parts, flat):
            out.append(total[start:start + f.shape[0]].reshape(p.shape))
            start += f.shape[0]
        return out

    def agreed_mean(self, value: Any, grad: Array,
                    failure: NumericalError | None = None) -> tuple[Any, Array]:
        """The means over the ranks of ``value`` (a host float, or a 0-d array of ``grad``'s
        backend) and ``grad [P]`` in one ``all_reduce`` (``agreed_sums``: a failure on any
        rank raises on every rank). A host value comes back as a float, a device one as a 0-d
        array."""
        if ops.is_numpy(grad):
            head = np.array([float(value)], dtype=grad.dtype)
        else:
            xp = ops.namespace(grad)
            # asarray: a failed rank's value is the host 0.0 (``TrainingLoop._group_objective``)
            head = xp.reshape(xp.asarray(value, dtype=grad.dtype, device=grad.device), (1,))
        total_value, total_grad = self.agreed_sums([head, grad], failure)
        mean = total_value[0] / self.size
        return (float(mean) if isinstance(grad, np.ndarray) else mean), total_grad / self.size


def current() -> Group | None:
    """The active process group (``None``: none, or one process only; never imports
    torch)."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return None
    size = int(dist.get_world_size())
    return Group(int(dist.get_rank()), size) if size > 1 else None


def is_main() -> bool:
    """Whether this process writes the run's records (MLflow, ``outputs/``): rank 0 of the
    active group, or the only process."""
    group = current()
    return group is None or group.rank == 0


def current_rank() -> int:
    """This process's rank (0 without a group)."""
    group = current()
    return 0 if group is None else group.rank


def env_timeout_s() -> float:
    """The collective timeout ``$GPINFER_COLLECTIVE_TIMEOUT_S`` (default
    ``DEFAULT_TIMEOUT_S``); ``InputError`` unless a positive number."""
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def launched_by_torchrun() -> bool:
    """Whether the environment is ``torchrun``'s (every variable of ``TORCHRUN_ENV`` set)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "cpu") -> Group | None:
    """Starts the process group ``torchrun``'s environment describes, unless one is active:
    gloo for ``device="cpu"``, nccl for CUDA, ``timeout_s`` on every collective. Returns the
    group (``None``: not launched by ``torchrun``, or one process)."""
    if current() is not None or not launched_by_torchrun():
        return current()
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend,
                                timeout=datetime.timedelta(seconds=float(timeout_s)))
    return current()
