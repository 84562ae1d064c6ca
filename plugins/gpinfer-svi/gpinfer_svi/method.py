"""svi: stochastic variational inference with inducing points (Hensman et al. 2015; spec
jj-taylor-svi §3, ep-sep-multiclass §3.2).

Maximises the uncollapsed ELBO over ``theta`` (kernel log-parameters, optionally inducing
inputs), ``mu [L, M]`` and the Cholesky factors ``Lq [L, M, M]`` of ``q(u_l)``, one latent per
class for multi-class likelihoods (robust-max, softmax), one for Bernoulli logit/probit.
Binary expectations by ``n_quadrature``-node Gauss-Hermite; multi-class by the likelihood.

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

#: objective scales (spec §3.4): the authors' "batch" scale, per datum, or the full ELBO
SCALES = ("batch", "per_datum", "full")


class VariationalState:
    """Packs ``(theta, mu, Lq)`` into one vector and evaluates the ELBO on a batch."""

    def __init__(self, X: Array, y: Array, likelihood, hp: HyperParameters, n_latent: int,
                 M: int, n_quadrature: int, robustmax_nodes: int | None = None,
                 softmax_samples: int | None = None, rng: np.random.Generator | None = None):
        self.X, self.y, self.likelihood, self.hp = X, y, likelihood, hp
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
                self._covs.append(FixedInputCovariances(k, Z, X, share=(self._covs or [None])[0]))
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
            if self.robustmax_nodes and getattr(self.likelihood, "name", "") == "robustmax":
                return robustmax_expectation(self.likelihood.epsilon, y, self.robustmax_nodes)
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
    ``n_quadrature`` (binary Gauss-Hermite nodes), ``robustmax_nodes`` (``None``: the
    likelihood's accurate adaptive rule; an integer: the faster ``robustmax_expectation``
    Gauss-Hermite rule with that many nodes), ``softmax_samples`` (``None``: the likelihood's
    product Gauss-Hermite rule; an integer: unbiased Monte-Carlo ``softmax_expectation`` with
    that many draws per point), ``natural_gradient`` (``None``, or a step size in
    ``(0, 1]``: ``q(u)`` then moves by natural-gradient steps on the unbiased ELBO estimate and
    the optimiser moves only ``theta``; step 1 is exact for conjugate problems), ``scale``
    (``batch``, ``per_datum``, ``full``), ``learn_inducing``, ``report_every`` (steps per
    reported iteration), ``time_budget_s``, ``default_M``.
    """

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
        "natural_gradient": None,
        "softmax_samples": None,
        "scale": "batch",
        "learn_inducing": False,
        "report_every": None,
        "time_budget_s": None,
        "default_M": 100,
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
        Z = inducing_inputs(problem.inducing, X, problem.rng, int(self.options["default_M"]))
        kernels = [problem.kernel.copy() for _ in range(n_latent)]
        hp = HyperParameters(kernels, Z=[Z] * n_latent, optimize=problem.optimize,
                             optimize_inducing=bool(self.options["learn_inducing"]))
        rm, ss = self.options["robustmax_nodes"], self.options["softmax_samples"]
        state = VariationalState(X, y, lik, hp, n_latent, Z.shape[0],
                                 int(self.options["n_quadrature"]),
                                 None if rm is None else int(rm),
                                 None if ss is None else int(ss), problem.rng)
        M = Z.shape[0]
        x0 = state.pack(np.zeros((n_latent, M)), np.repeat(np.eye(M)[None], n_latent, axis=0))
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
        opt = LBFGSB(**opt_options)
        n = state.X.shape[0]
        s = self._scale(n, n)

        def fun(z: Array) -> tuple[float, Array]:
            v, g = state.elbo(z, None)
            return s * v, s * g

        def on_iteration(it: int, z: Array, value: float) -> bool:
            rep.report(it, value / s, state.snapshot(z), {})
            return False

        result = opt.maximize(fun, x, int(problem.max_iter), on_iteration)
        if not rep.history:
            rep.report(1, result.value / s, state.snapshot(result.x), {})
        extra = {"lbfgs_success": np.array(result.success),
                 "lbfgs_message": np.array(result.message)}
        if not result.success:
            warnings.warn(f"svi: L-BFGS-B ended abnormally: {result.message}", RuntimeWarning,
                          stacklevel=3)
        return result.x, result.value / s, max(result.n_iter, 1), extra
