"""Gaussian regression likelihood ``p(y | f) = N(y | f, sigma^2)`` (spec power-ep §2.5, §3).

Everything is closed form. The single parameter is ``log sigma^2`` (unconstrained).
"""

from __future__ import annotations

import math

import numpy as np

from gpinfer.errors import InputError
from gpinfer.interfaces import ExpectedLogProb, TiltedMoments
from gpinfer.likelihoods.base import (
    ScalarLikelihood,
    check_latent,
    check_mean_var,
    check_power,
)

Array = np.ndarray

_LOG_2PI = math.log(2.0 * math.pi)


class Gaussian(ScalarLikelihood):
    """``p(y | f) = N(y | f, variance)``; ``task = "regression"``, targets are real ``[N]``.

    Parameter (unconstrained): ``log_variance``. Power-EP tilted moments for any power ``a``
    (spec power-ep §2.5, the form that stays accurate as ``a -> 0``), with
    ``D = a var + variance``:
    ``log Z = (1-a)/2 log(2 pi variance) - 1/2 log(2 pi D) - a (y - mean)^2 / (2 D)``.
    """

    name = "gaussian"
    task = "regression"
    capabilities = frozenset({"log_prob_derivatives", "log_concave"})
    n_classes = None

    def __init__(self, variance: float = 1.0):
        variance = float(variance)
        if not (np.isfinite(variance) and variance > 0):
            raise InputError(
                f"Gaussian noise variance must be positive and finite, got {variance!r}"
            )
        self.variance = variance

    def __repr__(self) -> str:
        return f"Gaussian(variance={self.variance:.6g})"

    # -- parameters --------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return ["log_variance"]

    def get_unconstrained(self) -> Array:
        return np.array([math.log(self.variance)])

    def set_unconstrained(self, theta: Array) -> None:
        theta = np.asarray(theta, dtype=float).reshape(-1)
        if theta.shape != (1,) or not np.isfinite(theta[0]):
            raise InputError(f"Gaussian expects one finite unconstrained parameter, got {theta}")
        self.variance = float(np.exp(theta[0]))

    # -- hooks -------------------------------------------------------------------------------
    def _targets(self, y: Array, n: int) -> Array:
        y = check_latent(y, "y", 1)
        if y.shape[0] != n:
            raise InputError(f"y must have shape [{n}] to match the latent values, got {y.shape}")
        return y

    def _log_prob_derivatives(self, y: Array, F: Array, order: int) -> tuple[Array, ...]:
        resid = y - F
        out: list[Array] = [
            -0.5 * (_LOG_2PI + math.log(self.variance)) - 0.5 * resid**2 / self.variance
        ]
        if order >= 1:
            out.append(resid / self.variance)
        if order >= 2:
            out.append(np.full_like(resid, -1.0 / self.variance))
        out.extend(np.zeros_like(resid) for _ in range(3, order + 1))
        return tuple(out)

    def _tilted(self, y: Array, mean: Array, var: Array, power: float) -> TiltedMoments:
        s2, a = self.variance, power
        D = a * var + s2
        resid = y - mean
        log_z = (
            0.5 * (1.0 - a) * (_LOG_2PI + math.log(s2))
            - 0.5 * (_LOG_2PI + np.log(D))
            - 0.5 * a * resid**2 / D
        )
        d1 = a * resid / D
        dvar = -0.5 * a / D + 0.5 * (a * resid / D) ** 2
        return TiltedMoments(log_z, d1, dvar)

    def _expected_log_prob(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        s2 = self.variance
        resid = y - mean
        value = -0.5 * (_LOG_2PI + math.log(s2)) - 0.5 * (resid**2 + var) / s2
        return ExpectedLogProb(value, resid / s2, np.full_like(resid, -0.5 / s2))

    def _predict_proba(self, mean: Array, var: Array) -> Array:
        raise InputError(
            "the Gaussian likelihood is for regression: it has no class probabilities; "
            "use predict_mean_var(mean, var) or log_predictive(y, mean, var)"
        )

    def _log_predictive(self, y: Array, mean: Array, var: Array) -> Array:
        D = var + self.variance
        return -0.5 * (_LOG_2PI + np.log(D)) - 0.5 * (y - mean) ** 2 / D

    # -- regression extras -------------------------------------------------------------------
    def predict_mean_var(self, mean: Array, var: Array) -> tuple[Array, Array]:
        """Predictive mean and variance of ``y``: ``(mean, var + variance)``, ``[N]`` each."""
        mean, var = check_mean_var(mean, var, 1)
        return mean, var + self.variance

    def tilted_grad_params(self, y: Array, mean: Array, var: Array, power: float = 1.0) -> Array:
        """``d log Z / d log variance`` of ``tilted(y, mean, var, power)``, ``[N, 1]``.

        ``d log Z / d variance = (1-a)/(2 variance) - 1/(2 D) + a (y - mean)^2 / (2 D^2)``.
        """
        mean, var = check_mean_var(mean, var, 1)
        y = self._targets(y, mean.shape[0])
        a, s2 = check_power(power), self.variance
        D = a * var + s2
        grad = 0.5 * (1.0 - a) / s2 - 0.5 / D + 0.5 * a * (y - mean) ** 2 / D**2
        return (s2 * grad)[:, None]

    def expected_log_prob_grad_params(self, y: Array, mean: Array, var: Array) -> Array:
        """``d/d log variance`` of ``expected_log_prob(y, mean, var).value``, ``[N, 1]``."""
        mean, var = check_mean_var(mean, var, 1)
        y = self._targets(y, mean.shape[0])
        return (-0.5 + 0.5 * ((y - mean) ** 2 + var) / self.variance)[:, None]
