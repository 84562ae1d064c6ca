"""The Laplace approximation for binary GP classification (spec binary §2.1).

``fit`` runs Newton to the mode of the posterior; with ``problem.optimize`` it maximises
``log Z_LA`` over the kernel's log-parameters under the "outer" schedule: every evaluation runs
Newton to convergence from the previous mode (warm start), then the optimiser takes one step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    Method,
    Problem,
)
from gpinfer.kernels.base import Kernel
from gpinfer.likelihoods.base import ScalarLikelihood
from gpinfer.optim import make_optimizer
from gpinfer.options import Option, choice, integer, mapping, real
from gpinfer.posterior import DenseSitePosterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites import DiagonalSiteAlgebra
from gpinfer.sites.driver import binary_labels
from gpinfer.training.outer import OuterSchedule
from gpinfer_laplace.evidence import LaplaceEvidence
from gpinfer_laplace.sites import LaplaceSites


class Laplace(Method):
    """Laplace approximation: ``q(f) = N(f_hat, (K^-1 + W)^-1)`` at the posterior mode.

    Options:

    * ``newton_tol``: Newton stops when ``|Delta Psi| <= newton_tol``;
    * ``max_newton``: Newton steps per mode search;
    * ``optimizer``: ``"lbfgs"``, ``"adam"`` or ``"adadelta"`` (``gpinfer.optim``);
    * ``optimizer_options``: keyword arguments for the optimiser (e.g. ``{"bounds": (-10, 10)}``).

    With ``problem.optimize`` an iteration is one optimiser step (``max_iter`` of them), each
    evaluation running Newton to convergence from the previous mode; the callback gets
    ``extra = {newton_steps, grad_norm, psi}``. Otherwise an iteration is one Newton step (at
    most ``min(max_iter, max_newton)``), ``extra = {psi, delta_psi, step_size}``. The reported
    objective is ``log Z_LA`` at the current mode. Abnormal optimiser ends and unconverged
    Newton runs are reported as ``RuntimeWarning``s (and in ``state``).
    """

    #: the objective, log p(y) of discrete labels or a bound on it, is never positive
    objective_limit: ClassVar[float | None] = 0.0

    name: ClassVar[str] = "laplace"
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = False
    supports_minibatch: ClassVar[bool] = False
    #: Psi and log Z_LA sum log p(y_i | f_i) over points: a weight multiplies a point's term
    supports_sample_weight: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("logit", "probit")
    #: any binary log-concave single-latent likelihood with derivatives (a third party's)
    likelihood_requirements: ClassVar[frozenset[str] | None] = frozenset(
        {"log_prob_derivatives", "log_concave"})
    option_spec: ClassVar[dict[str, Option]] = {
        "newton_tol": real(1e-9, "(0, inf)", doc="Newton stopping tolerance on the mode"),
        "max_newton": integer(100, "[1, inf)", doc="Newton steps per mode search"),
        "optimizer": choice("lbfgs", ("lbfgs", "adam", "adadelta"), doc="hyper-parameter step"),
        "optimizer_options": mapping(doc="keyword options of the optimiser"),
    }

    # -- entry point -------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        y = binary_labels(problem, self.name)
        if problem.batch_size is not None:
            raise InputError("laplace does not support mini-batches (batch_size must be None)")
        if problem.inducing is not None:
            raise InputError("laplace uses no inducing points (inducing / M must be None)")
        if not isinstance(problem.likelihood, ScalarLikelihood):
            raise InputError(
                f"laplace needs a likelihood with log_prob_derivatives; "
                f"{type(problem.likelihood).__name__} has none"
            )
        X = np.asarray(problem.X, dtype=float)
        kernel = problem.kernel.copy()
        sites = LaplaceSites(
            kernel.K(X), y, problem.likelihood,
            tol=self.options["newton_tol"], max_newton=self.options["max_newton"],
            kernel=kernel, X=X, weights=problem.sample_weight,
        )
        hp = HyperParameters(kernel, optimize=problem.optimize)
        run = _Run(problem, X, kernel, sites, callback)
        if problem.optimize and hp.size > 0:
            n_iter, info = self._optimize(run, hp)
        else:
            n_iter, info = self._newton(run, problem.max_iter)
        log_evidence = sites.log_evidence()
        state = {
            "alpha": sites.alpha.copy(),
            "f_hat": sites.f.copy(),
            "sqrt_w": sites.algebra.sqrt_w.copy(),
            "kernel_params": kernel.get_unconstrained().copy(),
            **info,
        }
        return FitResult(
            posterior=sites.posterior(),
            log_evidence=float(log_evidence),
            kernel=kernel,
            n_iter=n_iter,
            history=run.history,
            state=state,
        )

    # -- fixed hyper-parameters: Newton steps are the iterations ------------------------------
    def _newton(self, run: _Run, max_iter: int) -> tuple[int, dict[str, Array]]:
        sites = run.sites
        limit = min(int(max_iter), int(self.options["max_newton"]))
        it = 0
        while it < limit and not sites.converged:
            it += 1
            change = sites.update()
            if run.report(
                it, sites.log_evidence(), sites.algebra, sites.alpha, run.kernel,
                {"psi": sites.psi, "delta_psi": change, "step_size": sites.last_step_size},
            ):
                break
        if not sites.converged:
            warnings.warn(
                f"laplace: Newton did not converge in {limit} steps "
                f"(last |delta Psi| = {sites.last_change:.3g}); raise max_iter / max_newton",
                RuntimeWarning, stacklevel=3,
            )
        return it, {"newton_converged": np.array(sites.converged)}

    # -- hyper-parameter learning (outer schedule) -------------------------------------------
    def _optimize(self, run: _Run, hp: HyperParameters) -> tuple[int, dict[str, Array]]:
        sites, kernel, X = run.sites, run.kernel, run.X
        evidence = LaplaceEvidence()
        options = dict(self.options["optimizer_options"] or {})
        optimizer = make_optimizer(self.options["optimizer"], **options)
        last: dict[str, Any] = {}
        counts = {"evaluations": 0, "unconverged": 0}

        def fun(theta: Array) -> tuple[float, Array]:
            counts["evaluations"] += 1
            hp.unpack(theta)
            try:
                sites.set_kernel_matrix(kernel.K(X))
                steps = sites.run()
                value = evidence.evaluate(sites)
            except NumericalError as err:
                raise NumericalError(
                    f"laplace, hyper-parameter evaluation {counts['evaluations']} at "
                    f"{hp.describe()}: {err}", iteration=err.iteration, quantity=err.quantity,
                ) from err
            counts["unconverged"] += not sites.converged
            grad = parameter_gradient(hp, X, value.gradients)
            last.update(value=value.value, steps=steps, grad_norm=float(np.linalg.norm(grad)))
            return value.value, grad

        def report(it: int, x: Array, value: float) -> bool:
            return run.report(
                it, last["value"], sites.algebra, sites.alpha, kernel,
                {"newton_steps": float(last["steps"]), "grad_norm": last["grad_norm"],
                 "psi": sites.psi},
            )

        # the schedule leaves kernel and sites at the returned point
        schedule = OuterSchedule("laplace", report, label=f"optimizer "
                                 f"{self.options['optimizer']!r}", history=run.history)
        result = schedule.run(optimizer, fun, hp.pack(), int(run.problem.max_iter))
        if counts["unconverged"]:
            warnings.warn(
                f"laplace: Newton did not converge within max_newton="
                f"{self.options['max_newton']} steps in {counts['unconverged']} of "
                f"{counts['evaluations']} evidence evaluations", RuntimeWarning, stacklevel=3,
            )
        info = {
            "optimizer_success": np.array(result.success),
            "evaluations": np.array(counts["evaluations"]),
        }
        return result.n_iter, info


class _Run:
    """Book-keeping of one ``fit``: the problem, the live objects and the core reporter."""

    def __init__(self, problem: Problem, X: Array, kernel: Kernel, sites: LaplaceSites,
                 callback: FitCallback | None):
        self.problem = problem
        self.X = X
        self.kernel = kernel
        self.sites = sites
        self.reporter = IterationReporter(callback, "laplace")
        self.history = self.reporter.history

    def report(
        self,
        iteration: int,
        objective: float,
        algebra: DiagonalSiteAlgebra,
        alpha: Array,
        kernel: Kernel,
        extra: dict[str, float],
    ) -> bool:
        """Record one iteration and call the fit callback (posterior built only on demand);
        True when the callback asked training to stop."""
        posterior = _snapshot(self.problem, self.X, kernel.copy(), algebra, alpha.copy())
        return self.reporter.report(iteration, objective, posterior, extra)


def _snapshot(
    problem: Problem, X: Array, kernel: Kernel, algebra: DiagonalSiteAlgebra, alpha: Array
) -> Callable[[], DenseSitePosterior]:
    """A zero-argument builder of the posterior as it is now (later updates do not leak in)."""
    return lambda: algebra.posterior(problem.likelihood, kernel, X, alpha)
