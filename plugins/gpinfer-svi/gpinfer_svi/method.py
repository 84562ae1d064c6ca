"""svi: stochastic variational inference with inducing points (Hensman et al. 2015; spec
jj-taylor-svi §3, ep-sep-multiclass §3.2).

Maximises the uncollapsed ELBO over ``theta`` (kernel log-parameters, optionally inducing
inputs), ``mu [L, M]`` and the Cholesky factors ``Lq [L, M, M]`` of ``q(u_l)``, one latent per
class for multi-class likelihoods (robust-max, softmax), one for Bernoulli logit/probit.
Binary expectations by ``n_quadrature``-node Gauss-Hermite; robust-max by the fast 1-D trapezoid
of ``gpinfer_svi.robustmax`` (default) or the likelihood's rule; softmax by the likelihood.

Mini-batches (``problem.batch_size``) are reshuffled every epoch and scaled by ``N/|b|``
(actual size of the last batch); ``None`` means full batch. Optimisers: AdaDelta (climin form,
the paper's), Adam, or L-BFGS-B (full batch only). One reported iteration is ``report_every``
steps (default: a tenth of an epoch); its objective is the mean mini-batch ELBO estimate.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np

from gpinfer.data.minibatch import MiniBatches
from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.inducing import FixedInputCovariances, inducing_inputs
from gpinfer.interfaces import Array, FitCallback, FitResult, Method, Problem
from gpinfer.kernels.initialisation import prepare_kernel
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.optim import LBFGSB, make_optimizer
from gpinfer.optim.lbfgs import check_finite
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter, binary_signs
from gpinfer.sites.variational import (
    SVI_GAUSS_HERMITE_POINTS,
    ELBOEstimate,
    binary_expectation,
    likelihood_expectation,
    logistic_expectation,
    natural_gradient_step,
    robustmax_expectation,
    softmax_expectation,
    uncollapsed_elbo,
)
from gpinfer_svi.robustmax import robustmax_trapezoid_expectation

#: objective scales (spec §3.4): the authors' "batch" scale, per datum, or the full ELBO
SCALES = ("batch", "per_datum", "full")
#: robust-max expectation rules: the fast absolute-accuracy trapezoid (``gpinfer_svi.robustmax``)
#: or the likelihood's log-space rule (``RobustMax.expected_log_prob``, slower, tail-accurate)
ROBUSTMAX_RULES = ("trapezoid", "likelihood")
#: inducing-input initialisations: K-means centres shared by all latents (spec jj-taylor-svi), or
#: M distinct training inputs drawn independently per latent (spec ep-sep §2.11, Table 2)
INDUCING_INITS = ("kmeans", "random")
#: initial q(u): Sigma = I (the paper's svi), or the prior Sigma = Kuu (spec ep-sep §2.11)
INITS_Q = ("identity", "prior")
class VariationalState:
    """Packs ``(theta, mu, Lq)`` into one vector and evaluates the ELBO on a batch."""

    def __init__(self, X: Array, y: Array, likelihood, hp: HyperParameters, n_latent: int,
                 M: int, n_quadrature: int, robustmax_nodes: int | None = None,
                 softmax_samples: int | None = None, rng: np.random.Generator | None = None,
                 robustmax_rule: str = "trapezoid"):
        self.X, self.y, self.likelihood, self.hp = X, y, likelihood, hp
        if robustmax_rule not in ROBUSTMAX_RULES:
            raise InputError(f"svi: robustmax_rule must be one of {ROBUSTMAX_RULES}, got "
                             f"{robustmax_rule!r}")
        self.robustmax_rule = robustmax_rule
        self.L, self.M = n_latent, M
        self.tril = np.tril_indices(M)
        self.n_quadrature = n_quadrature
        self.signs = None if likelihood.multiclass else 2.0 * y - 1.0
        self.robustmax_nodes = robustmax_nodes
        self.softmax_samples = softmax_samples
        self.rng = rng if rng is not None else np.random.default_rng(0)
        # fixed Z, only kernel parameters learned: cached distances and fused kernel VJPs
        names = hp.names
        self._fast = (hp.Z is not None and not any(hp.inducing_is_free(l) for l in range(self.L))
                      and all(n.startswith("kernel") for n in names)
                      and len({id(k) for k in hp.kernels}) == self.L)
        self._covs: list[FixedInputCovariances] = []
        if self._fast:
            for k, Z in zip(hp.kernels, hp.Z):
                first = (self._covs or [None])[0]
                share = first if first is not None and first.Z.shape == Z.shape and \
                    np.array_equal(first.Z, Z) else None  # distances reused only for the same Z
                self._covs.append(FixedInputCovariances(k, Z, X, share=share))
            prefix = ["kernel"] if self.L == 1 else [f"kernel[{l}]" for l in range(self.L)]
            full = [f"{p}.{q}" for p, k in zip(prefix, hp.kernels) for q in k.param_names]
            self._theta_index = np.array([full.index(n) for n in names], dtype=np.int64)

    def pack(self, mu: Array, Lq: Array) -> Array:
        return np.concatenate([self.hp.pack(), mu.ravel(), Lq[:, self.tril[0], self.tril[1]]
                               .ravel()])

    def unpack(self, x: Array) -> tuple[Array, Array]:
        """Writes ``theta`` into the kernels; returns ``mu [L, M]`` and ``Lq [L, M, M]``."""
        P, L, M = self.hp.size, self.L, self.M
        self.hp.unpack(x[:P])
        mu = x[P:P + L * M].reshape(L, M)
        Lq = np.zeros((L, M, M))
        Lq[:, self.tril[0], self.tril[1]] = x[P + L * M:].reshape(L, -1)
        return mu, Lq

    def elbo(self, x: Array, batch: Array | None) -> tuple[float, Array]:
        """Unbiased ELBO estimate on ``batch`` (``None``: all points) and its gradient."""
        value, grad, _ = self.estimate(x, batch)
        return value, grad

    def estimate(self, x: Array, batch: Array | None) -> tuple[float, Array, ELBOEstimate]:
        """``elbo`` plus the full ``ELBOEstimate`` (with ``dSigma`` for natural gradients)."""
        mu, Lq = self.unpack(x)
        n = self.X.shape[0]
        Xb = self.X if batch is None else self.X[batch]
        scale = n / Xb.shape[0]
        kernels, Zs = self.hp.kernels, self.hp.Z
        if self._fast:
            mats = [c.matrices(batch) for c in self._covs]
            Kuu, Kub = [m[0] for m in mats], [m[1] for m in mats]
            Kdiag = np.stack([m[2] for m in mats])
        else:
            Kuu = [k.K(Z) for k, Z in zip(kernels, Zs)]
            Kub = [k.K(Z, Xb) for k, Z in zip(kernels, Zs)]
            Kdiag = np.stack([k.K_diag(Xb) for k in kernels])
        est = uncollapsed_elbo(Kuu, Kub, Kdiag, mu, Lq, self._expectation(batch), scale)
        if self._fast:
            g_full = np.concatenate([c.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag, batch)
                                     for c, G in zip(self._covs, est.matrix)])
            g_theta = g_full[self._theta_index]
        else:
            g_theta = parameter_gradient(self.hp, Xb, est.matrix)
        grad = np.concatenate([g_theta, est.dmu.ravel(),
                               est.dLq[:, self.tril[0], self.tril[1]].ravel()])
        return est.value, grad, est

    def natural_step(self, x: Array, est: ELBOEstimate, step: float) -> Array:
        """``x`` with every ``q(u_l)`` moved by one natural-gradient step (theta unchanged)."""
        mu, Lq = self.unpack(x)
        for l in range(self.L):
            mu[l], Lq[l] = natural_gradient_step(mu[l], Lq[l], est.dmu[l], est.dSigma[l], step)
        return self.pack(mu, Lq)

    def _expectation(self, batch: Array | None):
        """The per-point expected log-likelihood on ``batch`` (``None``: all points)."""
        if self.signs is None:
            y = self.y if batch is None else self.y[batch]
            if getattr(self.likelihood, "name", "") == "robustmax":
                if self.robustmax_nodes:
                    return robustmax_expectation(self.likelihood.epsilon, y, self.robustmax_nodes)
                if self.robustmax_rule == "trapezoid":
                    return robustmax_trapezoid_expectation(self.likelihood.epsilon, y)
            if self.softmax_samples and getattr(self.likelihood, "name", "") == "softmax":
                return softmax_expectation(y, self.softmax_samples, self.rng)
            return likelihood_expectation(self.likelihood, y)
        s = self.signs if batch is None else self.signs[batch]
        if getattr(self.likelihood, "name", "") == "logit":
            return logistic_expectation(s, self.n_quadrature)
        return binary_expectation(self.likelihood.link, s, self.n_quadrature)

    def snapshot(self, x: Array):
        """A zero-argument callable building the posterior at a copy of ``x``."""
        x = np.array(x, dtype=float)
        return lambda: self.posterior(x)

    def posterior(self, x: Array) -> InducingPosterior:
        saved = self.hp.pack()
        mu, Lq = self.unpack(x)
        post = InducingPosterior(self.likelihood, [k.copy() for k in self.hp.kernels],
                                 [z.copy() for z in self.hp.Z], list(mu),
                                 [lq @ lq.T for lq in Lq])
        self.hp.unpack(saved)
        return post


class SVI(Method):
    """Stochastic variational GP classification (binary and multi-class).

    Options: ``optimizer`` (``adadelta``, ``adam``, ``lbfgs``), ``optimizer_options``,
    ``n_quadrature`` (binary Gauss-Hermite nodes), ``robustmax_rule`` (``"trapezoid"``, the
    default: the fast absolute-accuracy rule of ``gpinfer_svi.robustmax``; ``"likelihood"``: the
    likelihood's log-space adaptive rule, ~7x slower at ``C = 10``), ``robustmax_nodes``
    (``None``, or an integer: Gauss-Hermite in ``f_y`` with that many nodes, inaccurate for many
    classes or unequal variances; overrides ``robustmax_rule``), ``softmax_samples`` (``None``:
    the likelihood's product Gauss-Hermite rule; an integer: unbiased Monte-Carlo
    ``softmax_expectation`` with that many draws per point), ``natural_gradient`` (``None``, or a
    step size in ``(0, 1]``: ``q(u)`` then moves by natural-gradient steps on the unbiased ELBO
    estimate and the optimiser moves only ``theta``; step 1 is exact for conjugate problems),
    ``scale`` (``batch``, ``per_datum``, ``full``), ``learn_inducing``, ``report_every`` (steps
    per reported iteration), ``time_budget_s``, ``default_M``.

    Model set-up options (defaults: the svi paper's; the Table-2 VI baseline of spec ep-sep
    §3.2/§2.11 uses the alternatives): ``inducing_init`` (``"kmeans"``: K-means centres shared
    by all latents; ``"random"``: ``M`` distinct training inputs drawn independently per latent
    from the problem's generator, the same draws as ep/sep/gfitc), ``init_q`` (``"identity"``:
    ``Sigma = I``; ``"prior"``: ``Sigma = Kuu``), ``noise`` (``None``, or a white-noise variance
    added to the kernel when it has none), ``lengthscale_init`` (``"kernel"`` or ``"median"``:
    squared length-scale = median pairwise distance), ``hyper_bounds`` (``None`` or
    ``(low, high)``: L-BFGS-B box on the log kernel parameters; ``q(u)`` and ``Z`` unbounded).
    """

    #: the objective, log p(y) of discrete labels or a bound on it, is never positive
    objective_limit: ClassVar[float | None] = 0.0

    name: ClassVar[str] = "svi"
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = True
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("logit", "probit", "robustmax", "softmax")
    default_options: ClassVar[dict[str, Any]] = {
        "optimizer": "adadelta",
        "optimizer_options": None,
        "n_quadrature": SVI_GAUSS_HERMITE_POINTS,
        "robustmax_nodes": None,
        "robustmax_rule": "trapezoid",
        "natural_gradient": None,
        "softmax_samples": None,
        "scale": "batch",
        "learn_inducing": False,
        "report_every": None,
        "time_budget_s": None,
        "default_M": 100,
        "inducing_init": "kmeans",
        "init_q": "identity",
        "noise": None,
        "lengthscale_init": "median",
        "hyper_bounds": None,
    }

    def _setup(self, problem: Problem) -> tuple[VariationalState, Array]:
        lik = problem.likelihood
        X = np.asarray(problem.X, dtype=float)
        if lik.multiclass:
            y = np.asarray(problem.y, dtype=np.int64)
            n_latent = lik.n_latent(problem.n_classes)
        else:
            if getattr(lik, "link", None) is None:
                raise InputError(f"svi needs a Bernoulli or multi-class likelihood; got "
                                 f"{type(lik).__name__}")
            y = (binary_signs(problem.y, problem.n_classes, "svi") > 0).astype(float)
            n_latent = 1
        if self.options["scale"] not in SCALES:
            raise InputError(f"svi: scale must be one of {SCALES}, got {self.options['scale']!r}")
        o = self.options
        for key, allowed in (("inducing_init", INDUCING_INITS), ("init_q", INITS_Q)):
            if o[key] not in allowed:
                raise InputError(f"svi: {key} must be one of {allowed}, got {o[key]!r}")
        kernel = prepare_kernel(problem.kernel, X, o["noise"], str(o["lengthscale_init"]),
                                owner="svi")
        if o["inducing_init"] == "random" and not isinstance(problem.inducing, np.ndarray):
            M = int(o["default_M"]) if problem.inducing is None else int(problem.inducing)
            if not 1 <= M <= X.shape[0]:
                raise InputError(f"svi: M must be in 1..N={X.shape[0]}, got {M}")
            Zs = [X[problem.rng.choice(X.shape[0], M, replace=False)] for _ in range(n_latent)]
        else:
            Zs = [inducing_inputs(problem.inducing, X, problem.rng, int(o["default_M"]))] * n_latent
        kernels = [kernel.copy() for _ in range(n_latent)]
        hp = HyperParameters(kernels, Z=Zs, optimize=problem.optimize,
                             optimize_inducing=bool(o["learn_inducing"]))
        rm, ss = o["robustmax_nodes"], o["softmax_samples"]
        M = Zs[0].shape[0]
        state = VariationalState(X, y, lik, hp, n_latent, M, int(o["n_quadrature"]),
                                 None if rm is None else int(rm),
                                 None if ss is None else int(ss), problem.rng,
                                 str(o["robustmax_rule"]))
        if o["init_q"] == "prior":
            Lq0 = np.stack([jittered_cholesky(k.K(Z), name="Kuu").L for k, Z in zip(kernels, Zs)])
        else:
            Lq0 = np.repeat(np.eye(M)[None], n_latent, axis=0)
        x0 = state.pack(np.zeros((n_latent, M)), Lq0)
        return state, x0

    def _scale(self, n: int, b: int) -> float:
        return {"batch": b / n, "per_datum": 1.0 / n, "full": 1.0}[self.options["scale"]]

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        state, x = self._setup(problem)
        rep = IterationReporter(callback, self.name)
        name = str(self.options["optimizer"]).lower()
        opt_options = dict(self.options["optimizer_options"] or {})
        extra_state: dict[str, Array] = {}
        if name in ("lbfgs", "l-bfgs-b", "lbfgsb"):
            if problem.batch_size is not None:
                raise InputError("svi with L-BFGS-B needs full-batch training (batch_size=None)")
            x, value, n_iter, extra_state = self._fit_lbfgs(problem, state, x, rep, opt_options)
        else:
            x, value, n_iter = self._fit_stochastic(problem, state, x, rep, name, opt_options)
        mu, Lq = state.unpack(x)
        posterior = state.posterior(x)
        out = {"mu": mu, "Lq": Lq, "Z": state.hp.Z[0].copy(), **extra_state}
        for l, k in enumerate(state.hp.kernels):
            out[f"kernel_params_{l}"] = k.get_unconstrained().copy()
        kernel = state.hp.kernels[0] if state.L == 1 else state.hp.kernels
        return FitResult(posterior=posterior, log_evidence=float(value), kernel=kernel,
                         n_iter=n_iter, history=rep.history, state=out)

    def _fit_stochastic(self, problem, state, x, rep, name, opt_options):
        n = state.X.shape[0]
        opt = make_optimizer(name, **opt_options)
        batches = None
        steps_per_epoch = 1
        if problem.batch_size is not None:
            batches = MiniBatches(n, int(problem.batch_size), problem.rng).epochs(None)
            steps_per_epoch = -(-n // int(problem.batch_size))
        every = self.options["report_every"] or max(1, round(0.1 * steps_per_epoch))
        budget = self.options["time_budget_s"]
        ngd = self.options["natural_gradient"]
        if ngd is not None and not 0.0 < float(ngd) <= 1.0:
            raise InputError(f"svi: natural_gradient must be None or in (0, 1], got {ngd!r}")
        P = state.hp.size if ngd is not None else x.size  # entries the optimiser moves
        opt.reset(x[:P])
        value, it, step = -np.inf, 0, 0
        for it in range(1, int(problem.max_iter) + 1):
            values = []
            for _ in range(int(every)):
                step += 1
                batch = None if batches is None else next(batches)
                b = n if batch is None else batch.size
                xe = np.concatenate([opt.lookahead(x[:P]), x[P:]]) if P else x.copy()
                v, g, est = state.estimate(xe, batch)
                check_finite(v, g, step, "svi ELBO")
                x = xe
                if P:
                    x[:P] = opt.step(xe[:P], self._scale(n, b) * g[:P])
                if ngd is not None:
                    x = state.natural_step(x, est, float(ngd))
                values.append(v)
            value = float(np.mean(values))
            rep.report(it, value, state.snapshot(x),
                       {"epoch": step / steps_per_epoch, "steps": float(step)})
            if budget is not None and rep.elapsed() > float(budget):
                break
        return x, value, it

    def _fit_lbfgs(self, problem, state, x, rep, opt_options):
        hb = self.options["hyper_bounds"]
        if hb is not None and "bounds" not in opt_options:
            lo, hi = (float(v) for v in hb)
            opt_options["bounds"] = (state.hp.bounds(kernel=(lo, hi))
                                     + [(None, None)] * (x.size - state.hp.size))
        opt = LBFGSB(**opt_options)
        n = state.X.shape[0]
        s = self._scale(n, n)

        def fun(z: Array) -> tuple[float, Array]:
            v, g = state.elbo(z, None)
            return s * v, s * g

        def on_iteration(it: int, z: Array, value: float) -> bool:
            rep.report(it, value / s, state.snapshot(z), {"lbfgs_abnormal": 0.0})
            return False

        result = opt.maximize(fun, x, int(problem.max_iter), on_iteration)
        if not rep.history or not result.success:
            # the final point, with an abnormal end recorded in the run's metrics
            rep.report(len(rep.history) + 1, result.value / s, state.snapshot(result.x),
                       {"lbfgs_abnormal": float(not result.success)})
        extra = {"lbfgs_success": np.array(result.success),
                 "lbfgs_message": np.array(result.message)}
        if not result.success:
            warnings.warn(f"svi: L-BFGS-B ended abnormally: {result.message}", RuntimeWarning,
                          stacklevel=3)
        return result.x, result.value / s, max(result.n_iter, 1), extra
