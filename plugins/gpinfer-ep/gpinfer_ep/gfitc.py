"""GFITC: EP on the exact Heaviside factors with the FITC prior, u marginalised (spec ep-sep §3.1).

Per class the latent vector ``f^c [N]`` has prior ``N(0, Q_c + diag(Lambda_c))`` with
``Lambda = s`` (FITC variances, noise included). Two 1-D role sites per factor (the same
winner/loser layout as EP, ``gpinfer.sites.inducing``) sum into ``tau_ic, nu_ic``. With
``den = 1 + tau Lambda``, ``d = tau / den``, ``nu' = nu / den`` the posterior over ``u_c`` is the
``WhitenedGaussian(A diag(d) A^T, A nu')``, whose ``B``, ``w`` give the marginals
``mu = Lambda nu' + a^T w / den`` and ``Sigma = Lambda / den + ||L_B^-1 a||^2 / den^2``.

Training: outer schedule, L-BFGS-B on ``-log Z`` with EP run to convergence (warm start) at
every evaluation (``maxiter = max_iter``). Batch only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar, cast

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.inducing import INDUCING_INITS
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    MatrixGradients,
    Method,
    Problem,
    SiteState,
)
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import lengthscale_init_option
from gpinfer.numerics.cholesky import tri_solve
from gpinfer.optim.lbfgs import LBFGSB
from gpinfer.options import Option, choice, integer, real
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites.inducing import (
    WhitenedGaussian,
    aggregate,
    at_label,
    factor_mask,
    new_role_site,
    pair_tilted,
    remove_site,
    role_delta,
)
from gpinfer.sites.stacked import StackedTerms
from gpinfer.training.inner import InnerSchedule
from gpinfer.training.outer import OuterSchedule
from gpinfer_ep.gram import weighted_gram
from gpinfer_ep.model import all_terms, check_likelihood, class_kernels, initial_inducing

#: GFITC's initial site precision (spec §2.11)
INITIAL_TAU = 1e-2
#: failed sweeps (restored, damping halved) one EP run survives (spec §3.1)
MAX_SWEEP_FAILURES = 20


class FITCSites(SiteState):
    """Role sites on the latent marginals of every class (``[N, C]`` each, spec §3.1); a
    ``SiteState`` whose ``update`` is one damped sweep with the ``terms`` of the current
    ``run``."""

    def __init__(self, y: Array, C: int):
        N = y.shape[0]
        self.y = y
        self.mask = factor_mask(y, C)
        self.W1 = np.where(self.mask, INITIAL_TAU, 0.0)
        self.L1 = np.where(self.mask, INITIAL_TAU, 0.0)
        self.W2 = np.zeros((N, C))
        self.L2 = np.zeros((N, C))
        self.failures = 0  # failed sweeps (restored, damping halved), reported as a metric
        # the class terms the sweeps use, held only during ``run`` (the reports deep-copy the
        # sites: kept, the terms' [M, N] matrices would be copied into every report)
        self.terms: StackedTerms | None = None

    def snapshot(self) -> tuple[Array, ...]:
        return tuple(a.copy() for a in (self.W1, self.W2, self.L1, self.L2))

    def restore(self, snap: object) -> None:
        self.W1, self.W2, self.L1, self.L2 = (a.copy() for a in cast(tuple[Array, ...], snap))

    def tau_nu(self) -> tuple[Array, Array]:
        return (aggregate(self.W1, self.L1, self.mask),
                aggregate(self.W2, self.L2, self.mask))

    def marginals(self, terms: StackedTerms
                  ) -> tuple[Array, Array, list[tuple[Any, ...]]]:
        """``(mu, Sigma [N, C], [(q_c, den_c, d_c, nu'_c)])`` of the current sites (``terms``:
        the classes' geometry at the training inputs, read one class at a time)."""
        tau, nu = self.tau_nu()
        mus, sigmas, parts = [], [], []
        for c, t in enumerate(terms.latents()):
            den = 1.0 + tau[:, c] * t.s
            d, nup = tau[:, c] / den, nu[:, c] / den
            q = WhitenedGaussian(weighted_gram(t.A, d), t.A @ nup)
            p = q.project(t.A)
            mus.append(t.s * nup + p.mu / den)
            sigmas.append(t.s / den + p.v / den**2)
            parts.append((q, den, d, nup, p))
        return np.stack(mus, 1), np.stack(sigmas, 1), parts

    def sweep(self, terms: StackedTerms, rho: float) -> float:
        """One damped parallel EP sweep on the Heaviside factors; returns max |site change|."""
        mu, S, _ = self.marginals(terms)
        y, mask = self.y, self.mask
        cav_w = remove_site(at_label(mu, y), at_label(S, y), self.W1, self.W2)
        cav_l = remove_site(mu, S, self.L1, self.L2)
        t = pair_tilted(cav_w.a, cav_w.v, cav_l.a, cav_l.v, mask)
        matched = (*new_role_site(t.g_win, t.gamma, cav_w.a, cav_w.v),
                   *new_role_site(-t.g_win, t.gamma, cav_l.a, cav_l.v))
        old = (self.W1, self.W2, self.L1, self.L2)
        new = [np.where(mask, rho * n + (1 - rho) * o, 0.0) for n, o in zip(matched, old)]
        if not all(np.all(np.isfinite(n)) for n in new):
            raise NumericalError("non-finite GFITC sites", quantity="sites")
        change = max(float(np.max(np.abs(n - o))) for n, o in zip(new, old))
        self.W1, self.W2, self.L1, self.L2 = new
        return change

    def update(self, damping: float, iteration: int) -> float:
        """One damped sweep with the ``terms`` of the current ``run``."""
        assert self.terms is not None  # set by ``run``
        return self.sweep(self.terms, damping)

    def run(self, terms: StackedTerms, tol: float, max_sweeps: int,
            rho0: float = 0.5, decay: float = 0.99) -> int:
        """EP to convergence (largest site change ``< tol``) on the engine's inner site
        schedule, damping ``rho0`` decaying by ``decay`` per sweep; a failed sweep is restored
        and retried at half the damping, up to ``MAX_SWEEP_FAILURES`` (spec §3.1). Returns the
        sweeps done."""
        self.terms = terms
        try:
            run = InnerSchedule(tol=tol, max_updates=max_sweeps, damping=rho0, decay=decay,
                                strict=True, max_failures=MAX_SWEEP_FAILURES).run(self)
        finally:
            self.terms = None
        self.failures += run.failures
        return run.updates

    def evidence(self, terms: StackedTerms) -> tuple[float, list[MatrixGradients]]:
        """``log Z^GFITC`` and its gradient at convergence (sites fixed), spec §3.1."""
        mu, S, parts = self.marginals(terms)
        y, mask = self.y, self.mask
        tau, nu = self.tau_nu()
        cav_w = remove_site(at_label(mu, y), at_label(S, y), self.W1, self.W2)
        cav_l = remove_site(mu, S, self.L1, self.L2)
        t = pair_tilted(cav_w.a, cav_w.v, cav_l.a, cav_l.v, mask)
        deltas = (role_delta(at_label(mu, y), at_label(S, y), self.W1, self.W2, cav_w.d)
                  + role_delta(mu, S, self.L1, self.L2, cav_l.d))
        value = float(np.sum(np.where(mask, t.log_z + deltas, 0.0)))
        grads = []
        for c, (term, (q, den, d, nup, p)) in enumerate(zip(terms.latents(), parts)):
            value += (-0.5 * np.sum(np.log(den)) - np.sum(np.log(np.diag(q.LB)))
                      + 0.5 * nu[:, c] @ mu[:, c])
            alpha = nup - d * p.mu
            g = 0.5 * (alpha**2 - (d - d * d * p.v))
            A = term.A
            Y = 0.5 * np.outer(A @ alpha, alpha) - 0.5 * q.B_inv(A * d) - A * g
            YA = Y @ A.T
            G_uu = -tri_solve(term.L, tri_solve(term.L, 0.5 * (YA + YA.T), transpose=True).T,
                              transpose=True)
            grads.append(MatrixGradients(Kuu=0.5 * (G_uu + G_uu.T),
                                         Kuf=2.0 * tri_solve(term.L, Y, transpose=True),
                                         Kff_diag=g))
        return value, grads

    def posterior_moments(self, terms: StackedTerms) -> list[tuple[Array, Array]]:
        """``(m_c, S_c)`` over ``u_c`` with the same predictions as spec §3.1."""
        _, _, parts = self.marginals(terms)
        return [q.moments(t.L) for t, (q, *_rest) in zip(terms.latents(), parts)]


class GFITC(Method):
    """The GFITC baseline: FITC prior, exact argmax factors, EP to convergence per L-BFGS-B
    evaluation. Options: ``ep_tol``, ``ep_max_sweeps``, ``noise``, ``lengthscale_init``
    (as for ``ep``).

    If EP fails at a point L-BFGS-B tries (after its own retries with more damping), training
    stops at the last accepted iterate with a ``RuntimeWarning`` and ``stopped_on_failure = 1``
    in the last history entry (the outer schedule's trial-failure rule,
    ``gpinfer.training.outer``); a failure at the starting point is an error."""

    name: ClassVar[str] = "gfitc"
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = True
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = False
    likelihoods: ClassVar[tuple[str, ...]] = ("argmax",)
    option_spec: ClassVar[dict[str, Option]] = {
        "ep_tol": real(1e-3, "(0, inf)", doc="EP convergence tolerance per evaluation"),
        "ep_max_sweeps": integer(1000, "[1, inf)"),
        "noise": real(1.0, "(0, inf)", none=True, doc="white noise added to the kernel"),
        "lengthscale_init": lengthscale_init_option(),
        "inducing_init": choice("random", INDUCING_INITS,
                                doc="random: M training inputs per class (the paper's)"),
    }

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        check_likelihood(problem, self.name)
        if problem.batch_size is not None:
            raise InputError("gfitc is batch only (batch_size must be None)")
        reporter = IterationReporter(callback, self.name)
        kernels = class_kernels(problem, self.options["noise"], self.options["lengthscale_init"])
        Zs = initial_inducing(problem, self.name, self.options["inducing_init"])
        hp = HyperParameters(kernels, Z=Zs, optimize=problem.optimize)
        run = _Run(problem, kernels, hp, reporter, float(self.options["ep_tol"]),
                   int(self.options["ep_max_sweeps"]))
        theta0 = hp.pack()
        if problem.optimize and hp.size:
            # a trial point where EP fails ends training at the last accepted iterate, with a
            # warning and ``stopped_on_failure`` in the last history entry
            schedule = OuterSchedule(self.name, run.report, history=reporter.history)
            n_iter = schedule.run(LBFGSB(stop_on_trial_failure=True), run.evaluate, theta0,
                                  int(problem.max_iter)).n_iter
        else:
            value, _ = run.evaluate(theta0)
            run.report(1, theta0, value)
            n_iter = 1
        post = run.posterior()
        return FitResult(posterior=post, log_evidence=float(run.value), kernel=kernels,
                         n_iter=n_iter, history=reporter.history,
                         state={**post.state(), "theta": hp.pack()})


class _Run:
    """One GFITC fit: EP to convergence at ``theta``, its evidence and gradient, the report."""

    def __init__(self, problem: Problem, kernels: list[Kernel], hp: HyperParameters,
                 reporter: IterationReporter, tol: float, max_sweeps: int):
        self.problem, self.kernels, self.hp, self.reporter = problem, kernels, hp, reporter
        self.X, self.tol, self.max_sweeps = np.asarray(problem.X, float), tol, max_sweeps
        self.sites = FITCSites(np.asarray(problem.y, np.int64), problem.n_classes)
        self.value, self.sweeps = float("nan"), 0

    def inducing(self) -> list[Array]:
        if self.hp.Z is None:
            raise TypeError("gfitc hyper-parameters carry inducing inputs")
        return self.hp.Z

    def evaluate(self, theta: Array) -> tuple[float, Array]:
        """EP run to ``tol`` at ``theta [P]`` (warm start); the log evidence and its gradient."""
        self.hp.unpack(theta)
        terms = all_terms(self.kernels, self.inducing(), self.X)
        self.sweeps = self.sites.run(terms, self.tol, self.max_sweeps)
        self.value, grads = self.sites.evidence(terms)
        return self.value, self.hp.gradient(self.X, grads)

    def posterior(self, at: FITCSites | None = None) -> InducingPosterior:
        """The posterior of ``at`` (default: the sites now) at the current hyper-parameters."""
        terms = all_terms(self.kernels, self.inducing(), self.X)
        mS = (self.sites if at is None else at).posterior_moments(terms)
        return InducingPosterior(self.problem.likelihood, [k.copy() for k in self.kernels],
                                 [z.copy() for z in self.inducing()], [a for a, _ in mS],
                                 [b for _, b in mS])

    def posterior_now(self) -> Callable[[], InducingPosterior]:
        """A builder of the posterior at the current sites and hyper-parameters."""
        theta, frozen = self.hp.pack(), copy.deepcopy(self.sites)

        def build() -> InducingPosterior:
            with self.hp.installed(theta):
                return self.posterior(frozen)

        return build

    def report(self, it: int, theta: Array, value: float) -> bool:
        """Report iteration ``it`` (the sites and hyper-parameters are at ``theta``)."""
        extra = {"ep_sweeps": float(self.sweeps), "failures": float(self.sites.failures)}
        return self.reporter.report(it, value, self.posterior_now(), extra)
