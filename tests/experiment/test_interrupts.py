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


def test_a_run_takes_sigterm_as_an_interrupt_and_gives_it_back() -> None:
    """Inside ``run_stops`` a SIGTERM is a ``KeyboardInterrupt`` naming it, deferred in a store
    call (``deferred``) until the call's end; afterwards the handler it had is back."""
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.run_stops():
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()
        reached = False
        with pytest.raises(KeyboardInterrupt, match="signal 15"), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()
            reached = True  # the store call was not cut short
        assert reached
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_while_a_runs_end_is_recorded_acts_when_the_run_has_ended(installed) -> None:
    """After ``hold`` a Ctrl-C is only remembered, ``release`` included (a store call's end),
    and raised when the ``run_stops`` block ends."""
    interrupts.release()
    recorded = False
    with pytest.raises(KeyboardInterrupt), interrupts.run_stops():
        interrupts.hold()
        _ctrl_c()
        _spin()
        with interrupts.deferred():  # a store call of the record: not cut short either
            pass
        recorded = True
    assert recorded
    interrupts.release()  # acted on once


def test_a_ctrl_c_held_with_a_sigterm_is_not_lost_when_sigterm_is_ignored(installed) -> None:
    """A SIGTERM and a Ctrl-C while a run's end is recorded: the SIGTERM is sent again under
    the handler it had before the run (here ``SIG_IGN``: the process goes on), and the Ctrl-C
    still raises when the ``run_stops`` block ends."""
    interrupts.release()
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.run_stops():
            interrupts.hold()
            os.kill(os.getpid(), signal.SIGTERM)
            _ctrl_c()
            _spin()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    interrupts.release()  # acted on once
