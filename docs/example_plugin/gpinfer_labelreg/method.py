"""Label regression: GP regression on the labels -1/+1 with a fixed noise variance.

The posterior is ``q(f) = N(K alpha, (K^-1 + I/noise)^-1)`` with ``alpha = (K + noise I)^-1 t``;
the objective is the regression evidence ``log N(t | 0, K + noise I)``; predictions go through
the likelihood (probit by default). A deliberately small method that shows the whole plugin
contract and reuses the core: the B-matrix algebra, hyper-parameter packing and L-BFGS-B.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    IterationInfo,
    MatrixGradients,
    Method,
    Problem,
)
from gpinfer.kernels.base import Kernel
from gpinfer.optim import make_optimizer
from gpinfer.options import Option, real
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
        start = time.perf_counter()
        X, t = problem.X, 2.0 * problem.y - 1.0  # class indices 0/1 -> labels -1/+1
        noise = float(self.options["noise"])
        kernel = problem.kernel.copy()
        hp = HyperParameters(kernel, optimize=problem.optimize)
        history: list[dict[str, float]] = []

        def evidence(theta: Array) -> tuple[float, Array]:
            hp.unpack(theta)
            value, grads, _, _ = label_regression_evidence(kernel, X, t, noise)
            return value, hp.gradient(X, grads)

        def report(iteration: int, theta: Array, value: float) -> bool:
            history.append({"objective": value, "elapsed": time.perf_counter() - start})
            if callback is not None:
                callback(IterationInfo(iteration, value, history[-1]["elapsed"]))
            return False

        if hp.size:  # the core's outer schedule leaves the kernel at the returned point
            schedule = OuterSchedule(self.name, report)
            schedule.run(make_optimizer("lbfgs"), evidence, hp.pack(), problem.max_iter)
        value, _, algebra, alpha = label_regression_evidence(kernel, X, t, noise)
        if not history:
            report(1, hp.pack(), value)
        return FitResult(
            posterior=algebra.posterior(problem.likelihood, kernel, X, alpha),
            log_evidence=value,
            kernel=kernel,
            n_iter=len(history),
            history=history,
            state={"alpha": alpha},
        )
