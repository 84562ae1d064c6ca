"""svi: stochastic variational inference with inducing points (Hensman et al. 2015; spec
jj-taylor-svi §3, ep-sep-multiclass §3.2).

Maximises the uncollapsed ELBO over ``theta`` (kernel log-parameters, optionally inducing
inputs), ``mu [L, M]`` and the Cholesky factors ``Lq [L, M, M]`` of ``q(u_l)``, one latent per
class for multi-class likelihoods (robust-max, softmax), one for Bernoulli logit/probit.
The expected log-likelihood is the likelihood's own ``variational_expectations``, its rule set by
the likelihood's ``expectation`` option (Bernoulli: 100-node Gauss-Hermite; robust-max: the fast
1-D trapezoid; softmax: product Gauss-Hermite or Monte Carlo); any classification likelihood
works, a third party's included.

Mini-batches (``problem.batch_size``) are reshuffled every epoch and scaled by ``N/|b|``
(actual size of the last batch); ``None`` means full batch. Optimisers: AdaDelta (climin form,
the paper's), Adam, or L-BFGS-B (full batch only). AdaDelta and Adam run on the core's
mini-batch schedule (``gpinfer.training.minibatch``): one reported iteration is ``report_every``
steps (default: a tenth of an epoch; fewer when the time budget runs out), read once on a
device; its objective is the mean mini-batch ELBO estimate.

Data-parallel (``gpinfer.training.distributed``): in a ``torch.distributed`` process group,
AdaDelta and Adam steps evaluate this rank's part of each global batch and average the ranks'
ELBO values and gradients with one ``all_reduce`` per step; every rank takes the one-process
step (natural gradients, L-BFGS-B, Monte-Carlo expectations and a time budget are refused
there for now).

Array backend (``problem.backend``, ``gpinfer.backend``): numpy, or torch on a CPU or GPU, in
float64 or float32. ``X`` and ``y`` stay on the host and each mini-batch is moved to the backend;
the inducing inputs, ``mu``, ``Lq``, the packed parameter vector and the optimiser's state live
there. The default optimiser is the same on every backend (L-BFGS-B for full batches, AdaDelta
for mini-batches), so the same call gives the same model on numpy and torch (float64: to
round-off): L-BFGS-B keeps its own state on the host in float64 and evaluates the ELBO and its
gradient on the backend (``gpinfer.optim.lbfgs``). The fitted ``InducingPosterior`` holds host
numpy arrays (it pickles without a GPU).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.choice import NUMPY, Backend
from gpinfer.data.source import host_rows, median_input
from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.inducing import DEFAULT_M, INDUCING_INITS, initial_inducing
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    Likelihood,
    Method,
    Problem,
    Scalar,
    StochasticOptimizer,
)
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.fixed import FixedGroup, fixed_gradient, fixed_groups, fixed_matrices
from gpinfer.kernels.initialisation import lengthscale_init_option, start_kernel
from gpinfer.kernels.stacked import StackedCovariances
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.optim import LBFGSB, make_optimizer
from gpinfer.options import Option, bounds, choice, flag, integer, mapping, real
from gpinfer.posterior import InducingPosterior
from gpinfer.reporting import IterationReporter, binary_signs
from gpinfer.training import distributed
from gpinfer.training.minibatch import (
    BatchSteps,
    MiniBatchSchedule,
    Payload,
    Read,
    check_step,
)
from gpinfer.training.outer import OuterSchedule
from gpinfer_svi.variational import (
    ELBOEstimate,
    ExpectationFn,
    likelihood_expectation,
    natural_gradient_step,
    uncollapsed_elbo,
)

#: objective scales (spec §3.4): the authors' "batch" scale, per datum, or the full ELBO
SCALES = ("batch", "per_datum", "full")
#: svi's robust-max rules before the likelihood owned them -> ``RobustMax(expectation=...)``
ROBUSTMAX_RULES = {"trapezoid": "trapezoid", "likelihood": "log_space"}
#: deprecated svi options (one release): the likelihood's ``expectation`` settings now
LEGACY_EXPECTATION_OPTIONS = ("n_quadrature", "robustmax_rule", "robustmax_nodes",
                              "softmax_samples")
#: inducing-input initialisations: K-means centres shared by all latents (spec jj-taylor-svi), or
#: M distinct training inputs drawn independently per latent (spec ep-sep §2.11, Table 2)
#: initial q(u): Sigma = I (the paper's svi), or the prior Sigma = Kuu (spec ep-sep §2.11)
INITS_Q = ("identity", "prior")
def legacy_expectation(likelihood: Likelihood, options: Mapping[str, Any], *,
                       warn: bool = True) -> Likelihood:
    """``likelihood`` with the expectation rule of svi's deprecated options (a copy; itself when
    none is set), with a ``DeprecationWarning`` unless ``warn`` is False. Each option applies to
    the likelihoods that offer its rule and is ignored by the others (``n_quadrature`` the
    binary ones, the robust-max and softmax options theirs)."""
    legacy = {k: options.get(k) for k in LEGACY_EXPECTATION_OPTIONS
              if options.get(k) is not None}
    if not legacy:
        return likelihood
    if warn:
        warnings.warn(
            f"svi options {sorted(legacy)} are deprecated: the likelihood owns its expectation "
            "rule (e.g. RobustMax(expectation='log_space'), Softmax(expectation='monte_carlo', "
            "mc_samples=32), BernoulliLogit(quadrature_points=100))",
            DeprecationWarning, stacklevel=4)
    rules = likelihood.expectation_rules
    rule = legacy.get("robustmax_rule")
    if rule is not None and rule not in ROBUSTMAX_RULES:
        raise InputError(f"svi: robustmax_rule must be one of {list(ROBUSTMAX_RULES)}, got "
                         f"{rule!r}")
    if likelihood.multiclass and "trapezoid" in rules:  # the robust-max family
        if legacy.get("robustmax_nodes"):
            return likelihood.with_expectation("gauss_hermite",
                                               quadrature_points=legacy["robustmax_nodes"])
        if rule is not None:
            return likelihood.with_expectation(ROBUSTMAX_RULES[rule])
    if legacy.get("softmax_samples") and "monte_carlo" in rules:
        return likelihood.with_expectation("monte_carlo", mc_samples=legacy["softmax_samples"])
    if (legacy.get("n_quadrature") is not None and not likelihood.multiclass
            and "quadrature_points" in likelihood.expectation_settings):
        return likelihood.with_expectation(quadrature_points=legacy["n_quadrature"])
    return likelihood


class VariationalState:
    """Packs ``(theta, mu, Lq)`` into one vector and evaluates the ELBO on a batch."""

    def __init__(self, X: Array, y: Array, likelihood: Likelihood, hp: HyperParameters,
                 n_latent: int, M: int, rng: np.random.Generator | None = None,
                 backend: Backend = NUMPY, sample_weight: Array | None = None):
        """``X [N, D]``, class indices ``y [N]`` (both host arrays), ``n_latent`` latents with
        ``M`` inducing inputs each; ``rng`` feeds Monte-Carlo expectation rules of the
        likelihood. ``hp`` holds one kernel and ``Z`` per latent, or one of each shared by
        every latent (``shared_inducing``: ``Kuu [M, M]``, ``Kuf [M, B]`` are formed once per
        step and shared by the latents, ``shared_uncollapsed_elbo``, whose matrix gradients
        are the latents' sums, for the one VJP). ``backend``: where the ELBO runs (``hp.Z`` already
        lives there); each batch of ``X`` and ``y`` is moved to it. ``sample_weight [N]``:
        weights of the points' expected log-likelihoods (``None``: all one)."""
        self.X, self.y, self.likelihood, self.hp = X, np.asarray(y, dtype=np.int64), likelihood, hp
        self.weights = None if sample_weight is None else np.asarray(sample_weight, float)
        self.L, self.M = n_latent, M
        if hp.n_latent not in (1, n_latent):
            raise ValueError(f"hyper-parameters of {hp.n_latent} latents for {n_latent} latents")
        #: one kernel and one ``Z`` shared by every latent
        self.shared = hp.n_latent != n_latent
        self.backend = backend
        self.tril = tuple(backend.as_index(i) for i in np.tril_indices(M))
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._X_full: Array | None = None  # X on the backend, for full-batch steps
        # fixed Z, only kernel parameters learned: cached distances and fused kernel VJPs (a
        # numpy fast path, in memory and out of core alike; other backends take the generic one)
        self._fast = (backend.is_numpy and hp.Z is not None and not self.shared
                      and not any(hp.inducing_is_free(l) for l in range(self.L))
                      and bool(np.all(hp.kernel_entries("")))
                      and len({id(k) for k in hp.kernels}) == self.L)
        self._groups: list[FixedGroup] = []
        #: the last step's covariances, one per group (kept until the next step's are formed)
        self._last: list[StackedCovariances | None] = []
        if self._fast:
            names = hp.names  # kernel parameters only (few)
            # latents with equal Z share one distance cache and one batched computation
            self._groups = fixed_groups(hp.kernels, self.Zs, X)
            prefix = ["kernel"] if self.L == 1 else [f"kernel[{l}]" for l in range(self.L)]
            full = [f"{p}.{q}" for p, k in zip(prefix, hp.kernels) for q in k.param_names]
            self._theta_index = np.array([full.index(n) for n in names], dtype=np.int64)

    @property
    def Zs(self) -> list[Array]:
        """The inducing inputs, one ``[M, D]`` per latent (``hp.Z``; always set for svi; when
        shared, the one array repeated)."""
        Z = self.hp.Z
        if Z is None:
            raise ValueError("svi's hyper-parameters hold no inducing inputs")
        return Z * self.L if self.shared else Z

    @property
    def kernels(self) -> list[Kernel]:
        """One kernel per latent (``hp.kernels``; when shared, the one kernel repeated)."""
        return self.hp.kernels * self.L if self.shared else self.hp.kernels

    def pack(self, mu: Array, Lq: Array) -> Array:
        """``(theta, mu [L, M], Lq [L, M, M])`` as one vector on ``mu``'s namespace."""
        xp = ops.namespace(mu)
        theta = ops.like(mu, self.hp.pack())
        return xp.concat([theta, xp.reshape(mu, (-1,)),
                          xp.reshape(Lq[:, self.tril[0], self.tril[1]], (-1,))])

    def unpack(self, x: Array) -> tuple[Array, Array]:
        """Writes ``theta`` into the kernels; returns ``mu [L, M]`` and ``Lq [L, M, M]`` (views
        of / arrays on ``x``'s namespace)."""
        self.hp.unpack(x[:self.hp.size])
        return self._q_factors(x)

    def _q_factors(self, x: Array) -> tuple[Array, Array]:
        """``mu [L, M]`` and ``Lq [L, M, M]`` of ``x`` (``unpack`` without the kernels)."""
        xp = ops.namespace(x)
        P, L, M = self.hp.size, self.L, self.M
        mu = xp.reshape(x[P:P + L * M], (L, M))
        Lq = ops.zeros(x, (L, M, M))
        Lq[:, self.tril[0], self.tril[1]] = xp.reshape(x[P + L * M:], (L, -1))
        return mu, Lq

    def _inputs(self, batch: Array | None) -> Array:
        """The batch's inputs on the backend (full batch: moved once and kept)."""
        if batch is not None:
            return self.backend.asarray(self.X[batch])
        if self._X_full is None:
            self._X_full = self.backend.asarray(self.X)
        return self._X_full

    def elbo(self, x: Array, batch: Array | None) -> tuple[float, Array]:
        """Unbiased ELBO estimate on ``batch`` (``None``: all points) and its gradient."""
        value, grad, _ = self.estimate(x, batch, natural=False)
        return ops.scalar(value), grad

    def estimate(self, x: Array, batch: Array | None, natural: bool = True,
                 scale: float | None = None) -> tuple[Scalar, Array, ELBOEstimate]:
        """``elbo`` plus the full ``ELBOEstimate`` (with ``dSigma`` for natural gradients, or
        ``natural=False``: without it); on a device the value is a 0-d array, unread.
        ``scale``: the data term's weight (``None``: ``N / |batch|``, unbiased)."""
        mu, Lq = self.unpack(x)
        xp = ops.namespace(mu)
        n = self.X.shape[0]
        Xb = self._inputs(batch)
        if scale is None:
            scale = n / Xb.shape[0]
        # per class: a list of [M, M] / [M, B] arrays, or one stacked [C, M, M] / [C, M, B] array
        Kuu: list[Array] | Array
        Kub: list[Array] | Array
        if self._fast:  # the batch's rows read once (Xb), for every latent
            covs, Kuu, Kub, Kdiag = fixed_matrices(self._groups, self.hp.kernels, batch, Xb)
            self._last = covs
        elif (cov := self.hp.covariances(Xb)) is not None:  # one batched kernel path
            Kuu, Kub, Kdiag = cov.Kuu, cov.Kuf, cov.Kff_diag  # reused by hp.gradient's VJP
        else:
            kernels, Zs = self.hp.kernels, self.hp.Z or []
            Kuu = [k.K(Z) for k, Z in zip(kernels, Zs)]
            Kub = [k.K(Z, Xb) for k, Z in zip(kernels, Zs)]
            Kdiag = xp.stack([k.K_diag(Xb) for k in kernels])
        # shared: one Kuu, Kub, Kdiag for every latent; est.matrix their gradients' sums
        est = uncollapsed_elbo(Kuu, Kub, Kdiag, mu, Lq, self._expectation(batch), scale,
                               with_dSigma=natural)
        if self._fast:
            g_full = fixed_gradient(self._groups, covs, self.hp.kernels, est.matrix, batch, Xb)
            g_theta = g_full[self._theta_index]
        else:
            g_theta = parameter_gradient(self.hp, Xb, est.matrix)
        if ops.is_numpy(g_theta) != ops.is_numpy(mu):  # the fast path's host gradient
            g_theta = ops.like(mu, g_theta)
        grad = xp.concat([g_theta, xp.reshape(est.dmu, (-1,)),
                          xp.reshape(est.dLq[:, self.tril[0], self.tril[1]], (-1,))])
        return est.value, grad, est

    def natural_step(self, x: Array, est: ELBOEstimate, step: float) -> Array:
        """``x`` with every ``q(u_l)`` moved by one natural-gradient step (theta unchanged)."""
        mu, Lq = self.unpack(x)
        if est.dSigma is None:
            raise ValueError("natural_step needs an ELBOEstimate with dSigma")
        for l in range(self.L):
            mu[l], Lq[l] = natural_gradient_step(mu[l], Lq[l], est.dmu[l], est.dSigma[l], step)
        return self.pack(mu, Lq)

    def _expectation(self, batch: Array | None) -> ExpectationFn:
        """The per-point expected log-likelihood on ``batch`` (``None``: all points): the
        likelihood's ``variational_expectations``, times the points' weights when given."""
        y = self.y if batch is None else self.y[batch]
        fn = likelihood_expectation(self.likelihood, self.backend.as_index(y), self.rng)
        if self.weights is None:
            return fn
        w = self.backend.asarray(self.weights if batch is None else self.weights[batch])

        def weighted(mean: Array, var: Array) -> tuple[Array, Array, Array]:
            value, dmean, dvar = fn(mean, var)
            return w * value, w[:, None] * dmean, w[:, None] * dvar

        return weighted

    def snapshot(self, x: Array) -> Callable[[], InducingPosterior]:
        """A zero-argument callable building the posterior at a copy of ``x``."""
        x = ops.copy(x)
        return lambda: self.posterior(x)

    def posterior(self, x: Array) -> InducingPosterior:
        """The posterior at ``x``, on the host (numpy arrays, whatever the backend)."""
        with self.hp.installed(x[:self.hp.size]):
            mu, Lq = self._q_factors(x)
            mu_h, Lq_h = np.array(ops.to_host(mu)), ops.to_host(Lq)
            return InducingPosterior(self.likelihood, [k.copy() for k in self.kernels],
                                     [np.array(ops.to_host(z)) for z in self.Zs], list(mu_h),
                                     [lq @ lq.T for lq in Lq_h])


class _SVISteps(BatchSteps):
    """svi's step for ``MiniBatchSchedule`` (``SVI._step`` at the packed point ``x``); a window's
    replay starts from ``x`` and a copy of the optimiser."""

    def __init__(self, method: SVI, state: VariationalState, x: Array,
                 opt: StochasticOptimizer, ngd: float | None, steps_per_epoch: int,
                 group: distributed.Group | None = None):
        self.method, self.state, self.x, self.opt, self.ngd = method, state, x, opt, ngd
        self.group = group  # the data-parallel process group (None: one process)
        self.P = state.hp.size if ngd is not None else x.shape[0]  # entries the optimiser moves
        opt.reset(x[:self.P])
        self.steps_per_epoch = steps_per_epoch
        self._device = not ops.is_numpy(x)
        self.value = -np.inf  # the last iteration's mean ELBO estimate

    def on_device(self) -> bool:
        return self._device

    def step(self, batch: Array | None, iteration: int, index: int) -> tuple[Scalar, ...]:
        self.x, value = self.method._step(self.state, self.P, self.ngd, self.state.X.shape[0],
                                          self.x, self.opt, batch, index, self.group)
        return (value,)

    def save(self) -> object:
        return self.x, copy.deepcopy(self.opt)

    def load(self, saved: object) -> None:
        self.x, self.opt = cast(tuple[Array, StochasticOptimizer], saved)

    def payload(self, iteration: int, reads: list[Read], steps: int) -> Payload:
        self.value = float(np.mean([r[0] for r in reads]))
        return self.value, self.state.snapshot(self.x), {"epoch": steps / self.steps_per_epoch,
                                                         "steps": float(steps)}


class SVI(Method):
    """Stochastic variational GP classification (binary and multi-class).

    The expectation rule belongs to the likelihood (``expectation`` and its settings, e.g.
    ``RobustMax(expectation="log_space")``, ``Softmax(expectation="monte_carlo",
    mc_samples=32)``, ``BernoulliLogit(quadrature_points=100)``). Deprecated (one release, with a
    ``DeprecationWarning``; ``None`` leaves the likelihood's rule): ``n_quadrature`` (Bernoulli
    ``quadrature_points``), ``robustmax_rule`` (``"trapezoid"`` or ``"likelihood"``, the
    robust-max ``"log_space"`` rule), ``robustmax_nodes`` (robust-max ``"gauss_hermite"`` with
    that many nodes), ``softmax_samples`` (softmax ``"monte_carlo"`` with that many draws).

    Options: ``optimizer`` (``None``: ``lbfgs`` for full batches, ``adadelta`` for mini-batches;
    or ``adadelta``, ``adam``, ``lbfgs``), ``optimizer_options``,
    ``natural_gradient`` (``None``, or a
    step size in ``(0, 1]``: ``q(u)`` then moves by natural-gradient steps on the unbiased ELBO
    estimate and the optimiser moves only ``theta``; step 1 is exact for conjugate problems),
    ``scale`` (``batch``, ``per_datum``, ``full``), ``learn_inducing``, ``report_every`` (steps
    per reported iteration), ``time_budget_s``, ``default_M``.

    Model set-up options: ``inducing_init`` (``"kmeans"``: K-means centres shared
    by all latents; ``"random"``: ``M`` distinct training inputs drawn independently per latent
    from the problem's generator, the same draws as ep/sep/gfitc), ``shared_inducing`` (``True``:
    one ``Z`` and one kernel shared by every latent, GPflow SVGP's model: ``Kuu``, ``Kuf`` formed
    once per step and broadcast over the latents; default ``False``), ``init_q`` (``"prior"``, the
    default: ``Sigma = Kuu``; ``"identity"``: ``Sigma = I``, the svi paper's, whose KL term is
    huge when ``Kuu`` is ill-conditioned, so that small problems under-train), ``noise`` (a
    white-noise variance added to the kernel when it has none, default ``1e-2``, which keeps
    ``Kuu`` well-conditioned; ``None``: none, the paper's), ``lengthscale_init`` (``"kernel"``
    or ``"median"``: squared length-scale = median pairwise distance; ``"auto"``, the default:
    ``"kernel"`` for a ``Kernel`` object held fixed, else ``"median"``), ``hyper_bounds``
    (``None`` or ``(low, high)``: L-BFGS-B box on the log kernel parameters; ``q(u)`` and ``Z``
    unbounded).
    """

    #: the objective, log p(y) of discrete labels or a bound on it, is never positive
    objective_limit: ClassVar[float | None] = 0.0
    objective_kind = "bound"
    #: ``refine``: q(u) at the fit's kernel parameters and inducing inputs
    refines: ClassVar[bool] = True
    #: early stopping's ``refit="auto"``: the folds' models, each at its own best validation
    #: iterate, each ``q(u)`` refined on all the rows, averaged (vi-robustmax on wine and
    #: breast_cancer: ``benchmarks/early_stopping.py``; what over-fits is the hyper-parameters)
    early_stopping_rule: ClassVar[tuple[bool | str, int]] = ("average", 250)
    #: the ELBO runs on numpy or torch (CPU, CUDA), float64 or float32 (``gpinfer.backend``)
    backends: ClassVar[tuple[str, ...]] = ("numpy", "torch")
    float32: ClassVar[bool] = True

    name: ClassVar[str] = "svi"
    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = True
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    supports_out_of_core: ClassVar[bool] = True
    #: data-parallel stochastic fits (``_check_group``: the ELBO's gradient all-reduced)
    supports_process_group: ClassVar[bool] = True
    #: the ELBO's data term is a sum over points: a weight multiplies a point's term
    supports_sample_weight: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("logit", "probit", "robustmax", "softmax")
    #: any classification likelihood: the ELBO needs only ``variational_expectations``
    likelihood_requirements: ClassVar[frozenset[str] | None] = frozenset()
    option_spec: ClassVar[dict[str, Option]] = {
        "optimizer": choice(None, (None, "adadelta", "adam", "lbfgs"),
                            doc="None: lbfgs for full batches, adadelta for mini-batches"),
        "optimizer_options": mapping(doc="keyword options of the optimiser"),
        "n_quadrature": integer(None, "[1, inf)", none=True, doc="deprecated"),
        "robustmax_nodes": integer(None, "[1, inf)", none=True, doc="deprecated"),
        "robustmax_rule": choice(None, (None, *ROBUSTMAX_RULES), doc="deprecated"),
        "natural_gradient": real(None, "(0, 1]", none=True, doc="natural-gradient step on q(u)"),
        "softmax_samples": integer(None, "[1, inf)", none=True, doc="deprecated"),
        "scale": choice("batch", SCALES),
        "learn_inducing": flag(False),
        "shared_inducing": flag(False, doc="one Z and one kernel shared by every latent"),
        "report_every": integer(None, "[1, inf)", none=True, doc="steps per iteration"),
        "time_budget_s": real(None, "(0, inf)", none=True),
        "default_M": integer(DEFAULT_M, "[1, inf)", doc="M when the run leaves it null"),
        "inducing_init": choice("kmeans", INDUCING_INITS),
        "init_q": choice("prior", INITS_Q, doc="q(u) starts at the prior (identity: Sigma = I)"),
        "noise": real(1e-2, "(0, inf)", none=True, doc="white noise added to the kernel"),
        "lengthscale_init": lengthscale_init_option(),
        "hyper_bounds": bounds(None, none=True, doc="L-BFGS-B box on the log kernel parameters"),
    }

    @classmethod
    def expectation_likelihood(cls, likelihood: Likelihood, options: Mapping[str, Any]
                               ) -> Likelihood | None:
        """The ELBO evaluates ``likelihood``'s ``variational_expectations``, with the rule of
        the deprecated options (``Method.expectation_likelihood``)."""
        return legacy_expectation(likelihood, options, warn=False)

    @classmethod
    def optimizer_for(cls, options: Mapping[str, Any], batch_size: int | None) -> str:
        """The ``optimizer`` option, or for ``None`` the same default on every backend (the
        same call gives the same model): L-BFGS-B for full batches (``batch_size`` ``None``),
        AdaDelta for mini-batches (``Method.optimizer_for``); ``InputError`` for L-BFGS-B on
        mini-batches."""
        name = options.get("optimizer") or ("lbfgs" if batch_size is None else "adadelta")
        if name == "lbfgs" and batch_size is not None:
            raise InputError(
                f"{cls.name} with L-BFGS-B (optimizer={name!r}) needs full-batch training: leave "
                f"batch_size unset (got batch_size={batch_size}), or for mini-batches set "
                "method_options={'optimizer': 'adadelta'} (or 'adam')")
        return name

    def _check_optimizer(self, problem: Problem) -> str:
        """The optimiser's name (``optimizer_for``), built once with ``optimizer_options`` so that
        a bad option (or L-BFGS-B where it cannot run) is an ``InputError`` before any set-up."""
        name = self.optimizer_for(self.options, problem.batch_size)
        if name == "lbfgs" and distributed.current() is not None:
            raise InputError(
                f"{self.name or 'svi'} with L-BFGS-B (optimizer={name!r}) is not available in a "
                "process group (torch.distributed): set method_options={'optimizer': "
                "'adadelta'} (or 'adam')")
        make_optimizer(name, **dict(self.options["optimizer_options"] or {}))
        return name

    def _data(self, problem: Problem) -> tuple[Likelihood, Array, Array, int]:
        """The likelihood (with the deprecated options' rule), ``X [N, D]``, the labels
        ``y [N]`` as svi reads them (class indices; 0/1 for a binary likelihood) and the
        number of latents."""
        lik = legacy_expectation(problem.likelihood, self.options)
        X = host_rows(problem.X)
        if lik.task != "classification":
            raise InputError(f"svi needs a classification likelihood; got {type(lik).__name__}")
        if lik.multiclass:
            return lik, X, np.asarray(problem.y, dtype=np.int64), lik.n_latent(problem.n_classes)
        y = (binary_signs(problem.y, problem.n_classes, "svi") > 0).astype(np.int64)
        return lik, X, y, 1

    def _setup(self, problem: Problem) -> tuple[VariationalState, Array]:
        lik, X, y, n_latent = self._data(problem)
        if self.options["scale"] not in SCALES:
            raise InputError(f"svi: scale must be one of {SCALES}, got {self.options['scale']!r}")
        o = self.options
        for key, allowed in (("inducing_init", INDUCING_INITS), ("init_q", INITS_Q)):
            if o[key] not in allowed:
                raise InputError(f"svi: {key} must be one of {allowed}, got {o[key]!r}")
        kernel = start_kernel(problem, median_input(X), o["noise"], str(o["lengthscale_init"]),
                              owner="svi")
        n_own = 1 if o["shared_inducing"] else n_latent  # latents with their own kernel and Z
        Zs = initial_inducing(problem.inducing, X, problem.rng, n_own,
                              init=o["inducing_init"], default=int(o["default_M"]), owner="svi")
        kernels = [kernel.copy() for _ in range(n_own)]
        M = Zs[0].shape[0]
        if o["init_q"] == "prior":  # on the host, before Z moves to the backend
            Lq0 = np.stack([jittered_cholesky(k.K(Z), name="Kuu").L for k, Z in zip(kernels, Zs)])
            Lq0 = np.repeat(Lq0, n_latent // n_own, axis=0)
        else:
            Lq0 = np.repeat(np.eye(M)[None], n_latent, axis=0)
        backend = problem.backend
        hp = HyperParameters(kernels, Z=[backend.asarray(Z) for Z in Zs],
                             optimize=problem.optimize,
                             optimize_inducing=bool(o["learn_inducing"]),
                             device_kernels=not backend.is_numpy)  # read back by ``hp.kernels``
        state = VariationalState(X, y, lik, hp, n_latent, M, problem.rng, backend,
                                 problem.sample_weight)
        x0 = state.pack(backend.asarray(np.zeros((n_latent, M))), backend.asarray(Lq0))
        return state, x0

    def _scale(self, n: int, b: int) -> float:
        return {"batch": b / n, "per_datum": 1.0 / n, "full": 1.0}[self.options["scale"]]

    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        name = self._check_optimizer(problem)
        state, x = self._setup(problem)
        return self._train(problem, state, x, name, callback)

    def refine(self, problem: Problem, fitted: FitResult,
               callback: FitCallback | None = None) -> FitResult:
        """``q(u)`` optimised further (the same optimiser as ``fit``) at ``fitted``'s kernel
        parameters and inducing inputs, held fixed, from ``fitted``'s ``q(u)`` (its ``state``
        ``mu [L, M]`` and ``Lq [L, M, M]``; without them, its posterior's means and the
        Cholesky factors of its covariances) (``Method.refine``)."""
        post = fitted.posterior
        name = self._check_optimizer(problem)
        if not isinstance(post, InducingPosterior):
            raise InputError("svi.refine needs a fit of svi (an InducingPosterior); got "
                             f"{type(post).__name__}")
        lik, X, y, n_latent = self._data(problem)
        backend = problem.backend
        hp = HyperParameters([k.copy() for k in post.kernels],
                             Z=[backend.asarray(Z) for Z in post.Z], optimize=False,
                             device_kernels=True)
        state = VariationalState(X, y, lik, hp, n_latent, post.Z[0].shape[0], problem.rng,
                                 backend, problem.sample_weight)
        if "mu" in fitted.state:  # the fit's own parameters
            mu, Lq = fitted.state["mu"], fitted.state["Lq"]
        else:  # a posterior alone (an iterate): Lq from S
            mu, Lq = np.stack(post.m), jittered_cholesky(
                np.stack(post.S), name="posterior covariance S", part="latent").L
        x = state.pack(backend.asarray(np.asarray(mu, dtype=float)),
                       backend.asarray(np.asarray(Lq, dtype=float)))
        return self._train(problem, state, x, name, callback)

    def _train(self, problem: Problem, state: VariationalState, x: Array, name: str,
               callback: FitCallback | None) -> FitResult:
        """The fit with the optimiser ``name`` (``_check_optimizer``) from the packed start
        ``x`` (``VariationalState.pack``): every entry that ``state.hp`` leaves free and
        ``q(u)``."""
        rep = IterationReporter(callback, self.name, self.options["time_budget_s"])
        opt_options = dict(self.options["optimizer_options"] or {})
        extra_state: dict[str, Array] = {}
        if name == "lbfgs":
            x, value, n_iter, extra_state = self._fit_lbfgs(problem, state, x, rep, opt_options)
        else:
            x, value, n_iter = self._fit_stochastic(problem, state, x, rep, name, opt_options)
        mu, Lq = state.unpack(x)
        posterior = state.posterior(x)
        out = {"mu": np.array(ops.to_host(mu)), "Lq": np.array(ops.to_host(Lq)),
               "Z": np.array(ops.to_host(state.Zs[0])), **extra_state}
        for l, k in enumerate(state.hp.kernels):
            out[f"kernel_params_{l}"] = k.get_unconstrained().copy()
        kernel = state.hp.kernels[0] if state.L == 1 else state.kernels
        return FitResult(posterior=posterior, log_evidence=float(value), kernel=kernel,
                         n_iter=n_iter, history=rep.history, state=out)

    def _fit_stochastic(self, problem: Problem, state: VariationalState, x: Array,
                        rep: IterationReporter, name: str, opt_options: dict[str, Any]
                        ) -> tuple[Array, float, int]:
        """AdaDelta or Adam (and natural-gradient steps on ``q(u)``) on the mini-batch
        schedule (``gpinfer.training.minibatch``): one reported iteration is ``report_every``
        steps, read once on a device. Returns ``(x, the last iteration's mean ELBO estimate,
        iterations)``."""
        opt = make_optimizer(name, **opt_options)
        if not isinstance(opt, StochasticOptimizer):
            raise InputError(f"svi: optimizer {name!r} does not take single steps; use adadelta, "
                             "adam or lbfgs")
        ngd = self.options["natural_gradient"]
        if ngd is not None and not 0.0 < float(ngd) <= 1.0:
            raise InputError(f"svi: natural_gradient must be None or in (0, 1], got {ngd!r}")
        group = distributed.current()
        if group is not None:
            self._check_group(state, ngd, group, problem.batch_size)
        bs = problem.batch_size
        schedule = MiniBatchSchedule(state.X.shape[0], None if bs is None else int(bs),
                                     problem.rng, rep)
        every = int(self.options["report_every"] or max(1, round(0.1 * schedule.steps_per_epoch)))
        schedule.per_iteration = schedule.read_every = every
        steps = _SVISteps(self, state, x, opt, None if ngd is None else float(ngd),
                          schedule.steps_per_epoch, group)
        n_iter = schedule.run(steps, int(problem.max_iter))
        return steps.x, steps.value, n_iter

    def _check_group(self, state: VariationalState, ngd: float | None,
                     group: distributed.Group, batch_size: int | None) -> None:
        """``InputError`` for what a data-parallel fit does not do yet: natural-gradient steps
        (their ``dSigma`` is not summed across ranks), Monte-Carlo expectations (each rank
        would draw for its own rows from the shared generator, and the ranks' batch orders
        would part), a time budget (the ranks would stop at different steps) and a batch (the
        last one of an epoch included) of fewer points than ranks (a rank without rows)."""
        n = state.X.shape[0]
        smallest = distributed.smallest_batch(n, batch_size)
        if smallest < group.size:
            raise InputError(f"svi: a batch of {smallest} points for {group.size} ranks "
                             f"(batch_size={batch_size}, {n} points): every batch needs a point "
                             "per rank")
        if ngd is not None:
            raise InputError("svi: natural_gradient is not available in a process group "
                             "(torch.distributed); use adam or adadelta alone")
        if self.options["time_budget_s"] is not None:  # the ranks' clocks would part
            raise InputError("svi: time_budget_s is not available in a process group "
                             "(torch.distributed); bound the fit by max_iter")
        if getattr(state.likelihood, "expectation", None) == "monte_carlo":
            raise InputError("svi: a Monte-Carlo expectation rule is not available in a process "
                             "group (torch.distributed); use a quadrature rule")

    def _step(self, state: VariationalState, P: int, ngd: float | None, n: int, x: Array,
              opt: StochasticOptimizer, batch: Array | None, step: int,
              group: distributed.Group | None = None) -> tuple[Array, Scalar]:
        """One step on ``batch`` (``None``: all points): the ELBO estimate at the optimiser's
        look-ahead point, its checks, the optimiser's update of ``x [:P]`` and the
        natural-gradient step (``ngd``). Returns the new ``x`` and the estimate (unread on a
        device inside ``ops.deferred_checks``: its finiteness is checked there).

        In a process ``group`` of ``K`` ranks, ``batch`` is the global batch of ``b`` points:
        this rank evaluates its rows (``group.rows``) with the data term weighted
        ``K N / b``, and the ranks' values and gradients are averaged (one ``all_reduce``):
        the KL, which every rank computes whole, enters once and the data term is the global
        batch's ``N / b`` times its sum, so every rank takes the one-process step."""
        xp = ops.namespace(x)
        b = n if batch is None else batch.size
        xe = xp.concat([opt.lookahead(x[:P]), x[P:]]) if P else ops.copy(x)
        if group is None:
            v, g, est = state.estimate(xe, batch, natural=ngd is not None)
        else:
            rows = group.rows(np.arange(n) if batch is None else batch)
            # a NumericalError on this rank (e.g. a Cholesky) travels as the failure flag, so
            # every rank raises instead of waiting in the collective
            done, failure = distributed.attempt(lambda: state.estimate(
                xe, rows, natural=False, scale=group.size * n / b))
            v, g = (done[0], done[1]) if done is not None else (0.0, xe * 0.0)
            v, g = group.agreed_mean(v, g, failure)
        check_step(v, g, step, "svi ELBO")
        x = xe
        if P:
            x[:P] = opt.step(xe[:P], self._scale(n, b) * g[:P])
        if ngd is not None:
            x = state.natural_step(x, est, ngd)
        return x, v

    def _fit_lbfgs(self, problem: Problem, state: VariationalState, x: Array,
                   rep: IterationReporter, opt_options: dict[str, Any]
                   ) -> tuple[Array, float, int, dict[str, Array]]:
        hb = self.options["hyper_bounds"]
        if hb is not None and "bounds" not in opt_options:
            lo, hi = (float(v) for v in hb)
            opt_options["bounds"] = (state.hp.bounds(kernel=(lo, hi))
                                     + [(None, None)] * (x.shape[0] - state.hp.size))
        opt = LBFGSB(**opt_options)
        n = state.X.shape[0]
        s = self._scale(n, n)

        def fun(z: Array) -> tuple[float, Array]:
            v, g = state.elbo(z, None)
            return s * v, s * g

        def on_iteration(it: int, z: Array, value: float) -> bool:
            return rep.report(it, value / s, state.snapshot(z), {"lbfgs_abnormal": 0.0})

        # the report and the result are built from z alone: no memo, no re-solve
        schedule = OuterSchedule("svi", on_iteration, refresh=False, finish="never",
                                 history=rep.history)
        result = schedule.run(opt, fun, x, int(problem.max_iter))
        if not rep.history or not result.success:
            # the final point, with an abnormal end recorded in the run's metrics
            rep.report(len(rep.history) + 1, result.value / s, state.snapshot(result.x),
                       {"lbfgs_abnormal": float(not result.success)})
        extra = {"lbfgs_success": np.array(result.success),
                 "lbfgs_message": np.array(result.message)}
        return result.x, result.value / s, max(result.n_iter, 1), extra
