"""Label regression: GP regression on the labels -1/+1 with a fixed noise variance.

The posterior is ``q(f) = N(K alpha, (K^-1 + I/noise)^-1)`` with ``alpha = (K + noise I)^-1 t``;
the objective is the regression evidence ``log N(t | 0, K + noise I)``; predictions go through
the likelihood (probit by default). A deliberately small method that shows the whole plugin
contract and reuses the core: the B-matrix algebra, hyper-parameter packing, L-BFGS-B on the
engine's outer optimiser schedule and its reporter (training-time clock, history, stop
requests, per-iteration posteriors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    MatrixGradients,
    Method,
    Problem,
)
from gpinfer.kernels.base import Kernel
from gpinfer.optim import make_optimizer
from gpinfer.options import Option, real
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites import DiagonalSiteAlgebra
from gpinfer.training.outer import OuterSchedule


def label_regression_evidence(
    kernel: Kernel, X: Array, t: Array, noise: float
) -> tuple[float, MatrixGradients, DiagonalSiteAlgebra, Array]:
    """``log N(t | 0, K + noise I)`` and its gradient wrt ``K`` for ``X [N, D]``, ``t [N]``.

    Returns ``(value, MatrixGradients(Kff=[N, N]), algebra, alpha [N])``.
    """
    n = len(t)
    algebra = DiagonalSiteAlgebra.from_kernel_matrix(kernel.K(X), np.full(n, 1.0 / noise))
    R = algebra.R()  # (K + noise I)^-1
    alpha = R @ t
    log_det = algebra.log_det_B + n * np.log(noise)  # log|K + noise I|
    value = -0.5 * t @ alpha - 0.5 * log_det - 0.5 * n * np.log(2.0 * np.pi)
    G = 0.5 * (np.outer(alpha, alpha) - R)
    return float(value), MatrixGradients(Kff=G), algebra, alpha


class LabelRegression(Method):
    """Label regression for binary classification (option ``noise``: the label noise variance)."""

    name: ClassVar[str] = "labelreg"
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = False
    supports_minibatch: ClassVar[bool] = False
    likelihoods: ClassVar[tuple[str, ...]] = ("probit", "logit")
    option_spec: ClassVar[dict[str, Option]] = {
        "noise": real(1.0, "(0, inf)", doc="label noise variance"),
    }

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        reporter = IterationReporter(callback, self.name)  # the engine's clock and history
        X, t = problem.X, 2.0 * problem.y - 1.0  # class indices 0/1 -> labels -1/+1
        noise = float(self.options["noise"])
        kernel = problem.kernel.copy()
        hp = HyperParameters(kernel, optimize=problem.optimize)

        def evidence(theta: Array) -> tuple[float, Array]:
            hp.unpack(theta)
            value, grads, _, _ = label_regression_evidence(kernel, X, t, noise)
            return value, hp.gradient(X, grads)

        def posterior_at(theta: Array) -> Callable[[], Posterior]:
            """The posterior as it is at ``theta [P]`` (built only when asked, even after
            training: the fit guard may restore a best iterate)."""

            def build() -> Posterior:
                with hp.installed(theta):
                    _, _, algebra, alpha = label_regression_evidence(kernel, X, t, noise)
                    return algebra.posterior(problem.likelihood, kernel.copy(), X, alpha)

            return build

        def report(iteration: int, theta: Array, value: float) -> bool:
            # True when the callback asked to stop (early stopping): the schedule then ends
            return reporter.report(iteration, value, posterior_at(theta.copy()))

        if hp.size:  # the core's outer schedule leaves the kernel at the returned point
            schedule = OuterSchedule(self.name, report, history=reporter.history)
            schedule.run(make_optimizer("lbfgs"), evidence, hp.pack(), problem.max_iter)
        value, _, algebra, alpha = label_regression_evidence(kernel, X, t, noise)
        if not reporter.history:
            report(1, hp.pack(), value)
        return FitResult(
            posterior=algebra.posterior(problem.likelihood, kernel, X, alpha),
            log_evidence=value,
            kernel=kernel,
            n_iter=len(reporter.history),
            history=reporter.history,
            state={"alpha": alpha},
        )
