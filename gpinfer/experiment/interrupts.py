"""Ctrl-C in ``gpinfer-run``: taken between config compositions, never inside one, and never lost.

Two ways a Ctrl-C went wrong: a ``KeyboardInterrupt`` raised inside OmegaConf (its
``flag_override`` context restores flags on nodes that are half built) surfaced as
``AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'`` with a
traceback; and one raised inside a weak-reference callback or a finaliser is printed and
dropped by Python ("Exception ignored in ..."), so the sweep went on. ``gpinfer-run`` therefore
owns SIGINT:

* ``install()``: SIGINT is remembered; while *deferring* (from ``install`` until ``release``,
  and inside ``deferred()``) it is only remembered, otherwise it is also raised at once as
  ``KeyboardInterrupt`` (a run in progress ends KILLED);
* ``release()``: stop deferring, and raise ``KeyboardInterrupt`` for a SIGINT remembered
  meanwhile *or dropped earlier*. Called where composing is over: the sweeper's ``sweep``,
  every job's task function, and after each job's composition (``deferred()``), so a sweep
  stops at the next job at the latest;
* ``uninstall()``: the default handler back (end of ``gpinfer-run``).

Only the main thread of the process that called ``install`` is affected; elsewhere (a
launcher's worker processes, other threads) these are no-ops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_state: dict[str, bool] = {"installed": False, "deferring": False, "pending": False}


def _handler(signum: int, frame: Any) -> None:
    _state["pending"] = True
    if not _state["deferring"]:
        raise KeyboardInterrupt


def _active() -> bool:
    return _state["installed"] and threading.current_thread() is threading.main_thread()


def install() -> None:
    """Own SIGINT (deferring it until ``release``); nothing when SIGINT is ignored (a
    background job) or handled by someone else, or off the main thread."""
    if threading.current_thread() is not threading.main_thread() or _state["installed"]:
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    _state.update(installed=True, deferring=True, pending=False)
    signal.signal(signal.SIGINT, _handler)


def release() -> None:
    """Stop deferring; ``KeyboardInterrupt`` if a SIGINT came and was not acted on."""
    if not _active():
        return
    _state["deferring"] = False
    if _state["pending"]:
        _state["pending"] = False
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT only remembered during the block, acted on at its end (``release``)."""
    if not _active():
        yield
        return
    outer = _state["deferring"]
    _state["deferring"] = True
    try:
        yield
    finally:
        if not outer:
            release()


def uninstall() -> None:
    """The default SIGINT handler back; a remembered SIGINT is dropped."""
    if not _active():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _state.update(installed=False, deferring=False, pending=False)
