"""The core interfaces (Likelihood, SiteApproximation, Optimizer) and the method-plugin protocol.

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
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import numpy as np

from gpinfer.backend.choice import BACKENDS, NUMPY, Backend
from gpinfer.errors import InputError
from gpinfer.options import Option, check_options

if TYPE_CHECKING:
    from gpinfer.kernels.base import Kernel
    from gpinfer.posterior import Posterior

Array = np.ndarray
#: the backends of a rule that ``Likelihood.expectation_backends`` does not list
NUMPY_ONLY: frozenset[str] = frozenset({"numpy"})
#: the backends of a rule written against the array API (``gpinfer.backend.ops``)
EVERY_BACKEND: frozenset[str] = frozenset(BACKENDS)
#: a float, or a 0-d array of a backend (e.g. a torch tensor on a device) not yet read
Scalar = float | Any


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
    #: what it answers beyond this abstract interface, by name (``"log_prob_derivatives"``,
    #: ``"log_sigmoid"``, ``"tilted_d2"``, ...): methods declare the names they need in
    #: ``Method.likelihood_requirements`` (see ``docs/glossary.md``, capabilities)
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: the rules ``variational_expectations`` can use; the likelihood's constructor option
    #: ``expectation`` picks one (the first is the class's default)
    expectation_rules: ClassVar[tuple[str, ...]] = ("expected_log_prob",)
    #: the array backends (``gpinfer.backend``) each rule runs on: ``rule`` -> names, or
    #: ``(rule, n_classes)`` -> names where a class count differs (softmax's two-class
    #: Gauss-Hermite); a rule not listed runs on numpy only, and every rule runs on numpy
    #: (checked when the class is defined). Read through ``supported_backends`` by the check
    #: before training (``gpinfer.validation.check_method_compatible``) and by
    #: ``variational_expectations`` itself
    expectation_backends: ClassVar[Mapping[str | tuple[str, int], frozenset[str]]] = {}

    #: the integer settings of those rules, as attribute names (e.g. ``"quadrature_points"``)
    expectation_settings: ClassVar[tuple[str, ...]] = ()
    #: the rule in use (an instance attribute once set through ``set_expectation``)
    expectation: str = "expected_log_prob"
    #: whether ``predict_proba`` and ``log_predictive`` take arrays of any array-API namespace
    #: (``gpinfer.backend``); otherwise a posterior hands them host arrays
    device_predictions: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for key, names in cls.expectation_backends.items():
            if "numpy" not in names or not set(names) <= set(BACKENDS):
                raise TypeError(
                    f"{cls.__qualname__}.expectation_backends[{key!r}] must name numpy and "
                    f"only the backends {list(BACKENDS)}; got {sorted(names)}")

    def set_expectation(self, rule: str | None = None, **settings: int | None) -> None:
        """Choose the rule of ``variational_expectations`` (``None``: keep it) and its settings
        (``None`` values are left as they are); an ``InputError`` names the valid choices."""
        if rule is not None:
            if rule not in self.expectation_rules:
                raise InputError(
                    f"{type(self).__name__}: expectation must be one of "
                    f"{list(self.expectation_rules)}, got {rule!r}"
                )
            self.expectation = rule
        for key, value in settings.items():
            if key not in self.expectation_settings:
                known = ", ".join(self.expectation_settings) or "none"
                raise InputError(
                    f"{type(self).__name__}: unknown expectation setting {key!r} (known: {known})"
                )
            if value is None:
                continue
            if isinstance(value, bool) or int(value) != value or int(value) < 1:
                raise InputError(f"{type(self).__name__}: {key} must be a positive integer, "
                                 f"got {value!r}")
            setattr(self, key, int(value))

    def with_expectation(self, rule: str | None = None, **settings: int | None) -> Likelihood:
        """A copy of this likelihood with another expectation rule (see ``set_expectation``)."""
        out = copy.copy(self)
        out.set_expectation(rule, **settings)
        return out

    def supported_backends(self, expectation: str | None = None,
                           n_classes: int | None = None) -> frozenset[str]:
        """The array backends the ``variational_expectations`` rule ``expectation`` (None: the
        one in use) runs on for ``n_classes`` classes, from ``expectation_backends`` (None:
        the rule's entry for any count, not a count's own); an unknown rule is an
        ``InputError`` naming the rules."""
        rule = self.expectation if expectation is None else expectation
        if rule not in self.expectation_rules:
            raise InputError(f"{type(self).__name__}: expectation must be one of "
                             f"{list(self.expectation_rules)}, got {rule!r}")
        declared = self.expectation_backends
        if n_classes is not None and (rule, n_classes) in declared:
            return frozenset(declared[rule, n_classes])
        return frozenset(declared.get(rule, NUMPY_ONLY))

    def require_backend(self, backend: str, n_classes: int | None = None) -> None:
        """``InputError`` unless the rule in use runs on ``backend`` (a name) for ``n_classes``
        classes: it names the rule, the backend, the backends the rule runs on and this
        likelihood's rules that run on ``backend``."""
        rule = self.expectation
        supported = self.supported_backends(rule, n_classes)
        if backend in supported:
            return
        classes = (f" with {n_classes} classes"
                   if (rule, n_classes) in self.expectation_backends else "")
        others = [r for r in self.expectation_rules
                  if r != rule and backend in self.supported_backends(r, n_classes)]
        fix = (f"on {backend} use expectation=" + " or ".join(repr(r) for r in others)
               if others else f"no rule of {type(self).__name__} runs on {backend}")
        if "numpy" in supported:
            fix += ", or leave backend and device unset (numpy)"
        raise InputError(
            f"{type(self).__name__}(expectation={rule!r}){classes} runs on "
            f"{' and '.join(sorted(supported))} only, not on the {backend} backend: {fix}")

    def supports(self, requirements: Iterable[str]) -> bool:
        """Whether this likelihood has every capability named in ``requirements``."""
        return set(requirements) <= self.capabilities

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

    def variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None = None
    ) -> ExpectedLogProb:
        """``E_{N(f|mean,var)}[log p(y|f)]`` and its derivatives by this likelihood's rule for
        variational objectives (the ELBO of svi), chosen by its ``expectation`` option.

        Shapes as ``expected_log_prob``. The default rule is ``expected_log_prob`` itself; a
        likelihood may offer faster rules of absolute accuracy (fixed Gauss-Hermite nodes, the
        robust-max trapezoid) or unbiased Monte-Carlo ones (which draw from ``rng``).
        """
        return self.expected_log_prob(y, mean, var)

    # -- gradients wrt the likelihood's own parameters (``get_unconstrained``) ----------------
    def tilted_grad_params(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> Array:
        """``d log Z / d theta_lik`` of ``tilted(y, mean, var, power)``, ``[N, P]`` (``P = 0``
        for a likelihood without parameters, the default)."""
        return np.zeros((np.shape(mean)[0], 0))

    def expected_log_prob_grad_params(self, y: Array, mean: Array, var: Array) -> Array:
        """``d/d theta_lik`` of ``expected_log_prob(y, mean, var).value``, ``[N, P]``."""
        return np.zeros((np.shape(mean)[0], 0))

    def log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        """``log p(y_n | data)`` under a Gaussian latent, ``[N]``; override for accurate tails."""
        P = self.predict_proba(mean, var)
        return np.log(np.clip(P[np.arange(len(y)), np.asarray(y, dtype=int)], 1e-300, None))


# --------------------------------------------------------------------------------------------
# Site approximation
# --------------------------------------------------------------------------------------------


class SiteState(abc.ABC):
    """What the engine's inner site schedule (``gpinfer.training.inner.InnerSchedule``)
    drives: the sites of one family at fixed hyper-parameters, their damped update and copies
    of them. Implemented per site family: dense EP (``gpinfer.sites.ep.EPSites``), tap's
    fixed point (``gpinfer_binary.tap.TAPSites``), gfitc's sites
    (``gpinfer_ep.gfitc.FITCSites``), pep's power-EP sites
    (``gpinfer_pep.rank_one.RankOnePEPSites``), the vi-jj bound's expansion points
    (``gpinfer_jj.bound.XiSites``), laplace's mode (``gpinfer_laplace.sites.LaplaceSites``),
    ivm's liquid set (``gpinfer_ivm.inference._LiquidSites``), and through
    ``SiteApproximation`` ep and sep.

    ``update`` returns the change the schedule's convergence test reads (a family's own
    measure: the largest site change, or ``|Delta log Z|``); ``snapshot`` and ``restore`` serve
    the failure policy (``max_failures``) and ``SiteApproximation``; a family that uses the
    divergence policy ``gpinfer.training.inner.Restart`` also gives ``move`` and ``restart``.
    """

    @abc.abstractmethod
    def update(self, damping: float, iteration: int) -> Scalar:
        """One damped update of the sites (``damping`` in ``(0, 1]``, 1: none); returns the
        change it made (a float, or a 0-d array where the sites live)."""

    def snapshot(self) -> object:
        """An independent copy of the site state (the failure policy's)."""
        raise NotImplementedError(f"{type(self).__name__} has no snapshot (failure policy)")

    def restore(self, snapshot: object) -> None:
        """Return to a state taken by ``snapshot``."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore (failure policy)")

    def move(self) -> float:
        """How far the last update moved the sites, as the divergence policy watches it."""
        raise NotImplementedError(f"{type(self).__name__} has no divergence measure (move)")

    def restart(self) -> None:
        """Back to the initial sites (the divergence policy's restart)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart")


class SiteApproximation(SiteState):
    """What the core training loop (``gpinfer.training.loop.TrainingLoop``) drives: the sites of
    an approximate posterior (a ``SiteState``), their local update on a batch, the objective
    they define and its matrix gradients.

    Per step the loop calls ``prepare(batch)`` once (what depends on the hyper-parameters at the
    batch's inputs: kernel matrices, factors), then ``update`` one or more times (damped
    moment matching of the batch's sites) and ``objective`` once; the loop turns the matrix
    gradients into the hyper-parameter gradient and takes the optimiser step. ``snapshot`` and
    ``restore`` serve the failure policy and the per-iteration posterior builders.
    Implemented by ep and sep (``gpinfer_ep``); a new site method implements these six methods
    and gets the schedules, the failure policy, reporting and early stopping.
    """

    @abc.abstractmethod
    def prepare(self, batch: Array, iteration: int) -> None:
        """Compute what the sites of the points ``batch [B]`` need at the current
        hyper-parameters (called once per step, before ``update`` and ``objective``)."""

    @abc.abstractmethod
    def update(self, damping: float, iteration: int) -> Scalar:
        """One damped update of the prepared batch's sites; returns the largest site change
        (a float, or a 0-d array where the sites live: the loop reads it with its pending
        ``ops.deferred_checks`` at the step's end)."""

    @abc.abstractmethod
    def objective(self, scale: float, iteration: int) -> ObjectiveValue:
        """The objective on the prepared batch (its data terms times ``scale = N / B``) and its
        matrix gradients, one ``MatrixGradients`` per latent."""

    @abc.abstractmethod
    def snapshot(self) -> object:
        """An independent copy of the site state."""

    @abc.abstractmethod
    def restore(self, snapshot: object) -> None:
        """Return to a state taken by ``snapshot``."""

    @abc.abstractmethod
    def posterior(self) -> Posterior:
        """The current approximate posterior, ready for prediction."""

    def end_epoch(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Called after each pass over the data in mini-batch training (e.g. to recompute
        site sums from stored sites)."""

    def batch_inputs(self) -> Array | None:
        """The prepared batch's inputs ``[B, D]`` as the sites computed with them (on their
        array backend, ``gpinfer.backend``), for the kernels' vector-Jacobian products; None:
        the loop takes the host rows ``X[batch]``."""
        return None


# --------------------------------------------------------------------------------------------
# Matrix gradients and objective values
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
    """An objective's value (a float, or a 0-d array where the objective was computed, read
    by the caller) and its matrix-level gradients (one ``MatrixGradients``, or one per
    latent)."""

    value: Scalar
    gradients: MatrixGradients | Sequence[MatrixGradients] = field(
        default_factory=MatrixGradients)


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

ValueAndGrad = Callable[[Array], tuple[float, Array]]
#: ``callback(iteration, x, value)`` of ``Optimizer.maximize``; True stops the optimiser
IterationCallback = Callable[[int, Array, float], "bool | None"]


@dataclass
class OptimizationResult:
    """What an optimiser returns: the final point and how it ended (``trial_failure``: it
    stopped at its last accepted iterate because a trial point failed numerically)."""

    x: Array
    value: float
    n_iter: int
    success: bool
    message: str = ""
    trial_failure: bool = False


class Optimizer(abc.ABC):
    """How hyper-parameters move: maximise ``fun`` (returning value and gradient) from ``x0``."""

    @abc.abstractmethod
    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None) -> OptimizationResult:
        """Maximise ``fun``. ``callback(iteration, x, value)`` may return True to stop early."""


class StochasticOptimizer(Optimizer):
    """An optimiser that takes one step at a time from a (possibly noisy) gradient."""

    @abc.abstractmethod
    def reset(self, x0: Array) -> None:
        """Start from ``x0`` with a fresh internal state."""

    def lookahead(self, x: Array) -> Array:
        """The point ``[P]`` at which the gradient for the next step is taken (``x`` itself;
        momentum methods such as Nesterov's override it)."""
        return x

    @abc.abstractmethod
    def step(self, x: Array, grad: Array) -> Array:
        """One ascent step from ``x`` along the gradient ``grad``; returns the new point."""

    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None) -> OptimizationResult:
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
    * ``kernel_given``: True when the caller gave ``kernel`` as a ``Kernel`` object (its
      parameters are meant), False when it was built from a name (its length-scale a
      placeholder); with ``optimize`` False, the ``lengthscale_init="auto"`` of the methods
      with a median heuristic keeps such a kernel as given (``gpinfer.kernels.initialisation``).
    * ``max_iter``: outer iterations (hyper-parameter steps, or sweeps when ``optimize`` is False).
    * ``batch_size``: ``None`` for batch training, else the mini-batch size.
    * ``rng``: the run's random generator (seeded from ``seed``).
    * ``backend``: the array backend (``gpinfer.backend.Backend``: numpy, or torch on a CPU or
      GPU, and its dtype), checked against the method's ``backends`` and ``float32`` before
      ``fit``. ``X`` and ``y`` stay on the host; a method moves batches to the backend.
    * ``sample_weight``: ``None``, or positive weights ``[N]`` (float64) that multiply each
      point's term of the objective (weight 2 counts a point twice); given only to methods
      with ``supports_sample_weight`` (the estimators drop rows of weight zero and pass
      all-one weights as ``None``).
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
    backend: Backend = NUMPY
    sample_weight: Array | None = None
    kernel_given: bool = False

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


#: what a method's reported objective is (``Method.objective_kind``)
ObjectiveKind = Literal["bound", "estimate", "surrogate"]
OBJECTIVE_KINDS: tuple[ObjectiveKind, ...] = ("bound", "estimate", "surrogate")
#: what the fit guard compares with the class-frequency predictor (``Method.baseline_measure``)
BaselineMeasure = Literal["nll", "error"]
BASELINE_MEASURES: tuple[BaselineMeasure, ...] = ("nll", "error")

#: called once per iteration; returning ``True`` asks the method to stop after this iteration
#: (``None`` or ``False``: go on)
FitCallback = Callable[[IterationInfo], bool | None]


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
      ``no_better_than_baseline``, ``constant_predictions``, ``single_class_predictions``);
      ``diagnostics``: its numbers (``train_nll``, ``baseline_nll``, ``restored_iteration``,
      ...). Set by the estimator after ``fit``; methods leave them empty.
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
    #: whether mini-batch ``fit`` reads ``Problem.X`` by rows only (``X[index]``, ``X.shape``,
    #: and the core's ``initial_inducing``; ``gpinfer.data.source.host_rows``): the estimators
    #: then accept inputs out of core (a memmap, ``.npy`` shards, Parquet) for it
    supports_out_of_core: ClassVar[bool] = False
    #: whether ``fit`` trains data-parallel in a ``torch.distributed`` process group (each rank
    #: its part of every batch, the ranks' sums all-reduced: ``gpinfer.training.distributed``);
    #: the estimators and ``gpinfer-run`` refuse the other methods in a group before training
    #: (every rank would fit the whole model alone). Option-level limits (a method's own
    #: settings that do not run in a group) stay the method's ``InputError``s
    supports_process_group: ClassVar[bool] = False
    #: whether ``fit`` honours ``Problem.sample_weight`` (per-point weights of an objective
    #: that is a sum over points); other methods get ``None`` and the estimators reject weights
    #: other than 0/1 for them before training
    supports_sample_weight: ClassVar[bool] = False
    #: what the estimators' ``optimize=None`` (their default) means for this method: False for a
    #: method without a gradient (AIS) or whose objective is maximised by a degenerate kernel (FV)
    optimize_by_default: ClassVar[bool] = True
    #: likelihood names this method accepts (first one is the default)
    likelihoods: ClassVar[Sequence[str]] = ("probit",)
    #: the likelihood capabilities this method needs (``Likelihood.capabilities``): a likelihood
    #: object whose name is not in ``likelihoods`` (a third party's) is accepted when it has them
    #: all; ``None``: only the named likelihoods
    likelihood_requirements: ClassVar[frozenset[str] | None] = None
    #: the method's options, declared once: name -> ``gpinfer.options.Option`` (type, range,
    #: default, doc). ``default_options`` is derived from it, and ``__init__`` checks every value
    #: against it (one ``InputError`` naming the method, option, value and what is allowed)
    option_spec: ClassVar[Mapping[str, Option]] = {}
    #: default method options (derived from ``option_spec`` when the class declares one; a
    #: class may still give the dict alone, unchecked); ``__init__`` rejects unknown keys
    default_options: ClassVar[Mapping[str, Any]] = {}
    #: renamed options, old name -> new name: the old name keeps working for one release, with a
    #: ``DeprecationWarning`` (``docs/glossary.md``, renamed options)
    renamed_options: ClassVar[Mapping[str, str]] = {}
    #: the most the reported objective can be, mathematically: ``0.0`` for a lower bound on (or
    #: an approximation of) the log-likelihood of discrete labels; ``None``: no such limit
    #: (EP energies, densities of continuous targets). Checked by ``gpinfer.fit_guard``.
    objective_limit: ClassVar[float | None] = None
    #: what the reported objective is (``OBJECTIVE_KINDS``): ``"bound"``, a lower bound on
    #: ``log p(y)`` (the variational methods); ``"estimate"``, an approximation of it (Laplace,
    #: EP energies); ``"surrogate"``, neither (vi-taylor's Taylor objective, which away from its
    #: fixed point can exceed every bound). The fit guard ranks the iterates of a bound or an
    #: estimate by their objective, and those of a surrogate by their training NLL on a fixed
    #: subsample, never by the surrogate (``gpinfer.fit_guard``)
    objective_kind: ClassVar[ObjectiveKind] = "estimate"
    #: what the fit guard's "no better than knowing nothing" compares for a classifier
    #: (``BASELINE_MEASURES``): ``"nll"``, the training NLL against predicting the class
    #: frequencies; ``"error"``, the training error rate against predicting the majority class,
    #: for a method whose class probabilities are bounded by its construction rather than fitted
    #: (lr squashes regression on +-1 targets: about Phi(1) = 0.84 at most, so its NLL cannot
    #: reach the frequencies' on a 95/5 data set however well it classifies). Both NLLs are
    #: recorded either way (``gpinfer.fit_guard.check_against_baseline``)
    baseline_measure: ClassVar[BaselineMeasure] = "nll"
    #: whether the reported objectives are one quantity that training maximises, so that the fit
    #: guard may restore the best reported iterate when training ends far below it
    restore_best_iterate: ClassVar[bool] = True
    #: array backends the method runs on (``gpinfer.backend``): numpy only by default; a method
    #: written against the array API adds ``"torch"`` (CPU or CUDA). The estimators and
    #: ``gpinfer-run`` refuse any other before training, naming the methods that declare it
    backends: ClassVar[Sequence[str]] = ("numpy",)
    #: whether ``refine`` (the approximation at fixed hyper-parameters, from a fit) is there
    refines: ClassVar[bool] = False
    #: the early-stopping rule the estimators' ``refit="auto"`` (their default) runs for this
    #: method, ``(refit, refine_iter)``: ``refit`` True (train again on all the data for the
    #: chosen number of iterations), False (the hold-out fit's best iterate) or ``"average"``
    #: (the validation folds' models averaged; a regressor refits instead), then up to
    #: ``refine_iter`` iterations on the posterior alone (needs ``refines``). The default is the
    #: refit without refinement (``gpinfer.training.early_stopping``)
    early_stopping_rule: ClassVar[tuple[bool | str, int]] = (True, 0)
    #: whether the method is stable in single precision (``dtype="float32"``)
    float32: ClassVar[bool] = False
    #: why not, when ``float32`` is False (the error a user sees names it)
    float64_reason: ClassVar[str] = "it is not stable in single precision"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.objective_kind not in OBJECTIVE_KINDS:
            raise TypeError(
                f"{cls.__qualname__}.objective_kind must be one of {list(OBJECTIVE_KINDS)}; "
                f"got {cls.objective_kind!r}"
            )
        if cls.baseline_measure not in BASELINE_MEASURES:
            raise TypeError(
                f"{cls.__qualname__}.baseline_measure must be one of {list(BASELINE_MEASURES)}; "
                f"got {cls.baseline_measure!r}"
            )
        _check_early_stopping_rule(cls)
        if "option_spec" in cls.__dict__:
            if "default_options" in cls.__dict__:
                raise TypeError(
                    f"{cls.__qualname__} declares both option_spec and default_options; declare "
                    "option_spec only (default_options is derived from it)"
                )
            cls.default_options = {key: opt.default for key, opt in cls.option_spec.items()}

    @classmethod
    def expectation_likelihood(cls, likelihood: Likelihood, options: Mapping[str, Any]
                               ) -> Likelihood | None:
        """The likelihood whose ``variational_expectations`` training evaluates on the array
        backend, its rule set as the method's ``options`` set it; ``None`` (the default) when
        training never calls it. The check before training refuses a backend that its rule
        does not declare (``Likelihood.supported_backends``)."""
        return None

    @classmethod
    def optimizer_for(cls, options: Mapping[str, Any], batch_size: int | None) -> str | None:
        """The optimiser (a ``gpinfer.optim.make_optimizer`` name) that ``fit`` runs, with the
        method's ``options["optimizer_options"]``, for these ``options`` on mini-batches of
        ``batch_size`` points (``None``: full batch); ``gpinfer-run`` builds it once before its
        MLflow run, so that a bad name or option is refused first. ``None``: nothing to check.
        The default is the ``optimizer`` option of a method that declares one (``None`` leaves
        the choice to ``fit``); a method that picks its optimiser for the problem's shape names
        it here, and raises ``InputError`` where none of its optimisers can run."""
        return options.get("optimizer") if "optimizer" in cls.default_options else None

    def __init__(self, **options: Any):
        options = _apply_renames(self.name or type(self).__name__, self.renamed_options, options)
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            known = ", ".join(sorted(self.default_options)) or "none"
            raise InputError(
                f"method {self.name!r} got unknown option(s) {unknown}; known options: {known}"
            )
        checked = check_options(self.name or type(self).__name__, self.option_spec, options)
        self.options: dict[str, Any] = {**self.default_options, **checked}

    @abc.abstractmethod
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        """Fit the approximation (and, if ``problem.optimize``, the hyper-parameters)."""

    def refine(self, problem: Problem, fitted: FitResult,
               callback: FitCallback | None = None) -> FitResult:
        """Optimise the approximate posterior of ``fitted`` (a fit of this method to
        ``problem``'s data) further with its hyper-parameters (kernel parameters, inducing
        inputs) held where ``fitted`` left them, for up to ``problem.max_iter`` iterations,
        starting from ``fitted``'s posterior: early stopping's ``refine_iter``
        (``gpinfer.training.early_stopping``). Methods that can do so set ``refines``."""
        raise NotImplementedError(f"method {self.name!r} cannot refine a fit at fixed "
                                  "hyper-parameters")


def _check_early_stopping_rule(cls: type[Method]) -> None:
    """``TypeError`` at class definition for a ``Method.early_stopping_rule`` that is not
    ``(True | False | "average", refine_iter >= 0)``, or that refines a method without
    ``refines``."""
    rule = cls.early_stopping_rule
    ok = (isinstance(rule, tuple) and len(rule) == 2
          and (isinstance(rule[0], bool) or rule[0] == "average")
          and isinstance(rule[1], int) and not isinstance(rule[1], bool) and rule[1] >= 0)
    if not ok:
        raise TypeError(f"{cls.__qualname__}.early_stopping_rule must be (refit, refine_iter) "
                        f"with refit True, False or 'average' and refine_iter >= 0; got {rule!r}")
    if rule[1] and (not cls.refines or rule[0] is False):
        raise TypeError(f"{cls.__qualname__}.early_stopping_rule refines ({rule[1]} iterations) "
                        "but the class has refines=False or the rule refit=False")


def _apply_renames(method: str, renamed: Mapping[str, str], options: dict[str, Any]
                   ) -> dict[str, Any]:
    """``options`` with every old name of ``renamed`` moved to its new name, warning once per
    old name (``DeprecationWarning``); both names at once is an ``InputError``."""
    if not renamed or not set(options) & set(renamed):
        return options
    import warnings

    out = dict(options)
    for old, new in renamed.items():
        if old not in out:
            continue
        if new in out:
            raise InputError(f"method {method!r} got both {old!r} and its new name {new!r}; "
                             f"give {new!r} only")
        warnings.warn(f"method {method!r}: option {old!r} is renamed {new!r}; the old name "
                      "works for one more release", DeprecationWarning, stacklevel=4)
        out[new] = out.pop(old)
    return out
