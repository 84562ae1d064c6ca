"""The plugin of docs/example_plugin runs the shared method battery, so the guide stays true."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from gpinfer.kernels import RBF
from gpinfer.testing import MethodTestSuite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "example_plugin"))
from gpinfer_labelreg import LabelRegression, label_regression_evidence  # noqa: E402


class TestExampleLabelRegression(MethodTestSuite):
    method_name = "labelreg-example"
    method_cls = LabelRegression

    def objective_and_gradient(self, X, y):
        kernel = RBF(lengthscale=[0.8, 1.3], variance=2.0)
        t = 2.0 * y - 1.0

        def value(theta):
            kernel.set_unconstrained(theta)
            return label_regression_evidence(kernel, X, t, 0.5)[0]

        def gradient(theta):
            kernel.set_unconstrained(theta)
            grads = label_regression_evidence(kernel, X, t, 0.5)[1]
            return kernel.grad_params(X, None, grads.Kff)

        return value, gradient, kernel.get_unconstrained()


def test_example_evidence_equals_dense_gaussian_log_density():
    """Oracle: the evidence is the log density of N(0, K + noise I), computed directly."""
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(3)
    X = rng.standard_normal((12, 2))
    t = np.where(rng.random(12) < 0.5, -1.0, 1.0)
    kernel = RBF(lengthscale=1.1, variance=1.7)
    value = label_regression_evidence(kernel, X, t, 0.3)[0]
    expected = multivariate_normal(np.zeros(12), kernel.K(X) + 0.3 * np.eye(12)).logpdf(t)
    assert abs(value - expected) < 1e-9
