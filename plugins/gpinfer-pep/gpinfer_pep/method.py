"""The ``pep`` method and its aliases ``fitc`` (alpha = 1) and ``vfe`` (alpha = 0).

Regression (Gaussian likelihood): the collapsed closed form (spec power-ep §3), maximised by
L-BFGS-B over kernel log-parameters, inducing inputs and ``log s2``. Binary classification
(probit, logit): rank-one Power-EP sites (``gpinfer.sites.rank_one``); full-batch training uses
the outer schedule (sites to convergence, warm-started, then one L-BFGS-B step), mini-batch
training the paper's stochastic schedule (``n_sweeps`` parallel sweeps on a batch's sites, then
one Adam step on the batch energy, spec §2.10).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, ClassVar

import numpy as np
from scipy.cluster.vq import kmeans2

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    IterationInfo,
    MatrixGradients,
    Method,
    Problem,
)
from gpinfer.optim import make_optimizer
from gpinfer.sites.power_tilted import QUADRATURES, check_alpha
from gpinfer.sites.rank_one import (
    SCHEDULES,
    SITE_STEPS,
    InducingGeometry,
    RankOnePEPSites,
    WhitenedInducingPosterior,
)
from gpinfer.validation import check_binary_labels
from gpinfer_pep.collapsed import check_partition, collapsed_pep

#: box bounds on the unconstrained (log) parameters, to keep L-BFGS-B line searches sane
_LOG_BOUNDS = (-14.0, 12.0)


def initial_inducing(X: Array, inducing: int | Array | None, rng: np.random.Generator
                     ) -> Array:
    """``Z [M, D]``: given inputs, or k-means++ centres of ``X`` (``M = min(N, 50)`` if unset)."""
    if isinstance(inducing, np.ndarray):
        return inducing.copy()
    M = min(X.shape[0], 50) if inducing is None else int(inducing)
    if M >= X.shape[0]:
        return X[:M].copy()
    seed = int(rng.integers(2**31 - 1))
    centres, _ = kmeans2(X, M, minit="++", seed=seed)
    return centres


def median_lengthscales(kernel, X: Array, rule: str, rng: np.random.Generator) -> None:
    """Set every ``lengthscale*`` parameter to the median pairwise distance / 2 (``rule``
    ``"median"``; at most 1000 rows are used)."""
    if rule != "median":
        raise InputError(f"init_lengthscale must be null or 'median'; got {rule!r}")
    rows = X if X.shape[0] <= 1000 else X[rng.choice(X.shape[0], 1000, replace=False)]
    sq = np.sum(rows * rows, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T
    dist = np.sqrt(np.maximum(d2[np.triu_indices(rows.shape[0], 1)], 0.0))
    value = np.log(max(float(np.median(dist)) / 2.0, 1e-6)) if dist.size else 0.0
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
    gained less than ``stop_tol`` nats over the last ``stop_window`` iterations; ``None``: off).
    """

    name: ClassVar[str] = "pep"
    tasks: ClassVar[tuple[str, ...]] = ("classification", "regression")
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("probit", "logit", "gaussian")
    default_options: ClassVar[dict[str, Any]] = {
        "alpha": 0.5,
        "blocks": None,
        "schedule": "parallel",
        "damping": 0.5,
        "site_step": "power",
        "n_sweeps": 10,
        "max_sweeps": 500,
        "tol": 1e-6,
        "quadrature": "trapezoid",
        "gh_degree": 20,
        "jitter": 1e-8,
        "learn_inducing": True,
        "optimizer": None,
        "learning_rate": 0.01,
        "max_fun": 2000,
        "epochs": None,
        "init_lengthscale": None,
        "converge_step": "full",
        "stop_window": None,
        "stop_tol": 0.1,
    }
    #: a fixed power for the aliases (``None``: the ``alpha`` option)
    fixed_alpha: ClassVar[float | None] = None

    def __init__(self, **options: Any):
        super().__init__(**options)
        o = self.options
        check_alpha(self.alpha)
        if o["schedule"] not in SCHEDULES:
            raise InputError(f"schedule must be one of {SCHEDULES}; got {o['schedule']!r}")
        if o["site_step"] not in SITE_STEPS:
            raise InputError(f"site_step must be one of {SITE_STEPS}; got {o['site_step']!r}")
        if o["quadrature"] not in QUADRATURES:
            raise InputError(f"quadrature must be one of {QUADRATURES}; got {o['quadrature']!r}")
        if not 0.0 < float(o["damping"]) <= 1.0:
            raise InputError(f"damping must lie in (0, 1]; got {o['damping']!r}")
        for key in ("n_sweeps", "max_sweeps", "max_fun", "gh_degree"):
            if int(o[key]) < 1:
                raise InputError(f"{key} must be a positive int; got {o[key]!r}")
        if o["converge_step"] is not None and o["converge_step"] not in SITE_STEPS:
            raise InputError(f"converge_step must be None or one of {SITE_STEPS}; "
                             f"got {o['converge_step']!r}")
        if o["stop_window"] is not None and int(o["stop_window"]) < 1:
            raise InputError(f"stop_window must be None or a positive int; "
                             f"got {o['stop_window']!r}")
        if not float(o["stop_tol"]) >= 0.0:
            raise InputError(f"stop_tol must be >= 0; got {o['stop_tol']!r}")

    @property
    def alpha(self) -> float:
        return float(self.fixed_alpha if self.fixed_alpha is not None else self.options["alpha"])

    # -- entry point -------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        X = np.asarray(problem.X, dtype=float)
        kernel = problem.kernel.copy()
        if self.options["init_lengthscale"] is not None:
            median_lengthscales(kernel, X, self.options["init_lengthscale"], problem.rng)
        Z = initial_inducing(X, problem.inducing, problem.rng)
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
    default_options: ClassVar[dict[str, Any]] = {
        k: v for k, v in PowerEP.default_options.items() if k != "alpha"
    }
    fixed_alpha: ClassVar[float | None] = 1.0


class VFE(PowerEP):
    """Power EP at ``alpha = 0``: Titsias' collapsed bound for regression; for classification
    the Hensman et al. (2015) ELBO with rank-one natural-parameter sites (full site steps)."""

    name: ClassVar[str] = "vfe"
    default_options: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in PowerEP.default_options.items() if k != "alpha"},
        "site_step": "full",
    }
    fixed_alpha: ClassVar[float | None] = 0.0


# --------------------------------------------------------------------------------------------
# Shared fit book-keeping
# --------------------------------------------------------------------------------------------


class _Fit:
    """One ``fit``: hyper-parameters, history and the callback."""

    def __init__(self, method: PowerEP, problem: Problem, X: Array, y: Array, kernel, Z: Array,
                 callback: FitCallback | None):
        self.method, self.problem, self.X, self.y = method, problem, X, y
        self.kernel, self.callback = kernel, callback
        self.opt = method.options
        self.lik = problem.likelihood
        self.start = time.perf_counter()
        self.history: list[dict[str, float]] = []
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
        return self.hp.Z[0]

    def bounds(self):
        return self.hp.bounds(kernel=_LOG_BOUNDS, likelihood=_LOG_BOUNDS)

    def geometry(self, X: Array | None = None) -> InducingGeometry:
        return InducingGeometry.from_kernel(self.kernel, self.Z, self.X if X is None else X,
                                            float(self.opt["jitter"]))

    def report(self, it: int, value: float, posterior, extra: dict[str, float]) -> None:
        elapsed = time.perf_counter() - self.start
        self.history.append({"objective": float(value), "elapsed": elapsed, **extra})
        if self.callback is not None:
            self.callback(IterationInfo(iteration=it, objective=float(value), elapsed=elapsed,
                                        posterior=posterior, extra=extra))

    def maximize_lbfgs(self, fun) -> tuple[int, bool]:
        """L-BFGS-B over ``theta`` with the box bounds; returns (iterations, success)."""
        theta0 = self.hp.pack()
        if theta0.size == 0:
            fun(theta0)
            return 0, True
        name = str(self.opt["optimizer"] or "lbfgs").lower()
        if name in ("lbfgs", "lbfgsb", "l-bfgs-b"):
            opt = make_optimizer("lbfgs", bounds=self.bounds(), maxfun=int(self.opt["max_fun"]))
        else:
            opt = make_optimizer(name, learning_rate=float(self.opt["learning_rate"]))
        res = opt.maximize(fun, theta0, int(self.problem.max_iter), self.on_iteration(fun))
        fun(res.x)
        if not res.success:
            warnings.warn(f"{self.method.name}: L-BFGS-B ended abnormally: {res.message}",
                          RuntimeWarning, stacklevel=4)
        return res.n_iter, res.success

    def on_iteration(self, fun):
        window = self.opt["stop_window"]

        def cb(it: int, x: Array, value: float) -> bool:
            self.hp.unpack(x)
            self.report(it, value, self.snapshot(), self.work_since_report())
            return window is not None and plateaued(
                [h["objective"] for h in self.history], int(window), float(self.opt["stop_tol"]))
        return cb


class _Regression(_Fit):
    """Collapsed regression: closed-form energy, gradients, posterior (spec §3)."""

    def fit(self) -> FitResult:
        n = self.X.shape[0]
        blocks = self.opt["blocks"]
        self.blocks = None if blocks is None else check_partition(blocks, n)
        a = self.method.alpha
        self.alpha = np.full(n if self.blocks is None else len(self.blocks), a)
        self.last = None
        n_iter, success = self.maximize_lbfgs(self.evaluate)
        res = self.last
        return FitResult(
            posterior=self.snapshot()(), log_evidence=res.value, kernel=self.kernel,
            n_iter=n_iter, history=self.history,
            state={"Z": self.Z.copy(), "gamma": res.gamma, "noise": np.array(self.lik.variance),
                   "alpha": np.array(a), "optimizer_success": np.array(success)},
        )

    def evaluate(self, theta: Array) -> tuple[float, Array]:
        self.work["nfev"] += 1
        self.hp.unpack(theta)
        geo = self.geometry()
        Kbb = None if self.blocks is None else [self.kernel.K(self.X[b]) for b in self.blocks]
        res = collapsed_pep(geo, self.y, self.lik.variance, self.alpha, self.blocks, Kbb)
        self.last = res
        grad = parameter_gradient(self.hp, self.X, res.grads)
        for b, R in zip(self.blocks or [], res.block_grads or []):
            grad += parameter_gradient(self.hp, self.X[b], MatrixGradients(Kff=R))
        return res.value, grad

    def snapshot(self):
        res, kernel, Z, lik = self.last, self.kernel.copy(), self.Z.copy(), self.lik
        return lambda: WhitenedInducingPosterior(lik, kernel, Z, res.L, res.L_B, res.gamma)


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

    def snapshot(self):
        post = WhitenedInducingPosterior(self.lik, self.kernel.copy(), self.Z.copy(),
                                         self.sites.geo.L, self.sites.L_B,
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
        name = str(o["optimizer"] or "adam").lower()
        name = "adam" if name.startswith("lbfgs") or name == "l-bfgs-b" else name  # no batches
        adam = make_optimizer(name, learning_rate=float(o["learning_rate"]))
        theta = self.hp.pack()
        adam.reset(theta)
        lo, hi = np.array(self.bounds(), dtype=float).T if theta.size else (None, None)
        order, pos, rng = np.arange(0), 0, self.problem.rng
        for it in range(1, n_steps + 1):
            if pos >= order.size:
                order, pos = rng.permutation(n), 0
            batch = order[pos:pos + batch_size]
            pos += batch_size
            value, grad = self.step(batch)
            if theta.size:
                theta = np.clip(adam.step(theta, grad), np.nan_to_num(lo, nan=-np.inf),
                                np.nan_to_num(hi, nan=np.inf))
                self.hp.unpack(theta)
            self.report(it, value, self.snapshot(), {"batch_energy": value})
        return n_steps

    def step(self, batch: Array) -> tuple[float, Array]:
        """Refresh the posterior, ``n_sweeps`` parallel sweeps on ``batch``, batch energy and
        its gradient (spec §2.10)."""
        self.sites.set_geometry(self.geometry(), self.kernel, self.Z)
        for _ in range(int(self.opt["n_sweeps"])):
            self.sites.update(batch)
        try:
            out = self.sites.energy(batch)
        except NumericalError as err:
            raise NumericalError(f"{self.method.name}: mini-batch energy: {err}",
                                 quantity=err.quantity) from err
        return out.value, parameter_gradient(self.hp, self.X[batch], out.gradients)
