"""``gpinfer.training.inner``: the engine's inner site schedule (damping and its decay, the
convergence test, the cap, the failure policy, the divergence policy) on a scripted
``SiteState``, and dense EP on it against a hand-written sweep loop."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import SiteState
from gpinfer.kernels import RBF
from gpinfer.likelihoods.bernoulli import BernoulliProbit
from gpinfer.sites.ep import EPSites, ep_log_evidence
from gpinfer.training.inner import InnerSchedule, Restart, SweepPolicy


class Scripted(SiteState):
    """Sites whose ``update`` returns the next of ``changes`` (and ``moves`` for ``move``),
    raising ``NumericalError`` on the calls listed in ``fail_on``; records every damping."""

    def __init__(self, changes, moves=None, fail_on=()):
        self.changes, self.moves, self.fail_on = list(changes), moves, set(fail_on)
        self.value, self.calls, self.dampings, self.restarts = 0, 0, [], 0

    def update(self, damping, iteration):
        self.calls += 1
        self.dampings.append(damping)
        self.value += 1  # what a restore must undo
        if self.calls in self.fail_on:
            raise NumericalError("scripted failure", quantity="sites")
        return self.changes.pop(0)

    def snapshot(self):
        return self.value

    def restore(self, snapshot):
        self.value = snapshot

    def move(self):
        return self.moves.pop(0)

    def restart(self):
        self.restarts += 1


def test_stops_at_the_first_change_within_tol_and_counts_updates():
    state = Scripted([1.0, 0.5, 0.1, 0.01, 0.001])
    out = InnerSchedule(tol=0.1, max_updates=10).run(state)
    assert (out.updates, out.converged, out.change) == (3, True, 0.1)  # <= tol
    strict = InnerSchedule(tol=0.1, max_updates=10, strict=True).run(Scripted([1.0, 0.1, 0.01]))
    assert (strict.updates, strict.change) == (3, 0.01)  # < tol: 0.1 does not pass


def test_min_updates_counts_the_updates_of_earlier_runs():
    schedule = InnerSchedule(tol=1.0, max_updates=10, min_updates=3)
    assert schedule.run(Scripted([0.0] * 5)).updates == 3
    assert schedule.run(Scripted([0.0] * 5), done=2).updates == 1


def test_the_cap_ends_an_unconverged_run():
    out = InnerSchedule(tol=1e-3, max_updates=4).run(Scripted([1.0] * 10))
    assert (out.updates, out.converged) == (4, False)
    assert InnerSchedule(tol=1.0, max_updates=0).run(Scripted([])).updates == 0


def test_damping_decays_after_every_update():
    state = Scripted([1.0, 1.0, 1.0])
    out = InnerSchedule(tol=0.0, max_updates=3, damping=0.5, decay=0.9).run(state)
    np.testing.assert_allclose(state.dampings, [0.5, 0.45, 0.405])
    assert out.damping == pytest.approx(0.5 * 0.9**3)


def test_a_failed_update_is_restored_and_retried_at_half_the_damping():
    state = Scripted([1.0, 0.0], fail_on={2})
    out = InnerSchedule(tol=0.0, max_updates=5, damping=0.8, max_failures=3).run(state)
    assert (out.updates, out.failures, out.converged) == (2, 1, True)
    assert state.dampings == [0.8, 0.8, 0.4]
    assert state.value == 2  # the failed update's move was undone


def test_failures_past_the_limit_and_without_a_policy_are_raised():
    with pytest.raises(NumericalError, match="scripted"):
        InnerSchedule(tol=0.0, max_updates=5, max_failures=1).run(
            Scripted([1.0] * 5, fail_on={1, 2}))
    with pytest.raises(NumericalError, match="scripted"):
        InnerSchedule(tol=0.0, max_updates=5).run(Scripted([1.0] * 5, fail_on={1}))


def test_growing_moves_restart_the_sites_once_with_the_restart_damping():
    moves = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] + [7.0 + k for k in range(10)]
    state = Scripted([1.0] * 16, moves=moves)
    with pytest.warns(RuntimeWarning, match="EP: site changes grew for 5 sweeps; restarting "
                                            "with damping 0.5"):
        out = InnerSchedule(tol=0.0, max_updates=16, policy=Restart(5, 0.5)).run(
            state, owner="EP")
    assert state.restarts == 1 and out.restarted  # at damping 0.5 it does not fire again
    assert state.dampings[:6] == [1.0] * 6 and state.dampings[6:] == [0.5] * 10


def test_moves_that_shrink_once_reset_the_count():
    moves = [1.0, 2.0, 3.0, 4.0, 3.5, 4.0, 5.0, 6.0, 7.0]
    state = Scripted([1.0] * 9, moves=moves)
    out = InnerSchedule(tol=0.0, max_updates=9, policy=Restart(5, 0.5)).run(state)
    assert state.restarts == 0 and not out.restarted


def test_bad_settings_are_input_errors():
    with pytest.raises(InputError, match="damping"):
        InnerSchedule(tol=1.0, max_updates=1, damping=0.0)
    with pytest.raises(InputError, match="max_updates"):
        InnerSchedule(tol=1.0, max_updates=-1)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_dense_ep_on_the_schedule_is_its_hand_written_sweep_loop(schedule):
    """The oracle: sweeps until ``|Delta log Z_EP| <= tol`` after at least two, by hand."""
    X = np.linspace(-3, 3, 12)[:, None]
    y = np.where(np.arange(12) == 3, 1, (X[:, 0] > 0).astype(np.int64))
    K = RBF(lengthscale=1.0, variance=20.0).K(X)
    lik = BernoulliProbit()
    ran = EPSites(K, y, lik, tol=1e-9, schedule=schedule)
    sweeps = ran.run()
    hand = EPSites(K, y, lik, tol=1e-9, schedule=schedule)
    log_z, count = -np.inf, 0
    while True:
        hand.update(hand.damping)
        count += 1
        new = ep_log_evidence(lik, y, hand.algebra, hand.nu)
        done = count >= 2 and abs(new - log_z) <= 1e-9
        log_z = new
        if done:
            break
    assert ran.converged and sweeps == count == ran.n_sweeps
    np.testing.assert_array_equal(ran.tau, hand.tau)
    assert ran.log_evidence() == log_z
    assert ran.run() == 0  # converged sites are not swept again


def test_a_policy_watches_every_update_that_did_not_converge_before_the_decay():
    seen = []

    class Recording(SweepPolicy):
        def watcher(self, state, damping, owner):
            seen.append(("start", damping, owner))
            return lambda run: seen.append((run.updates, run.damping))

    out = InnerSchedule(tol=0.1, max_updates=10, damping=0.5, decay=0.5,
                        policy=Recording()).run(Scripted([1.0, 0.5, 0.01]), owner="x")
    assert out.updates == 3
    assert seen == [("start", 0.5, "x"), (1, 0.5), (2, 0.25)]
