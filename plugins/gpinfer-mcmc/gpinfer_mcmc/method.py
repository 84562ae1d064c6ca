"""``mcmc-ais``: the gold standard of spec binary §3 (HMC samples, AIS evidence from EP).

``fit`` (fixed hyper-parameters): dense EP gives the start ``q`` (§3.3); a pilot AIS run adapts
per-block step sizes; production AIS gives ``log Z`` (log-mean-exp of ``R`` runs) with its
standard error (``state["log_evidence_se"]``); HMC at ``tau = 1`` continued from the AIS end
points gives posterior samples, Monte-Carlo marginals and Rao-Blackwellised predictions.
Acceptance below ``min_acceptance`` in any block is a ``RuntimeWarning`` and a metric; jitter
added to ``K`` is reported likewise.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, ClassVar

import numpy as np
from scipy.linalg import solve_triangular

from gpinfer.errors import InputError
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    IterationInfo,
    Likelihood,
    Problem,
)
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky
from gpinfer.posterior import Posterior
from gpinfer.sites.driver import DenseBinaryMethod, binary_labels
from gpinfer.sites.ep import EPSites
from gpinfer_mcmc.ais import GaussianStart, LogLik, run_ais, sample_posterior

#: budget presets: temperatures T, runs R, posterior samples per chain, pilot temperatures
BUDGETS: dict[str, dict[str, int]] = {
    "full": {"T": 20000, "R": 5, "n_samples": 2000, "pilot_T": 2000},
    "fast": {"T": 3000, "R": 4, "n_samples": 500, "pilot_T": 500},
    "tiny": {"T": 200, "R": 2, "n_samples": 100, "pilot_T": 100},
}


def bernoulli_loglik(likelihood: Likelihood, y: Array) -> LogLik:
    """``log p(y|F) [R]`` and its gradient ``[N, R]`` for ``F [N, R]`` (``y`` 0/1)."""
    sign = (2.0 * y - 1.0)[:, None]
    link = getattr(likelihood, "link", None)
    if link is None:
        raise InputError(f"mcmc-ais needs a Bernoulli likelihood, got {type(likelihood).__name__}")

    def loglik(F: Array) -> tuple[Array, Array]:
        psi, dpsi = link.derivatives(sign * F, 1)
        return np.sum(psi, axis=0), sign * dpsi

    return loglik


class MCMCPosterior(Posterior):
    """Monte-Carlo posterior from samples ``F [N, S]``: Rao-Blackwellised predictions.

    ``mu*_s = k*^T K^-1 f_s``, ``s*^2 = k** - k*^T K^-1 k*``; ``predict_proba`` averages
    ``p(y*|mu*_s, s*^2)`` over samples; ``predict_f`` gives the mixture mean and variance.
    """

    def __init__(self, likelihood: Likelihood, kernel: Kernel, X: Array, F: Array, L_K: Array):
        super().__init__(likelihood)
        self.kernel, self.X, self.F, self.L_K = kernel, X, F, L_K
        self.A = chol_solve(L_K, F)  # K^-1 F  [N, S]

    def _parts(self, X: Array) -> tuple[Array, Array]:
        Ks = self.kernel.K(self.X, X)
        V = solve_triangular(self.L_K, Ks, lower=True)
        var = np.maximum(self.kernel.K_diag(X) - np.sum(V * V, axis=0), 1e-300)
        return Ks.T @ self.A, var  # [N*, S], [N*]

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        mu, var = self._parts(X)
        return mu.mean(axis=1)[:, None], (var + mu.var(axis=1))[:, None]

    def predict_proba(self, X: Array) -> Array:
        mu, var = self._parts(X)
        S = mu.shape[1]
        P = self.likelihood.predict_proba(mu.reshape(-1), np.repeat(var, S))
        return P.reshape(mu.shape[0], S, -1).mean(axis=1)

    def log_predictive(self, X: Array, y: Array) -> Array:
        P = self.predict_proba(X)
        return np.log(np.maximum(P[np.arange(len(y)), np.asarray(y, int)], 1e-300))

    def state(self) -> dict[str, Array]:
        return {"mean_f": self.F.mean(axis=1), "var_f": self.F.var(axis=1)}


class MCMCAIS(DenseBinaryMethod):
    """HMC + AIS at fixed hyper-parameters; ``log_evidence`` is the AIS estimate.

    Options: ``budget`` (``full`` | ``fast`` | ``tiny``) and overrides ``T``, ``R``,
    ``n_samples``, ``pilot_T``; ``start`` (``ep`` | ``prior``); ``n_leapfrog`` (20);
    ``n_blocks`` (40); ``min_acceptance`` (0.5); ``step_size`` (``None``: adapted by the pilot
    run; a number: fixed for every block, no pilot). No gradient: ``optimize`` must be false.
    """

    name: ClassVar[str] = "mcmc-ais"
    default_options: ClassVar[dict[str, Any]] = {
        "budget": "full", "T": None, "R": None, "n_samples": None, "pilot_T": None,
        "start": "ep", "n_leapfrog": 20, "n_blocks": 40, "min_acceptance": 0.5,
        "step_size": None,
    }

    def solve(self, K, y, likelihood, warm):  # pragma: no cover - fit is overridden
        raise NotImplementedError("mcmc-ais runs through fit(); AIS has no gradient")

    def _settings(self) -> dict[str, int]:
        budget = self.options["budget"]
        if budget not in BUDGETS:
            raise InputError(f"mcmc-ais: unknown budget {budget!r}; known: {sorted(BUDGETS)}")
        out = dict(BUDGETS[budget])
        for key in out:
            if self.options[key] is not None:
                out[key] = int(self.options[key])
        if out["T"] < 1 or out["R"] < 1:
            raise InputError("mcmc-ais: T and R must be positive")
        return out

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        t0 = time.perf_counter()
        y = binary_labels(problem, self.name)
        self.check_problem(problem)
        kernel = problem.kernel.copy()
        if problem.optimize and kernel.get_unconstrained().size:
            raise InputError("mcmc-ais estimates log Z at fixed hyper-parameters (AIS has no "
                             "gradient); set optimize=false")
        cfg, rng, X = self._settings(), problem.rng, np.asarray(problem.X, float)
        K = kernel.K(X)
        L_K, jitter = jittered_cholesky(K, name="K (mcmc-ais)", start=1e-8)
        if jitter > 0:
            warnings.warn(f"mcmc-ais: added jitter {jitter:.3g} to K", RuntimeWarning,
                          stacklevel=2)
        loglik = bernoulli_loglik(problem.likelihood, y)
        start = self._start(K, L_K, y, problem.likelihood)
        history: list[dict[str, float]] = []

        def progress(block: int, partial: float) -> None:
            elapsed = time.perf_counter() - t0
            history.append({"objective": partial, "elapsed": elapsed})
            if callback is not None:
                callback(IterationInfo(iteration=block, objective=partial, elapsed=elapsed))

        o = self.options
        if o["step_size"] is None:
            steps = run_ais(loglik, start, cfg["pilot_T"], cfg["R"], rng, adapt=True,
                            n_leapfrog=o["n_leapfrog"], n_blocks=o["n_blocks"]).step_sizes
        else:
            steps = np.full(max(1, min(int(o["n_blocks"]), cfg["T"])), float(o["step_size"]))
        res = run_ais(loglik, start, cfg["T"], cfg["R"], rng, n_leapfrog=o["n_leapfrog"],
                      n_blocks=o["n_blocks"], step_sizes=steps, progress=progress)
        samples, acc_post = sample_posterior(loglik, start, res.F, cfg["n_samples"],
                                             float(res.step_sizes[-1]), rng,
                                             n_leapfrog=o["n_leapfrog"])
        min_acc = float(min(res.acceptance.min(), acc_post))
        if min_acc < float(o["min_acceptance"]):
            warnings.warn(f"mcmc-ais: HMC acceptance {min_acc:.2f} is below "
                          f"{o['min_acceptance']}; the estimate may be unreliable",
                          RuntimeWarning, stacklevel=2)
        if history:
            history[-1].update(min_acceptance=min_acc, log_evidence_se=res.se, jitter=jitter)
        state = {"log_evidence_se": np.array(res.se), "log_z_runs": res.log_z_runs,
                 "acceptance": res.acceptance, "posterior_acceptance": np.array(acc_post),
                 "min_acceptance": np.array(min_acc), "step_sizes": res.step_sizes,
                 "jitter": np.array(jitter), "weight_ess": np.array(res.weight_ess),
                 "log_z_start": np.array(start.log_z0), "mean_f": samples.mean(axis=1),
                 "var_f": samples.var(axis=1)}
        return FitResult(posterior=MCMCPosterior(problem.likelihood, kernel, X, samples, L_K),
                         log_evidence=res.log_z, kernel=kernel, n_iter=len(history),
                         history=history, state=state, log_evidence_se=float(res.se))

    def _start(self, K: Array, L_K: Array, y: Array, likelihood: Likelihood) -> GaussianStart:
        n = y.shape[0]
        if self.options["start"] == "prior":
            return GaussianStart(np.zeros(n), L_K, np.zeros(n), np.zeros(n), 0.0)
        if self.options["start"] != "ep":
            raise InputError(f"mcmc-ais: start must be 'ep' or 'prior', got "
                             f"{self.options['start']!r}")
        ep = EPSites(K, y, likelihood, tol=1e-8)
        ep.run()
        V = ep.algebra.posterior_cov()
        L = jittered_cholesky(V, name="EP covariance").L
        log_z0 = 0.5 * ep.nu @ ep.mu - 0.5 * ep.algebra.log_det_B
        return GaussianStart(ep.mu.copy(), L, ep.tau.copy(), ep.nu.copy(), float(log_z0))
