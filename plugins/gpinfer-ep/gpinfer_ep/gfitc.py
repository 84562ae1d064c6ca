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
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

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
)
from gpinfer.kernels.initialisation import LENGTHSCALE_INITS
from gpinfer.numerics.cholesky import tri_solve
from gpinfer.numerics.gram import weighted_gram
from gpinfer.optim.lbfgs import LBFGSB
from gpinfer.options import Option, choice, integer, real
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter
from gpinfer.sites.inducing import (
    ClassTerms,
    WhitenedGaussian,
    aggregate,
    at_label,
    factor_mask,
    new_role_site,
    pair_tilted,
    remove_site,
    role_delta,
)
from gpinfer_ep.model import all_terms, check_likelihood, class_kernels, initial_inducing

#: GFITC's initial site precision (spec §2.11)
INITIAL_TAU = 1e-2


class FITCSites:
    """Role sites on the latent marginals of every class (``[N, C]`` each, spec §3.1)."""

    def __init__(self, y: Array, C: int):
        N = y.shape[0]
        self.y = y
        self.mask = factor_mask(y, C)
        self.W1 = np.where(self.mask, INITIAL_TAU, 0.0)
        self.L1 = np.where(self.mask, INITIAL_TAU, 0.0)
        self.W2 = np.zeros((N, C))
        self.L2 = np.zeros((N, C))
        self.failures = 0  # failed sweeps (restored, damping halved), reported as a metric

    def snapshot(self) -> tuple[Array, ...]:
        return tuple(a.copy() for a in (self.W1, self.W2, self.L1, self.L2))

    def restore(self, snap: tuple[Array, ...]) -> None:
        self.W1, self.W2, self.L1, self.L2 = (a.copy() for a in snap)

    def tau_nu(self) -> tuple[Array, Array]:
        return (aggregate(self.W1, self.L1, self.mask),
                aggregate(self.W2, self.L2, self.mask))

    def marginals(self, terms: Sequence[ClassTerms]
                  ) -> tuple[Array, Array, list[tuple[Any, ...]]]:
        """``(mu, Sigma [N, C], [(q_c, den_c, d_c, nu'_c)])`` of the current sites."""
        tau, nu = self.tau_nu()
        mus, sigmas, parts = [], [], []
        for c, t in enumerate(terms):
            den = 1.0 + tau[:, c] * t.s
            d, nup = tau[:, c] / den, nu[:, c] / den
            q = WhitenedGaussian(weighted_gram(t.A, d), t.A @ nup)
            p = q.project(t.A)
            mus.append(t.s * nup + p.mu / den)
            sigmas.append(t.s / den + p.v / den**2)
            parts.append((q, den, d, nup, p))
        return np.stack(mus, 1), np.stack(sigmas, 1), parts

    def sweep(self, terms: Sequence[ClassTerms], rho: float) -> float:
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

    def run(self, terms: Sequence[ClassTerms], tol: float, max_sweeps: int,
            rho0: float = 0.5, decay: float = 0.99) -> int:
        """EP to convergence; failure restores, halves the damping and retries (spec §3.1)."""
        rho, sweeps, failures = rho0, 0, 0
        while sweeps < max_sweeps:
            snap = self.snapshot()
            try:
                change = self.sweep(terms, rho)
            except NumericalError:
                failures += 1
                self.failures += 1
                if failures > 20:
                    raise
                self.restore(snap)
                rho *= 0.5
                continue
            sweeps += 1
            rho *= decay
            if change < tol:
                break
        return sweeps

    def evidence(self, terms: Sequence[ClassTerms]) -> tuple[float, list[MatrixGradients]]:
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
        for c, (term, (q, den, d, nup, p)) in enumerate(zip(terms, parts)):
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

    def posterior_moments(self, terms: Sequence[ClassTerms]) -> list[tuple[Array, Array]]:
        """``(m_c, S_c)`` over ``u_c`` with the same predictions as spec §3.1."""
        _, _, parts = self.marginals(terms)
        return [q.moments(t.L) for t, (q, *_rest) in zip(terms, parts)]


class _TrialPointFailed(Exception):
    """EP failed at a hyper-parameter value L-BFGS-B tried (not the starting point)."""


class GFITC(Method):
    """The GFITC baseline: FITC prior, exact argmax factors, EP to convergence per L-BFGS-B
    evaluation. Options: ``ep_tol``, ``ep_max_sweeps``, ``noise``, ``lengthscale_init``
    (as for ``ep``).

    If EP fails at a point L-BFGS-B tries (after its own retries with more damping), training
    stops at the last accepted iterate with a ``RuntimeWarning`` and ``stopped_on_failure = 1``
    in the last history entry; a failure at the starting point is an error."""

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
        "lengthscale_init": choice("median", LENGTHSCALE_INITS),
        "inducing_init": choice("random", INDUCING_INITS,
                                doc="random: M training inputs per class (the paper's)"),
    }

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        check_likelihood(problem, self.name)
        if problem.batch_size is not None:
            raise InputError("gfitc is batch only (batch_size must be None)")
        reporter = IterationReporter(callback, self.name)
        history = reporter.history
        X, y = np.asarray(problem.X, float), np.asarray(problem.y, np.int64)
        kernels = class_kernels(problem, self.options["noise"], self.options["lengthscale_init"])
        Zs = initial_inducing(problem, self.name, self.options["inducing_init"])
        hp = HyperParameters(kernels, Z=Zs, optimize=problem.optimize)
        sites = FITCSites(y, problem.n_classes)
        tol, max_sweeps = float(self.options["ep_tol"]), int(self.options["ep_max_sweeps"])
        last: dict[str, Any] = {}
        accepted: dict[str, Any] = {"theta": hp.pack()}  # the last L-BFGS-B iterate

        def inducing() -> list[Array]:
            if hp.Z is None:
                raise TypeError("gfitc hyper-parameters carry inducing inputs")
            return hp.Z

        def evaluated_at(theta: Array) -> bool:
            """Whether the last evaluation was at ``theta``."""
            last_theta = last.get("theta")
            return last_theta is not None and np.array_equal(theta, last_theta)

        def fun(theta: Array) -> tuple[float, Array]:
            hp.unpack(theta)
            terms = all_terms(kernels, inducing(), X)
            try:
                sweeps = sites.run(terms, tol, max_sweeps)
                value, grads = sites.evidence(terms)
            except NumericalError as err:
                if "theta" not in last:  # the starting point: nothing to fall back on
                    raise
                raise _TrialPointFailed(str(err)) from err
            last.update(theta=np.array(theta), value=value, sweeps=sweeps)
            return value, hp.gradient(X, grads)

        def posterior(at: FITCSites | None = None) -> InducingPosterior:
            terms = all_terms(kernels, inducing(), X)
            mS = (sites if at is None else at).posterior_moments(terms)
            return InducingPosterior(problem.likelihood, [k.copy() for k in kernels],
                                     [z.copy() for z in inducing()], [a for a, _ in mS],
                                     [b for _, b in mS])

        def posterior_now() -> Callable[[], InducingPosterior]:
            """A builder of the posterior at the current sites and hyper-parameters."""
            theta, frozen = hp.pack(), copy.deepcopy(sites)

            def build() -> InducingPosterior:
                current = hp.pack()
                hp.unpack(theta)
                try:
                    return posterior(frozen)
                finally:
                    hp.unpack(current)

            return build

        def on_iteration(it: int, x: Array, value: float) -> bool:
            if not evaluated_at(x):
                fun(x)
            accepted["theta"] = np.array(x)
            extra = {"ep_sweeps": float(last["sweeps"]), "failures": float(sites.failures)}
            return reporter.report(it, value, posterior_now(), extra)

        theta0 = hp.pack()
        if problem.optimize and hp.size:
            try:
                result = LBFGSB().maximize(fun, theta0, int(problem.max_iter), on_iteration)
                final, n_iter = result.x, result.n_iter
            except _TrialPointFailed as err:
                warnings.warn(f"gfitc: EP failed at a trial point of L-BFGS-B ({err}); training "
                              f"stopped at iteration {len(history)}, the last accepted one",
                              RuntimeWarning, stacklevel=2)
                final, n_iter = accepted["theta"], len(history)
                last.pop("theta", None)  # the failed call left its hyper-parameters in hp
                if history:
                    history[-1]["stopped_on_failure"] = 1.0
            if not evaluated_at(final):
                fun(final)
        else:
            value, _ = fun(theta0)
            on_iteration(1, theta0, value)
            n_iter = 1
        post = posterior()
        return FitResult(posterior=post, log_evidence=float(last["value"]), kernel=kernels,
                         n_iter=n_iter, history=history,
                         state={**post.state(), "theta": hp.pack()})
