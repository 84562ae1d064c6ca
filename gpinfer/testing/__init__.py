"""Test helpers shipped with gpinfer: the finite-difference checker and the method test suite."""

from gpinfer.testing.gradcheck import assert_gradient_close, numerical_gradient, relative_error
from gpinfer.testing.method_suite import SUITES, MethodTestSuite

__all__ = [
    "SUITES",
    "MethodTestSuite",
    "assert_gradient_close",
    "numerical_gradient",
    "relative_error",
]
