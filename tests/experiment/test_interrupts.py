"""``gpinfer.experiment.interrupts``: SIGINT deferred while composing, never lost, with real
signals sent to this process."""

from __future__ import annotations

import os
import signal

import pytest

from gpinfer.experiment import interrupts


@pytest.fixture
def installed():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default here (a background session)")
    interrupts.install()
    try:
        yield
    finally:
        interrupts.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_deferred_until_release(installed) -> None:
    _ctrl_c()  # install() defers: composing the primary config
    with pytest.raises(KeyboardInterrupt):
        interrupts.release()
    interrupts.release()  # acted on once


def _spin() -> None:
    for _ in range(2_000_000):  # Python runs signal handlers between bytecodes
        pass


def test_immediate_after_release(installed) -> None:
    interrupts.release()
    with pytest.raises(KeyboardInterrupt):
        _ctrl_c()
        _spin()


def test_inside_a_composition_raised_at_its_end(installed) -> None:
    interrupts.release()
    reached = False
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        _ctrl_c()
        _spin()
        reached = True  # the composition was not cut short
    assert reached


def test_a_dropped_interrupt_is_raised_at_the_next_release(installed) -> None:
    """A KeyboardInterrupt swallowed (a finaliser, a bare except) is not forgotten."""
    interrupts.release()
    try:
        _ctrl_c()
        _spin()
    except KeyboardInterrupt:
        pass  # swallowed, as Python does inside a weak-reference callback
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        pass


def test_no_op_without_install() -> None:
    """Without ``install`` no call touches the process's SIGINT handler (whatever it is: Python's
    own, or ``SIG_IGN`` in a background job) and none raises."""
    before = signal.getsignal(signal.SIGINT)
    interrupts.release()
    with interrupts.deferred():
        assert signal.getsignal(signal.SIGINT) is before
    interrupts.uninstall()
    assert signal.getsignal(signal.SIGINT) is before
