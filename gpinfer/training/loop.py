"""The core training loop of the site methods: sites refined by damped moment matching,
hyper-parameters by a gradient step, in one of three schedules.

A method supplies a ``SiteApproximation`` (``gpinfer.interfaces``: its sites, their update, the
objective they define with its matrix gradients, snapshots, the posterior) and the
``HyperParameters`` of its kernels and inducing inputs; ``TrainingLoop`` does the rest:

* **schedules** (``Schedule``): ``inner`` (full batch: one damped parallel site sweep, then one
  sign-adaptive ascent step on the hyper-parameters; the damping decays by ``damping_decay``
  per iteration), ``outer`` (full batch: sweeps until the largest site change is below
  ``outer_tol``, then one step) and mini-batch (``problem.batch_size``: an iteration is one
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

Optimiser coordinates: ``coordinates`` ``d [P]`` lets the optimiser act on ``xi = d * theta``
(gradient ``g / d``); ep/sep step in the log of the *squared* length-scale as the paper does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpinfer.backend import ops
from gpinfer.data.minibatch import MiniBatches
from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Array, FitCallback, Problem, SiteApproximation
from gpinfer.kernels.checks import checked_inputs
from gpinfer.optim.adam import Adam
from gpinfer.optim.sign_adaptive import SignAdaptiveAscent
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter

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

    def check(self, owner: str, minibatch: bool) -> Schedule:
        """``self``, or an ``InputError`` naming ``owner`` and the bad setting."""
        if self.kind not in SCHEDULES:
            raise InputError(f"{owner}: schedule must be one of {list(SCHEDULES)}, got "
                             f"{self.kind!r}")
        if minibatch and self.kind != "inner":
            raise InputError(f"{owner}: mini-batch training uses the inner schedule only")
        return self


class TrainingLoop:
    """One fit of a ``SiteApproximation``: the schedule, the failure policy, reporting.

    ``X [N, D]`` the training inputs (the kernels' vector-Jacobian products need them),
    ``coordinates [P]`` the optimiser's scaling of ``hp.pack()`` (None: 1), ``n_jobs`` threads
    for the per-latent kernel VJPs. After ``run``: ``iteration``, ``value`` (the last objective),
    ``failures``, ``damping_raises``, ``rho`` (the damping), ``history``.
    """

    def __init__(self, name: str, problem: Problem, sites: SiteApproximation,
                 hp: HyperParameters, X: Array, schedule: Schedule,
                 callback: FitCallback | None = None, *, time_limit_s: float | None = None,
                 coordinates: Array | None = None, n_jobs: int = 1):
        self.name = name
        self.problem, self.sites, self.hp, self.X = problem, sites, hp, X
        self.schedule = schedule.check(name, problem.batch_size is not None)
        self.reporter = IterationReporter(callback, name, time_limit_s)
        self.history = self.reporter.history
        self.coord = np.ones(hp.size) if coordinates is None else np.asarray(coordinates, float)
        self._coord_on: Array = self.coord
        # the entries with a scale other than 1, as one range (x * 1 and x / 1 are x exactly,
        # so the others are left alone: P can be millions, the scaled entries few)
        scaled = np.flatnonzero(self.coord != 1.0)
        self._scaled = slice(int(scaled[0]), int(scaled[-1]) + 1) if scaled.size else slice(0, 0)
        self.n_jobs = n_jobs
        self.iteration = 0
        self.failures = 0
        self.damping_raises = 0
        self.rho = float(schedule.damping)
        self.value = float("nan")
        self._since_best = 0
        self.best_value = -np.inf
        self.best: tuple[object, Array] | None = None

    # -- state -------------------------------------------------------------------------------
    def _state(self) -> tuple[object, Array]:
        """``(sites snapshot, hyper-parameters)``: what a back-off or a report restores."""
        return self.sites.snapshot(), self.hp.pack()

    def _restore(self, pair: tuple[object, Array]) -> None:
        self.sites.restore(pair[0])
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
        if type(self._coord_on) is not type(theta):
            self._coord_on = ops.like(theta, self.coord)
        return self._coord_on

    def _scaled_theta(self) -> Array:
        """``coordinates * theta`` (what the optimisers step on)."""
        theta = self.hp.pack()
        return theta * self._coordinates(theta)

    def _ascend(self, opt: SignAdaptiveAscent | Adam, grad: Array) -> None:
        """One optimiser step in the scaled coordinates from the current hyper-parameters
        (``grad`` is scaled in place)."""
        if self.hp.size:  # in place on arrays this step owns: P can be millions
            theta = self.hp.pack()
            part = self._scaled
            coord = self._coordinates(theta)[part]
            theta[part] *= coord
            grad[part] /= coord
            xi = opt.step_into(theta, grad) if isinstance(opt, Adam) else opt.step(theta, grad)
            xi[part] /= coord
            self.hp.unpack(xi, owned=True)

    def _step(self, batch: Array, rho: float) -> tuple[float, Array, float]:
        """Refine the sites of ``batch``, then the objective and its gradient on ``batch``
        (inputs' values checked once, before training: see ``checked_inputs``)."""
        with checked_inputs():
            return self._checked_step(batch, rho)

    def _checked_step(self, batch: Array, rho: float) -> tuple[float, Array, float]:
        it = self.iteration
        with ops.deferred_checks() as checks:  # on a device: one read, at the step's end
            self.sites.prepare(batch, it)
            change = self.sites.update(rho, it)
            if self.problem.batch_size is None and self.schedule.kind == "outer":
                for _ in range(int(self.schedule.outer_max_sweeps)):
                    change = checks.flush(change)[0]
                    if change < self.schedule.outer_tol:
                        break
                    change = self.sites.update(rho, it)
            scale = self.X.shape[0] / batch.shape[0]
            out = self.sites.objective(scale, it)
            X_batch = self.sites.batch_inputs()
            grad = self.hp.gradient(self.X[batch] if X_batch is None else X_batch,
                                    out.gradients, self.n_jobs)
            ops.require_finite(lambda: NumericalError(
                "non-finite objective or gradient", iteration=it, quantity="objective"),
                out.value, grad)
            value, change = checks.flush(out.value, change)
        return value, grad, change

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

    def _report(self, value: float, change: float, good: tuple[object, Array]) -> None:
        extra = {"damping": self.rho, "failures": float(self.failures),
                 "damping_raises": float(self.damping_raises), "site_change": change}
        self.reporter.report(self.iteration, value, self.posterior_at(good), extra)

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
        batches = MiniBatches(N, size, self.problem.rng)
        self.rho = 1.0
        good = self._state()  # per epoch: snapshots cost O(state)
        while self._more():
            self.iteration += 1
            values, change = [], 0.0
            for batch in batches:
                try:
                    value, grad, ch = self._step(batch, self.rho)
                except NumericalError as err:
                    self._fail(err, good, opt)
                    continue
                values.append(value)
                change = max(change, ch)
                self._ascend(opt, grad)
                if self.reporter.out_of_time():
                    break
            self.sites.end_epoch()
            self.value = float(np.mean(values)) if values else self.value
            good = self._state()
            self._report(self.value, change, good)
