"""The ``pep`` method and its aliases ``fitc`` (alpha = 1) and ``vfe`` (alpha = 0).

Regression (Gaussian likelihood): the collapsed closed form (spec power-ep §3), maximised by
L-BFGS-B over kernel log-parameters, inducing inputs and ``log s2``. Binary classification
(probit, logit): rank-one Power-EP sites (``gpinfer_pep.rank_one``); full-batch training uses
the outer schedule (sites to convergence, warm-started, then one L-BFGS-B step), mini-batch
training the paper's stochastic schedule (``n_sweeps`` parallel sweeps on a batch's sites, then
one Adam step on the batch energy, spec §2.10).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.inducing import initial_inducing
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    MatrixGradients,
    Method,
    Problem,
    Scalar,
    StochasticOptimizer,
    ValueAndGrad,
)
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import median_distance
from gpinfer.likelihoods.gaussian import Gaussian
from gpinfer.numerics.settings import LOG_PARAMETER_BOUNDS
from gpinfer.optim import make_optimizer
from gpinfer.options import Option, choice, custom, flag, integer, real
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites.stacked import StackedTerms
from gpinfer.training.minibatch import (
    BatchSteps,
    MiniBatchSchedule,
    Payload,
    Read,
    check_step,
)
from gpinfer.training.outer import OuterSchedule
from gpinfer.validation import check_binary_labels
from gpinfer_pep.collapsed import CollapsedResult, check_partition, collapsed_pep
from gpinfer_pep.power_tilted import QUADRATURES
from gpinfer_pep.rank_one import (
    SCHEDULES,
    SITE_STEPS,
    RankOnePEPSites,
    WhitenedInducingPosterior,
    kernel_geometry,
)

#: box bounds on the unconstrained (log) parameters, to keep L-BFGS-B line searches sane
_LOG_BOUNDS = LOG_PARAMETER_BOUNDS


def median_lengthscales(kernel: Kernel, X: Array, rule: str, rng: np.random.Generator) -> None:
    """Set every ``lengthscale*`` parameter to the median pairwise distance / 2 (``rule``
    ``"median"``; at most 1000 rows are used)."""
    if rule != "median":
        raise InputError(f"init_lengthscale must be null or 'median'; got {rule!r}")
    value = np.log(max(median_distance(X, rng) / 2.0, 1e-6)) if X.shape[0] > 1 else 0.0
    theta = kernel.get_unconstrained().copy()
    names = kernel.param_names
    idx = [i for i, n in enumerate(names) if n.split(".")[-1].startswith("lengthscale")]
    if not idx:
        raise InputError(f"init_lengthscale='median' needs a kernel with lengthscales; "
                         f"{type(kernel).__name__} has {names}")
    theta[idx] = value
    kernel.set_unconstrained(theta)


def plateaued(values: list[float], window: int, tol: float) -> bool:
    """True once ``values[-1] - values[-1 - window] < tol`` (an objective being maximised)."""
    return len(values) > window and values[-1] - values[-1 - window] < tol


class PowerEP(Method):
    """Power EP with power ``alpha`` in [0, 1]: 0 is VFE, 1 is FITC (regression) / EP.

    Options: ``alpha`` (scalar; 0 is the VFE limit), ``blocks`` (regression only: a partition
    of the training indices for the PITC-like variant), ``schedule`` (parallel, sequential),
    ``damping`` (rho in (0, 1]), ``site_step`` (power, full), ``n_sweeps`` (PEP sweeps per
    mini-batch step), ``max_sweeps`` and ``tol`` (outer schedule: sweeps to convergence),
    ``quadrature`` (trapezoid, gauss-hermite, engine), ``gh_degree``, ``jitter`` (relative to
    the mean diagonal of ``Kuu``), ``learn_inducing``, ``optimizer`` (``None`` or lbfgs:
    L-BFGS-B full batch, Adam with mini-batches; adam / adadelta: that optimiser throughout),
    ``learning_rate`` (Adam), ``max_fun`` (L-BFGS-B evaluations),
    ``epochs`` (mini-batch training: passes over the data; ``None``: ``max_iter`` Adam steps),
    ``init_lengthscale`` (``None``: the kernel's own; ``"median"``: every log-lengthscale set to
    log(median pairwise distance / 2), the reference initialisation, spec §6.5),
    ``converge_step`` (site step when the sites are run to ``tol``: after training and in the
    outer schedule; ``"full"`` (default) reaches the fixed point of the power step, spec
    §2.6, in about ``1 / alpha`` times fewer sweeps; ``None``: the ``site_step`` option),
    ``stop_window`` and ``stop_tol`` (L-BFGS-B: stop once the objective has
    gained less than ``stop_tol`` nats over the last ``stop_window`` iterations (default 0.1
    over 10); ``None``: off, run to ``max_iter``).
    """

    name: ClassVar[str] = "pep"
    tasks: ClassVar[tuple[str, ...]] = ("classification", "regression")
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("probit", "logit", "gaussian")
    option_spec: ClassVar[dict[str, Option]] = {
        "alpha": real(0.5, "[0, 1]", doc="the power (0: VFE, 1: FITC / EP)"),
        "blocks": custom(None, "a list of index lists partitioning the training points",
                         lambda v: isinstance(v, list | tuple), none=True,
                         doc="regression only: PITC-like blocks"),
        "schedule": choice("parallel", SCHEDULES),
        "damping": real(0.5, "(0, 1]", doc="rho"),
        "site_step": choice("power", SITE_STEPS),
        "n_sweeps": integer(10, "[1, inf)", doc="PEP sweeps per mini-batch step"),
        "max_sweeps": integer(500, "[1, inf)", doc="sweeps to convergence per evaluation"),
        "tol": real(1e-4, "(0, inf)", doc="relative site-change tolerance"),
        "quadrature": choice("trapezoid", QUADRATURES),
        "gh_degree": integer(20, "[1, inf)"),
        "jitter": real(1e-8, "[0, inf)", doc="times the mean diagonal of Kuu"),
        "learn_inducing": flag(True),
        "optimizer": choice(None, (None, "lbfgs", "adam", "adadelta"),
                            doc="None: L-BFGS-B full batch, Adam with mini-batches"),
        "learning_rate": real(0.01, "(0, inf)", doc="Adam"),
        "max_fun": integer(2000, "[1, inf)", doc="L-BFGS-B function evaluations"),
        "epochs": integer(None, "[1, inf)", none=True, doc="mini-batch passes over the data"),
        "init_lengthscale": choice(None, (None, "median")),
        "converge_step": choice("full", (None, *SITE_STEPS)),
        "stop_window": integer(10, "[1, inf)", none=True),
        "stop_tol": real(0.1, "[0, inf)", doc="nats over stop_window iterations"),
    }
    #: a fixed power for the aliases (``None``: the ``alpha`` option)
    fixed_alpha: ClassVar[float | None] = None

    @property
    def alpha(self) -> float:
        return float(self.fixed_alpha if self.fixed_alpha is not None else self.options["alpha"])

    @classmethod
    def optimizer_for(cls, options: Mapping[str, Any], batch_size: int | None) -> str:
        """The optimiser ``fit`` runs (``Method.optimizer_for``): the ``optimizer`` option; for
        ``None`` L-BFGS-B on a full batch, and on mini-batches (``batch_size`` set), where
        L-BFGS-B cannot run, Adam for ``None`` and ``"lbfgs"`` alike."""
        name = str(options.get("optimizer") or "lbfgs")
        return "adam" if batch_size is not None and name == "lbfgs" else name

    # -- entry point -------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        X = np.asarray(problem.X, dtype=float)
        kernel = problem.kernel.copy()
        if self.options["init_lengthscale"] is not None:
            median_lengthscales(kernel, X, self.options["init_lengthscale"], problem.rng)
        # k-means with scipy's default 10 Lloyd steps: the starting points of the Bui et al.
        # protocols (benchmarks/pep_*) as they were measured
        Z = initial_inducing(problem.inducing, X, problem.rng, init="kmeans", owner=self.name,
                             kmeans_iterations=10)[0]
        lik = problem.likelihood
        if lik.task == "regression":
            y = np.asarray(problem.y, dtype=float)
            if not np.all(np.isfinite(y)):
                raise InputError("regression targets y contain NaN or inf; clean them first")
            return _Regression(self, problem, X, y, kernel, Z, callback).fit()
        if self.options["blocks"] is not None:
            raise InputError("blocks (the PITC-like variant) are for regression only")
        y = check_binary_labels(problem.y, problem.n_classes, self.name, require_both=True)
        return _Classification(self, problem, X, y, kernel, Z, callback).fit()


class FITC(PowerEP):
    """Power EP at ``alpha = 1``: FITC for regression, sparse EP for classification."""

    name: ClassVar[str] = "fitc"
    option_spec: ClassVar[dict[str, Option]] = {
        k: v for k, v in PowerEP.option_spec.items() if k != "alpha"
    }
    fixed_alpha: ClassVar[float | None] = 1.0


class VFE(PowerEP):
    """Power EP at ``alpha = 0``: Titsias' collapsed bound for regression; for classification
    the Hensman et al. (2015) ELBO with rank-one natural-parameter sites (full site steps)."""

    name: ClassVar[str] = "vfe"
    option_spec: ClassVar[dict[str, Option]] = {
        **{k: v for k, v in PowerEP.option_spec.items() if k != "alpha"},
        "site_step": choice("full", SITE_STEPS, doc="alpha = 0 always takes the full step"),
    }
    fixed_alpha: ClassVar[float | None] = 0.0


# --------------------------------------------------------------------------------------------
# Shared fit book-keeping
# --------------------------------------------------------------------------------------------


class _Fit:
    """One ``fit``: hyper-parameters, history and the callback."""

    def __init__(self, method: PowerEP, problem: Problem, X: Array, y: Array, kernel: Kernel,
                 Z: Array,
                 callback: FitCallback | None):
        self.method, self.problem, self.X, self.y = method, problem, X, y
        self.kernel, self.callback = kernel, callback
        self.opt = method.options
        self.lik = problem.likelihood
        self.reporter = IterationReporter(callback, method.name)  # training-only clock
        self.history = self.reporter.history
        self.hp = HyperParameters(kernel, self.lik, Z, optimize=problem.optimize,
                                  optimize_inducing=bool(self.opt["learn_inducing"]))
        #: energy evaluations and site sweeps so far, and at the last report
        self.work = {"nfev": 0, "sweeps": 0}
        self._reported_work = dict(self.work)

    def work_since_report(self) -> dict[str, float]:
        """Evaluations (``nfev``) and site sweeps (``sweeps``) since the last report."""
        out = {k: float(v - self._reported_work[k]) for k, v in self.work.items()}
        self._reported_work = dict(self.work)
        return out

    @property
    def Z(self) -> Array:
        Z = self.hp.Z
        if Z is None:
            raise ValueError("pep's hyper-parameters hold no inducing inputs")
        return Z[0]

    def snapshot(self) -> Callable[[], Posterior]:
        """A zero-argument callable building the posterior as it is now."""
        raise NotImplementedError

    def bounds(self) -> list[tuple[float | None, float | None]]:
        return self.hp.bounds(kernel=_LOG_BOUNDS, likelihood=_LOG_BOUNDS)

    def geometry(self, X: Array | None = None) -> StackedTerms:
        return kernel_geometry(self.kernel, self.Z, self.X if X is None else X,
                               float(self.opt["jitter"]))

    def report(self, it: int, value: float, posterior: Callable[[], Posterior] | None,
               extra: dict[str, float]) -> bool:
        """Report iteration ``it``; True when the callback asked training to stop."""
        return self.reporter.report(it, value, posterior, extra)

    def maximize_lbfgs(self, fun: ValueAndGrad) -> tuple[int, bool]:
        """The outer schedule over ``theta`` (L-BFGS-B with the box bounds, or the optimiser
        the options name), solving again at its end point; returns (iterations, success)."""
        theta0 = self.hp.pack()
        if theta0.size == 0:
            fun(theta0)
            return 0, True
        name = self.method.optimizer_for(self.opt, None)
        if name == "lbfgs":
            opt = make_optimizer("lbfgs", bounds=self.bounds(), maxfun=int(self.opt["max_fun"]))
            label = "L-BFGS-B"
        else:
            opt = make_optimizer(name, learning_rate=float(self.opt["learning_rate"]))
            label = f"optimizer {name!r}"
        # the report reads the last solve (no re-solve at the accepted iterate); the end point
        # is always solved again (the sites' warm start moves on from there)
        schedule = OuterSchedule(self.method.name, self.on_iteration(), refresh=False,
                                 finish="always", label=label, history=self.history)
        res = schedule.run(opt, fun, theta0, int(self.problem.max_iter))
        return res.n_iter, res.success

    def on_iteration(self) -> Callable[[int, Array, float], bool]:
        window = self.opt["stop_window"]

        def cb(it: int, x: Array, value: float) -> bool:
            self.hp.unpack(x)
            if self.report(it, value, self.snapshot(), self.work_since_report()):
                return True
            return window is not None and plateaued(
                [h["objective"] for h in self.history], int(window), float(self.opt["stop_tol"]))
        return cb


class _Regression(_Fit):
    """Collapsed regression: closed-form energy, gradients, posterior (spec §3)."""

    @property
    def noise(self) -> float:
        """The Gaussian likelihood's noise variance."""
        if not isinstance(self.lik, Gaussian):
            raise InputError(f"pep regression needs the Gaussian likelihood; got "
                             f"{type(self.lik).__name__}")
        return self.lik.variance

    def fit(self) -> FitResult:
        n = self.X.shape[0]
        blocks = self.opt["blocks"]
        self.blocks = None if blocks is None else check_partition(blocks, n)
        a = self.method.alpha
        self.alpha = np.full(n if self.blocks is None else len(self.blocks), a)
        self.last: CollapsedResult | None = None
        n_iter, success = self.maximize_lbfgs(self.evaluate)
        res = self.last
        assert res is not None  # maximize_lbfgs evaluates at least once
        return FitResult(
            posterior=self.snapshot()(), log_evidence=res.value, kernel=self.kernel,
            n_iter=n_iter, history=self.history,
            state={"Z": self.Z.copy(), "gamma": res.gamma, "noise": np.array(self.noise),
                   "alpha": np.array(a), "optimizer_success": np.array(success)},
        )

    def evaluate(self, theta: Array) -> tuple[float, Array]:
        self.work["nfev"] += 1
        self.hp.unpack(theta)
        geo = self.geometry()
        Kbb = None if self.blocks is None else [self.kernel.K(self.X[b]) for b in self.blocks]
        res = collapsed_pep(geo, self.y, self.noise, self.alpha, self.blocks, Kbb)
        self.last = res
        grad = parameter_gradient(self.hp, self.X, res.grads)
        for b, R in zip(self.blocks or [], res.block_grads or []):
            grad += parameter_gradient(self.hp, self.X[b], MatrixGradients(Kff=R))
        return res.value, grad

    def snapshot(self) -> Callable[[], Posterior]:
        res, kernel, Z, lik = self.last, self.kernel.copy(), self.Z.copy(), self.lik
        if res is None:
            raise RuntimeError("pep regression: no energy evaluated yet")
        return lambda: WhitenedInducingPosterior(lik, kernel, Z, res.L, res.L_B, res.gamma)


class _PEPSteps(BatchSteps):
    """pep's step for ``MiniBatchSchedule`` (numpy): ``_Classification.step`` on the batch,
    then one step of the stochastic optimiser, clipped to the box bounds; every step is an
    iteration, reported with its batch energy."""

    def __init__(self, fit: _Classification, opt: StochasticOptimizer):
        self.fit, self.opt = fit, opt
        self.theta = fit.hp.pack()
        opt.reset(self.theta)
        box = np.array(fit.bounds(), dtype=float).T if self.theta.size else np.zeros((2, 0))
        self.lo, self.hi = np.nan_to_num(box[0], nan=-np.inf), np.nan_to_num(box[1], nan=np.inf)

    def step(self, batch: Array | None, iteration: int, index: int) -> tuple[Scalar, ...]:
        assert batch is not None  # pep's stochastic schedule always has batches
        value, grad = self.fit.step(batch)
        check_step(value, grad, index, f"{self.fit.method.name} batch energy")
        if self.theta.size:
            self.theta = np.clip(self.opt.step(self.theta, grad), self.lo, self.hi)
            self.fit.hp.unpack(self.theta)
        return (value,)

    def payload(self, iteration: int, reads: list[Read], steps: int) -> Payload:
        value = reads[-1][0]
        return value, self.fit.snapshot(), {"batch_energy": value}


class _Classification(_Fit):
    """Iterative Power EP with rank-one sites (spec §2, §4)."""

    def fit(self) -> FitResult:
        o = self.opt
        self.sites = RankOnePEPSites(
            self.lik, self.y, self.method.alpha, schedule=o["schedule"], damping=o["damping"],
            site_step=o["site_step"], quadrature=o["quadrature"], gh_degree=o["gh_degree"],
            tol=o["tol"], rng=self.problem.rng,
        )
        self.sites.set_geometry(self.geometry(), self.kernel, self.Z)
        if self.problem.batch_size is None:
            n_iter = self._outer()
        else:
            n_iter = self._stochastic(int(self.problem.batch_size))
        self.sites.set_geometry(self.geometry(), self.kernel.copy(), self.Z.copy())
        self.run_sites()
        value = self.sites.energy(with_gradients=False).value
        if self.sites.skipped:
            warnings.warn(f"{self.method.name}: {self.sites.skipped} site updates skipped "
                          "(improper cavities)", RuntimeWarning, stacklevel=3)
        return FitResult(
            posterior=self.sites.posterior(), log_evidence=value, kernel=self.kernel,
            n_iter=n_iter, history=self.history,
            state={"Z": self.Z.copy(), "tau": self.sites.tau.copy(), "nu": self.sites.nu.copy(),
                   "alpha": np.array(self.method.alpha),
                   "skipped_updates": np.array(self.sites.skipped)},
        )

    def snapshot(self) -> Callable[[], Posterior]:
        post = WhitenedInducingPosterior(self.lik, self.kernel.copy(), self.Z.copy(),
                                         self.sites.geometry.L, self.sites.L_B,
                                         self.sites.gamma.copy())
        return lambda: post

    def run_sites(self) -> int:
        """Sweep all sites to ``tol`` with the ``converge_step`` site step (same fixed point)."""
        step, self.sites.site_step = self.sites.site_step, (self.opt["converge_step"]
                                                            or self.sites.site_step)
        try:
            return self.sites.run(int(self.opt["max_sweeps"]))
        finally:
            self.sites.site_step = step

    def converge(self) -> int:
        """Install the current geometry and run the sites to ``tol`` (warm start)."""
        self.sites.set_geometry(self.geometry(), self.kernel, self.Z)
        sweeps = self.run_sites()
        if not self.sites.converged:
            warnings.warn(f"{self.method.name}: PEP did not converge in {sweeps} sweeps "
                          f"(change {self.sites.last_change:.2g})", RuntimeWarning, stacklevel=3)
        return sweeps

    def evaluate(self, theta: Array) -> tuple[float, Array]:
        self.work["nfev"] += 1
        self.hp.unpack(theta)
        self.work["sweeps"] += self.converge()
        out = self.sites.energy()
        return out.value, parameter_gradient(self.hp, self.X, out.gradients)

    def _outer(self) -> int:
        if self.hp.size == 0:
            sweeps = self.converge()
            value = self.sites.energy(with_gradients=False).value
            self.report(1, value, self.snapshot(), {"sweeps": float(sweeps)})
            return 1
        return self.maximize_lbfgs(self.evaluate)[0]

    def _stochastic(self, batch_size: int) -> int:
        """Mini-batch PEP sweeps interleaved with Adam steps (``max_iter`` steps, or
        ``epochs`` passes over the data)."""
        o, n = self.opt, self.X.shape[0]
        n_steps = int(self.problem.max_iter) if o["epochs"] is None else \
            int(o["epochs"]) * int(np.ceil(n / batch_size))
        name = self.method.optimizer_for(o, batch_size)  # L-BFGS-B takes no mini-batches
        adam = make_optimizer(name, learning_rate=float(o["learning_rate"]))
        if not isinstance(adam, StochasticOptimizer):
            raise InputError(f"{self.method.name}: mini-batches need a stochastic optimiser "
                             f"(adam, adadelta), not {name!r}")
        schedule = MiniBatchSchedule(n, batch_size, self.problem.rng, self.reporter,
                                     steps_per_iteration=1)
        return schedule.run(_PEPSteps(self, adam), n_steps)

    def step(self, batch: Array) -> tuple[float, Array]:
        """Refresh the posterior, ``n_sweeps`` parallel sweeps on ``batch``, batch energy and
        its gradient (spec §2.10)."""
        self.sites.set_geometry(self.geometry(), self.kernel, self.Z)
        for _ in range(int(self.opt["n_sweeps"])):
            self.sites.sweep(batch)
        try:
            out = self.sites.energy(batch)
        except NumericalError as err:
            raise NumericalError(f"{self.method.name}: mini-batch energy: {err}",
                                 quantity=err.quantity) from err
        return out.value, parameter_gradient(self.hp, self.X[batch], out.gradients)
