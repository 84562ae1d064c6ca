"""Test helpers shipped with gpinfer: the finite-difference checker and the method test suite."""

from gpinfer.testing.gradcheck import assert_gradient_close, numerical_gradient, relative_error

__all__ = ["assert_gradient_close", "numerical_gradient", "relative_error"]
