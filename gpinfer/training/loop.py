"""The core training loop of the site methods: sites refined by damped moment matching,
hyper-parameters by a gradient step, in one of three schedules.

A method supplies a ``SiteApproximation`` (``gpinfer.interfaces``: its sites, their update, the
objective they define with its matrix gradients, snapshots, the posterior) and the
``HyperParameters`` of its kernels and inducing inputs; ``TrainingLoop`` does the rest:

* **schedules** (``Schedule``): ``inner`` (full batch: one damped parallel site sweep, then one
  sign-adaptive ascent step on the hyper-parameters; the damping decays by ``damping_decay``
  per iteration), ``outer`` (full batch: sweeps until the largest site change is below
  ``outer_tol``, on the engine's inner site schedule ``gpinfer.training.inner.InnerSchedule``,
  then one step) and mini-batch (``problem.batch_size``: an iteration is one
  epoch; for every batch its sites are refined without damping, then one Adam step on the
  ``N / |batch|``-scaled gradient);
* **failure policy**: a ``NumericalError`` in a step restores the last good state (sites and
  hyper-parameters), halves the damping and every learning rate and goes on; more than
  ``max_failures`` failures, or a failure in the first full-batch step, end the fit with the
  error and its context (method, iteration, quantity);
* **divergence** (full batch): when the objective has stayed below its best value for
  ``patience`` iterations, the best state is restored and the damping and steps are halved;
* **reporting** through ``IterationReporter``: ``elapsed`` is training time (the callback's time
  left out), the time budget, and stop requests (early stopping) end the fit after the
  iteration reported.

Array backends (``gpinfer.backend``): the loop is backend-blind. The sites hold their state and
the prepared batch's inputs (``SiteApproximation.batch_inputs``) on their backend; the
hyper-parameter vector lives where the inducing inputs live, and so do the optimisers' states;
non-finite values there are caught as on the host and trigger the same back-off. A step runs
inside one ``ops.deferred_checks`` context: the sites' checks, the objective and the site
change (device values) and the gradient's finiteness are read in one transfer at the step's
end, before the optimiser step and before any snapshot, so a failed check restores the last
good state exactly as an immediate one would (the outer schedule reads the change per sweep).
On a device Kuu's Cholesky is checked in that read too (``ops.deferred_checks(redo=True)``):
the sites' state before the step is kept (``SiteApproximation.snapshot``; a full-batch step
reuses the state the loop keeps after every iteration, no second copy), and when the read
shows a failed factorisation the step is redone from it with the factorisation checked at once
(its jitter escalation on the host), so every step gives what an immediate check gives.
Mini-batch training runs on ``gpinfer.training.minibatch.MiniBatchSchedule`` (the batch order,
the epochs, the windows of ``Schedule.read_every = k`` steps read once on a device and replayed
one read per step when the read shows a failure, the report and the stop request); the loop
hands it its step (``_SiteBatchSteps``: sites, objective and gradient, Adam), the state a
window's replay restores (sites, hyper-parameters, Adam's moments) and the epoch's report.
numpy reads every step at once, whatever ``k``.

Compiled steps (``compile_mode``, torch only, checked before training by
``gpinfer.backend.compile.check_compile``): the step's computation and the optimiser update
run inside ``compiling(mode)``, where their tensor regions (kernel covariances and VJPs, site
algebra, matrix gradients, Adam) run ``torch.compile``d. Shapes stay fixed: a compiled
mini-batch fit drops each epoch's last, short batch (``MiniBatches(drop_last=True)``; a
warning names the ``N mod B`` points) instead of compiling a second shape.

Optimiser coordinates: ``coordinates`` ``d [P]`` lets the optimiser act on ``xi = d * theta``
(gradient ``g / d``); ep/sep step in the log of the *squared* length-scale as the paper does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.compile import compiling
from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Array, FitCallback, Problem, Scalar, SiteApproximation
from gpinfer.kernels.checks import checked_inputs
from gpinfer.optim.adam import Adam
from gpinfer.optim.sign_adaptive import SignAdaptiveAscent
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.training.distributed import Group, attempt
from gpinfer.training.inner import InnerSchedule
from gpinfer.training.minibatch import BatchSteps, MiniBatchSchedule, Payload, Read

#: the full-batch schedules (mini-batch training is chosen by ``Problem.batch_size``)
SCHEDULES = ("inner", "outer")


@dataclass(frozen=True)
class Schedule:
    """How the loop alternates site updates and hyper-parameter steps (see the module doc)."""

    kind: str = "inner"
    damping: float = 0.5
    damping_decay: float = 0.99
    outer_tol: float = 1e-3
    outer_max_sweeps: int = 1000
    learning_rate: float = 0.01
    adam_learning_rate: float = 0.001
    patience: int = 20
    max_failures: int = 30
    read_every: int = 1

    def check(self, owner: str, minibatch: bool) -> Schedule:
        """``self``, or an ``InputError`` naming ``owner`` and the bad setting."""
        if self.kind not in SCHEDULES:
            raise InputError(f"{owner}: schedule must be one of {list(SCHEDULES)}, got "
                             f"{self.kind!r}")
        if minibatch and self.kind != "inner":
            raise InputError(f"{owner}: mini-batch training uses the inner schedule only")
        if int(self.read_every) != self.read_every or self.read_every < 1:
            raise InputError(f"{owner}: read_every must be an integer >= 1, got "
                             f"{self.read_every!r}")
        if self.read_every > 1 and not minibatch:
            raise InputError(f"{owner}: read_every > 1 applies to mini-batch training only "
                             "(full-batch iterations read every step)")
        return self


class TrainingLoop:
    """One fit of a ``SiteApproximation``: the schedule, the failure policy, reporting.

    ``X [N, D]`` the training inputs (the kernels' vector-Jacobian products need them),
    ``coordinates [P]`` the optimiser's scaling of ``hp.pack()`` (None: 1), ``n_jobs`` threads
    for the per-latent kernel VJPs, ``compile_mode`` the ``compile`` option (already checked:
    ``check_compile``). After ``run``: ``iteration``, ``value`` (the last objective),
    ``failures``, ``damping_raises``, ``rho`` (the damping), ``history``.
    """

    def __init__(self, name: str, problem: Problem, sites: SiteApproximation,
                 hp: HyperParameters, X: Array, schedule: Schedule,
                 callback: FitCallback | None = None, *, time_limit_s: float | None = None,
                 coordinates: Array | None = None, n_jobs: int = 1,
                 compile_mode: str = "none", group: Group | None = None):
        self.name = name
        self.problem, self.sites, self.hp, self.X = problem, sites, hp, X
        self.schedule = schedule.check(name, problem.batch_size is not None)
        self.reporter = IterationReporter(callback, name, time_limit_s)
        self.history = self.reporter.history
        self.coord = np.ones(hp.size) if coordinates is None else np.asarray(coordinates, float)
        self._coord_on: Array = self.coord
        self._coord_part: Array | None = None  # ``_scaled_coordinates``
        # the entries with a scale other than 1, as one range (x * 1 and x / 1 are x exactly,
        # so the others are left alone: P can be millions, the scaled entries few)
        scaled = np.flatnonzero(self.coord != 1.0)
        self._scaled = slice(int(scaled[0]), int(scaled[-1]) + 1) if scaled.size else slice(0, 0)
        #: the vector the last optimiser step handed to ``hp.unpack(owned=True)``: the next
        #: step packs into it while ``hp`` still holds it (``HyperParameters.pack(reuse=)``;
        #: on the host: no new ``[P]`` array per step)
        self._theta: Array | None = None
        #: the last step's gradient ``[P]``: read by its optimiser step only (sign-adaptive
        #: keeps a copy), so the next step's gradient may be written into it
        #: (``HyperParameters.gradient(out=)``; on the host: no new ``[P]`` array per step)
        self._grad: Array | None = None
        self.n_jobs = n_jobs
        self.compile_mode = compile_mode
        #: the data-parallel process group (``None``: one process): the sites take this rank's
        #: points of each batch, and the objective and gradient are averaged over the ranks
        self.group = group
        self.iteration = 0
        self.failures = 0
        self.damping_raises = 0
        self.rho = float(schedule.damping)
        self.value = float("nan")
        self._since_best = 0
        self.best_value = -np.inf
        self.best: tuple[object, Array] | None = None
        #: steps redone after a deferred Kuu factorisation failed (``ops.RedoStep``)
        self.redone = 0
        self._on_device: bool | None = None  # known after the first step (from its gradient)
        #: a snapshot the sites equal now (kept or restored), None after a step moved them
        self._sites_now: object | None = None

    # -- state -------------------------------------------------------------------------------
    def _state(self) -> tuple[object, Array]:
        """``(sites snapshot, hyper-parameters)``: what a back-off or a report restores."""
        self._sites_now = self.sites.snapshot()
        return self._sites_now, self.hp.pack()

    def _restore(self, pair: tuple[object, Array]) -> None:
        self.sites.restore(pair[0])
        self._sites_now = pair[0]
        if self.hp.size:
            self.hp.unpack(pair[1])

    def posterior_at(self, pair: tuple[object, Array]) -> Callable[[], Posterior]:
        """A zero-argument builder of the posterior at ``pair`` (later steps do not leak in)."""

        def build() -> Posterior:
            current = self._state()
            self._restore(pair)
            try:
                return self.sites.posterior()
            finally:
                self._restore(current)

        return build

    # -- one step ----------------------------------------------------------------------------
    def _coordinates(self, theta: Array) -> Array:
        """``coordinates [P]`` where ``theta`` lives (moved to a backend device once)."""
        if not ops.holds_like(self._coord_on, theta):
            self._coord_on = ops.like(theta, self.coord)
            self._coord_part = None
        return self._coord_on

    def _scaled_coordinates(self, theta: Array) -> Array:
        """``coordinates[part]`` of the scaled entries, where ``theta`` lives (kept: a view
        of ``_coordinates``, sliced once)."""
        coord = self._coordinates(theta)
        if self._coord_part is None:
            self._coord_part = coord[self._scaled]
        return self._coord_part

    def _scaled_theta(self) -> Array:
        """``coordinates * theta`` (what the optimisers step on)."""
        theta = self.hp.pack()
        return theta * self._coordinates(theta)

    def _ascend(self, opt: SignAdaptiveAscent | Adam, grad: Array) -> None:
        """One optimiser step in the scaled coordinates from the current hyper-parameters
        (``grad`` is scaled in place)."""
        if self.hp.size:  # in place on arrays this step owns: P can be millions
            with compiling(self.compile_mode):
                theta = self.hp.pack(reuse=self._theta)
                part = self._scaled
                coord = self._scaled_coordinates(theta)
                # on views (``x[part] *= c`` would also write the result back onto itself:
                # one more slice and copy on a device)
                theta_part, grad_part = theta[part], grad[part]
                theta_part *= coord
                grad_part /= coord
                xi = (opt.step_into(theta, grad) if isinstance(opt, Adam)
                      else opt.step(theta, grad))
                # Adam writes into theta: its view is xi's (no second slice)
                xi_part = theta_part if xi is theta else xi[part]
                xi_part /= coord
                self.hp.unpack(xi, owned=True)
                self._theta = xi

    def _step(self, batch: Array, rho: float) -> tuple[float, Array, float]:
        """Refine the sites of ``batch``, then the objective and its gradient on ``batch``, read
        at the step's end (inputs' values checked once, before training: see
        ``checked_inputs``). On a device a failed Kuu factorisation shows in that read: the
        step is then redone from the sites' state before it with the factorisation checked at
        once (see the module doc)."""
        with checked_inputs():
            before = None  # a full-batch step starts from a kept state: no new copy
            if self._on_device:
                before = self._sites_now if self._sites_now is not None else self.sites.snapshot()
            self._sites_now = None  # the step moves the sites
            try:
                return self._read_step(batch, rho, redo=before is not None)
            except ops.RedoStep:
                self.sites.restore(before)
                self.redone += 1
                return self._read_step(batch, rho, redo=False)

    def _read_step(self, batch: Array, rho: float, redo: bool) -> tuple[float, Array, float]:
        """One step in its own ``deferred_checks`` context, read once at its end."""
        with ops.deferred_checks(redo) as checks:  # on a device: one read, at the step's end
            unread, grad, unread_change = self._unread_step(batch, rho, checks)
            value, change = checks.flush(unread, unread_change)
            if self._on_device is None:  # the step's checks wait for its read (a device)
                self._on_device = ops.checks_for(grad) is not None
        return value, grad, change

    def _unread_step(self, batch: Array, rho: float, checks: ops.DeferredChecks | None
                     ) -> tuple[Scalar, Array, Scalar]:
        """The step's computation; its objective ``[]``, site change ``[]`` and the gradient's
        finiteness check are left unread in ``checks`` (device values; floats on numpy),
        except that the outer schedule reads the change per sweep. Returns ``(objective,
        gradient [P], change)``."""
        with compiling(self.compile_mode):
            return self._computed_step(batch, rho, checks)

    def _computed_step(self, batch: Array, rho: float, checks: ops.DeferredChecks | None
                       ) -> tuple[Scalar, Array, Scalar]:
        it = self.iteration
        self.sites.prepare(batch, it)
        if self.problem.batch_size is None and self.schedule.kind == "outer":
            assert checks is not None  # full batch: inside ``_read_step``'s context
            flush = checks.flush
            change: Scalar = self._sweeps(rho).run(self.sites, iteration=it,
                                                   read=lambda c: flush(c)[0]).change
        else:
            change = self.sites.update(rho, it)
        scale = self.X.shape[0] / batch.shape[0]
        if self.group is not None:
            value, grad = self._group_objective(scale, it)
        else:
            out = self.sites.objective(scale, it)
            X_batch = self.sites.batch_inputs()
            grad = self.hp.gradient(self.X[batch] if X_batch is None else X_batch,
                                    out.gradients, self.n_jobs, out=self._grad)
            self._grad = grad  # the next step's out: hp.gradient writes a host buffer only
            value = out.value
        ops.require_finite(lambda: NumericalError(
            "non-finite objective or gradient", iteration=it, quantity="objective"),
            value, grad)
        return value, grad, change

    def _group_objective(self, scale: float, it: int) -> tuple[Scalar, Array]:
        """The objective and gradient ``[P]`` of the global batch in the process group: this
        rank's points (the sites' ``batch_inputs``) with the data term weighted
        ``K N / |batch|``, the ranks' values and gradients averaged (the scale-free part,
        equal on every rank, enters once); a failure on any rank raises on every rank
        (``Group.agreed_mean``)."""
        group = cast(Group, self.group)

        def part() -> tuple[Scalar, Array]:
            out = self.sites.objective(group.size * scale, it)
            inputs = self.sites.batch_inputs()
            if inputs is None:
                raise TypeError(f"{self.name}: a data-parallel step needs the sites' inputs "
                                "of this rank's points (batch_inputs)")
            return out.value, self.hp.gradient(inputs, out.gradients, self.n_jobs)

        done, failure = attempt(part)
        value, grad = done if done is not None else (0.0, self.hp.pack() * 0.0)
        return group.agreed_mean(value, grad, failure)

    def _sweeps(self, rho: float) -> InnerSchedule:
        """The ``outer`` schedule's sweeps at damping ``rho``: until the largest site change is
        below ``outer_tol``, at most ``outer_max_sweeps + 1`` (the engine's inner site
        schedule; a failure ends the step, and the loop's failure policy takes it)."""
        return InnerSchedule(tol=float(self.schedule.outer_tol), strict=True, damping=rho,
                             max_updates=int(self.schedule.outer_max_sweeps) + 1)

    # -- failure policy and divergence -------------------------------------------------------
    def _fail(self, err: NumericalError, good: tuple[object, Array],
              opt: SignAdaptiveAscent | Adam) -> None:
        if self.iteration <= 1 and self.failures == 0 and self.problem.batch_size is None:
            raise NumericalError(f"{self.name}: the first update failed: {err}",
                                 iteration=1, quantity=err.quantity) from err
        self.failures += 1
        if self.failures > self.schedule.max_failures:
            raise NumericalError(f"{self.name}: {self.failures} failed updates, last: {err}",
                                 iteration=self.iteration, quantity=err.quantity) from err
        self._back_off(good, opt)

    def _back_off(self, pair: tuple[object, Array], opt: SignAdaptiveAscent | Adam) -> None:
        """Restore ``pair`` and halve the damping and every step."""
        self._restore(pair)
        self.rho *= 0.5
        if isinstance(opt, SignAdaptiveAscent):
            opt.halve()
        else:
            opt.learning_rate *= 0.5

    def _watch(self, value: float, good: tuple[object, Array],
               opt: SignAdaptiveAscent | Adam) -> bool:
        """Track the best objective (``good``: the state that gave ``value``); after
        ``patience`` iterations below it restore the best state and halve the damping and the
        steps. True when it did so."""
        if value > self.best_value:
            self.best_value, self.best, self._since_best = value, good, 0
            return False
        self._since_best += 1
        if self._since_best < int(self.schedule.patience) or self.best is None:
            return False
        self._back_off(self.best, opt)
        self.damping_raises += 1
        self._since_best = 0
        return True

    def _metrics(self, change: float) -> dict[str, float]:
        """An iteration's metrics: damping, failures, damping raises, the site change."""
        return {"damping": self.rho, "failures": float(self.failures),
                "damping_raises": float(self.damping_raises), "site_change": change}

    def _report(self, value: float, change: float, good: tuple[object, Array]) -> None:
        self.reporter.report(self.iteration, value, self.posterior_at(good),
                             self._metrics(change))

    def _more(self) -> bool:
        return self.iteration < int(self.problem.max_iter) and not self.reporter.should_stop()

    # -- schedules ---------------------------------------------------------------------------
    def run(self) -> None:
        """Train to ``problem.max_iter`` iterations, the time budget or a stop request."""
        if self.problem.batch_size is None:
            self._full_batch()
        else:
            self._minibatch(int(self.problem.batch_size))

    def _full_batch(self) -> None:
        batch = np.arange(self.X.shape[0])
        opt = SignAdaptiveAscent(learning_rate=float(self.schedule.learning_rate))
        opt.reset(self._scaled_theta())
        good = self._state()
        while self._more():
            self.iteration += 1
            try:
                value, grad, change = self._step(batch, self.rho)
            except NumericalError as err:
                self._fail(err, good, opt)
                continue
            good = self._state()  # the state that gave ``value``
            diverged = self._watch(value, good, opt)
            self.value = value
            if not diverged:
                self._ascend(opt, grad)
            self._report(value, change, good)
            if not diverged:
                self.rho *= float(self.schedule.damping_decay)

    def _minibatch(self, size: int) -> None:
        N = self.X.shape[0]
        if size > N:
            raise InputError(f"{self.name}: batch_size {size} exceeds the {N} training points")
        opt = Adam(learning_rate=float(self.schedule.adam_learning_rate))
        opt.reset(self._scaled_theta())
        fixed = self.compile_mode != "none"
        if fixed and N % size:
            warnings.warn(f"{self.name}: compile={self.compile_mode!r} keeps shapes fixed: the "
                          f"last {N % size} points of each epoch's shuffled order (N mod "
                          f"batch_size) are dropped from that epoch", UserWarning, stacklevel=2)
        self.rho = 1.0
        schedule = MiniBatchSchedule(N, size, self.problem.rng, self.reporter,
                                     read_every=int(self.schedule.read_every), drop_last=fixed)
        schedule.run(_SiteBatchSteps(self, opt), int(self.problem.max_iter))


class _SiteBatchSteps(BatchSteps):
    """The loop's mini-batch step for ``MiniBatchSchedule``: the batch's sites refined without
    damping, the ``N / |batch|``-scaled objective and gradient, one Adam step; an iteration is
    an epoch, reported with the sites' state at its end."""

    reads_lone_steps = True  # ``TrainingLoop._step``: one read, a Kuu redo from the sites only

    def __init__(self, loop: TrainingLoop, opt: Adam):
        self.loop, self.opt = loop, opt
        self.good = loop._state()  # per epoch: snapshots cost O(state)

    def on_device(self) -> bool | None:
        return self.loop._on_device

    def step(self, batch: Array | None, iteration: int, index: int) -> tuple[Scalar, ...]:
        assert batch is not None  # the loop's mini-batches are never the full batch
        loop = self.loop
        loop.iteration, loop._sites_now = iteration, None
        with checked_inputs():
            value, grad, change = loop._unread_step(batch, loop.rho, ops.pending_checks())
        loop._ascend(self.opt, grad)  # unchecked: a failure replays the window
        return value, change

    def read_step(self, batch: Array | None, iteration: int, index: int) -> Read | None:
        """``TrainingLoop._step`` and the Adam step; a failure backs off to the epoch's start
        (``TrainingLoop._fail``)."""
        assert batch is not None
        loop = self.loop
        loop.iteration = iteration
        try:
            value, grad, change = loop._step(batch, loop.rho)
        except NumericalError as err:
            loop._fail(err, self.good, self.opt)
            return None
        loop._ascend(self.opt, grad)
        return value, change

    def save(self) -> object:
        loop = self.loop
        saved = (loop.sites.snapshot(), loop.hp.pack(), self.opt.snapshot())
        loop._sites_now = None
        return saved

    def load(self, saved: object) -> None:
        sites, theta, moments = cast(tuple[object, Array, tuple[int, Array, Array]], saved)
        self.loop._restore((sites, theta))
        self.opt.restore(moments)

    def payload(self, iteration: int, reads: list[Read], steps: int) -> Payload:
        loop = self.loop
        loop.sites.end_epoch()
        if reads:
            loop.value = float(np.mean([r[0] for r in reads]))
        self.good = loop._state()
        change = max([0.0, *(r[1] for r in reads)])
        return loop.value, loop.posterior_at(self.good), loop._metrics(change)
