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

A rank that fails ends the job on every rank, whatever failed and wherever:

* a ``NumericalError`` in a rank's part of a step travels as the failure flag of the step's
  collective (``attempt``, ``Group.agreed_sums``): every rank raises it at the same step and the
  group stays usable;
* any other exception that leaves a fit or a ``gpinfer-run`` job on one rank (its data reading,
  a callback, ``KeyboardInterrupt``) passes ``leave_on_failure``, which ends this rank's part of
  the group (``destroy_process_group``: its connections close) before it propagates, so the
  other ranks' current or next collective raises a ``GroupError`` at once rather than after the
  collective timeout; a process that left its group gets a ``GroupError`` from ``current``
  until a new group is started;
* a rank killed without cleanup (SIGKILL, out of memory) closes its connections too: gloo
  raises "Connection closed by peer" in the others' collectives, which ``Group.all_reduce_sum``
  turns into a ``GroupError``; a rank that hangs ends the others at the collective timeout.

(With nccl a closed peer is not seen by the others: they end at the collective timeout. Only
gloo was run here.)
"""

from __future__ import annotations

import datetime
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import GroupError, InputError, NumericalError
from gpinfer.interfaces import Array

T = TypeVar("T")

#: the environment ``torchrun`` sets for every rank
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: default timeout of a collective (s): a rank that died ends the others' wait
DEFAULT_TIMEOUT_S = 300.0
#: the environment variable of ``gpinfer-run``'s collective timeout (s)
TIMEOUT_ENV = "GPINFER_COLLECTIVE_TIMEOUT_S"
#: attribute set on an error that every rank of the group raised at the same collective
AGREED = "gpinfer_group_agreed"
#: why this process left its group (``leave_on_failure``), until a new group is started
_left: dict[str, str] = {}
#: sums this process has started (``Group._sum``: the collectives of training steps)
_collectives = [0]
#: the key of the group's store (``torch.distributed``'s c10d store: ``torchrun``'s agent store,
#: a file store, ...) under which the first rank that leaves after a failure posts why
FAILURE_KEY = "gpinfer/failure"
#: the store of the group ``start_group`` started, and a weak reference to that group
#: (``torch.distributed``'s ``group.WORLD``; a strong one would keep its connections open after
#: ``destroy_process_group``): the failure post's store while that group is the active one
_started: dict[str, Any] = {}


def _dist() -> Any:
    """``torch.distributed`` when already imported and usable, else ``None`` (no import)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return None
    return dist


def attempt(compute: Callable[[], T]) -> tuple[T | None, Exception | None]:
    """``compute()``, this rank's part of a step, with its deferred checks
    (``ops.pending_checks``) read before the collective that follows: ``(result, None)``, or
    ``(None, error)`` when it or a check raised (a ``NumericalError``, or any other
    ``Exception``: the caller then sends zeros with the failure flags, ``Group.agreed_sums``,
    and every rank raises at that collective)."""
    try:
        out = compute()
        pending = ops.pending_checks()
        if pending is not None:
            pending.flush()
        return out, None
    except Exception as err:  # noqa: BLE001 - raised again on this rank by agreed_sums
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
        (summed in place on a copy, through a torch view of it)."""
        dist = _dist()
        out = ops.copy(buffer)
        t = ops.torch_view(out)
        if dist.get_backend() == "nccl" or t.device.type == "cpu":
            self._sum(dist, t)
            return out
        host = t.cpu()  # gloo on a device tensor: through the host
        self._sum(dist, host)
        t.copy_(host)
        return out

    def _sum(self, dist: Any, tensor: Any) -> None:
        """``all_reduce`` (sum) of ``tensor`` in place (``_collective``; counted in
        ``_collectives``)."""
        _collectives[0] += 1
        self._collective(dist, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM))

    def _collective(self, dist: Any, call: Callable[[], object]) -> None:
        """``call()``, one collective of this rank; a ``GroupError`` when it fails (another
        rank ended: its connections closed, or the timeout passed)."""
        try:
            call()
        except RuntimeError as err:  # torch.distributed's DistBackendError and gloo's errors
            first = str(err).split(". ")[0][:300]
            posted = _posted_failure(dist)
            cause = f"the first failure: {posted}" if posted else (
                "another rank ended (it raised, was interrupted or killed) or the collective "
                f"timed out ({TIMEOUT_ENV})")
            raise GroupError(f"rank {self.rank} of {self.size}: a collective of the process "
                             f"group failed: {cause}; {first}") from err

    def agree_checks(self, failure: Exception | None) -> None:
        """The end of the checks before training, on every rank (one ``all_gather_object`` of
        each rank's failure, ``None`` or its type and message): returns when no rank failed;
        else every rank raises at this collective and the group stays usable: the failed rank
        its own ``failure``, the others an ``InputError`` (a ``GroupError`` when some failure
        was not an ``InputError``) naming each failed rank and its message. A rank given other
        data or settings than the others thus ends them at once, not at the collective
        timeout."""
        dist = _dist()
        note = None if failure is None else (
            isinstance(failure, InputError), f"{type(failure).__name__}: {failure}"[:2000])
        notes: list[Any] = [None] * self.size
        self._collective(dist, lambda: dist.all_gather_object(notes, note))
        failed = [(r, n) for r, n in enumerate(notes) if n is not None]
        if not failed:
            return
        error = failure
        if error is None:
            kind = InputError if all(n[0] for _, n in failed) else GroupError
            error = kind(f"the checks before training failed on another rank of the process "
                         f"group (this is rank {self.rank} of {self.size}): "
                         + "; ".join(f"rank {r}: {n[1]}" for r, n in failed))
        setattr(error, AGREED, True)  # every rank raises here: the group stays usable
        raise error

    def agreed_sums(self, parts: list[Array], failure: Exception | None) -> list[Array]:
        """The sums over the ranks of ``parts`` (arrays of one backend and dtype, any shapes),
        in one ``all_reduce`` together with a failure flag (0; 1 for a ``NumericalError``;
        ``size + 1`` for any other error, so the sum tells whether any was not numerical), so
        that every rank reaches the same decision: when some rank's part failed (``failure``;
        its parts are then ignored and may be zeros), every rank raises: the failed rank its
        own error, the others a ``NumericalError`` naming the other ranks when every failure
        was numerical (the failure policy then runs alike on every rank), else a
        ``GroupError``. No rank is left waiting in a collective and the group stays usable.
        Returns the summed arrays in ``parts``' shapes."""
        xp = ops.namespace(parts[0])
        flat = [xp.reshape(p, (-1,)) for p in parts]
        code = 0.0 if failure is None else (
            1.0 if isinstance(failure, NumericalError) else self.size + 1.0)
        flag = xp.zeros_like(flat[0][:1]) + code
        total = self.all_reduce_sum(xp.concat([*flat, flag]))
        flags = float(total[-1])
        if flags > 0:
            where = f"another rank of {self.size} (rank {self.rank} of the process group)"
            error = failure if failure is not None else (
                GroupError(f"an error on {where} in its part of the step") if flags > self.size
                else NumericalError(f"a numerical failure on {where}"))
            setattr(error, AGREED, True)  # every rank raises here: the group stays usable
            raise error
        out, start = [], 0
        for p, f in zip(parts, flat):
            out.append(total[start:start + f.shape[0]].reshape(p.shape))
            start += f.shape[0]
        return out

    def agreed_mean(self, value: Any, grad: Array,
                    failure: Exception | None = None) -> tuple[Any, Array]:
        """The means over the ranks of ``value`` (a host float, or a 0-d array of ``grad``'s
        backend) and ``grad [P]`` in one ``all_reduce`` (``agreed_sums``: a failure on any
        rank raises on every rank). A host value comes back as a float (numpy's ``float64``),
        a device one as a 0-d array."""
        # like: a failed rank's value is the host 0.0 (``TrainingLoop._group_objective``)
        head = ops.namespace(grad).reshape(ops.like(grad, value), (1,))
        total_value, total_grad = self.agreed_sums([head, grad], failure)
        return total_value[0] / self.size, total_grad / self.size


def current() -> Group | None:
    """The active process group (``None``: none, or one process only; never imports
    torch). ``GroupError`` when this process left its group after a failure
    (``leave_on_failure``) and no new group was started: a fit would otherwise run alone on
    this rank."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        if _left:
            raise GroupError(f"this process left its process group after a failure "
                             f"({_left['why']}); start a new group "
                             "(torch.distributed.init_process_group) or a new process")
        return None
    _left.clear()
    size = int(dist.get_world_size())
    return Group(int(dist.get_rank()), size) if size > 1 else None


@contextmanager
def checks_agreed() -> Iterator[None]:
    """Around the checks a fit makes before its first collective: in a process group of two or
    more ranks, they end in one agreement (``Group.agree_checks``), so that an ``Exception``
    raised by this rank's checks (an ``InputError`` for its own data, say) raises on every
    rank at once, naming this rank and its message, and a rank whose checks passed learns of
    the others' failures before training. Without a group: nothing."""
    group = current()
    if group is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        group.agree_checks(exc)  # raises exc, marked agreed
        raise
    group.agree_checks(None)


@contextmanager
def leave_on_failure(uniform_checks: bool = True) -> Iterator[None]:
    """Around work that may meet the other ranks in collectives (a fit, a ``gpinfer-run``
    job): an exception that leaves it on this rank (any, ``KeyboardInterrupt`` included) first
    ends this rank's part of the active group (``torch.distributed.destroy_process_group``:
    its connections close), so the other ranks' current or next collective raises a
    ``GroupError`` at once instead of waiting for the collective timeout.

    The group is kept for an error every rank raised at the same collective
    (``Group.agreed_sums``, ``Group.agree_checks``: a fit's checks end in one agreement,
    ``checks_agreed``, so one rank's refusal raises on every rank) and, with ``uniform_checks``,
    for an ``InputError`` raised before this rank's first sum inside the block (a
    method's refusal of its options, which every rank makes alike on the same settings).
    ``uniform_checks=False`` where ranks check different things
    (``gpinfer-run``: rank 0 alone opens the store and the output folder). Without a group:
    nothing."""
    start = _collectives[0]
    try:
        yield
    except BaseException as exc:
        checked = uniform_checks and isinstance(exc, InputError) and _collectives[0] == start
        if not (checked or getattr(exc, AGREED, False)):
            _leave(exc)
        raise


def _leave(exc: BaseException) -> None:
    """Destroy the active group of two or more ranks (nothing without one), remembering
    ``exc`` for ``current`` and another rank's posted failure for ``peer_failure``; the first
    rank to leave posts ``exc`` in the group's store (``FAILURE_KEY``) for the others' error
    messages."""
    dist = _dist()
    if dist is None or not dist.is_initialized() or int(dist.get_world_size()) < 2:
        return
    why = f"rank {int(dist.get_rank())}: {type(exc).__name__}: {exc}"[:300]
    peer = _posted_failure(dist)
    _left.update(why=why, peer=peer or "")
    if peer is None and not isinstance(exc, GroupError):
        try:
            _store(dist).set(FAILURE_KEY, why)
        except Exception:  # noqa: BLE001 - a message only: the group ends all the same
            pass
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group: the original error matters
        pass


def _store(dist: Any) -> Any:
    """The active group's c10d store: the one ``start_group`` gave it (``gpinfer-run`` under
    ``torchrun``, ``gpinfer.testing.ranks``), else, for a group the caller started with
    ``torch.distributed.init_process_group``, the default group's store through torch's
    private ``distributed_c10d._get_default_store`` (torch 2.13.0, checked: no public way to
    reach the store of a group started without one; every use fails soft)."""
    group = _started["group"]() if _started else None
    if group is not None and group is dist.group.WORLD:
        return _started["store"]
    return dist.distributed_c10d._get_default_store()


def _posted_failure(dist: Any) -> str | None:
    """The failure another rank posted in the group's store before it left (``_leave``), or
    ``None`` (none posted, or no store to read)."""
    try:
        store = _store(dist)
        if store.check([FAILURE_KEY]):
            return bytes(store.get(FAILURE_KEY)).decode(errors="replace")
    except Exception:  # noqa: BLE001 - a message only
        pass
    return None


def peer_failure() -> str | None:
    """The failure another rank posted before this process left its group after an error
    (``leave_on_failure``): its rank, type and message; ``None`` when this process has not
    left a group, or no other rank had posted one (a killed rank posts nothing). ``gpinfer-run``
    records an interruption that came after such a failure (``torchrun`` stops the other
    workers with SIGTERM) as that failure."""
    return _left.get("peer") or None


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
        start_group("nccl" if device.startswith("cuda") else "gloo", "env://", timeout_s)
    return current()


def start_group(backend: str, init_method: str, timeout_s: float, rank: int = -1,
                world_size: int = -1) -> None:
    """``torch.distributed.init_process_group(backend, init_method, ...)`` done with public
    calls, keeping the store: the rendezvous of ``init_method`` (``env://``: ``torchrun``'s
    environment and agent store; ``file://...``; ``rank``/``world_size`` -1: from the
    method) gives the store, which the group gets under torch's own ``default_pg`` prefix (as
    ``init_process_group`` does) and the failure post (``_leave``) under ``gpinfer``;
    ``timeout_s`` on every collective and on the store."""
    import torch.distributed as dist
    from torch.distributed.rendezvous import rendezvous

    timeout = datetime.timedelta(seconds=float(timeout_s))
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store),
                            rank=rank, world_size=world_size, timeout=timeout)
    _started.update(group=weakref.ref(dist.group.WORLD),
                    store=dist.PrefixStore("gpinfer", store))
