"""Shared fixtures for the binary-family tests: toy data and value/gradient closures."""

from __future__ import annotations

import numpy as np

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels import RBF
from gpinfer.likelihoods.bernoulli import BernoulliLogit, BernoulliProbit

LIKELIHOODS = {"logit": BernoulliLogit, "probit": BernoulliProbit}
TOY_X = np.array([[np.sqrt(2.0)], [-np.sqrt(2.0)]])
TOY_Y = np.array([1, 0])


def n10_data():
    """The deterministic n = 10 problem of spec §7.7 (one outlier at x = -1)."""
    X = np.linspace(-3, 3, 10)[:, None]
    y = (X[:, 0] > 0).astype(np.int64)
    y[3] = 1
    return X, y


def se(ln_ell: float, ln_sf: float) -> RBF:
    return RBF(lengthscale=np.exp(ln_ell), variance=np.exp(2 * ln_sf))


def value_and_gradient(method, kernel, X, y, lik):
    """``(value(theta), gradient(theta), theta0)`` of ``method.solve`` over kernel log-params.

    The value is re-solved warm-started from the unperturbed solution (spec §7.8).
    """
    hp = HyperParameters(kernel)
    theta0 = hp.pack()
    warm = method.solve(kernel.K(X), y, lik, None).warm

    def value(theta):
        hp.unpack(theta)
        return method.solve(kernel.K(X), y, lik, warm).log_evidence

    def gradient(theta):
        hp.unpack(theta)
        sol = method.solve(kernel.K(X), y, lik, warm)
        return parameter_gradient(hp, X, MatrixGradients(Kff=sol.gradient()))

    return value, gradient, theta0
