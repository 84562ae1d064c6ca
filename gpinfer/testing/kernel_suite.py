"""The battery every kernel passes: subclass ``KernelTestSuite``, set ``kernel`` and ``reference``.

Example::

    from gpinfer.testing import KernelTestSuite

    class TestMyKernel(KernelTestSuite):
        kernel = MyKernel(lengthscale=0.8)
        reference = staticmethod(my_naive_double_loop)   # (X [N, D], X2 [N2, D] or None) -> K

Checks on fixed-seed inputs (``N = 7`` and ``N2 = 5`` points in ``D = 3`` dimensions): values
against the naive ``reference`` (square and cross), symmetry, ``K_diag`` against the diagonal,
shapes, every vector-Jacobian product against finite differences (``grad_params``,
``grad_params_diag``, ``grad_inputs``, ``grad_inputs_diag``, and ``vjp`` equal to the separate
products), the unconstrained round trip, copies independent of the original, scikit-learn's
``get_params`` / ``clone`` / ``set_params``, pickling.
Subclasses are recorded in ``KERNEL_SUITES`` (by kernel class name) so that a completeness test
can fail when a registered kernel has none.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pytest

from gpinfer.kernels.base import Kernel
from gpinfer.testing.gradcheck import assert_gradient_close

Array = np.ndarray

__all__ = ["KERNEL_SUITES", "KernelTestSuite"]

#: class names of the kernels that have a ``KernelTestSuite`` subclass
KERNEL_SUITES: set[str] = set()

_N, _N2, _D = 7, 5, 3


class KernelTestSuite:
    """Reusable tests for one kernel object.

    * ``kernel``: the kernel under test (required; the tests work on copies).
    * ``reference``: a naive ``(X, X2) -> K`` at the kernel's parameters (``X2=None``: square),
      or ``None`` to skip the value check (then say why in the subclass).
    * ``rtol``: tolerance of the value check; ``grad_rtol``: of the finite-difference checks.
    """

    kernel: ClassVar[Kernel | None] = None
    reference: ClassVar[Callable[[Array, Array | None], Array] | None] = None
    rtol: ClassVar[float] = 1e-10
    grad_rtol: ClassVar[float] = 1e-5

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kernel is not None:
            KERNEL_SUITES.add(type(cls.kernel).__name__)

    def _kernel(self) -> Kernel:
        if self.kernel is None:
            pytest.skip("KernelTestSuite without a kernel")
        return self.kernel.copy()

    @staticmethod
    def _data() -> tuple[Array, Array, Array, Array, Array]:
        """``X [N, D]``, ``X2 [N2, D]``, a non-symmetric ``dK [N, N]`` (both triangles count),
        ``dK_cross [N, N2]``, ``dK_diag [N]``."""
        rng = np.random.default_rng(42)
        return (rng.normal(size=(_N, _D)), rng.normal(size=(_N2, _D)),
                rng.normal(size=(_N, _N)), rng.normal(size=(_N, _N2)), rng.normal(size=_N))

    # -- values --------------------------------------------------------------------------------
    def test_values_against_the_naive_reference(self):
        k = self._kernel()
        if self.reference is None:
            pytest.skip("no naive reference given")
        X, X2, *_ = self._data()
        ref = type(self).reference
        np.testing.assert_allclose(k.K(X), ref(X, None), rtol=self.rtol, atol=1e-12)
        np.testing.assert_allclose(k.K(X, X2), ref(X, X2), rtol=self.rtol, atol=1e-12)

    def test_shapes_symmetry_and_diagonal(self):
        k = self._kernel()
        X, X2, *_ = self._data()
        K = k.K(X)
        assert K.shape == (_N, _N) and k.K(X, X2).shape == (_N, _N2)
        np.testing.assert_allclose(K, K.T, rtol=0, atol=1e-12)
        np.testing.assert_allclose(k.K_diag(X), np.diag(K), rtol=1e-12, atol=1e-14)
        assert np.min(np.linalg.eigvalsh(0.5 * (K + K.T))) > -1e-10 * max(1.0, np.max(np.diag(K)))
        theta = k.get_unconstrained()
        assert theta.shape == (k.n_params,) and len(k.param_names) == k.n_params

    # -- vector-Jacobian products ----------------------------------------------------------------
    def _params_fd(self, k: Kernel, matrix: Callable[[Kernel], Array], grad: Array,
                   what: str) -> None:
        probe = k.copy()

        def f(theta: Array) -> float:
            probe.set_unconstrained(theta)
            return float(np.sum(matrix(probe)))

        assert grad.shape == (k.n_params,)
        assert_gradient_close(f, grad, k.get_unconstrained(), rtol=self.grad_rtol,
                              name=f"{type(k).__name__} {what}")

    def test_grad_params_by_finite_differences(self):
        k = self._kernel()
        X, X2, dK, dKc, dKd = self._data()
        self._params_fd(k, lambda kk: dK * kk.K(X), k.grad_params(X, None, dK), "grad_params")
        self._params_fd(k, lambda kk: dKc * kk.K(X, X2), k.grad_params(X, X2, dKc),
                        "grad_params (cross)")
        self._params_fd(k, lambda kk: dKd * kk.K_diag(X), k.grad_params_diag(X, dKd),
                        "grad_params_diag")

    def test_grad_inputs_by_finite_differences(self):
        k = self._kernel()
        X, X2, dK, dKc, dKd = self._data()
        for what, grad, f in (
            ("grad_inputs", k.grad_inputs(X, None, dK),
             lambda x: float(np.sum(dK * k.K(x.reshape(X.shape))))),
            ("grad_inputs (cross)", k.grad_inputs(X, X2, dKc),
             lambda x: float(np.sum(dKc * k.K(x.reshape(X.shape), X2)))),
            ("grad_inputs_diag", k.grad_inputs_diag(X, dKd),
             lambda x: float(np.sum(dKd * k.K_diag(x.reshape(X.shape))))),
        ):
            assert np.shape(grad) == X.shape
            assert_gradient_close(f, np.ravel(grad), X.ravel(), rtol=self.grad_rtol,
                                  name=f"{type(k).__name__} {what}")

    def test_vjp_equals_the_two_separate_products(self):
        k = self._kernel()
        X, X2, dK, dKc, _ = self._data()
        for X_2, G in ((None, dK), (X2, dKc)):
            g_params, g_inputs = k.vjp(X, X_2, G)
            np.testing.assert_allclose(g_params, k.grad_params(X, X_2, G), rtol=1e-10,
                                       atol=1e-12)
            np.testing.assert_allclose(g_inputs, k.grad_inputs(X, X_2, G), rtol=1e-10,
                                       atol=1e-12)
            assert k.vjp(X, X_2, G, inputs=False)[1] is None

    # -- parameters, copies, pickling --------------------------------------------------------------
    def test_unconstrained_round_trip(self):
        k = self._kernel()
        X, *_ = self._data()
        theta = k.get_unconstrained()
        other = k.copy()
        other.set_unconstrained(theta + 0.3)
        np.testing.assert_allclose(other.get_unconstrained(), theta + 0.3, rtol=1e-12)
        other.set_unconstrained(theta)
        np.testing.assert_allclose(other.K(X), k.K(X), rtol=1e-12, atol=1e-14)

    def test_copies_are_independent(self):
        k = self._kernel()
        X, *_ = self._data()
        before = k.K(X)
        twin = k.copy()
        twin.set_unconstrained(twin.get_unconstrained() + 0.5)
        np.testing.assert_array_equal(k.K(X), before)

    def test_scikit_learn_parameters(self):
        """``get_params`` / ``clone`` / ``set_params`` (``gpinfer.kernels.base``): a clone is an
        equal kernel with the same matrix, before and after the parameters move; setting the
        parameters ``get_params`` gives changes nothing; the repr names the class."""
        from sklearn.base import clone

        k = self._kernel()
        X, *_ = self._data()
        for _ in range(2):
            twin = clone(k)
            assert twin is not k and twin == k
            np.testing.assert_allclose(twin.K(X), k.K(X), rtol=1e-12, atol=1e-14)
            k.set_unconstrained(k.get_unconstrained() + 0.25)  # now learned values
        before = k.K(X)
        k.set_params(**k.get_params(deep=False))
        np.testing.assert_allclose(k.K(X), before, rtol=1e-12, atol=1e-14)
        assert repr(k).startswith(f"{type(k).__name__}(") and "object at" not in repr(k)

    def test_pickles(self):
        k = self._kernel()
        X, X2, *_ = self._data()
        k.K(X, X2)  # fill any memo first: what is pickled must not depend on it
        back = pickle.loads(pickle.dumps(k))
        assert type(back) is type(k)
        np.testing.assert_array_equal(back.K(X, X2), k.K(X, X2))
        np.testing.assert_array_equal(back.get_unconstrained(), k.get_unconstrained())
