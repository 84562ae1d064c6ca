"""Likelihood base classes and input checks.

Re-exports the contract from ``gpinfer.interfaces`` (``Likelihood``, ``TiltedMoments``,
``ExpectedLogProb``) and adds ``ScalarLikelihood``, the base of single-latent likelihoods. As in
GPflow, each public method validates its inputs and then calls a private ``_method`` that holds
the integration strategy: by default log-space Gauss-Hermite (``n_gh`` nodes) on the
likelihood's log-derivatives; a likelihood with a closed form or a better rule overrides only
that private piece. ``variational_expectations`` (the ELBO's expected log-likelihood) follows the
likelihood's ``expectation`` option (``docs/glossary.md``, expectation rules); its default rule
is ``expected_log_prob``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError, NonFiniteError
from gpinfer.interfaces import ExpectedLogProb, Likelihood, TiltedMoments
from gpinfer.numerics import settings
from gpinfer.numerics.quadrature import gauss_hermite, gauss_hermite_tilted

Array = np.ndarray

__all__ = [
    "ExpectedLogProb",
    "Likelihood",
    "ScalarLikelihood",
    "TiltedMoments",
    "check_labels",
    "check_latent",
    "check_power",
]


# --------------------------------------------------------------------------------------------
# Input checks (shared with the multi-class likelihoods)
# --------------------------------------------------------------------------------------------


def require_rule_backend(likelihood: Likelihood, mean: Array, n_classes: int | None) -> None:
    """The last guard of ``variational_expectations`` (the check before training refuses the
    same earlier): ``likelihood.require_backend`` for ``mean``'s backend (numpy runs every
    rule: ``Likelihood.expectation_backends``)."""
    likelihood.require_backend(ops.backend_name(mean), n_classes)


def _finite_array(x: Array, name: str) -> Array:
    """``x`` as a finite floating array (``ops.as_array``: host values as float64 numpy; a
    backend array on its device, integers as float64). Its finiteness is checked on a device
    inside ``ops.deferred_checks`` (a training step) with the step's read, else at once."""
    try:
        arr = ops.as_array(x)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be numeric, got {type(x).__name__}") from exc
    ops.require_finite(lambda: NonFiniteError(f"{name} contains NaN or infinite values",
                                              quantity=name), arr)
    return arr


def check_latent(F: Array, name: str, ndim: int, n_latent: int | None = None) -> Array:
    """``F`` as a finite float array with ``ndim`` dimensions (and ``n_latent`` columns if 2-D)."""
    arr = _finite_array(F, name)
    if arr.ndim != ndim:
        want = "[N]" if ndim == 1 else "[N, C]"
        raise InputError(f"{name} must have shape {want}, got shape {tuple(arr.shape)}")
    if ndim == 2 and n_latent is not None and arr.shape[1] != n_latent:
        raise InputError(f"{name} must have {n_latent} columns, got shape {tuple(arr.shape)}")
    return arr


def check_mean_var(mean: Array, var: Array, ndim: int) -> tuple[Array, Array]:
    """Finite ``mean``, non-negative finite ``var`` of equal shape (``[N]`` or ``[N, C]``).

    Variances are floored at ``settings.VARIANCE_FLOOR`` (so a zero variance is accepted).
    """
    mean = check_latent(mean, "mean", ndim)
    var = check_latent(var, "var", ndim)
    if mean.shape != var.shape:
        raise InputError(f"mean and var must have the same shape, got {tuple(mean.shape)} and "
                         f"{tuple(var.shape)}")
    xp = ops.namespace(var)
    ops.require(xp.all(var >= 0), lambda: InputError(  # on a device: deferred in a step
        f"var must be non-negative, got minimum {ops.scalar(xp.min(var)):.3g}"))
    return mean, ops.floored(var, settings.VARIANCE_FLOOR)


def check_labels(y: Array, n_classes: int, n: int) -> Array:
    """Class indices ``0..n_classes-1`` as an int64 array ``[n]`` of ``y``'s namespace (host
    labels: numpy; backend labels, a torch integer tensor of ``Backend.as_index``, on their
    device); clear errors otherwise. On a device the range check is read with a training
    step's values (``ops.deferred_checks``), else at once."""
    arr = ops.as_array(y, dtype=None)
    xp = ops.namespace(arr)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InputError(f"y must have shape [{n}] to match the latent values, got "
                         f"{tuple(arr.shape)}")
    if xp.isdtype(arr.dtype, "real floating"):
        if not ops.all_finite(arr) or bool(xp.any(arr != xp.round(arr))):
            raise InputError("labels must be integer class indices 0..C-1, got non-integer values")
    elif arr.size and not xp.isdtype(arr.dtype, "integral"):
        raise InputError(f"labels must be integer class indices, got dtype {arr.dtype}")
    labels = xp.astype(arr, xp.int64)

    def out_of_range() -> InputError:
        bad = ops.to_host(labels)
        bad = bad[(bad < 0) | (bad >= n_classes)][:5]
        hint = " (sign labels -1/+1 must be mapped to 0/1)" if np.any(bad == -1) else ""
        return InputError(
            f"labels must be class indices in 0..{n_classes - 1}, got {bad.tolist()}{hint}")

    if n:
        ops.require(xp.all((labels >= 0) & (labels < n_classes)), out_of_range)
    return labels


def check_power(power: float) -> float:
    """A positive finite power (the Power-EP alpha)."""
    try:
        value = float(power)
    except (TypeError, ValueError) as exc:
        raise InputError(f"power must be a positive number, got {power!r}") from exc
    if not (np.isfinite(value) and value > 0):
        raise InputError(f"power must be positive and finite, got {power!r}")
    return value


# --------------------------------------------------------------------------------------------
# Single-latent base class
# --------------------------------------------------------------------------------------------


class ScalarLikelihood(Likelihood):
    """A likelihood with one latent value per point: ``F``, ``mean``, ``var`` and ``y`` are ``[N]``.

    Subclasses implement ``_targets`` (validate/convert ``y``) and ``_log_prob_derivatives``;
    they may override ``_tilted``, ``_expected_log_prob``, ``_predict_proba`` and
    ``_log_predictive`` with closed forms or better rules.
    """

    #: number of classes (2 for Bernoulli; ``None`` for regression)
    n_classes: ClassVar[int | None] = 2
    #: Gauss-Hermite nodes of the default strategies
    n_gh: ClassVar[int] = settings.GAUSS_HERMITE_POINTS
    capabilities: ClassVar[frozenset[str]] = frozenset({"log_prob_derivatives"})

    # -- hooks -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _targets(self, y: Array, n: int) -> Array:
        """Validated targets ``[n]`` in the internal representation (e.g. signs ``+-1``)."""

    @abc.abstractmethod
    def _log_prob_derivatives(self, y: Array, F: Array, order: int) -> tuple[Array, ...]:
        """``(log p, d/dF log p, ..., d^order/dF^order log p)`` for internal targets ``y``."""

    def _log_prob(self, y: Array, F: Array) -> Array:
        return self._log_prob_derivatives(y, F, 0)[0]

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        """Default: log-space Gauss-Hermite with Stein-form derivatives."""
        Y = y[:, None]

        def at_nodes(F: Array) -> tuple[Array, Array, Array]:
            l0, l1, l2 = self._log_prob_derivatives(np.broadcast_to(Y, F.shape), F, 2)
            return l0, l1, l2

        out = gauss_hermite_tilted(at_nodes, mean, var, power, self.n_gh)
        return TiltedMoments(out.log_z, out.d1, 0.5 * (out.d2 + out.d1**2))

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        """Default: Gauss-Hermite with Price/Bonnet derivatives ``E[l']`` and ``E[l'']/2``."""
        x, w = gauss_hermite(self.n_gh)
        F = mean[:, None] + np.sqrt(var)[:, None] * x
        l0, l1, l2 = self._log_prob_derivatives(np.broadcast_to(y[:, None], F.shape), F, 2)
        return ExpectedLogProb(l0 @ w, l1 @ w, 0.5 * (l2 @ w))

    def _variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None
    ) -> ExpectedLogProb:
        """Default: the ``expected_log_prob`` rule (override to offer other ``expectation``s)."""
        return self._expected_log_prob(y, mean, var)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        """Default: ``p(y = c) = exp(log Z_c)`` with the tilted normaliser at power one."""
        if self.n_classes is None:
            raise InputError(
                f"{type(self).__name__} is a regression likelihood: no class probabilities"
            )
        cols = [
            np.exp(
                self._tilted(self._targets(np.full(mean.shape, c), mean.size), mean, var, 1.0).log_z
            )
            for c in range(self.n_classes)
        ]
        return np.stack(cols, axis=1)

    def _log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        """``log int p(y | f) N(f | mean, var) df``: the tilted ``log Z`` at power one."""
        return self._tilted(y, mean, var, 1.0).log_z

    # -- public API (validation, then the private strategy) ---------------------------------
    def log_prob(self, y: Array, F: Array) -> Array:
        """``log p(y_n | F_n)``, ``[N]``."""
        F = check_latent(F, "F", 1)
        return self._log_prob(self._targets(y, F.shape[0]), F)

    def log_prob_derivatives(self, y: Array, F: Array, order: int = 3) -> tuple[Array, ...]:
        """``(d/dF log p, ..., d^order/dF^order log p)``, each ``[N]`` (``1 <= order <= 4``)."""
        if not 1 <= int(order) <= 4:
            raise InputError(f"order must be in 1..4, got {order}")
        F = check_latent(F, "F", 1)
        return self._log_prob_derivatives(self._targets(y, F.shape[0]), F, int(order))[1:]

    def log_prob_evaluator(self, y: Array, order: int) -> Callable[[Array], tuple[Array, ...]]:
        """``F -> (log p, d/dF log p, ..., d^order/dF^order log p)`` for fixed targets ``y [N]``.

        The targets are checked once; ``F`` is ``[N]`` or ``[N, ...]`` (e.g. ``[N, R]``: ``R``
        chains or nodes per point) and every output has its shape. For loops that evaluate the
        same data at many latent values (MCMC, Newton steps, Taylor expansions).
        """
        if not 0 <= int(order) <= 4:
            raise InputError(f"order must be in 0..4, got {order}")
        arr = np.asarray(y)
        targets = self._targets(arr, arr.shape[0] if arr.ndim else -1)
        order = int(order)

        def evaluate(F: Array) -> tuple[Array, ...]:
            F = np.asarray(F, dtype=float)
            if F.shape[:1] != targets.shape:
                raise InputError(f"F must have {targets.shape[0]} rows, got shape {F.shape}")
            Y = targets.reshape(targets.shape + (1,) * (F.ndim - 1))
            return self._log_prob_derivatives(Y, F, order)

        return evaluate

    def tilted(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> TiltedMoments:
        """``log Z``, ``d log Z/d mean``, ``d log Z/d var`` of ``p(y|f)^power N(f|mean,var)``."""
        mean, var = check_mean_var(mean, var, 1)
        return self._tilted(self._targets(y, mean.shape[0]), mean, var, check_power(power))

    def expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        """``E_{N(f|mean,var)}[log p(y|f)]`` with its ``mean`` and ``var`` derivatives, ``[N]``."""
        mean, var = check_mean_var(mean, var, 1)
        return self._expected_log_prob(self._targets(y, mean.shape[0]), mean, var)

    def variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None = None
    ) -> ExpectedLogProb:
        """``expected_log_prob`` by the ``expectation`` rule of this likelihood, ``[N]`` each.

        ``mean``, ``var`` may be backend arrays (torch tensors, ``gpinfer.backend``) when the rule
        supports them; ``y`` then host labels or backend int labels (``Backend.as_index``)."""
        mean, var = check_mean_var(mean, var, 1)
        require_rule_backend(self, mean, None)
        targets = self._targets(y, mean.shape[0])
        targets = ops.like(mean, targets)
        return self._variational_expectations(targets, mean, var, rng)

    def predict_proba(self, mean: Array, var: Array) -> Array:
        """Class probabilities ``[N, C]`` under ``f ~ N(mean, var)``; rows sum to one."""
        mean, var = check_mean_var(mean, var, 1)
        return self._predict_proba(mean, var)

    def log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        """``log p(y_n|data) = log int p(y_n|f) N(f|mean_n, var_n) df``, ``[N]``, tail-accurate."""
        mean, var = check_mean_var(mean, var, 1)
        return self._log_predictive(self._targets(y, mean.shape[0]), mean, var)
