"""Bernoulli likelihoods ``p(y | f) = sig(s f)`` with sign ``s = 2y - 1`` (labels 0/1).

Spec binary §1.2-1.3 and binary §1.6; power-ep §2.5. Write ``t = s f`` and ``psi(t) = log sig(t)``.

* ``BernoulliProbit`` (``sig = Phi``): closed-form tilted moments at power one
  (``z = s mean / sqrt(1 + var)``: ``log Z = log Phi(z)``), the 1-D engine for power != 1,
  closed-form predictive ``Phi(mean / sqrt(1 + var))``.
* ``BernoulliLogit`` (``sig = logistic``): everything through the 1-D engine of
  ``gpinfer.numerics.quadrature`` (analytic tails + composite Gauss-Legendre, log space).

Both provide ``log_prob_derivatives`` (Laplace), ``tilted_and_d2`` / ``tilted_d2`` (EP/TAP: the
second mean-derivative of ``log Z`` from the cancellation-free Stein form) and
``expected_log_prob_derivatives`` (``E_k = E[d^k/df^k log p]``, ``k <= 4``, KL's Newton step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import log_ndtr

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.interfaces import EVERY_BACKEND, ExpectedLogProb, Likelihood, TiltedMoments
from gpinfer.likelihoods.base import (
    ScalarLikelihood,
    check_labels,
    check_mean_var,
    check_power,
)
from gpinfer.numerics import settings
from gpinfer.numerics.normal import inv_mills, log_Phi_derivatives, probit_curvature
from gpinfer.numerics.quadrature import (
    LogSigmoid,
    gauss_hermite,
    sigmoid_expectations,
    sigmoid_tilted,
)

Array = Any


# --------------------------------------------------------------------------------------------
# The two log-sigmoids
# --------------------------------------------------------------------------------------------


class LogisticLink(LogSigmoid):
    """``psi(t) = log sigma(t) = -log(1 + exp(-t))``; table of spec binary §1.2."""

    right_cut = settings.LOGISTIC_TAIL_CUT
    left_linear_cut = settings.LOGISTIC_TAIL_CUT

    def derivatives(self, t: Array, order: int) -> tuple[Array, ...]:
        """Any array-API namespace (host values become float64 numpy arrays)."""
        t = ops.as_array(t)
        xp = ops.namespace(t)
        # one exponential: e = exp(-|t|), r = 1/(1+e); psi = min(t, 0) - log1p(e) (no
        # overflow), sigma(-t) = e r (t >= 0) or r (t < 0), p (1 - p) = e r^2 for both signs
        e = xp.exp(-xp.abs(t))
        r = 1.0 / (1.0 + e)
        out: list[Array] = [xp.minimum(t, 0.0) - xp.log1p(e)]
        pos = t >= 0
        if order >= 1:
            out.append(xp.where(pos, e * r, r))
        if order >= 2:
            pq = e * r * r
            out.append(-pq)
            if order >= 3:
                p = xp.where(pos, r, e * r)
                out.append(-pq * (1.0 - 2.0 * p))
            if order >= 4:
                out.append(-pq * (1.0 - 6.0 * pq))
        return tuple(out)


class ProbitLink(LogSigmoid):
    """``psi(t) = log Phi(t)`` (derivatives from ``gpinfer.numerics.normal``)."""

    right_cut = settings.PROBIT_TAIL_CUT
    left_linear_cut = None

    def derivatives(self, t: Array, order: int) -> tuple[Array, ...]:
        return log_Phi_derivatives(t, order)


LOGISTIC = LogisticLink()
PROBIT = ProbitLink()


# --------------------------------------------------------------------------------------------
# Shared Bernoulli machinery
# --------------------------------------------------------------------------------------------


class Bernoulli(ScalarLikelihood):
    """``p(y|f) = sig((2y - 1) f)``; tilted/expected quantities through ``link`` and the engine.

    A third party's binary likelihood of this form subclasses ``Bernoulli`` with its own
    ``LogSigmoid`` as ``link`` and gets every capability below (Laplace, EP/TAP, KL, the Taylor
    sites of vi-taylor, mcmc-ais, svi).

    ``expectation`` (the rule of ``variational_expectations``, svi's ELBO): ``"gauss_hermite"``
    (default; ``quadrature_points`` fixed nodes, absolute accuracy, derivatives of the discretised
    value) or ``"adaptive"`` (the 1-D engine of ``expected_log_prob``, tail-accurate).
    """

    link: LogSigmoid
    n_classes = 2
    capabilities = frozenset({"log_prob_derivatives", "log_concave", "log_sigmoid", "tilted_d2",
                              "expected_log_prob_derivatives"})
    expectation_rules = ("gauss_hermite", "adaptive")
    #: Gauss-Hermite on any array API; ``adaptive`` is the 1-D engine's (numpy only)
    expectation_backends = {"gauss_hermite": EVERY_BACKEND}
    expectation_settings = ("quadrature_points",)
    quadrature_points: int = settings.VARIATIONAL_GAUSS_HERMITE_POINTS

    def __init__(self, expectation: str = "gauss_hermite",
                 quadrature_points: int = settings.VARIATIONAL_GAUSS_HERMITE_POINTS):
        self.set_expectation(expectation, quadrature_points=quadrature_points)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(expectation={self.expectation!r}, "
                f"quadrature_points={self.quadrature_points})")

    def _variational_expectations(
        self, y: Array, mean: Array, var: Array, rng: np.random.Generator | None
    ) -> ExpectedLogProb:
        if self.expectation == "adaptive":
            return self._expected_log_prob(y, mean, var)
        return self._gauss_hermite_expectation(y, mean, var, self.quadrature_points)

    def _gauss_hermite_expectation(
        self, y: Array, mean: Array, var: Array, n_nodes: int
    ) -> ExpectedLogProb:
        """``E[log sig(s f)]`` by ``n_nodes``-point Gauss-Hermite for signs ``y = s [N]``.

        ``dE/dmean = E[l']``, ``dE/dvar = E[l'']/2`` with the same nodes (Bonnet/Price), so the
        derivatives are exact for the discretised value (spec jj-taylor-svi §3.2). Any
        array-API namespace (``y``: signs as floats of ``mean``'s namespace).
        """
        xp = ops.namespace(mean)
        x, w = (ops.like(mean, v) for v in gauss_hermite(int(n_nodes)))
        f = mean[:, None] + xp.sqrt(var)[:, None] * x  # [N, K]
        psi, d1, d2 = self.link.derivatives(y[:, None] * f, 2)
        return ExpectedLogProb(psi @ w, y * (d1 @ w), 0.5 * (d2 @ w))

    def _targets(self, y: Array, n: int) -> Array:
        return 2.0 * check_labels(y, 2, n) - 1.0

    def _log_prob_derivatives(self, y: Array, F: Array, order: int) -> tuple[Array, ...]:
        derivs = self.link.derivatives(y * F, order)
        return tuple(d * y**k for k, d in enumerate(derivs))

    def _engine_tilted(
        self, y: Array, mean: Array, var: Array, power: float
    ) -> tuple[TiltedMoments, Array]:
        out = sigmoid_tilted(self.link, y * mean, var, power)
        return TiltedMoments(out.log_z, y * out.d1, 0.5 * (out.d2 + out.d1**2)), out.d2

    def _tilted_and_d2(
        self, y: Array, mean: Array, var: Array, power: float
    ) -> tuple[TiltedMoments, Array]:
        return self._engine_tilted(y, mean, var, power)

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        return self._tilted_and_d2(y, mean, var, power)[0]

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        E0, E1, E2 = sigmoid_expectations(self.link, y * mean, var, 2)
        return ExpectedLogProb(E0, y * E1, 0.5 * E2)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        ones = np.ones_like(mean)
        log_p = np.stack(
            [self._tilted(-ones, mean, var, 1.0).log_z, self._tilted(ones, mean, var, 1.0).log_z],
            axis=1,
        )
        P = np.exp(log_p)
        return P / P.sum(axis=1, keepdims=True)

    # -- extras used by Laplace, EP/TAP and KL ------------------------------------------------
    def tilted_and_d2(
        self, y: Array, mean: Array, var: Array, power: float = 1.0
    ) -> tuple[TiltedMoments, Array]:
        """``tilted(...)`` and ``d2 = d^2 log Z / d mean^2`` ``[N]`` (Stein form, no cancellation).

        Tilted mean ``mean + var * dlogz_dmean``, tilted variance ``var + var^2 * d2``.
        """
        mean, var = check_mean_var(mean, var, 1)
        return self._tilted_and_d2(self._targets(y, mean.shape[0]), mean, var, check_power(power))

    def tilted_d2(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> Array:
        """``d^2 log Z / d mean^2``, ``[N]`` (see ``tilted_and_d2``)."""
        return self.tilted_and_d2(y, mean, var, power)[1]

    def expected_log_prob_derivatives(
        self, y: Array, mean: Array, var: Array, order: int = 4
    ) -> tuple[Array, ...]:
        """``(E_0, ..., E_order)``, ``E_k = E_{N(f|mean,var)}[d^k/df^k log p(y|f)]``, each ``[N]``.

        For ``a(mean, var) = E_0``: ``da/dmean = E_1``, ``da/dvar = E_2/2``, ``d2a/dmean2 = E_2``,
        ``d2a/dmean dvar = E_3/2``, ``d2a/dvar2 = E_4/4`` (spec binary §1.2).
        """
        if not 0 <= int(order) <= 4:
            raise ValueError(f"order must be in 0..4, got {order}")
        mean, var = check_mean_var(mean, var, 1)
        y = self._targets(y, mean.shape[0])
        E = sigmoid_expectations(self.link, y * mean, var, int(order))
        return tuple(e * y**k for k, e in enumerate(E))


def as_bernoulli(likelihood: Likelihood, owner: str) -> Bernoulli:
    """``likelihood`` itself when it is a ``Bernoulli`` (logit, probit or a third party's
    subclass: the capabilities ``tilted_d2``, ``log_sigmoid``, ...), else an ``InputError``
    naming ``owner``."""
    if not isinstance(likelihood, Bernoulli):
        raise InputError(f"{owner} needs a Bernoulli likelihood p(y|f) = sig(s f) (probit, logit "
                         f"or a Bernoulli subclass); got {type(likelihood).__name__}")
    return likelihood


class BernoulliLogit(Bernoulli):
    """Logistic Bernoulli likelihood ``p(y|f) = sigma((2y-1) f)``; no parameters.

    Tilted moments (any power), expectations and predictions use the 1-D engine (spec binary
    §1.3; relative accuracy ~1e-10 or better for ``|mean| <= 1e3``, ``1e-6 <= var <= 1e5``).
    """

    name = "logit"
    link = LOGISTIC
    capabilities = Bernoulli.capabilities | {"jaakkola_jordan"}

    def _gauss_hermite_expectation(
        self, y: Array, mean: Array, var: Array, n_nodes: int
    ) -> ExpectedLogProb:
        """The Gauss-Hermite rule with two transcendentals per node: ``l = log sig(t)``,
        ``l' = sig(-t)``, ``l'' = -sig(t) sig(-t)`` at ``t = s f`` from one ``expit`` and one
        ``log_expit`` (the same nodes and values as the generic rule). Any array-API namespace.
        """
        xp = ops.namespace(mean)
        x, w = (ops.like(mean, v) for v in gauss_hermite(int(n_nodes)))
        t = y[:, None] * mean[:, None] + (y[:, None] * xp.sqrt(var)[:, None]) * x  # [N, K]
        q = ops.expit(-t)
        E = ops.log_expit(t) @ w
        d1 = q @ w
        q *= 1.0 - q  # sig(-t) sig(t)
        return ExpectedLogProb(E, y * d1, -0.5 * (q @ w))


class BernoulliProbit(Bernoulli):
    """Probit Bernoulli likelihood ``p(y|f) = Phi((2y-1) f)``; no parameters.

    Power one: closed forms (spec binary §1.2, power-ep §2.5). Other powers: the 1-D engine
    around the tilted mode. Expectations: the engine (``E_k``).
    """

    name = "probit"
    link = PROBIT
    capabilities = Bernoulli.capabilities | {"closed_form_tilted_power_one"}

    def _tilted_and_d2(
        self, y: Array, mean: Array, var: Array, power: float
    ) -> tuple[TiltedMoments, Array]:
        if power != 1.0:
            return self._engine_tilted(y, mean, var, power)
        scale = np.sqrt(1.0 + var)
        z = y * mean / scale
        r = inv_mills(z)
        moments = TiltedMoments(log_ndtr(z), y * r / scale, -0.5 * z * r / (1.0 + var))
        return moments, -probit_curvature(z) / (1.0 + var)

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        z = mean / np.sqrt(1.0 + var)
        return np.stack([np.exp(log_ndtr(-z)), np.exp(log_ndtr(z))], axis=1)
