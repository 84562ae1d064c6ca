"""Entry points ``ivm`` (multi-class IVM, spec ivm §2-3) and ``ivm-baseline`` (spec §4).

``M`` (``problem.inducing``) is the final active-set size ``d_final``, default ``min(n, 150)``
(baseline: the budget ``d_max`` per class, default ``baseline.default_budget``).
Hyper-parameters:

* ``problem.optimize = False``: the paper's fixed-hyper-parameter mode, one conditional
  inference; the callback gets one iteration per inclusion (``objective`` = cumulative
  information score, ``posterior()`` = the current posterior with the liquid set frozen in, so
  the runner logs learning curves of test error/NLL against the active-set size).
* ``problem.optimize = True``: spec §3.5 round-based major/minor scheme: ``rounds`` times
  (at most ``max_iter - 2``: each major step and the final criterion are one iteration each)
  (major step: conditional inference at the current ``theta`` with a fixed RNG seed; minor step:
  ``minor_iter`` L-BFGS-B iterations on ``-G`` with the active set and sites frozen), then a
  last major step; the rounds stop early once the major-mode ``G`` changes by less than
  ``major_tol * (1 + |G|)`` or a step fails numerically (extreme ``theta``; a ``RuntimeWarning``
  names the failure). The result is the major step with the best ``G`` (its representation is
  kept, not recomputed).
  ``theta`` = the kernels' unconstrained parameters and (``learn_intercepts``) ``beta_1..C-1``
  (``beta_C = 0`` pins the shift invariance, spec P25).

``log_evidence`` is ``-G`` (the criterion is an upper bound on ``-log p(y)`` up to quadrature).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.fit_guard import classification_baseline_nll
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Array, FitCallback, FitResult, Likelihood, Method, Problem
from gpinfer.kernels.base import Kernel
from gpinfer.numerics import settings
from gpinfer.optim import make_optimizer
from gpinfer.options import Option, choice, custom, flag, integer, real
from gpinfer.posterior import Posterior
from gpinfer.reporting import IterationReporter
from gpinfer.training.outer import OuterSchedule
from gpinfer_ivm.baseline import (
    BASELINE_GH_ORDER,
    BASELINE_RULES,
    default_budget,
    resolve_baseline_rule,
    run_baseline,
)
from gpinfer_ivm.criterion import FrozenSites, criterion
from gpinfer_ivm.diagonal_softmax import diagonal_softmax_predictive
from gpinfer_ivm.gaussian_cubature import RULES, resolve_rule, softmax_predictive
from gpinfer_ivm.inference import EP_TOL, IVMSettings, run_inference
from gpinfer_ivm.projection import PROJECTION_ALGORITHMS
from gpinfer_ivm.solid import STUB_UPDATES

#: default final active-set size when ``M`` is not given
DEFAULT_D_FINAL = 150
#: default liquid-set size (capped at the final active-set size)
DEFAULT_L = 25

#: default largest move of each unconstrained (log) hyper-parameter in one minor step: a factor
#: 10. The minor step's criterion holds the sites of the last major step, which describe the
#: data only near that step's ``theta``; an unlimited step can leave for a region where the
#: frozen sites make the criterion prefer a vanishing signal variance (G -> n log C, the class
#: frequencies), a plateau the later rounds cannot leave (issue 27)
TRUST_RADIUS = float(np.log(10.0))
#: bounds of every unconstrained hyper-parameter during learning (``gpinfer.numerics.settings``)
THETA_BOUND = settings.IVM_LOG_PARAMETER_BOUND
#: learning "ended at a flat kernel" when its best ``G`` is within this fraction of
#: ``1 + |G_0|`` of the constant model's (``constant_model_criterion``: ``G_0`` at its best
#: intercepts, or at the kept ones)
FLAT_TOL = 1e-2

#: the fit's per-iteration reporter: ``report(objective, posterior builder, **extras)``
Report = Callable[..., None]


class IVMPosterior(Posterior):
    """Prediction from a representation with ``predict(X) -> (h [N*, C], A [N*, C, C])``.

    ``predict_f`` returns the means and the diagonal of ``A``; ``predict_proba`` integrates the
    softmax (with intercepts ``beta``) against the full ``C x C`` covariance (spec §2.10).
    """

    def __init__(self, likelihood: Likelihood, rep: Any, beta: Array, gh_order: int | None,
                 reduced: Any,
                 rule: str = "product"):  # fmt: skip
        super().__init__(likelihood)
        self.rep, self.beta, self.gh_order, self.reduced = rep, beta, gh_order, reduced
        self.rule = rule
        #: the concrete ``(rule, order)`` the predictions use (``rule="auto"`` resolved)
        self.quadrature = ((rule, None) if rule == "diagonal"
                           else resolve_rule(len(beta), gh_order, reduced, rule))

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        h, A = self.rep.predict(X)
        return h, np.maximum(np.diagonal(A, axis1=1, axis2=2).copy(), 1e-300)

    def predict_proba(self, X: Array) -> Array:
        h, A = self.rep.predict(X)
        if self.rule == "diagonal":  # ivm-baseline: diagonal A, exact 1-D reduction
            P = diagonal_softmax_predictive(h, np.diagonal(A, axis1=1, axis2=2), self.beta)
        else:
            P = softmax_predictive(h, A, self.beta, self.gh_order, self.reduced, self.rule)
        return P / P.sum(axis=1, keepdims=True)

    def log_predictive(self, X: Array, y: Array) -> Array:
        P = self.predict_proba(X)
        return np.log(np.clip(P[np.arange(len(y)), np.asarray(y, dtype=int)], 1e-300, None))

    def state(self) -> dict[str, Array]:
        return {"beta": self.beta}


class _ActiveSetMethod(Method):
    """Shared plumbing: kernels per class, ``d_final``, intercepts, learning loop."""

    #: reported criteria belong to different active sets: not one quantity to restore the best of
    restore_best_iterate: ClassVar[bool] = False

    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass = True
    uses_inducing_points = True
    likelihoods = ("softmax",)
    coupled: ClassVar[bool] = True
    #: kernel sharing, intercepts and the hyper-parameter learning loop (both methods)
    model_options: ClassVar[dict[str, Option]] = {
        "shared_kernel": flag(True, doc="one kernel for all C processes"),
        "intercepts": custom(None, "a list of C finite intercepts beta",
                             lambda v: isinstance(v, list | tuple | np.ndarray), none=True),
        "learn_intercepts": flag(True),
        "rounds": integer(4, "[0, inf)", doc="major/minor rounds when optimize=true"),
        "minor_iter": integer(8, "[0, inf)", doc="L-BFGS-B iterations per round"),
        "major_tol": real(1e-3, "[0, inf)", doc="relative change of G that stops the rounds"),
        "trust_radius": real(TRUST_RADIUS, "(0, inf)", none=True,
                             doc="largest move of each unconstrained hyper-parameter per minor "
                                 "step (None: only the bounds +-8)"),
    }

    def _d_final(self, problem: Problem) -> int:
        M = problem.inducing
        if M is None:
            return min(problem.n, DEFAULT_D_FINAL)
        if isinstance(M, np.ndarray):
            raise InputError(
                f"{self.name} selects its active set from the training points; pass M as a count"
            )
        if not 1 <= int(M) <= problem.n:
            raise InputError(f"M (d_final) must be in 1..n={problem.n}, got {M}")
        return int(M)

    def _kernels(self, problem: Problem) -> list[Kernel]:
        C = problem.n_classes
        if self.options["shared_kernel"]:
            return [problem.kernel.copy()] * C
        return [problem.kernel.copy() for _ in range(C)]

    def _beta(self, C: int) -> Array:
        beta = self.options["intercepts"]
        beta = np.zeros(C) if beta is None else np.asarray(beta, dtype=float)
        if beta.shape != (C,) or not np.all(np.isfinite(beta)):
            raise InputError(f"intercepts must be a finite list of {C} values, got {beta}")
        return beta - beta[-1]

    # -- hooks -------------------------------------------------------------------------------
    def _infer(self, problem: Problem, kernels: list[Kernel], beta: Array,
               rng: np.random.Generator, report: Report | None) -> tuple[Any, FrozenSites]:
        raise NotImplementedError

    def _order(self, C: int) -> tuple[int | None, Any]:
        return self.options["gh_order"], self.options["reduced"]

    def _rule(self, C: int) -> str:
        """The quadrature rule for ``C`` classes (``ivm``: as given; ``auto`` resolves in
        ``gaussian_cubature``)."""
        return str(self.options.get("rule") or "auto")

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        X, y, C = problem.X, np.asarray(problem.y, dtype=np.int64), problem.n_classes
        if C < 2:
            raise InputError(f"{self.name} needs at least two classes, got {C}")
        kernels = self._kernels(problem)
        beta = self._beta(C)
        order, reduced = self._order(C)
        seed = int(problem.rng.integers(2**31))
        reporter = IterationReporter(callback, self.name)  # training-only clock
        history = reporter.history
        it = [0]

        def report(objective: float, post: Callable[[], Posterior] | None, **extra: float
                   ) -> None:
            it[0] += 1
            reporter.report(it[0], objective, post, extra)

        def lik() -> Likelihood:
            return problem.likelihood

        if not problem.optimize:
            rep, sites = self._infer(problem, kernels, beta, np.random.default_rng(seed), report)
        else:
            rep, sites, beta = self._learn(problem, kernels, beta, seed, report)
        crit = criterion(kernels, X, y, sites, beta, order, reduced, False, self._rule(C))
        if not problem.optimize or it[0] < problem.max_iter:  # learning honours max_iter
            report(-crit.value, None, G1=crit.g1, G2=crit.g2)
        post = IVMPosterior(lik(), rep, beta, order, reduced, self._rule(C))
        state = {"beta": beta}
        if self.coupled:
            state.update(active=sites.I[0], pi=np.stack(sites.pi, 1), b=np.stack(sites.b, 1))
        return FitResult(
            posterior=post,
            log_evidence=-crit.value,
            kernel=kernels[0] if self.options["shared_kernel"] else kernels,
            n_iter=it[0],
            history=history,
            state=state,
        )

    def _learn(self, problem: Problem, kernels: list[Kernel], beta: Array, seed: int,
               report: Report) -> tuple[Any, FrozenSites, Array]:
        """Round-based major/minor optimisation of ``G`` (spec §3.5).

        Major steps at ``theta_0, ..., theta_R`` (``R = rounds``), each followed, except the
        last, by ``minor_iter`` L-BFGS-B iterations on ``G`` with the active set and sites
        frozen, each unconstrained hyper-parameter moving by at most ``trust_radius`` (within
        ``+-THETA_BOUND``). The rounds stop early when two successive major-mode values differ
        by less than ``major_tol * (1 + |G|)``, or when a step fails numerically. The result is
        the major step with the smallest ``G``, whose representation is kept (not recomputed),
        and the kernels are left at its ``theta``. Each major step is reported with ``G_major``
        and the unconstrained hyper-parameters (``hyper.<name>``, ``beta.<c>``).
        """
        X, y = problem.X, np.asarray(problem.y, dtype=np.int64)
        order, reduced = self._order(problem.n_classes)
        rule = self._rule(problem.n_classes)
        space = _LearnedParameters(kernels, beta, bool(self.options["learn_intercepts"]))
        rounds, minor_iter, tol = self._round_settings(problem)
        theta = space.theta0()
        best: tuple[float, Array, Any, FrozenSites, Array] | None = None
        previous: float | None = None
        for r in range(rounds + 1):
            b_now = space.unpack(theta)
            try:
                rep, sites = self._infer(problem, kernels, b_now, np.random.default_rng(seed), None)
                major = criterion(kernels, X, y, sites, b_now, order, reduced, False, rule).value
            except NumericalError as err:
                if best is None:
                    raise
                _stop_warning(self.name, r, "major", err)
                break  # extreme theta: stop at the best major step so far
            if best is None or major < best[0]:
                best = (major, theta.copy(), rep, sites, b_now)
            report(-major, None, round=float(r), G_major=major, **space.named(b_now))
            settled = previous is not None and abs(previous - major) <= tol * (1.0 + abs(major))
            if r == rounds or settled:
                break
            previous = major
            try:
                theta = self._minor(problem, space, sites, theta, minor_iter)
            except NumericalError as err:
                _stop_warning(self.name, r, "minor", err)
                break
        assert best is not None
        _, theta, rep, sites, b_best = best
        space.unpack(theta)  # the kept representation refers to the kernels at this theta
        _flat_warning(self.name, best[0], y, b_best, kernels, self._d_final(problem),
                      not self.coupled)
        return rep, sites, b_best

    def _round_settings(self, problem: Problem) -> tuple[int, int, float]:
        """``(rounds, minor_iter, major_tol)``; one reported iteration per major step and one
        for the final criterion: ``max_iter`` caps the rounds."""
        rounds = min(int(self.options["rounds"]), max(int(problem.max_iter) - 2, 0))
        minor_iter = int(self.options["minor_iter"])
        tol = float(self.options["major_tol"])
        if rounds < 0 or minor_iter < 0 or not tol >= 0.0:
            raise InputError(f"need rounds >= 0, minor_iter >= 0, major_tol >= 0; got "
                             f"{rounds}, {minor_iter}, {tol}")  # fmt: skip
        return rounds, minor_iter, tol

    def _minor(self, problem: Problem, space: _LearnedParameters, sites: FrozenSites,
               theta: Array, minor_iter: int) -> Array:
        """The minor mode from ``theta [P + nb]``: ``minor_iter`` L-BFGS-B iterations on ``G``
        with ``sites`` frozen, within ``trust_radius`` of ``theta`` and ``+-THETA_BOUND``; no
        reports, no re-solve (the next major step re-infers at the result)."""
        X, y, C = problem.X, np.asarray(problem.y, dtype=np.int64), problem.n_classes
        order, reduced = self._order(C)
        rule = self._rule(C)

        def fun(th: Array) -> tuple[float, Array]:
            b = space.unpack(th)
            res = criterion(space.kernels, X, y, sites, b, order, reduced, True, rule)
            return -res.value, -space.gradient(res.dkernel, res.dbeta)

        radius = self.options["trust_radius"]
        reach = np.inf if radius is None else float(radius)
        lo = np.maximum(theta - reach, -THETA_BOUND)
        hi = np.minimum(theta + reach, THETA_BOUND)
        opt = make_optimizer("lbfgs", bounds=list(zip(lo.tolist(), hi.tolist())))
        minor = OuterSchedule(self.name, refresh=False, finish="never", warn=False)
        return np.asarray(minor.run(opt, fun, np.clip(theta, lo, hi), minor_iter).x, dtype=float)


class _LearnedParameters:
    """The vector IVM learns: the kernels' unconstrained parameters ``[P]``, then (with
    ``learn_intercepts``) the first ``nb = C - 1`` intercepts (the last stays fixed)."""

    def __init__(self, kernels: list[Kernel], beta: Array, learn_beta: bool):
        self.kernels, self.beta = kernels, beta
        self.hp = HyperParameters(kernels)
        self.nb = beta.shape[0] - 1 if learn_beta else 0

    def theta0(self) -> Array:
        """The starting vector ``[P + nb]``."""
        return np.concatenate([self.hp.pack(), self.beta[: self.nb]])

    def unpack(self, theta: Array) -> Array:
        """Install ``theta [P + nb]`` in the kernels; the intercepts ``[C]`` it gives."""
        self.hp.unpack(theta[: self.hp.size])
        b = self.beta.copy()
        b[: self.nb] = theta[self.hp.size :]
        return b

    def gradient(self, dkernel: list[Array], dbeta: Array) -> Array:
        """The gradient ``[P + nb]`` from the kernels' parts and ``dbeta [C]``."""
        return np.concatenate(dkernel + [dbeta[: self.nb]])

    def named(self, b: Array) -> dict[str, float]:
        """The unconstrained hyper-parameters and the intercepts ``b [C]`` by name."""
        out = {f"hyper.{k}": float(v) for k, v in self.hp.describe().items()}
        out.update({f"beta.{c}": float(b[c]) for c in range(b.shape[0])})
        return out


def _stop_warning(name: str, r: int, mode: str, err: Exception) -> None:
    warnings.warn(f"{name}: hyper-parameter learning stopped in round {r} ({mode} mode): {err}; "
                  "keeping the best major step so far", RuntimeWarning, stacklevel=3)  # fmt: skip


def constant_model_criterion(y: Array, beta: Array | None = None) -> float:
    """``G`` of the constant model (kernel variance -> 0, so ``G2 -> 0``) on the labels
    ``y [n]``: ``-sum_i log softmax(beta)_{y_i}`` at the intercepts ``beta [C]``, or (``None``)
    at its best ones, ``-sum_c n_c log(n_c / n)`` (``n log C`` for balanced classes): ``n`` times
    the fit guard's class-frequency baseline."""
    if beta is None:
        n = y.shape[0]
        return n * classification_baseline_nll(y, int(y.max()) + 1, np.arange(n))
    log_p = beta - np.logaddexp.reduce(beta)
    return float(-np.sum(log_p[y]))


def _flat_warning(name: str, best: float, y: Array, beta: Array, kernels: list[Kernel],
                  d_final: int, per_class: bool) -> None:
    """Warn when the kept major step's ``best = G`` is the constant model's ``G_0``: within
    ``FLAT_TOL * (1 + |G_0|)`` of its best value or of its value at the kept intercepts
    ``beta [C]`` (with learned intercepts the two agree; with fixed ones a vanishing variance
    reaches the second, a kernel constant over the inputs the first). A ``G`` between them (fixed
    intercepts, a kernel that beats the constant model at them) or above both (e.g. a stop at
    the start) is no flat kernel. ``G`` charges every one of the ``n`` points the variance its
    marginal keeps; with few active points (``d_final``, ``per_class``: each class's budget) far
    apart (many features) most keep nearly the prior's, and the criterion's best kernel is the
    flat one."""
    flat = constant_model_criterion(y)
    kept = constant_model_criterion(y, beta)
    if all(abs(best - g0) > FLAT_TOL * (1.0 + abs(g0)) for g0 in (flat, kept)):
        return
    kernel = ", ".join(dict.fromkeys(repr(k) for k in kernels))
    active = (f"each class has only M={d_final} active" if per_class else
              f"only M={d_final} are active")
    warnings.warn(
        f"{name}: hyper-parameter learning ended at a flat kernel ({kernel}): the best major "
        f"step's criterion G {best:.6g} is the constant model's (at its best intercepts "
        f"{flat:.6g}, at the kept ones {kept:.6g}, within {FLAT_TOL:.0%}), so the model predicts "
        f"the same class probabilities everywhere. G charges all n={y.shape[0]} training points "
        f"and {active}: where the others keep nearly their prior variance (few active points, "
        f"many features) G prefers the flat kernel. Pass a larger M (now {d_final}"
        f"{' per class' if per_class else ''}) or fix the kernel (optimize=False)",
        RuntimeWarning, stacklevel=3)


class IVM(_ActiveSetMethod):
    """Multi-class IVM with a liquid set (spec ivm §2; options as in ``IVMSettings``)."""

    name = "ivm"
    coupled = True
    option_spec: ClassVar[dict[str, Option]] = {
        "L": integer(None, "[1, inf)", none=True,
                     doc=f"liquid-set size (None: min({DEFAULT_L}, d_final))"),
        "ep_sweeps": integer(3, "[0, inf)", doc="most EP sweeps over the liquid set per "
                             "inclusion"),
        "ep_tol": real(EP_TOL, "[0, inf)", doc="stop the EP sweeps once no liquid marginal "
                       "moves by this much in a sweep (mean in standard deviations, log "
                       "variance ratio; 0: always ep_sweeps)"),
        "pool_size": integer(None, "[1, inf)", none=True, doc="candidate pool size"),
        "retain": real(0.5, "[0, 1)", doc="fraction of the pool kept for the next one"),
        "n_init": integer(None, "[1, inf)", none=True, doc="random initial picks"),
        "gh_order": integer(None, "[1, inf)", none=True, doc="quadrature nodes per axis"),
        "reduced": flag(None, none=True, doc="integrate on the complement of 1"),
        "rule": choice("auto", RULES, doc="quadrature rule (auto: product while it has at "
                       "most AUTO_PRODUCT_NODES nodes, else the C-independent sobol rule)"),
        "projection": choice("newton", PROJECTION_ALGORITHMS),
        "stub_update": choice("lazy", STUB_UPDATES),
        **_ActiveSetMethod.model_options,
    }

    def _infer(self, problem: Problem, kernels: list[Kernel], beta: Array,
               rng: np.random.Generator, report: Report | None) -> tuple[Any, FrozenSites]:
        o = self.options
        d_final = self._d_final(problem)
        s = IVMSettings(
            d_final=d_final,
            L=min(DEFAULT_L, d_final) if o["L"] is None else min(int(o["L"]), d_final),
            ep_sweeps=int(o["ep_sweeps"]),
            ep_tol=float(o["ep_tol"]),
            pool_size=o["pool_size"],
            retain=float(o["retain"]),
            n_init=o["n_init"],
            gh_order=o["gh_order"],
            reduced=o["reduced"],
            rule=self._rule(problem.n_classes),
            projection=o["projection"],
            stub_update=o["stub_update"],
        )
        if o["L"] is not None and int(o["L"]) > s.d_final:
            raise InputError(f"liquid size L={o['L']} exceeds d_final (M)={s.d_final}")
        total = [0.0]

        def cb(size: int, runner: Any) -> None:
            if report is None:
                return
            if runner.result.history:
                total[0] += runner.result.history[-1]["score"]

            def post() -> IVMPosterior:
                return IVMPosterior(problem.likelihood, runner.snapshot(), beta, s.gh_order,
                                    s.reduced, s.rule)  # fmt: skip

            report(total[0], post, active_size=float(size))

        res = run_inference(kernels, problem.X, problem.y, beta, s, rng, cb)
        solid = res.solid
        sites = FrozenSites.from_restricted(solid.active.copy(), solid.pi[: solid.d].copy(),
                                            solid.b[: solid.d].copy())  # fmt: skip
        return solid, sites


class IVMBaseline(_ActiveSetMethod):
    """Independent-process baseline (spec ivm §4); ``M`` = budget ``d_max`` per class
    (default: ``baseline.default_budget``, the paper's ``min(n, 150)`` while the ``C``
    active sets together hold at most ``max(n, 450)`` sites, else that cap over the classes)."""

    name = "ivm-baseline"
    coupled = False
    option_spec: ClassVar[dict[str, Option]] = {
        "gh_order": integer(None, "[1, inf)", none=True,
                            doc="Gauss-Hermite nodes per axis (None: 3; given: rule auto is "
                                "the product rule)"),
        "rule": choice("auto", BASELINE_RULES, doc="quadrature rule (auto: the product rule "
                       "while it has at most AUTO_PRODUCT_NODES nodes, else diagonal: the exact "
                       "1-D reduction for the baseline's diagonal marginals)"),
        **_ActiveSetMethod.model_options,
    }

    def _d_final(self, problem: Problem) -> int:
        if problem.inducing is None:
            return default_budget(problem.n, problem.n_classes, DEFAULT_D_FINAL)
        return super()._d_final(problem)

    def _order(self, C: int) -> tuple[int | None, Any]:
        order = self.options["gh_order"]
        return (BASELINE_GH_ORDER if order is None else order), False

    def _rule(self, C: int) -> str:
        """``auto``: the product rule with ``gh_order`` given, or while GH-3 has at most
        ``AUTO_PRODUCT_NODES`` nodes, else the exact 1-D reduction for diagonal marginals
        (``diagonal``)."""
        return resolve_baseline_rule(C, self.options["gh_order"], str(self.options["rule"]))

    def _infer(self, problem: Problem, kernels: list[Kernel], beta: Array,
               rng: np.random.Generator, report: Report | None) -> tuple[Any, FrozenSites]:
        total = [0]

        def cb(step: int, rep: Any) -> None:
            if report is not None:
                total[0] = step
                report(float(step), None, active_size=float(step))

        rep = run_baseline(kernels, problem.X, np.asarray(problem.y, np.int64), beta,
                           self._d_final(problem), rng, self.options["gh_order"], cb,
                           self._rule(problem.n_classes))  # fmt: skip
        if report is not None and total[0] == 0:
            report(0.0, None, active_size=0.0)
        return rep, rep.frozen_sites()
