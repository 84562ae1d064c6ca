"""The engine's inner site schedule: damped updates of a ``SiteState`` until they converge.

A site family hands its state (``gpinfer.interfaces.SiteState``: ``update(damping, iteration)``
returning the change its convergence test reads, ``snapshot`` / ``restore``, and where it uses
the divergence policy, ``move`` and ``restart``) to ``InnerSchedule.run``; the schedule owns

* the **damping**: the value each update gets, decayed by ``decay`` after every update;
* the **convergence test**: ``change <= tol`` (``change < tol`` with ``strict``), applied once
  the state has had ``min_updates`` updates in all (``done`` counts those of earlier runs);
* the **cap**: at most ``max_updates`` updates per run (with ``tol = -inf``, no convergence
  test: exactly ``max_updates``, as the vi-jj family's Stage 1 rounds);
* the **failure policy**: with ``max_failures = k`` a ``NumericalError`` in an update restores
  the state from before it, halves the damping and tries again (the failed update does not
  count), and the ``k + 1``-th failure is raised; with ``None`` (the default) the error ends
  the run at once;
* the **divergence policy** (a ``SweepPolicy``, looked at after every update that did not
  converge, before the damping decays): the core's ``Restart`` (after ``patience`` updates in a
  row whose ``state.move()`` grew, the state restarts from its initial sites, ``state.restart()``,
  with the damping cut to ``Restart.damping``, once, with a ``RuntimeWarning``); a family with a
  rule of its own subclasses ``SweepPolicy`` (pep's damping cut on oscillating sweeps,
  ``gpinfer_pep.rank_one.OscillationCut``).

It returns an ``InnerRun`` (updates done, converged, the last change, the damping reached, the
failures and whether it restarted). The schedule does no arithmetic on the sites: a family
moved onto it keeps its fits bit for bit, and its number of updates.

Who runs on it: the dense binary family's EP sites (``gpinfer.sites.ep.EPSites``: ep-dense,
the start of kl and mcmc-ais), tap's fixed point (``gpinfer_binary.tap.TAPSites``), gfitc's
sites (``gpinfer_ep.gfitc.FITCSites``), pep's power-EP sites
(``gpinfer_pep.rank_one.RankOnePEPSites``, with ``OscillationCut``), the vi-jj family's
Stage 1 rounds (``gpinfer_jj.bound.XiSites``, ``n_upd`` of them), laplace's Newton steps to
the mode (``gpinfer_laplace.sites.LaplaceSites``), ivm's EP phase over its liquid set
(``gpinfer_ivm.inference._LiquidSites``), and the full-batch
``outer`` schedule of ``gpinfer.training.loop.TrainingLoop`` (ep/sep: sweeps to ``outer_tol``
between two hyper-parameter steps). See ``docs/design.md`` (the engine).
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Scalar, SiteState


@dataclass
class InnerRun:
    """What one ``InnerSchedule.run`` did: ``updates`` (successful ones, this run),
    ``converged``, the last ``change`` (``inf`` before any update), the ``damping`` reached,
    ``failures`` (updates restored and retried) and ``restarted`` (the divergence policy
    fired)."""

    updates: int = 0
    converged: bool = False
    change: float = float("inf")
    damping: float = 1.0
    failures: int = 0
    restarted: bool = False


#: a policy's watcher for one run: called after each update that did not converge, with the
#: run so far; it may change ``run.damping`` or restart the state
Watcher = Callable[[InnerRun], None]


class SweepPolicy(abc.ABC):
    """A divergence policy of the inner schedule: what happens to the damping (or the sites)
    between updates that have not converged."""

    @abc.abstractmethod
    def watcher(self, state: SiteState, damping: float, owner: str) -> Watcher:
        """A fresh watcher for one run of ``state`` that starts at ``damping``; ``owner``
        names the sites in warnings."""


@dataclass(frozen=True)
class Restart(SweepPolicy):
    """After ``patience`` updates in a row whose ``state.move()`` grew, restart the state from
    its initial sites with damping ``damping`` (only while the damping is above it, so at most
    once), with a ``RuntimeWarning``."""

    patience: int = 5
    damping: float = 0.5

    def watcher(self, state: SiteState, damping: float, owner: str) -> Watcher:
        grow, last = 0, float("inf")

        def watch(run: InnerRun) -> None:
            nonlocal grow, last
            move = float(state.move())
            grow = grow + 1 if move > last else 0
            last = move
            if grow >= self.patience and run.damping > self.damping:
                warnings.warn(f"{owner or 'sites'}: site changes grew for {self.patience} "
                              f"sweeps; restarting with damping {self.damping:g}",
                              RuntimeWarning, stacklevel=4)
                run.damping, run.restarted, grow = float(self.damping), True, 0
                state.restart()

        return watch


@dataclass(frozen=True)
class InnerSchedule:
    """Damped updates of a ``SiteState`` to convergence (see the module doc for each field)."""

    tol: float
    max_updates: int
    damping: float = 1.0
    decay: float = 1.0
    min_updates: int = 1
    strict: bool = False
    max_failures: int | None = None
    policy: SweepPolicy | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.damping <= 1.0:
            raise InputError(f"damping must be in (0, 1], got {self.damping}")
        if self.max_updates < 0:
            raise InputError(f"max_updates must be >= 0, got {self.max_updates}")

    def converged(self, change: float, total: int) -> bool:
        """The convergence test on ``change`` after ``total`` updates of the state in all."""
        if total < self.min_updates:
            return False
        return change < self.tol if self.strict else change <= self.tol

    def run(self, state: SiteState, *, done: int = 0, iteration: int = 0, owner: str = "",
            read: Callable[[Scalar], float] = float) -> InnerRun:
        """Update ``state`` until the convergence test passes or ``max_updates`` updates.

        ``done``: updates the state had before this run (for ``min_updates``); ``iteration``:
        passed to every ``update`` (the outer iteration, for error context); ``owner``: the name
        in the divergence warning; ``read``: how a change is read (a 0-d device array through
        the caller's deferred checks; ``float`` by default)."""
        out = InnerRun(damping=float(self.damping))
        watch = None if self.policy is None else self.policy.watcher(state, out.damping, owner)
        while out.updates < self.max_updates:
            try:
                change = self._update(state, out, iteration, read)
            except _Retry:
                continue
            out.updates += 1
            out.change = change
            out.converged = self.converged(change, done + out.updates)
            if watch is not None and not out.converged:
                watch(out)
            out.damping *= self.decay
            if out.converged:
                break
        return out

    def _update(self, state: SiteState, out: InnerRun, iteration: int,
                read: Callable[[Scalar], float]) -> float:
        """One update under the failure policy; ``_Retry`` after a restored failure."""
        if self.max_failures is None:
            return read(state.update(out.damping, iteration))
        snap = state.snapshot()
        try:
            return read(state.update(out.damping, iteration))
        except NumericalError:
            out.failures += 1
            if out.failures > self.max_failures:
                raise
            state.restore(snap)
            out.damping *= 0.5
            raise _Retry from None


class _Retry(Exception):
    """An update failed and was restored (the failure policy): try again."""
