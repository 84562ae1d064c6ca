"""Sparse multi-class EP and SEP (Villacampa-Calvo & Hernandez-Lobato 2017; spec ep-sep §2).

One training loop serves both methods; they differ only in their site state (``RankOneSites``
for EP, ``TiedSites`` for SEP). Batch mode (``batch_size`` None, spec §2.8.1): an iteration is one
parallel damped sweep over all factors plus one sign-adaptive ascent step on the hyper-parameters
(``schedule="inner"``), or EP to convergence then one step (``schedule="outer"``). Mini-batch
mode (§2.8.3-2.8.4): an iteration is one epoch; for every batch its sites are refined
(no damping), then one Adam step on the ``N/|batch|``-scaled gradient.

Failure policy (§2.5.4): a non-finite site, an invalid cavity or a failed Cholesky restores the
last good state (sites and hyper-parameters), halves the damping and every learning rate and
retries. Divergence (batch mode): when log Z_q has stayed below its best value for ``patience``
iterations, the state with the best log Z_q is restored and the damping and every learning rate
are halved. (The sign-adaptive steps grow by 2 % an iteration up to 1 in log units; once they
overshoot, log Z_q falls and oscillates, which a count of *consecutive* falls misses: waveform,
M = 5 %, climbed to -98.4 at iteration 212 and fell to -108.7 by 250 without two dozen falls in
a row.) Both are reported in ``IterationInfo.extra`` (``failures``, ``damping_raises``,
``damping``).

Optimiser coordinates (spec §2.9): the paper steps in ``log l`` with ``l = ell^2`` the *squared*
length-scale, while the kernels' unconstrained parameter is ``log ell``. Both optimisers therefore
act on ``xi = d * theta`` with ``d = 2`` for length-scale entries (1 elsewhere) and gradient
``g / d``; in ``log ell`` units a sign-adaptive step is a quarter (an Adam step half) of what it
would be in the kernels' own coordinates.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gpinfer.data.minibatch import MiniBatches
from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Array, FitCallback, FitResult, Method, Problem
from gpinfer.optim.adam import Adam
from gpinfer.optim.sign_adaptive import SignAdaptiveAscent
from gpinfer.parallel import blas_threads_for, check_n_jobs
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter
from gpinfer_ep.model import all_terms, check_likelihood, class_kernels, initial_inducing
from gpinfer_ep.state import RankOneSites, TiedSites

#: failed updates tolerated in one fit before giving up
MAX_FAILURES = 30


class _SparseEPBase(Method):
    """Shared options and loop of ``ep`` and ``sep``.

    Options: ``damping`` (initial rho, batch mode), ``damping_decay`` (per iteration),
    ``learning_rate`` (initial sign-adaptive step), ``adam_learning_rate`` (mini-batch),
    ``schedule`` (``"inner"``/``"outer"``), ``outer_tol``/``outer_max_sweeps``, ``noise``
    (white-noise variance added to the kernel if it has none; None: none), ``noise_in_Kuu``
    (spec P10; True: the noise is on ``diag Kuu`` and in ``kappa``; False: in ``kappa``, i.e. the
    FITC variances, only, via ``LatentNoise``), ``lengthscale_init``
    (``"median"``: spec §2.11 heuristic; ``"kernel"``: keep), ``patience`` (iterations below
    the best log Z_q before the best state is restored and the damping and steps are halved),
    ``time_limit_s`` (stop after this much training time; the callback's time, where test
    metrics are computed, is not counted, nor is it in ``elapsed``), ``n_jobs`` (threads for the
    per-class algebra, ``gpinfer.parallel``: same results; BLAS is held to one thread meanwhile).
    """

    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = True
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("argmax",)
    default_options: ClassVar[dict[str, Any]] = {
        "damping": 0.5,
        "damping_decay": 0.99,
        "learning_rate": 0.01,
        "adam_learning_rate": 0.001,
        "schedule": "inner",
        "outer_tol": 1e-3,
        "outer_max_sweeps": 1000,
        "noise": 1.0,
        "noise_in_Kuu": True,
        "lengthscale_init": "median",
        "patience": 20,
        "time_limit_s": None,
        "n_jobs": 1,
    }

    def make_state(self, y: Array, C: int, M: int, n_jobs: int) -> RankOneSites | TiedSites:
        raise NotImplementedError

    # -- entry point -------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        check_likelihood(problem, self.name)
        if self.options["schedule"] not in ("inner", "outer"):
            raise InputError(f"{self.name}: schedule must be 'inner' or 'outer'")
        if problem.batch_size is not None and self.options["schedule"] != "inner":
            raise InputError(f"{self.name}: mini-batch training uses the inner schedule only")
        X, y = np.asarray(problem.X, dtype=float), np.asarray(problem.y, dtype=np.int64)
        kernels = class_kernels(problem, self.options["noise"], self.options["lengthscale_init"],
                                self.options["noise_in_Kuu"])
        Zs = initial_inducing(problem, self.name)
        hp = HyperParameters(kernels, Z=Zs, optimize=problem.optimize)
        n_jobs = check_n_jobs(self.options["n_jobs"], f"{self.name} option n_jobs")
        state = self.make_state(y, problem.n_classes, Zs[0].shape[0], n_jobs)
        run = _Run(self, problem, X, kernels, hp, state, callback)
        with blas_threads_for(n_jobs):
            if problem.batch_size is None:
                run.batch()
            else:
                run.minibatch(int(problem.batch_size))
        posterior = run.posterior()
        return FitResult(
            posterior=posterior,
            log_evidence=run.value,
            kernel=kernels,
            n_iter=run.iteration,
            history=run.history,
            state={**posterior.state(), "theta": hp.pack(),
                   "failures": np.array(run.failures), "damping": np.array(run.rho)},
        )


class _Run:
    """One fit: the loop, the failure policy, reporting."""

    def __init__(self, method: _SparseEPBase, problem: Problem, X: Array, kernels, hp,
                 state, callback: FitCallback | None):
        self.opts = method.options
        self.name = method.name
        self.problem, self.X, self.kernels, self.hp, self.state = problem, X, kernels, hp, state
        self.reporter = IterationReporter(callback, method.name)  # training-only clock
        self.history = self.reporter.history
        self.iteration = 0
        self.failures = 0
        self.damping_raises = 0
        self.rho = float(self.opts["damping"])
        self.value = float("nan")
        self._since_best = 0
        self.best_value = -np.inf
        self.best: tuple[object, Array] | None = None  # (sites, hyper-parameters) of best_value
        self.coord = self._coordinates()

    # -- optimiser coordinates (spec §2.9: log of the squared length-scale) ------------------
    def _coordinates(self) -> Array:
        """``d [P]``: 2 for length-scale entries, 1 elsewhere (``xi = d * theta``)."""
        return np.array([2.0 if "lengthscale" in name else 1.0
                         for name in self.hp.names])

    def _to_paper(self, theta: Array) -> Array:
        return theta * self.coord

    def _set_from_paper(self, xi: Array) -> None:
        self.hp.unpack(xi / self.coord)

    def _ascend(self, opt, grad: Array) -> None:
        """One optimiser step in the paper's coordinates from the current hyper-parameters."""
        if self.hp.size:
            self._set_from_paper(opt.step(self._to_paper(self.hp.pack()), grad / self.coord))

    # -- helpers -----------------------------------------------------------------------------
    def _step_sites(self, idx: Array, rho: float, it: int) -> tuple[float, Array, float]:
        """Refine the sites of ``idx``, then objective and gradient on ``idx``."""
        Zs = self.hp.Z
        Xb = self.X[idx]
        n_jobs = self.state.n_jobs
        terms = all_terms(self.kernels, Zs, Xb, iteration=it, n_jobs=n_jobs)
        change = self.state.update(terms, idx, rho, iteration=it)
        if self.problem.batch_size is None and self.opts["schedule"] == "outer":
            for _ in range(int(self.opts["outer_max_sweeps"])):
                if change < self.opts["outer_tol"]:
                    break
                change = self.state.update(terms, idx, rho, iteration=it)
        scale = self.X.shape[0] / idx.shape[0]
        value, grads = self.state.evaluate(terms, idx, scale, iteration=it)
        grad = self.hp.gradient(Xb, grads, n_jobs)
        if not np.isfinite(value) or not np.all(np.isfinite(grad)):
            raise NumericalError("non-finite log Z_q or gradient", iteration=it,
                                 quantity="log Z_q")
        return value, grad, change

    def _fail(self, err: NumericalError, good: tuple[object, Array], optimizer) -> None:
        if self.iteration <= 1 and self.failures == 0 and self.problem.batch_size is None:
            raise NumericalError(f"{self.name}: the first EP update failed: {err}",
                                 iteration=1, quantity=err.quantity) from err
        self.failures += 1
        if self.failures > MAX_FAILURES:
            raise NumericalError(f"{self.name}: {self.failures} failed updates, last: {err}",
                                 iteration=self.iteration, quantity=err.quantity) from err
        self._back_off(good, optimizer)

    def _back_off(self, pair: tuple[object, Array], optimizer) -> None:
        """Restore ``(sites, hyper-parameters)`` and halve the damping and every step."""
        self.state.restore(pair[0])
        if self.hp.size:
            self.hp.unpack(pair[1])
        self.rho *= 0.5
        if isinstance(optimizer, SignAdaptiveAscent):
            optimizer.halve()
        else:
            optimizer.learning_rate *= 0.5

    def _watch(self, value: float, good: tuple[object, Array],
               optimizer: SignAdaptiveAscent) -> bool:
        """Track the best log Z_q (``good``: the sites and hyper-parameters that gave
        ``value``); after ``patience`` iterations below it restore the best state and halve the
        damping and the steps. True when it did so."""
        if value > self.best_value:
            self.best_value, self.best, self._since_best = value, good, 0
            return False
        self._since_best += 1
        if self._since_best < int(self.opts["patience"]):
            return False
        self._back_off(self.best, optimizer)
        self.damping_raises += 1
        self._since_best = 0
        return True

    def _report(self, value: float, change: float, good: tuple[object, Array]) -> None:
        """Report ``value``; ``good``: the (sites, hyper-parameters) the posterior is built at."""
        extra = {"damping": self.rho, "failures": float(self.failures),
                 "damping_raises": float(self.damping_raises), "site_change": change}
        self.reporter.report(self.iteration, value, self._posterior_at(good), extra)

    def _posterior_at(self, pair: tuple[object, Array]):
        """A zero-argument builder of the posterior at ``pair`` (later steps do not leak in)."""

        def build() -> InducingPosterior:
            current = (self.state.snapshot(), self.hp.pack())
            self.state.restore(pair[0])
            self.hp.unpack(pair[1])
            try:
                return self.posterior()
            finally:
                self.state.restore(current[0])
                self.hp.unpack(current[1])

        return build

    def _out_of_time(self) -> bool:
        limit = self.opts["time_limit_s"]
        return limit is not None and self.reporter.elapsed() > float(limit)

    # -- loops -------------------------------------------------------------------------------
    def batch(self) -> None:
        idx = np.arange(self.X.shape[0])
        opt = SignAdaptiveAscent(learning_rate=float(self.opts["learning_rate"]))
        opt.reset(self._to_paper(self.hp.pack()))
        good = (self.state.snapshot(), self.hp.pack())
        while self.iteration < int(self.problem.max_iter) and not self._out_of_time():
            self.iteration += 1
            try:
                value, grad, change = self._step_sites(idx, self.rho, self.iteration)
            except NumericalError as err:
                self._fail(err, good, opt)
                continue
            good = (self.state.snapshot(), self.hp.pack())  # the pair that gave ``value``
            diverged = self._watch(value, good, opt)
            self.value = value
            if diverged:
                self._report(value, change, good)
                continue
            self._ascend(opt, grad)
            self._report(value, change, good)
            self.rho *= float(self.opts["damping_decay"])

    def minibatch(self, size: int) -> None:
        N = self.X.shape[0]
        if size > N:
            raise InputError(f"{self.name}: batch_size {size} exceeds the {N} training points")
        opt = Adam(learning_rate=float(self.opts["adam_learning_rate"]))
        opt.reset(self._to_paper(self.hp.pack()))
        batches = MiniBatches(N, size, self.problem.rng)
        self.rho = 1.0
        good = (self.state.snapshot(), self.hp.pack())  # per epoch: snapshots cost O(state)
        while self.iteration < int(self.problem.max_iter) and not self._out_of_time():
            self.iteration += 1
            values, change = [], 0.0
            for idx in batches:
                try:
                    value, grad, ch = self._step_sites(idx, self.rho, self.iteration)
                except NumericalError as err:
                    self._fail(err, good, opt)
                    continue
                values.append(value)
                change = max(change, ch)
                self._ascend(opt, grad)
                if self._out_of_time():
                    break
            if hasattr(self.state, "refresh"):
                self.state.refresh()
            self.value = float(np.mean(values)) if values else self.value
            good = (self.state.snapshot(), self.hp.pack())
            self._report(self.value, change, good)

    # -- prediction --------------------------------------------------------------------------
    def posterior(self) -> InducingPosterior:
        Zs = self.hp.Z
        terms = all_terms(self.kernels, Zs, self.X[:1])
        m, S = [], []
        for q, t in zip(self.state.gaussians(terms), terms):
            mc, Vc = q.moments(t.L)
            m.append(mc)
            S.append(Vc)
        return InducingPosterior(self.problem.likelihood, [k.copy() for k in self.kernels],
                                 [z.copy() for z in Zs], m, S)


class EP(_SparseEPBase):
    """Sparse multi-class EP: one rank-one site per (point, non-label class) pair and role;
    memory ``O(N M C)`` (spec §2)."""

    name: ClassVar[str] = "ep"

    def make_state(self, y: Array, C: int, M: int, n_jobs: int) -> RankOneSites:
        return RankOneSites(y, C, M, n_jobs=n_jobs)


class SEP(_SparseEPBase):
    """Stochastic EP: sites tied per class, memory ``O(C M^2)`` whatever ``N`` (spec §2.3.1)."""

    name: ClassVar[str] = "sep"

    def make_state(self, y: Array, C: int, M: int, n_jobs: int) -> TiedSites:
        return TiedSites(y, C, M, n_jobs=n_jobs)
