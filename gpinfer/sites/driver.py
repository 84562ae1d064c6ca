"""A shared ``Method`` driver for full-GP binary methods with a dense solver (spec binary §1.6).

A plugin subclasses ``DenseBinaryMethod`` and implements ``solve(K, y, likelihood, warm)``
returning a ``DenseSolution`` (evidence, optional ``G = dL/dK``, posterior builder, warm-start
state). The driver does the rest, as the Laplace plugin does for its own solver:

* labels: binary 0/1 only (``InputError`` naming the multi-class methods), no ``M``, no batch;
* ``problem.optimize`` False: one solve, one reported iteration;
* ``optimizer: lbfgs | adam | adadelta``: outer schedule (inner solver to convergence,
  warm-started, then one hyper-parameter step) — needs ``G``;
* ``optimizer: grid`` with ``optimizer_options: {axes: [[...], [...]]}`` (``GridSearch``, cold
  start at every node, value only).
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    Likelihood,
    MatrixGradients,
    Method,
    Optimizer,
    Problem,
)
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.settings import LOG_PARAMETER_BOUNDS
from gpinfer.optim import make_optimizer
from gpinfer.optim.grid import GridSearch
from gpinfer.options import Option, choice, mapping
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.training.outer import OuterSchedule
from gpinfer.validation import check_binary_labels

PosteriorBuilder = Callable[[Likelihood, Kernel, Array], Posterior]


@dataclass
class DenseSolution:
    """What a dense binary solver returns for one ``K``.

    * ``log_evidence``: the method's own ``log Z`` estimate or bound;
    * ``gradient``: ``None`` (no gradient) or a zero-argument callable giving ``G [N, N]``;
    * ``posterior``: builds the fitted posterior from ``(likelihood, kernel, X [N, D])``;
    * ``converged``, ``n_inner`` (inner iterations), ``extra`` scalars (logged as metrics);
    * ``warm``: opaque state passed back to the next ``solve`` (warm start);
    * ``state``: named arrays for ``FitResult.state``.
    """

    log_evidence: float
    posterior: PosteriorBuilder
    gradient: Callable[[], Array] | None = None
    converged: bool = True
    n_inner: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    warm: Any = None
    state: dict[str, Array] = field(default_factory=dict)


def binary_labels(problem: Problem, method: str) -> Array:
    """Labels ``[N]`` as int 0/1; ``InputError`` naming the multi-class methods otherwise."""
    return check_binary_labels(problem.y, problem.n_classes, method)


def check_full_binary(problem: Problem, method: str) -> Array:
    """The 0/1 labels ``[N]`` of a full-GP binary problem: binary labels (``binary_labels``),
    no mini-batches, no inducing points (an ``InputError`` naming ``method`` otherwise)."""
    y = binary_labels(problem, method)
    if problem.batch_size is not None:
        raise InputError(f"{method} does not support mini-batches (batch_size must be None)")
    if problem.inducing is not None:
        raise InputError(f"{method} uses no inducing points (inducing / M must be None)")
    return y


class FullGPBinaryMethod(Method):
    """What every full-GP binary method declares and checks, whatever it runs (the dense
    solvers of ``DenseBinaryMethod``, mcmc-ais's sampler): binary classification with a probit
    or logit likelihood, no inducing points, no mini-batches (``check_problem``)."""

    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = False
    supports_minibatch: ClassVar[bool] = False
    likelihoods: ClassVar[tuple[str, ...]] = ("probit", "logit")

    def check_problem(self, problem: Problem) -> Array:
        """Validate the problem; return the 0/1 labels ``[N]``."""
        return check_full_binary(problem, self.name)


class DenseBinaryMethod(FullGPBinaryMethod):
    """Base of the dense binary methods; subclasses set ``name`` and implement ``solve``."""

    #: options every dense binary method accepts (subclasses add theirs to their option_spec)
    driver_options: ClassVar[dict[str, Option]] = {
        "optimizer": choice("lbfgs", ("lbfgs", "adam", "adadelta", "grid"),
                            doc="hyper-parameter optimiser (grid: optimizer_options.axes)"),
        "optimizer_options": mapping(doc="keyword options of the optimiser"),
    }

    @classmethod
    def optimizer_for(cls, options: Mapping[str, Any], batch_size: int | None) -> str | None:
        """The ``optimizer`` option, but ``None`` for ``"grid"``: the grid search is not one of
        ``make_optimizer``'s, and ``_optimizer`` checks its ``axes`` (``Method.optimizer_for``)."""
        name = super().optimizer_for(options, batch_size)
        return None if name == "grid" else name

    @abc.abstractmethod
    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        """Run the inner solver for prior ``K [N, N]`` and labels ``y [N]`` (0/1)."""

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        reporter = IterationReporter(callback, self.name)
        y = self.check_problem(problem)
        X = np.asarray(problem.X, dtype=float)
        kernel = problem.kernel.copy()
        hp = HyperParameters(kernel, optimize=problem.optimize)
        memo: dict[str, Any] = {"warm": None, "sol": None}

        def solve_at(theta: Array | None, cold: bool = False) -> DenseSolution:
            if theta is not None:
                hp.unpack(theta)
            try:
                sol = self.solve(kernel.K(X), y, problem.likelihood,
                                 None if cold else memo["warm"])
            except NumericalError as err:
                where = f" at {hp.describe()}" if hp.size else ""
                raise NumericalError(f"{self.name}{where}: {err}", iteration=err.iteration,
                                     quantity=err.quantity) from err
            memo.update(warm=sol.warm, sol=sol)
            return sol

        def report(it: int, sol: DenseSolution) -> bool:
            """Report iteration ``it``; True when training should stop (a stop request)."""
            extra = {"inner_iterations": float(sol.n_inner), **sol.extra}
            snap, build = kernel.copy(), sol.posterior
            return reporter.report(it, sol.log_evidence,
                                   lambda: build(problem.likelihood, snap, X), extra)

        n_iter, info = 1, dict[str, Array]()
        if problem.optimize and hp.size > 0:
            n_iter, info = self._optimize(problem, hp, X, solve_at, report, memo,
                                          reporter.history)
        else:
            report(1, solve_at(None))
        sol: DenseSolution = memo["sol"]
        if not sol.converged:
            warnings.warn(f"{self.name}: the inner solver did not converge "
                          f"({sol.n_inner} iterations)", RuntimeWarning, stacklevel=2)
        state = {"kernel_params": kernel.get_unconstrained().copy(),
                 "converged": np.array(sol.converged), **sol.state, **info}
        return FitResult(posterior=sol.posterior(problem.likelihood, kernel, X),
                         log_evidence=float(sol.log_evidence), kernel=kernel, n_iter=n_iter,
                         history=reporter.history, state=state)

    def _optimize(self, problem: Problem, hp: HyperParameters, X: Array,
                  solve_at: Callable[..., DenseSolution], report: Callable[[int, DenseSolution],
                                                                           bool],
                  memo: dict[str, Any], history: list[dict[str, float]]
                  ) -> tuple[int, dict[str, Array]]:
        name = str(self.options["optimizer"]).lower()
        optimizer, grid_search, default_box = self._optimizer(name, hp)
        grid = grid_search is not None

        def fun(theta: Array) -> tuple[float, Array]:
            sol = solve_at(theta, cold=grid)
            if grid:
                return sol.log_evidence, np.zeros_like(theta)
            if sol.gradient is None:
                raise InputError(f"{self.name}: this configuration has no evidence gradient; "
                                 "use optimizer=grid or optimize=false")
            grad = parameter_gradient(hp, X, MatrixGradients(Kff=sol.gradient()))
            return sol.log_evidence, grad

        max_iter = int(problem.max_iter)
        if grid_search is not None:
            max_iter = int(np.prod([len(a) for a in grid_search.axes]))
        schedule = OuterSchedule(self.name, lambda it, x, value: report(it, memo["sol"]),
                                 label=f"optimizer {name!r}", history=history,
                                 upper_names=hp.names if default_box else None)
        result = schedule.run(optimizer, fun, hp.pack(), max_iter,
                              solve=lambda theta: solve_at(theta, cold=grid))
        info: dict[str, Array] = {"optimizer_success": np.array(result.success)}
        if grid_search is not None:
            info["grid_values"] = grid_search.values.copy()
        return result.n_iter, info

    def _optimizer(self, name: str, hp: HyperParameters
                   ) -> tuple[Optimizer, GridSearch | None, bool]:
        """The optimiser called ``name`` with the ``optimizer_options``, the grid search when
        it is one, and whether it runs in the default box."""
        opts = dict(self.options["optimizer_options"] or {})
        if name == "grid":
            grid_search = GridSearch(opts.pop("axes", None) or [])
            if opts:
                raise InputError(f"grid optimizer got unknown options {sorted(opts)}")
            return grid_search, grid_search, False
        default_box = False
        if name in ("lbfgs", "lbfgsb", "l-bfgs-b"):
            # a trial point where the inner solver breaks down (an amplitude of e^300 on
            # separable data, say) ends the run at the last accepted iterate, with a warning
            opts.setdefault("stop_on_trial_failure", True)
            if "bounds" not in opts:
                # on separable data the evidence of ep-dense (and others) rises without end
                # with the signal variance: an upper bound stops it, and a warning names the
                # cause. Upper only: with a two-sided box on every coordinate scipy's first
                # step is a whole gradient step instead of a unit-length one (tap on
                # breast_cancer jumped to where its predictions break); one-sided, the path
                # is the unbounded one until it reaches the bound.
                upper = (None, LOG_PARAMETER_BOUNDS[1])
                opts["bounds"] = hp.bounds(kernel=upper, likelihood=upper)
                default_box = True
        return make_optimizer(name, **opts), None, default_box
