"""``mcmc-ais``: the gold standard of spec binary §3 (HMC samples, AIS evidence from EP).

``fit`` (fixed hyper-parameters): dense EP gives the start ``q`` (§3.3); a pilot AIS run adapts
per-block step sizes; production AIS gives ``log Z`` (log-mean-exp of ``R`` runs) with its
standard error (``state["log_evidence_se"]``); HMC at ``tau = 1`` continued from the AIS end
points gives posterior samples, Monte-Carlo marginals and Rao-Blackwellised predictions.
Acceptance below ``min_acceptance`` in any block is a ``RuntimeWarning`` and a metric; jitter
added to ``K`` is reported likewise. Diagnostics (spec §3.5-3.6), reported as final-iteration
metrics (``history[-1]``, the callback's ``extra``) and in ``state``: per-block acceptance and
its min/max, the sd of ``log Z_r`` across runs, the weight ESS, split-``R-hat`` (max over the
latent coordinates) and ESS (min over them) of the posterior chains (one per AIS run), and
``gold`` = all single-run checks of ``gold_checks`` passed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from scipy.special import logsumexp

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
from gpinfer.likelihoods.base import ScalarLikelihood
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, tri_solve
from gpinfer.options import Option, choice, integer, real
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites.driver import FullGPBinaryMethod
from gpinfer.sites.ep import EPSites
from gpinfer_mcmc.ais import (
    AISResult,
    GaussianStart,
    LogLik,
    effective_sample_size,
    gold_checks,
    run_ais,
    sample_posterior,
    split_rhat,
)

#: budget presets: temperatures T, runs R, posterior samples per chain, pilot temperatures,
#: most samples used by predictions (evenly thinned)
BUDGETS: dict[str, dict[str, int]] = {
    "full": {"T": 20000, "R": 5, "n_samples": 2000, "pilot_T": 2000, "predict_samples": 2000},
    "fast": {"T": 3000, "R": 4, "n_samples": 500, "pilot_T": 500, "predict_samples": 100},
    "tiny": {"T": 200, "R": 2, "n_samples": 100, "pilot_T": 100, "predict_samples": 200},
}
#: the default budget ``auto`` is ``fast`` up to this many training points
AUTO_REFERENCE_N = 400
#: least ``T``, ``pilot_T`` and ``n_samples`` of the ``auto`` budget
AUTO_FLOORS: dict[str, int] = {"T": 500, "pilot_T": 100, "n_samples": 100}


def auto_budget(n: int) -> dict[str, int]:
    """The ``auto`` budget for ``n`` training points: ``fast`` up to ``AUTO_REFERENCE_N``; above,
    ``T``, ``pilot_T`` and ``n_samples`` scaled by ``(AUTO_REFERENCE_N / n)^2`` (not below
    ``AUTO_FLOORS``), so that the ``O(N^2)`` products per HMC step cost in all what ``fast`` costs
    at ``AUTO_REFERENCE_N`` points (``R`` and ``predict_samples`` as in ``fast``)."""
    scale = min(1.0, (AUTO_REFERENCE_N / max(int(n), 1)) ** 2)
    out = dict(BUDGETS["fast"])
    for key, floor in AUTO_FLOORS.items():
        out[key] = max(floor, int(round(out[key] * scale)))
    return out


def bernoulli_loglik(likelihood: Likelihood, y: Array) -> LogLik:
    """``log p(y|F) [R]`` and its gradient ``[N, R]`` for ``F [N, R]`` (``y`` 0/1)."""
    if not (isinstance(likelihood, ScalarLikelihood) and likelihood.n_classes == 2):
        raise InputError(f"mcmc-ais needs a binary likelihood with pointwise derivatives "
                         f"(log_prob_derivatives), got {type(likelihood).__name__}")
    evaluate = likelihood.log_prob_evaluator(y, 1)

    def loglik(F: Array) -> tuple[Array, Array]:
        psi, dpsi = evaluate(F)
        return np.sum(psi, axis=0), dpsi

    return loglik


class MCMCPosterior(Posterior):
    """Monte-Carlo posterior from samples ``F [N, S]``: Rao-Blackwellised predictions.

    ``mu*_s = k*^T K^-1 f_s``, ``s*^2 = k** - k*^T K^-1 k*``; ``predict_proba`` averages
    ``p(y*|mu*_s, s*^2)`` over samples; ``predict_f`` gives the mixture mean and variance.
    Predictions use at most ``max_predict_samples`` samples, evenly thinned (each one costs a
    1-D integral per test point for the logistic likelihood); ``None``: all of them.
    """

    def __init__(self, likelihood: Likelihood, kernel: Kernel, X: Array, F: Array, L_K: Array,
                 max_predict_samples: int | None = None):
        super().__init__(likelihood)
        self.kernel, self.X, self.F, self.L_K = kernel, X, F, L_K
        S = F.shape[1]
        keep = S if max_predict_samples is None else max(1, min(S, int(max_predict_samples)))
        cols = np.unique(np.linspace(0, S - 1, keep).round().astype(int))
        self.A = chol_solve(L_K, F[:, cols])  # K^-1 F  [N, S']

    def _parts(self, X: Array) -> tuple[Array, Array]:
        Ks = self.kernel.K(self.X, X)
        V = tri_solve(self.L_K, Ks)
        var = np.maximum(self.kernel.K_diag(X) - np.sum(V * V, axis=0), 1e-300)
        return Ks.T @ self.A, var  # [N*, S'], [N*]

    def _log_probs(self, X: Array, labels: Array) -> Array:
        """``log p(y*_i | mu*_is, s*_i^2)`` ``[N*, S']`` for class indices ``labels [N*]``."""
        mu, var = self._parts(X)
        S = mu.shape[1]
        y = np.repeat(np.asarray(labels, dtype=np.int64), S)
        tilted = self.likelihood.tilted(y, mu.reshape(-1), np.repeat(var, S))
        return tilted.log_z.reshape(mu.shape)

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        mu, var = self._parts(X)
        return mu.mean(axis=1)[:, None], (var + mu.var(axis=1))[:, None]

    def predict_proba(self, X: Array) -> Array:
        p1 = np.mean(np.exp(self._log_probs(X, np.ones(np.shape(X)[0], dtype=np.int64))), axis=1)
        return np.stack([1.0 - p1, p1], axis=1)

    def log_predictive(self, X: Array, y: Array) -> Array:
        """``log mean_s p(y_i | mu*_is, s*_i^2)`` in log space (no ``log(1 - p)`` cancellation)."""
        lp = self._log_probs(X, y)
        return logsumexp(lp, axis=1) - np.log(lp.shape[1])

    def state(self) -> dict[str, Array]:
        return {"mean_f": self.F.mean(axis=1), "var_f": self.F.var(axis=1)}


class MCMCAIS(FullGPBinaryMethod):
    """HMC + AIS at fixed hyper-parameters; ``log_evidence`` is the AIS estimate.

    Options: ``budget`` (``auto`` | ``full`` | ``fast`` | ``tiny``; default ``auto``: ``fast``,
    the reduced gold standard that the paper-grid protocol pins, up to ``AUTO_REFERENCE_N`` = 400
    training points, and above them ``T``, ``pilot_T``, ``n_samples`` scaled by ``(400/N)^2``
    (floors 500, 100, 100; ``auto_budget``), so that a default fit costs at most about what
    ``fast`` costs at 400 points, at a larger Monte-Carlo error; the ``full`` budget of spec
    §3.6 costs about 8x ``fast``: ask for it where the estimate itself is the result) and
    overrides ``T``, ``R``, ``n_samples``, ``pilot_T``, ``predict_samples``; the AIS standard
    error (``log_evidence_se``; above ``max_se`` nats a ``RuntimeWarning``) and the §3.6 checks
    (``gold``) say whether a run is accurate enough; ``start`` (``ep`` | ``prior``);
    ``n_leapfrog`` (20); ``n_blocks`` (40); ``min_acceptance`` (0.5); ``step_size``
    (``None``: adapted by the pilot run; a number: fixed for every block, no pilot).
    No gradient: ``optimize`` must be false.
    """

    #: reported objectives are partial AIS estimates, not iterates of one maximisation
    restore_best_iterate: ClassVar[bool] = False
    #: AIS has no gradient: optimize defaults to False (and True is refused)
    optimize_by_default: ClassVar[bool] = False

    #: full-GP binary classification (``FullGPBinaryMethod``: no inducing points, no
    #: mini-batches), outside the engine's schedules: AIS is a sampler, not an iteration
    name: ClassVar[str] = "mcmc-ais"
    option_spec: ClassVar[dict[str, Option]] = {
        "budget": choice("auto", ("auto", *BUDGETS),
                         doc="preset of T, R, n_samples, pilot_T (auto: fast up to 400 training "
                             "points, above them T, pilot_T, n_samples x (400/N)^2, at least "
                             "500, 100, 100)"),
        "T": integer(None, "[1, inf)", none=True, doc="AIS temperatures (None: budget)"),
        "R": integer(None, "[1, inf)", none=True, doc="AIS runs (None: budget)"),
        "n_samples": integer(None, "[1, inf)", none=True, doc="posterior draws (None: budget)"),
        "pilot_T": integer(None, "[1, inf)", none=True, doc="pilot run length (None: budget)"),
        "predict_samples": integer(None, "[1, inf)", none=True,
                                   doc="most draws used by predictions (None: budget)"),
        "start": choice("ep", ("ep", "prior"), doc="where the chains start"),
        "n_leapfrog": integer(20, "[1, inf)", doc="leapfrog steps per HMC proposal"),
        "n_blocks": integer(40, "[1, inf)", doc="blocks of the AIS schedule"),
        "min_acceptance": real(0.5, "[0, 1]", doc="block acceptance below this is a warning"),
        "step_size": real(None, "(0, inf)", none=True, doc="None: adapted by the pilot run"),
        "max_se": real(0.1, "(0, inf)",
                       doc="AIS standard error of log Z (nats) above this is a warning"),
    }

    def _settings(self, n: int) -> dict[str, int]:
        """``T``, ``R``, ``n_samples``, ``pilot_T``, ``predict_samples`` for ``n`` points."""
        budget = self.options["budget"]  # the values are checked by option_spec
        out = auto_budget(n) if budget == "auto" else dict(BUDGETS[budget])
        for key in out:
            if self.options[key] is not None:
                out[key] = int(self.options[key])
        return out

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        reporter = IterationReporter(callback, self.name)  # the shared clock and history
        y = self.check_problem(problem)
        kernel = problem.kernel.copy()
        if problem.optimize and kernel.get_unconstrained().size:
            raise InputError("mcmc-ais estimates log Z at fixed hyper-parameters (AIS has no "
                             "gradient); set optimize=false")
        cfg, rng, X = self._settings(y.shape[0]), problem.rng, np.asarray(problem.X, float)
        K = kernel.K(X)
        L_K, jitter = jittered_cholesky(K, name="K (mcmc-ais)", start=1e-8)
        if jitter > 0:
            warnings.warn(f"mcmc-ais: added jitter {jitter:.3g} to K", RuntimeWarning,
                          stacklevel=2)
        loglik = bernoulli_loglik(problem.likelihood, y)
        start = self._start(K, L_K, y, problem.likelihood)
        history = reporter.history
        # max_iter bounds the reported iterations (AIS blocks, reported every `stride`), never
        # the sampling itself: a truncated temperature schedule would bias log Z
        n_blocks = int(self.options["n_blocks"])
        stride = -(-n_blocks // max(problem.max_iter - 1, 1))  # ceil

        def progress(block: int, partial: float) -> None:
            if block % stride and block != n_blocks:
                return
            reporter.report(len(history) + 1, partial, None)

        res = self._anneal(loglik, start, cfg, rng, progress)
        samples, acc_post = sample_posterior(loglik, start, res.F, cfg["n_samples"],
                                             float(res.step_sizes[-1]), rng,
                                             n_leapfrog=self.options["n_leapfrog"])
        min_acc = float(min(res.acceptance.min(), acc_post))
        self._warn_quality(res, cfg, min_acc)
        diag = self._diagnostics(res, samples, acc_post, min_acc)
        diag.update(log_evidence_se=res.se, jitter=jitter)
        if history:
            history[-1].update(diag)
        if callback is not None:  # the final estimate, after the last reported block
            callback(IterationInfo(iteration=len(history) + 1, objective=res.log_z,
                                   elapsed=reporter.elapsed(), extra=diag))
        state = {"log_evidence_se": np.array(res.se), "log_z_runs": res.log_z_runs,
                 "acceptance": res.acceptance, "posterior_acceptance": np.array(acc_post),
                 "step_sizes": res.step_sizes, "log_z_start": np.array(start.log_z0),
                 "mean_f": samples.mean(axis=1), "var_f": samples.var(axis=1),
                 **{f"budget_{k}": np.array(v) for k, v in cfg.items()},
                 **{k: np.array(v) for k, v in diag.items() if k != "log_evidence_se"}}
        post = MCMCPosterior(problem.likelihood, kernel, X, samples, L_K,
                             max_predict_samples=cfg["predict_samples"])
        return FitResult(posterior=post,
                         log_evidence=res.log_z, kernel=kernel, n_iter=len(history),
                         history=history, state=state, log_evidence_se=float(res.se))

    def _anneal(self, loglik: LogLik, start: GaussianStart, cfg: dict[str, int],
                rng: np.random.Generator,
                progress: Callable[[int, float], None]) -> AISResult:
        """The AIS runs (``cfg["T"]`` temperatures, ``cfg["R"]`` runs), with the step sizes of
        a pilot run (``step_size=None``) or the fixed ``step_size``."""
        o = self.options
        if o["step_size"] is None:
            steps = run_ais(loglik, start, cfg["pilot_T"], cfg["R"], rng, adapt=True,
                            n_leapfrog=o["n_leapfrog"], n_blocks=o["n_blocks"]).step_sizes
        else:
            steps = np.full(max(1, min(int(o["n_blocks"]), cfg["T"])), float(o["step_size"]))
        return run_ais(loglik, start, cfg["T"], cfg["R"], rng, n_leapfrog=o["n_leapfrog"],
                       n_blocks=o["n_blocks"], step_sizes=steps, progress=progress)

    def _warn_quality(self, res: AISResult, cfg: dict[str, int], min_acc: float) -> None:
        """Warnings on a low HMC acceptance and on a standard error of log Z that is too large
        (or, with one run, cannot be estimated)."""
        o = self.options
        if min_acc < float(o["min_acceptance"]):
            warnings.warn(f"mcmc-ais: HMC acceptance {min_acc:.2f} is below "
                          f"{o['min_acceptance']}; the estimate may be unreliable",
                          RuntimeWarning, stacklevel=3)
        if cfg["R"] < 2:  # one run has no spread: its error cannot be estimated, not infinite
            warnings.warn("mcmc-ais: with R = 1 annealing run the standard error of log Z cannot "
                          "be estimated; use R >= 2 (or a budget) to measure it",
                          RuntimeWarning, stacklevel=3)
        elif not res.se <= float(o["max_se"]):
            warnings.warn(f"mcmc-ais: the AIS standard error of log Z is {res.se:.3g} nats "
                          f"(above max_se = {o['max_se']:g}; T = {cfg['T']}, R = {cfg['R']}); "
                          f"raise T or R (or budget) for a more accurate estimate",
                          RuntimeWarning, stacklevel=3)

    @staticmethod
    def _diagnostics(res: AISResult, samples: Array, acc_post: float, min_acc: float
                     ) -> dict[str, float]:
        """Acceptance, run spread, weight ESS, R-hat, ESS and the ``gold`` flag (§3.5-3.6)."""
        R = res.log_z_runs.shape[0]
        chains = samples.reshape(samples.shape[0], -1, R).transpose(0, 2, 1)  # [N, R, S]
        rhat = float(np.max(split_rhat(chains))) if chains.shape[2] >= 4 else np.nan
        ess = float(np.min(effective_sample_size(chains))) if chains.shape[2] >= 4 else np.nan
        checks = gold_checks(res.log_z_runs, res.weight_ess, res.acceptance, rhat, ess)
        return {"min_acceptance": min_acc, "max_acceptance": float(res.acceptance.max()),
                "posterior_acceptance": acc_post,
                "sd_log_z_runs": float(np.std(res.log_z_runs, ddof=1)) if R > 1 else np.nan,
                "weight_ess": float(res.weight_ess), "rhat": rhat, "ess": ess,
                "gold": float(all(checks.values())),
                **{f"check_{k}": float(v) for k, v in checks.items()}}

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
