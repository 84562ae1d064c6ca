"""Stops in ``gpinfer-run``: SIGINT (Ctrl-C) and SIGTERM (a cluster's, a launcher's or
``torchrun``'s stop), taken by one handler, never inside a config composition or a store call,
never inside the record of a run's end, and never lost.

Three ways a stop went wrong: a ``KeyboardInterrupt`` raised inside OmegaConf (its
``flag_override`` context restores flags on nodes that are half built) surfaced as
``AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'`` with a
traceback; one raised inside a weak-reference callback or a finaliser is printed and dropped by
Python ("Exception ignored in ..."), so the sweep went on; and one raised while a failed run was
being recorded (its ``result.json``, its MLflow status) left the run RUNNING. So:

* ``install()`` (``gpinfer-run``): SIGINT taken for the process, *deferring* until ``release``;
* ``run_stops()``: around one run, SIGTERM taken too (its handler before restored at the end);
* a stop that comes is remembered; while deferring (from ``install`` until ``release``, and
  inside ``deferred()``: a composition, a store call) it is only remembered, otherwise it is
  also raised at once as ``KeyboardInterrupt`` (the run in progress ends KILLED);
* ``release()``: stop deferring, and raise ``KeyboardInterrupt`` for a stop remembered
  meanwhile *or dropped earlier*. Called where composing is over: the sweeper's ``sweep``,
  every job's task function, and at the end of each ``deferred()`` block, so a sweep stops at
  the next job at the latest;
* ``hold()``: from there until the enclosing ``run_stops()`` ends (once the run has ended),
  stops are only remembered, ``release`` included: called where a run's end starts being
  recorded (an exception in its start, its training or its records). At the end of
  ``run_stops()`` a stop that came while holding acts as if it came then: a SIGTERM is sent
  again to the process under the handler it had before (the default ends the process), a
  SIGINT raises ``KeyboardInterrupt``;
* ``uninstall()``: the default SIGINT handler back (end of ``gpinfer-run``).

Only the main thread is affected; elsewhere (a launcher's worker threads) these are no-ops, and
``install`` takes SIGINT only from Python's default handler (not from a background job's
``SIG_IGN`` or someone else's handler).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _State:
    """The handler's state: ``taken`` the signals it holds (with the handler each had before),
    ``deferring`` (``install``, ``deferred``), ``runs`` the open ``run_stops`` blocks,
    ``holding`` (``hold``), ``pending`` the stops remembered for ``release``, ``held`` those that
    came while holding."""

    taken: dict[int, Any] = field(default_factory=dict)
    deferring: bool = False
    runs: int = 0
    holding: bool = False
    pending: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)


_state = _State()


def _handler(signum: int, frame: Any) -> None:
    if _state.holding:
        _state.held.add(signum)
        return
    _state.pending.add(signum)  # kept when raised: a dropped KeyboardInterrupt is not lost
    if not _state.deferring:
        raise _interrupt(signum)


def _interrupt(signum: int) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` of a stop (a SIGTERM's names it: ``signal 15``)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(
        f"signal {signum}")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _active() -> bool:
    return bool(_state.taken) and _main_thread()


def _take(signum: int) -> bool:
    """The handler on ``signum`` (main thread only); whether it was set."""
    try:
        previous = signal.signal(signum, _handler)
    except (ValueError, OSError):  # not allowed here
        return False
    _state.taken[signum] = previous
    return True


def _give_back(signum: int) -> Any:
    """``signum``'s handler before ``_take`` restored; returns it."""
    previous = _state.taken.pop(signum)
    signal.signal(signum, previous)
    return previous


def install() -> None:
    """Take SIGINT (deferring it until ``release``); nothing when SIGINT is ignored (a
    background job) or handled by someone else, or off the main thread."""
    if not _main_thread() or signal.SIGINT in _state.taken:
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    if _take(signal.SIGINT):
        _state.deferring = True
        _state.pending.clear()


def release() -> None:
    """Stop deferring; ``KeyboardInterrupt`` if a stop came and was not acted on (nothing while
    holding: ``hold``)."""
    if not _active() or _state.holding:
        return
    _state.deferring = False
    if _state.pending:
        signum = min(_state.pending)  # SIGINT (2) before SIGTERM (15)
        _state.pending.clear()
        raise _interrupt(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Stops only remembered during the block, acted on at its end (``release``)."""
    if not _active():
        yield
        return
    outer = _state.deferring
    _state.deferring = True
    try:
        yield
    finally:
        if not outer:
            release()


def hold() -> None:
    """Until the enclosing ``run_stops`` ends, stops are only remembered (see the module doc);
    nothing outside one."""
    if _state.runs and _main_thread():
        _state.holding = True


@contextmanager
def run_stops() -> Iterator[None]:
    """Around one run: SIGTERM taken as SIGINT is (a ``KeyboardInterrupt``, deferred in store
    calls); at the end the handler it had is back, holding (``hold``) ends, and a stop that
    came while holding acts (see the module doc)."""
    if not _main_thread() or _state.runs:
        yield
        return
    took = signal.SIGTERM not in _state.taken and _take(signal.SIGTERM)
    _state.runs += 1
    try:
        yield
    finally:
        # SIGTERM's handler back first: a SIGTERM from here on cannot raise in this block
        # and leave its own handler on SIGTERM after the run
        previous = _give_back(signal.SIGTERM) if took else None
        _state.runs -= 1
        _state.holding = False
        held, _state.held = _state.held, set()
        _state.pending.discard(signal.SIGTERM)  # acted on: the run ended
        if signal.SIGTERM in held and previous is not None:
            held.discard(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)  # under the handler it had before
        if held:  # a Ctrl-C too, where that handler let the process go on (SIG_IGN, ...)
            raise _interrupt(min(held))


def uninstall() -> None:
    """The default SIGINT handler back; a remembered stop is dropped."""
    if not _main_thread() or signal.SIGINT not in _state.taken:
        return
    _give_back(signal.SIGINT)
    _state.deferring = False
    _state.pending.clear()
