"""``KernelTestSuite`` on every registered kernel (isotropic and ARD where it has lengthscales,
and a composite), with the naive references of ``tests/kernels/reference.py``; and the
completeness check: every kernel registered in ``gpinfer.kernels`` has a battery."""

from __future__ import annotations

from gpinfer.kernels import RBF, Linear, Matern32, Matern52, White
from gpinfer.testing import KERNEL_SUITES, KernelTestSuite, missing_batteries

from . import reference


class TestRBF(KernelTestSuite):
    kernel = RBF(lengthscale=0.8, variance=1.3)
    reference = staticmethod(lambda X, X2: reference.rbf(X, X2, 0.8, 1.3))


class TestRBFARD(KernelTestSuite):
    kernel = RBF(lengthscale=[0.7, 1.2, 2.0], variance=0.9)
    reference = staticmethod(lambda X, X2: reference.rbf(X, X2, [0.7, 1.2, 2.0], 0.9))


class TestMatern32(KernelTestSuite):
    kernel = Matern32(lengthscale=[0.6, 1.5, 0.9], variance=1.4)
    reference = staticmethod(lambda X, X2: reference.matern32(X, X2, [0.6, 1.5, 0.9], 1.4))


class TestMatern52(KernelTestSuite):
    kernel = Matern52(lengthscale=0.9, variance=1.2)
    reference = staticmethod(lambda X, X2: reference.matern52(X, X2, 0.9, 1.2))


class TestLinear(KernelTestSuite):
    kernel = Linear(variance=[0.5, 1.5, 2.0])
    reference = staticmethod(lambda X, X2: reference.linear(X, X2, [0.5, 1.5, 2.0]))


class TestWhite(KernelTestSuite):
    kernel = White(variance=0.3)
    reference = staticmethod(lambda X, X2: reference.white(X, X2, 0.3))


class TestComposite(KernelTestSuite):
    """Sums and products: the chain rule of ``gpinfer.kernels.combination``."""

    kernel = RBF([0.9, 1.1, 1.4], 1.2) * Linear(0.6) + White(0.1)
    reference = staticmethod(lambda X, X2: reference.rbf(X, X2, [0.9, 1.1, 1.4], 1.2)
                             * reference.linear(X, X2, 0.6) + reference.white(X, X2, 0.1))


def test_every_registered_kernel_has_a_battery():
    missing = missing_batteries("gpinfer.kernels", KERNEL_SUITES)
    assert not missing, f"kernels without a KernelTestSuite: {missing}"
