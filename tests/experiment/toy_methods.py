"""Toy method plugins for the experiment tests.

``conftest.py`` copies this file into a temporary site as ``gpinfer_exptoy_zz/methods.py`` and
registers it (distribution ``gpinfer-exptoy 9.9.0``) under the entry points ``toygp`` and
``toysparse``, so the registry, the estimator and subprocesses find them like any plugin.

The posterior is a nearest-class-mean softmax: cheap, deterministic and good enough to give a
sane test error. Options make the method misbehave on purpose: ``fail_at`` raises
``NumericalError`` at that iteration (after reporting the earlier ones), ``interrupt_at`` raises
``KeyboardInterrupt``, ``nan_at`` reports a NaN objective, ``sleep_s`` slows every iteration.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import FitResult, IterationInfo, Method, Problem
from gpinfer.posterior import Posterior


class ToyPosterior(Posterior):
    """``p(c | x) ∝ exp(-||x - mean_c||^2 / 2)``; latent ``[N*, C]`` = the logits, variance 0."""

    def __init__(self, likelihood: Any, means: np.ndarray):
        super().__init__(likelihood)
        self.means = means

    def predict_f(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d2 = ((X[:, None, :] - self.means[None, :, :]) ** 2).sum(axis=2)
        logits = -0.5 * d2
        return logits, np.zeros_like(logits)

    def _log_proba(self, X: np.ndarray) -> np.ndarray:
        logits, _ = self.predict_f(X)
        logits = logits - logits.max(axis=1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return np.exp(self._log_proba(X))

    def log_predictive(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self._log_proba(X)[np.arange(len(y)), np.asarray(y, dtype=int)]

    def state(self) -> dict[str, np.ndarray]:
        return {"means": self.means}


class ToyGP(Method):
    """A method without inducing points that reports one ``IterationInfo`` per iteration."""

    tasks: ClassVar = ("classification",)
    multiclass: ClassVar = True
    likelihoods: ClassVar = ("probit", "softmax")
    default_options: ClassVar = {"fail_at": 0, "interrupt_at": 0, "nan_at": 0, "sleep_s": 0.0}
    #: the last problem fitted (in-process tests inspect it)
    last_problem: ClassVar[Problem | None] = None

    def fit(self, problem: Problem, callback=None) -> FitResult:
        type(self).last_problem = problem
        o = self.options
        X, y = problem.X, problem.y
        means = np.stack([X[y == c].mean(axis=0) for c in range(problem.n_classes)])
        post = ToyPosterior(problem.likelihood, means)
        start = time.perf_counter()
        history: list[dict[str, float]] = []
        objective = 0.0
        for it in range(1, problem.max_iter + 1):
            if it == o["fail_at"]:
                raise NumericalError("toy: Cholesky of B failed", iteration=it, quantity="B")
            if it == o["interrupt_at"]:
                raise KeyboardInterrupt
            if o["sleep_s"]:
                time.sleep(o["sleep_s"])
            objective = float("nan") if it == o["nan_at"] else -50.0 - 100.0 / it
            info = IterationInfo(
                iteration=it,
                objective=objective,
                elapsed=time.perf_counter() - start,
                posterior=lambda: post,
                extra={"step_size": 0.5 / it},
            )
            history.append({"objective": objective, "elapsed": info.elapsed})
            if callback is not None:
                callback(info)
        return FitResult(
            posterior=post,
            log_evidence=objective,
            kernel=problem.kernel,
            n_iter=problem.max_iter,
            history=history,
            state={"means": means},
        )


class ToySparse(ToyGP):
    """The same, declaring inducing points, mini-batches and an optimiser option."""

    uses_inducing_points: ClassVar = True
    supports_minibatch: ClassVar = True
    default_options: ClassVar = {
        **ToyGP.default_options,
        "optimizer": "lbfgs",
        "optimizer_options": {},
    }
