"""vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full: collapsed quadratic-site bounds (Izmailov &
Kropotov 2017; spec jj-taylor-svi §2.9).

* ``vi-jj`` / ``vi-taylor`` (Alg. 1): per outer iteration, Stage 1 runs ``n_upd`` closed-form
  rounds (``xi`` rule, then ``q(u) <- (mu_hat, Sigma_hat)(xi)``), Stage 2 a fresh L-BFGS-B on the
  kernel's log-parameters capped at ``max_fun`` evaluations.
* ``vi-jj-hybrid``: Stage 2 moves ``(theta, xi)``; then ``q(u)`` is recomputed from its ``xi``.
* ``vi-jj-full``: one L-BFGS-B run on ``(theta, xi)`` from ``xi = 1``; one iteration per
  L-BFGS-B iteration.

Inducing inputs: K-means centres (``gpinfer.inducing``), fixed unless ``learn_inducing``.
Abnormal L-BFGS-B ends are counted in the iteration extras (``lbfgs_abnormal``), warned about and
kept in ``FitResult.state["lbfgs_messages"]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.fit_guard import check_objective_limit, objective_slack
from gpinfer.hyper import HyperParameters
from gpinfer.inducing import DEFAULT_M, inducing_inputs
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    Method,
    OptimizationResult,
    Problem,
    ValueAndGrad,
)
from gpinfer.kernels.initialisation import lengthscale_init_option, start_kernel
from gpinfer.numerics import settings
from gpinfer.numerics.cholesky import tri_solve
from gpinfer.optim import LBFGSB
from gpinfer.options import Option, bounds, choice, flag, integer, real
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter, binary_signs
from gpinfer.training.inner import InnerSchedule
from gpinfer.training.outer import OuterReport, OuterSchedule
from gpinfer_jj.bound import CollapsedObjective, XiSites
from gpinfer_jj.quadratic import CollapsedBound, marginals
from gpinfer_jj.taylor import (
    GUARD_SLACK,
    TRUST_RADIUS,
    GuardedStep,
    MapObjective,
    Stage1Result,
    closed_form_elbo,
    guarded_step,
    newton_rounds,
)

#: default bounds on the kernel's unconstrained (log) parameters (spec §4.2, widened; the table
#: ``gpinfer.numerics.settings``)
LOG_PARAM_BOUNDS = settings.VI_LOG_PARAMETER_BOUNDS


class _CollapsedVI(Method):
    """Shared fit loop; subclasses set ``kind`` (``jj``/``taylor``) and ``xi_mode``.

    Options: ``n_upd`` (Stage-1 rounds), ``max_fun`` (L-BFGS-B evaluations per Stage 2; the
    old name ``maxfun`` works for one release),
    ``carry`` (``"q"``: carry ``(mu, Sigma)`` as in the paper; ``"xi"``: carry ``xi``, monotone
    for JJ), ``init_q`` (``"identity"``: ``Sigma = I`` as in the paper; ``"prior"``), ``tol``
    (stop when ``|dF| / max(1, |F|) < tol`` twice in a row), ``time_budget_s``, ``bounds``
    (on every log-parameter), ``learn_inducing``, ``default_M`` (``M`` when not given),
    ``xi_lower`` (lower bound on ``xi`` when optimised), ``damping`` (Taylor: the first trial
    fraction of each Newton step of Stage 1, then halved until the MAP objective rises),
    ``lengthscale_init`` (``"median"``: squared length-scale = median pairwise distance, as
    ep/sep/gfitc/svi, so that the start suits any number of features; ``"kernel"``: the
    kernel's own, as the paper protocol's sqrt(D); ``"auto"``, the default: ``"kernel"`` for
    a ``Kernel`` object held fixed (``optimize=False``), else ``"median"``,
    ``gpinfer.kernels.initialisation``).
    """

    #: the objective, log p(y) of discrete labels or a bound on it, is never positive
    objective_limit: ClassVar[float | None] = 0.0

    kind: ClassVar[str] = "jj"
    xi_mode: ClassVar[str] = "closed"  # closed | hybrid | full
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = False
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = False
    likelihoods: ClassVar[tuple[str, ...]] = ("logit",)
    option_spec: ClassVar[dict[str, Option]] = {
        "n_upd": integer(3, "[1, inf)", doc="Stage-1 closed-form rounds per outer iteration"),
        "max_fun": integer(5, "[1, inf)", doc="L-BFGS-B evaluations per Stage 2"),
        "carry": choice("q", ("q", "xi"), doc="q: carry (mu, Sigma); xi: monotone variant"),
        "init_q": choice("identity", ("identity", "prior")),
        "tol": real(1e-6, "[0, inf)", doc="stop when |dF|/max(1,|F|) < tol twice in a row"),
        "time_budget_s": real(None, "(0, inf)", none=True),
        "bounds": bounds(LOG_PARAM_BOUNDS, doc="box on every log kernel parameter"),
        "learn_inducing": flag(False),
        "default_M": integer(DEFAULT_M, "[1, inf)", doc="M when the run leaves it null"),
        "xi_lower": real(1e-3, "(0, inf)", doc="lower bound on xi when optimised"),
        "damping": real(1.0, "(0, 1]", doc="Taylor: first trial fraction of each Newton step"),
        "lengthscale_init": lengthscale_init_option(),
    }

    #: one vocabulary with pep/fitc/vfe (``docs/options.md``)
    renamed_options: ClassVar[dict[str, str]] = {"maxfun": "max_fun"}

    # -- set-up ------------------------------------------------------------------------------
    def _objective(self, problem: Problem) -> tuple[CollapsedObjective, HyperParameters]:
        s = binary_signs(problem.y, problem.n_classes, self.name)
        if problem.batch_size is not None:
            raise InputError(f"{self.name} does not support mini-batches (batch_size=None)")
        X = np.asarray(problem.X, dtype=float)
        Z = inducing_inputs(problem.inducing, X, problem.rng, int(self.options["default_M"]))
        kernel = start_kernel(problem, X, None, str(self.options["lengthscale_init"]),
                              owner=self.name)
        hp = HyperParameters(kernel, Z=Z, optimize=problem.optimize,
                             optimize_inducing=bool(self.options["learn_inducing"]))
        return CollapsedObjective(self.kind, X, s, kernel, Z, problem.likelihood, hp), hp

    def _lbfgs(self, hp: HyperParameters, n_xi: int, maxfun: int | None,
               centre: Array | None = None, radius: float = np.inf) -> LBFGSB:
        """L-BFGS-B on the packed hyper-parameters (``[P]``, then ``n_xi`` entries of ``xi``);
        with ``centre [P]``, each hyper-parameter also kept within ``radius`` of it."""
        bounds = hp.bounds(kernel=tuple(self.options["bounds"]))
        if centre is not None and np.isfinite(radius):
            bounds = [(c - radius if lo is None else max(lo, c - radius),
                       c + radius if hi is None else min(hi, c + radius))
                      for (lo, hi), c in zip(bounds, centre.tolist())]
        bounds += [(float(self.options["xi_lower"]), None)] * n_xi
        return LBFGSB(bounds=bounds, maxfun=maxfun, stop_on_trial_failure=True)

    # -- fit ---------------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        obj, hp = self._objective(problem)
        rep = IterationReporter(callback, self.name, self.options["time_budget_s"])
        log: dict[str, Any] = {"messages": [], "abnormal": 0}
        if self.xi_mode == "full":
            xi, value, n_iter = self._fit_full(problem, obj, hp, rep, log)
        else:
            xi, value, n_iter = self._fit_alternating(problem, obj, hp, rep, log)
        if log["abnormal"]:
            warnings.warn(
                f"{self.name}: L-BFGS-B ended abnormally {log['abnormal']} time(s); last: "
                f"{log['last_abnormal']}", RuntimeWarning, stacklevel=2)
        posterior = obj.posterior(xi)
        state = {
            "xi": xi,
            "Z": obj.Z.copy(),
            "kernel_params": obj.kernel.get_unconstrained().copy(),
            "lbfgs_abnormal": np.array(log["abnormal"]),
            "lbfgs_messages": np.array(log["messages"] or [""]),
            "n_eval": np.array(obj.n_eval),
        }
        return FitResult(posterior=posterior, log_evidence=float(value), kernel=obj.kernel,
                         n_iter=n_iter, history=rep.history, state=state)

    def _within_limit(self, fun: ValueAndGrad, obj: CollapsedObjective) -> ValueAndGrad:
        """``fun`` raising ``NumericalError`` where the bound exceeds ``objective_limit`` (an
        L-BFGS-B trial point there ends Stage 2 at its last accepted iterate)."""
        n = obj.X.shape[0]

        def checked(x: Array) -> tuple[float, Array]:
            value, grad = fun(x)
            check_objective_limit(value, self.objective_limit, self.name, n)
            return value, grad

        return checked

    def _schedule(self, report: OuterReport | None = None,
                  history: list[dict[str, float]] | None = None) -> OuterSchedule:
        """The outer schedule of Stage 2 and of vi-jj-full: reports and the result are built
        from ``x`` alone (no memo, no re-solve); abnormal ends, trial failures included, are
        recorded by ``_record`` and warned about once per fit."""
        return OuterSchedule(self.name, report, refresh=False, finish="never", warn=False,
                             history=history)

    def _record(self, log: dict[str, Any], result: OptimizationResult) -> None:
        log["messages"].append(result.message)
        if not result.success:
            log["abnormal"] += 1
            log["last_abnormal"] = result.message

    def _snapshot(self, obj: CollapsedObjective, xi: Array) -> Callable[[], InducingPosterior]:
        theta, xi = obj.hp.pack(), xi.copy()

        def build():
            with obj.hp.installed(theta):
                return obj.posterior(xi)

        return build

    # -- Alg. 1 (vi-jj, vi-taylor) and the hybrid variant -----------------------------------
    def _stage1(self, obj: CollapsedObjective, mu: Array, Sigma: Array, xi: Array | None
                ) -> Stage1Result:
        """``n_upd`` closed-form rounds at fixed ``theta`` (Taylor: backtracked Newton rounds)."""
        fac = obj.factors()
        n_upd = int(self.options["n_upd"])
        carried = obj.bound(xi, fac) if self.options["carry"] == "xi" and xi is not None else None
        if obj.kind == "taylor":  # the Newton rounds need the means only
            if carried is None:
                nu = tri_solve(fac.L, mu)
                mean = fac.A_T @ nu
            else:
                nu, mean = carried.whitened_mean, carried.m_hat
            taylor = MapObjective(obj.s, obj.link)
            return newton_rounds(taylor, fac, lambda x: obj.bound(x, fac),
                                 taylor.point(nu, mean), n_upd, float(self.options["damping"]))
        # S2_hat before m_hat: the pass over R that gives the variances gives the means too
        if carried is None:
            mean, var = marginals(fac, mu, Sigma)
        else:
            var, mean = carried.S2_hat, carried.m_hat
        sites = XiSites(obj, fac, mean, var)
        # Alg. 1: n_upd rounds, no convergence test (tol = -inf) on the engine's inner schedule
        InnerSchedule(tol=-np.inf, max_updates=n_upd).run(sites)
        b, xi = sites.bound, sites.xi
        assert b is not None and xi is not None  # n_upd >= 1
        return Stage1Result(b.mu_hat, b.Sigma_hat, xi, b.value, 0)

    def _fit_alternating(self, problem: Problem, obj: CollapsedObjective, hp: HyperParameters,
                         rep: IterationReporter, log: dict[str, Any]
                         ) -> tuple[Array, float, int]:
        M = obj.Z.shape[0]
        if self.options["init_q"] == "identity":
            mu, Sigma = np.zeros(M), np.eye(M)
        else:
            mu, Sigma = np.zeros(M), obj.kernel.K(obj.Z)
        xi: Array | None = None
        small_changes, prev, it, value = 0, None, 0, -np.inf
        for it in range(1, int(problem.max_iter) + 1):
            stage1 = self._stage1(obj, mu, Sigma, xi)
            mu, Sigma, xi, value = stage1.mu, stage1.Sigma, stage1.xi, stage1.value
            extra: dict[str, float] = {"stage1_bound": value}
            if obj.kind == "taylor":
                extra["newton_halvings"] = float(stage1.halvings)
            if hp.size > 0:
                value, xi, b = self._stage2(obj, hp, xi, value, log, extra)
                if b is not None:
                    mu, Sigma = b.mu_hat, b.Sigma_hat
            rep.report(it, value, self._snapshot(obj, xi), extra)
            if prev is not None and abs(value - prev) / max(1.0, abs(value)) < self.options["tol"]:
                small_changes += 1
            else:
                small_changes = 0
            prev = value
            if small_changes >= 2 or rep.should_stop():
                break
        assert xi is not None  # max_iter >= 1
        if hp.size > 0 and self._guarded(obj):
            self._refuse_runaway(value, obj.X.shape[0], it)
        return xi, value, it

    def _stage2(self, obj: CollapsedObjective, hp: HyperParameters, xi: Array, value: float,
                log: dict[str, Any], extra: dict[str, float]
                ) -> tuple[float, Array, CollapsedBound | None]:
        """Stage 2 from the Stage-1 sites ``xi [N]`` and bound ``value``: L-BFGS-B on the
        hyper-parameters (vi-jj-hybrid: and ``xi``; vi-taylor's guard: checked against the
        true bound), leaving ``hp`` at the result. Returns ``(value, xi, bound at the new xi
        for vi-jj-hybrid, else None)``; ``extra`` gets the step's metrics."""
        n0 = obj.n_eval
        hybrid = self.xi_mode == "hybrid"
        guard = self._guarded(obj)
        # the true bound at the start, before Stage 2 moves the factors
        start_elbo = (closed_form_elbo(obj.bound(xi), obj.likelihood, obj.labels)
                      if guard else 0.0)
        x0 = np.concatenate([hp.pack(), xi]) if hybrid else hp.pack()

        def fun(x: Array, xi_fixed: Array = xi) -> tuple[float, Array]:
            if hybrid:  # theta and xi move together
                return obj.value_and_grad(x[: hp.size], x[hp.size:], with_xi=True)
            return obj.value_and_grad(x, xi_fixed)
        radius = float(self.options["trust_radius"]) if guard else np.inf
        opt = self._lbfgs(hp, xi.size if hybrid else 0, int(self.options["max_fun"]),
                          x0[: hp.size], radius)
        result = self._schedule().run(opt, self._within_limit(fun, obj), x0,
                                      10 * int(self.options["max_fun"]))
        self._record(log, result)
        if guard:
            step = self._guard_step(obj, x0, result.x, xi, start_elbo)
            hp.unpack(step.theta)
            value = value if step.refused else step.value
            extra.update(guard_elbo=start_elbo if step.refused else step.elbo,
                         guard_halvings=float(step.halvings), guard_refused=float(step.refused))
        else:
            hp.unpack(result.x[: hp.size])
            value = result.value
        b = None
        if hybrid:
            xi = result.x[hp.size:].copy()
            b = obj.bound(xi)
        extra.update(nfev=float(obj.n_eval - n0), lbfgs_abnormal=float(log["abnormal"]),
                     lbfgs_success=float(result.success))
        return value, xi, b

    def _refuse_runaway(self, value: float, n: int, iteration: int) -> None:
        """``NumericalError`` naming vi-jj-hybrid when the guarded fit still ends with the Taylor
        surrogate above 0: its sites never reached the Newton fixed point (where the surrogate
        is the DTC-Laplace evidence, never positive), so ``q(u)`` is not what vi-taylor
        promises."""
        if value > objective_slack(n):
            raise NumericalError(
                f"{self.name}: the Taylor surrogate ends at {value:.6g} > 0 after {iteration} "
                "iterations: Stage 1 did not reach its Newton fixed point at the learned kernel, "
                "so q(u) is not the DTC-Laplace posterior (nearly separable or strongly "
                "unbalanced data at large N); use vi-jj-hybrid, whose objective is a true bound",
                iteration=iteration, quantity="taylor surrogate")

    def _guarded(self, obj: CollapsedObjective) -> bool:
        """Whether Stage 2 is checked against the true bound (vi-taylor's ``guard``)."""
        return obj.kind == "taylor" and bool(self.options.get("guard", False))

    def _guard_step(self, obj: CollapsedObjective, start: Array, proposal: Array, xi: Array,
                    start_elbo: float) -> GuardedStep:
        """The part of the Stage-2 step ``start -> proposal`` (log kernel parameters ``[P]``)
        that the ELBO of the Taylor ``q(u)`` at ``xi [N]`` allows (``taylor.guarded_step``)."""
        hp = obj.hp

        def bound_at(theta: Array) -> CollapsedBound:
            hp.unpack(theta)
            return obj.bound(xi)

        def elbo(b: CollapsedBound) -> float:
            return closed_form_elbo(b, obj.likelihood, obj.labels)

        round_off = objective_slack(obj.X.shape[0])
        return guarded_step(bound_at, elbo, start, proposal, start_elbo,
                            GUARD_SLACK * abs(start_elbo) + round_off, round_off)

    # -- vi-jj-full ----------------------------------------------------------------------------
    def _fit_full(self, problem: Problem, obj: CollapsedObjective, hp: HyperParameters,
                  rep: IterationReporter, log: dict[str, Any]) -> tuple[Array, float, int]:
        n = obj.X.shape[0]
        x0 = np.concatenate([hp.pack(), np.ones(n)])

        def fun(x: Array) -> tuple[float, Array]:
            return obj.value_and_grad(x[: hp.size], x[hp.size:], with_xi=True)

        def on_iteration(it: int, x: Array, value: float) -> bool:
            rep.report(it, value, self._snapshot_at(obj, hp, x),
                       {"nfev": float(obj.n_eval)})
            return rep.should_stop()

        result = self._schedule(on_iteration, rep.history).run(
            self._lbfgs(hp, n, None), self._within_limit(fun, obj), x0, int(problem.max_iter))
        self._record(log, result)
        hp.unpack(result.x[: hp.size])
        xi = result.x[hp.size:].copy()
        if not rep.history:  # no completed iteration: report the end point once
            rep.report(1, result.value, self._snapshot(obj, xi), {"nfev": float(obj.n_eval)})
        return xi, result.value, max(result.n_iter, 1)

    def _snapshot_at(self, obj: CollapsedObjective, hp: HyperParameters, x: Array
                     ) -> Callable[[], InducingPosterior]:
        with hp.installed(x[: hp.size]):
            return self._snapshot(obj, x[hp.size:])


class _JJBound(_CollapsedVI):
    """The collapsed Jaakkola-Jordan bound (a true bound on the evidence); subclasses choose how
    ``xi`` moves (``xi_mode``)."""

    objective_kind = "bound"
    kind = "jj"


class ViJJ(_JJBound):
    """Alg. 1 with Jaakkola-Jordan sites (logistic likelihood)."""

    name: ClassVar[str] = "vi-jj"
    xi_mode = "closed"


class ViTaylor(_CollapsedVI):
    """Alg. 1 with second-order Taylor sites (``xi <- m``: Newton for the DTC-Laplace mode).

    Options beyond the family's: ``guard`` (default ``True``): each Stage-2 step stays within
    ``trust_radius`` of the start on every log hyper-parameter and is kept only where the
    surrogate is not above 0 and the ELBO of its ``q(u)``, a true bound, does not fall
    (``gpinfer_jj.taylor.guarded_step``; else halved, then refused); a fit whose surrogate still
    ends above 0 raises ``NumericalError`` naming vi-jj-hybrid. ``guard=False``: as before
    issue 27 (no trust region, no check).
    """

    name: ClassVar[str] = "vi-taylor"
    kind = "taylor"
    xi_mode = "closed"
    #: the Taylor surrogate is no bound: away from the Newton fixed point (where it is the
    #: DTC-Laplace evidence, never positive) sites on wrongly classified points can lift it above
    #: 0 legitimately; its failure mode is caught in Stage 1 (``gpinfer_jj.taylor``)
    objective_limit: ClassVar[float | None] = None
    objective_kind = "surrogate"  # the fit guard ranks its iterates by training NLL
    likelihoods: ClassVar[tuple[str, ...]] = ("logit", "probit")
    option_spec: ClassVar[dict[str, Option]] = {
        **_CollapsedVI.option_spec,
        "guard": flag(True, doc="Stage-2 steps kept only where the ELBO of their q(u), a true "
                                "bound, does not fall (gpinfer_jj.taylor.guarded_step)"),
        "trust_radius": real(TRUST_RADIUS, "(0, inf)",
                             doc="with guard: most change of each log hyper-parameter per Stage 2"),
    }
    #: any ``Bernoulli`` (``p(y|f) = sig(s f)`` with its own log-sigmoid ``link``)
    likelihood_requirements: ClassVar[frozenset[str] | None] = frozenset({"log_sigmoid"})


class ViJJHybrid(_JJBound):
    """Alg. 1 whose Stage 2 moves ``(theta, xi)`` with the ``xi`` gradient (§2.8)."""

    name: ClassVar[str] = "vi-jj-hybrid"
    xi_mode = "hybrid"


class ViJJFull(_JJBound):
    """One L-BFGS-B run on ``(theta, xi)`` maximising the collapsed JJ bound."""

    name: ClassVar[str] = "vi-jj-full"
    xi_mode = "full"
