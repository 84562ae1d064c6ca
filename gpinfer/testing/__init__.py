"""Test helpers shipped with gpinfer: the finite-difference checker and the batteries for
methods, likelihoods and kernels (subclass them in a plugin's tests)."""

from gpinfer.testing.completeness import missing_batteries
from gpinfer.testing.gradcheck import assert_gradient_close, numerical_gradient, relative_error
from gpinfer.testing.kernel_suite import KERNEL_SUITES, KernelTestSuite
from gpinfer.testing.likelihood_suite import LIKELIHOOD_SUITES, LikelihoodTestSuite
from gpinfer.testing.method_suite import SUITES, MethodTestSuite

__all__ = [
    "KERNEL_SUITES",
    "LIKELIHOOD_SUITES",
    "SUITES",
    "KernelTestSuite",
    "LikelihoodTestSuite",
    "MethodTestSuite",
    "assert_gradient_close",
    "missing_batteries",
    "numerical_gradient",
    "relative_error",
]
