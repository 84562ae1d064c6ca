"""The shared method battery on the label-regression plugin (what a plugin's own test file holds;
docs/plugins.md shows it whole and tests/test_example_plugin.py runs it)."""

from gpinfer_labelreg.method import LabelRegression, label_regression_evidence

from gpinfer.kernels import RBF
from gpinfer.testing import MethodTestSuite


class TestLabelRegression(MethodTestSuite):
    method_name = "labelreg"
    method_cls = LabelRegression  # the class itself: the suite runs before it is registered

    def objective_and_gradient(self, X, y):
        """The objective as a function of the kernel's unconstrained (log) parameters theta [P]:
        (value(theta) -> float, gradient(theta) -> [P], theta0 [P]) on X [N, D], y [N]."""
        kernel = RBF(lengthscale=[0.8, 1.3], variance=2.0)  # ARD: P = D + 1 = 3 parameters
        t = 2.0 * y - 1.0  # class indices 0/1 -> labels -1/+1, as fit does
        noise = LabelRegression.option_spec["noise"].default

        def value(theta):
            kernel.set_unconstrained(theta)
            return label_regression_evidence(kernel, X, t, noise)[0]

        def gradient(theta):
            kernel.set_unconstrained(theta)
            grads = label_regression_evidence(kernel, X, t, noise)[1]  # dL/dK [N, N]
            return kernel.grad_params(X, None, grads.Kff)  # the kernel's VJP: dL/dtheta [P]

        return value, gradient, kernel.get_unconstrained()
