"""The four core interfaces and the method-plugin protocol.

Symbols (shared with ``../shared/specs``; see ``docs/glossary.md``):

* ``N`` training points, ``D`` input dimensions, ``M`` inducing points, ``C`` classes,
  ``L`` latent functions (1 for binary classification and regression, ``C`` for multi-class).
* ``X [N, D]`` inputs, ``y [N]`` targets, ``Z [M, D]`` inducing inputs, ``F [N, L]`` latent values.
* Classification targets reaching a likelihood or a method are integer class indices
  ``0..C-1`` (binary: 0/1; a likelihood that needs signs maps ``0 -> -1, 1 -> +1`` itself).
* Objectives are **maximised** (log evidence, EP energy, ELBO); optimisers negate at their own
  boundary when the underlying routine minimises.

Data flows one way: arrays -> kernel matrices -> site update -> objective value and matrix
gradients (``MatrixGradients``) -> kernel vector-Jacobian product -> optimiser step.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from gpinfer.kernels.base import Kernel
    from gpinfer.posterior import Posterior

Array = np.ndarray


# --------------------------------------------------------------------------------------------
# Likelihood
# --------------------------------------------------------------------------------------------


class TiltedMoments(NamedTuple):
    """Log normaliser of the tilted ``p(y|f)^power N(f | mean, var)`` and its derivatives.

    For single-latent likelihoods every field has the shape of ``mean`` (``[N]``). For
    multi-class likelihoods with an independent Gaussian per class, ``log_z`` is ``[N]`` and the
    derivatives are ``[N, C]``.
    """

    log_z: Array
    dlogz_dmean: Array
    dlogz_dvar: Array


class ExpectedLogProb(NamedTuple):
    """``E_{N(f | mean, var)}[log p(y | f)]`` and its derivatives (shapes as ``TiltedMoments``)."""

    value: Array
    dmean: Array
    dvar: Array


class Likelihood(abc.ABC):
    """``p(y | f)`` for one data point with ``L`` latent values.

    Single-latent likelihoods (Bernoulli, Gaussian) take ``F``, ``mean``, ``var`` of shape
    ``[N]``; multi-class likelihoods take ``[N, C]``.
    """

    #: the registry name (entry point in ``gpinfer.likelihoods``), e.g. ``"probit"``
    name: ClassVar[str] = ""
    #: ``"classification"`` or ``"regression"``
    task: ClassVar[Literal["classification", "regression"]] = "classification"
    #: whether this likelihood models more than two classes
    multiclass: ClassVar[bool] = False

    def n_latent(self, n_classes: int) -> int:
        """Number of latent functions ``L`` for ``n_classes`` classes (1 unless multi-class)."""
        return n_classes if self.multiclass else 1

    # -- parameters (e.g. Gaussian noise), in an unconstrained space ------------------------
    @property
    def param_names(self) -> list[str]:
        return []

    def get_unconstrained(self) -> Array:
        """Likelihood parameters in the unconstrained space, ``[P]`` (empty by default)."""
        return np.zeros(0)

    def set_unconstrained(self, theta: Array) -> None:
        if np.size(theta):
            raise ValueError(f"{type(self).__name__} has no parameters")

    # -- the likelihood itself ---------------------------------------------------------------
    @abc.abstractmethod
    def log_prob(self, y: Array, F: Array) -> Array:
        """``log p(y_n | F_n)``, shape ``[N]``."""

    @abc.abstractmethod
    def tilted(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> TiltedMoments:
        """Moments of ``p(y|f)^power N(f | mean, var)``: closed form, else quadrature."""

    @abc.abstractmethod
    def expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        """``E_{N(f|mean,var)}[log p(y|f)]`` and its derivatives wrt ``mean`` and ``var``."""

    @abc.abstractmethod
    def predict_proba(self, mean: Array, var: Array) -> Array:
        """Predictive class probabilities ``[N, C]`` (rows sum to one) under a Gaussian latent."""

    def log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        """``log p(y_n | data)`` under a Gaussian latent, ``[N]``; override for accurate tails."""
        P = self.predict_proba(mean, var)
        return np.log(np.clip(P[np.arange(len(y)), np.asarray(y, dtype=int)], 1e-300, None))


# --------------------------------------------------------------------------------------------
# Site approximation
# --------------------------------------------------------------------------------------------


class SiteApproximation(abc.ABC):
    """The approximate posterior's state and its local update rule.

    Examples: per-point Gaussian sites (EP), tied sites (SEP), rank-one sites in inducing space
    (Power EP), a variational ``q(u) = N(m, S)``, quadratic JJ/Taylor surrogates, an IVM active set,
    the Laplace mode.
    """

    @abc.abstractmethod
    def update(self, batch: Array | None = None) -> float:
        """One update (a Newton step, an EP sweep, a natural-gradient step, ...).

        ``batch`` holds the indices ``[B]`` of the points to update (``None``: all of them).
        Returns a non-negative change measure used for convergence tests.
        """

    @abc.abstractmethod
    def posterior(self) -> Posterior:
        """The current approximate posterior, ready for prediction."""

    @property
    def converged(self) -> bool:
        """Whether the last update met this approximation's own convergence criterion."""
        return False


# --------------------------------------------------------------------------------------------
# Objective
# --------------------------------------------------------------------------------------------


@dataclass
class MatrixGradients:
    """Gradient of a scalar objective with respect to the kernel matrices it was computed from.

    Each field is ``None`` when the objective does not depend on that matrix. The convention is
    ``dL/dtheta = sum_ab G_ab dK_ab/dtheta`` with ``K`` the matrix as computed (both triangles
    of a symmetric matrix count; return the symmetrised ``(G + G.T)/2`` for symmetric matrices).

    * ``Kff [N, N]``: full training covariance (dense methods).
    * ``Kff_diag [N]``: its diagonal only (sparse methods).
    * ``Kuu [M, M]`` and ``Kuf [M, N]``: inducing covariances (sparse methods).
    * ``likelihood [P]``: the likelihood's unconstrained parameters.
    """

    Kff: Array | None = None
    Kff_diag: Array | None = None
    Kuu: Array | None = None
    Kuf: Array | None = None
    likelihood: Array | None = None


@dataclass
class ObjectiveValue:
    """An objective's value and its matrix-level gradient."""

    value: float
    gradients: MatrixGradients = field(default_factory=MatrixGradients)


class Objective(abc.ABC):
    """The estimate of ``log p(y)`` that hyper-parameters maximise."""

    #: whether ``evaluate`` fills ``gradients`` (False for, e.g., an AIS estimate)
    has_gradient: ClassVar[bool] = True

    @abc.abstractmethod
    def evaluate(self, sites: SiteApproximation, batch: Array | None = None) -> ObjectiveValue:
        """Value and matrix gradients at the current ``sites``.

        With ``batch`` (indices ``[B]``) the data term is estimated from the batch and scaled by
        ``N / B`` so that the estimate is unbiased for the full objective.
        """


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

ValueAndGrad = Callable[[Array], tuple[float, Array]]


@dataclass
class OptimizationResult:
    """What an optimiser returns: the final point and how it ended."""

    x: Array
    value: float
    n_iter: int
    success: bool
    message: str = ""


class Optimizer(abc.ABC):
    """How hyper-parameters move: maximise ``fun`` (returning value and gradient) from ``x0``."""

    @abc.abstractmethod
    def maximize(
        self,
        fun: ValueAndGrad,
        x0: Array,
        max_iter: int,
        callback: Callable[[int, Array, float], bool | None] | None = None,
    ) -> OptimizationResult:
        """Maximise ``fun``. ``callback(iteration, x, value)`` may return True to stop early."""


class StochasticOptimizer(Optimizer):
    """An optimiser that takes one step at a time from a (possibly noisy) gradient."""

    @abc.abstractmethod
    def reset(self, x0: Array) -> None:
        """Start from ``x0`` with a fresh internal state."""

    @abc.abstractmethod
    def step(self, x: Array, grad: Array) -> Array:
        """One ascent step from ``x`` along the gradient ``grad``; returns the new point."""

    def maximize(self, fun, x0, max_iter, callback=None) -> OptimizationResult:
        x = np.array(x0, dtype=float)
        self.reset(x)
        value = -np.inf
        it = 0
        for it in range(1, max_iter + 1):
            value, grad = fun(x)
            x = self.step(x, grad)
            if callback is not None and callback(it, x, value):
                break
        return OptimizationResult(x=x, value=float(value), n_iter=it, success=True)


# --------------------------------------------------------------------------------------------
# Methods (what a plugin registers in the entry-point group ``gpinfer.methods``)
# --------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """Everything a method's ``fit`` receives. Validated by the core before ``fit`` is called.

    * ``X [N, D]`` float64, finite. ``y [N]``: class indices ``0..C-1`` (int64) for
      classification, float64 targets for regression.
    * ``n_classes``: ``C`` (0 for regression).
    * ``kernel``: a fresh kernel the method may copy (one per latent) and must not share.
    * ``likelihood``: the likelihood object.
    * ``inducing``: ``None`` (method default or no inducing points), an ``int`` count ``M``, or an
      array ``[M, D]`` of initial inducing inputs.
    * ``optimize``: False keeps kernel parameters and inducing inputs fixed.
    * ``max_iter``: outer iterations (hyper-parameter steps, or sweeps when ``optimize`` is False).
    * ``batch_size``: ``None`` for batch training, else the mini-batch size.
    * ``rng``: the run's random generator (seeded from ``seed``).
    """

    X: Array
    y: Array
    n_classes: int
    kernel: Kernel
    likelihood: Likelihood
    inducing: int | Array | None = None
    optimize: bool = True
    max_iter: int = 100
    batch_size: int | None = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    @property
    def n(self) -> int:
        return self.X.shape[0]


@dataclass
class IterationInfo:
    """Reported to the fit callback once per outer iteration.

    ``posterior`` is a zero-argument callable returning the posterior *as it is at this
    iteration* (later training must not change what it builds: the fit guard may call it after
    training to restore the best iterate); the runner calls it only every few iterations (to
    log test metrics), so methods need not build it eagerly.
    ``extra`` holds method-specific scalars (damping, jitter, step size, ...), logged as metrics.
    """

    iteration: int
    objective: float
    elapsed: float
    posterior: Callable[[], Posterior] | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


FitCallback = Callable[[IterationInfo], None]


@dataclass
class FitResult:
    """What every method's ``fit`` returns.

    * ``posterior``: the one fitted-posterior type (``gpinfer.posterior.Posterior``) with
      ``predict_f(X) -> (mean [N*, L], var [N*, L])`` and ``predict_proba(X) -> [N*, C]``.
    * ``log_evidence``: the method's estimate of ``log p(y | X, theta)`` (or its bound).
    * ``kernel``: the fitted kernel (or a list of them, one per latent).
    * ``n_iter``: outer iterations done; ``history``: one dict per iteration (at least
      ``objective`` and ``elapsed``).
    * ``state``: named arrays that describe the fit (saved as the run's artifact).
    * ``log_evidence_se``: the standard error of a Monte-Carlo ``log_evidence`` (AIS), else None.
    * ``warnings``: codes of what ``gpinfer.fit_guard`` found (``restored_best_iterate``,
      ``no_better_than_baseline``); ``diagnostics``: its numbers (``train_nll``, ``baseline_nll``,
      ``restored_iteration``, ...). Set by the estimator after ``fit``; methods leave them empty.
    """

    posterior: Posterior
    log_evidence: float
    kernel: Any
    n_iter: int
    history: list[dict[str, float]] = field(default_factory=list)
    state: dict[str, Array] = field(default_factory=dict)
    log_evidence_se: float | None = None
    warnings: list[str] = field(default_factory=list)
    diagnostics: dict[str, float] = field(default_factory=dict)


class Method(abc.ABC):
    """An inference method. A plugin registers a subclass under ``gpinfer.methods``.

    Class attributes declare what the method handles; the core checks a problem against them
    before training (binary vs multi-class, inducing points, mini-batches) and reports a clear
    error naming the methods that would handle it.
    """

    #: the registry name (set to the entry-point name)
    name: ClassVar[str] = ""
    #: ``"classification"`` or ``"regression"`` (or both, as a tuple)
    tasks: ClassVar[Sequence[str]] = ("classification",)
    #: whether more than two classes are supported
    multiclass: ClassVar[bool] = False
    #: whether the method uses inducing points (a non-null ``M`` is rejected otherwise)
    uses_inducing_points: ClassVar[bool] = False
    #: whether mini-batch training (``batch_size``) is supported
    supports_minibatch: ClassVar[bool] = False
    #: likelihood names this method accepts (first one is the default)
    likelihoods: ClassVar[Sequence[str]] = ("probit",)
    #: default method options; ``__init__`` rejects unknown keys
    default_options: ClassVar[Mapping[str, Any]] = {}
    #: the most the reported objective can be, mathematically: ``0.0`` for a lower bound on (or
    #: an approximation of) the log-likelihood of discrete labels; ``None``: no such limit
    #: (EP energies, densities of continuous targets). Checked by ``gpinfer.fit_guard``.
    objective_limit: ClassVar[float | None] = None
    #: whether the reported objectives are one quantity that training maximises, so that the fit
    #: guard may restore the best reported iterate when training ends far below it
    restore_best_iterate: ClassVar[bool] = True

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            known = ", ".join(sorted(self.default_options)) or "none"
            raise ValueError(
                f"method {self.name!r} got unknown option(s) {unknown}; known options: {known}"
            )
        self.options: dict[str, Any] = {**self.default_options, **options}

    @abc.abstractmethod
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        """Fit the approximation (and, if ``problem.optimize``, the hyper-parameters)."""
