"""IVM's numerical failures are ``NumericalError``s naming the matrix (issue 23 item 3): its
factorisations and solves go through ``gpinfer.numerics.cholesky`` (before, a singular marginal
escaped the fit as numpy's ``LinAlgError``, a non-finite liquid mean as scipy's ``ValueError``
and a failed ``potrf`` in the projection as a ``LinAlgError``)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_ivm.inference import IVMSettings, run_inference
from gpinfer_ivm.liquid import EPRepresentation
from gpinfer_ivm.projection import _local
from gpinfer_ivm.solid import SolidRepresentation
from ivm_test_data import three_blobs

from gpinfer.errors import NumericalError
from gpinfer.kernels.stationary import RBF

Array = np.ndarray


class VanishingRBF(RBF):
    """``k(x, x') = m(x) m(x') rbf(x, x')`` with ``m(x) = [x_0 > cut]``: a valid (positive
    semi-definite) kernel whose variance is 0 where ``x_0 <= cut``."""

    def __init__(self, cut: float, **kwargs: float):
        super().__init__(**kwargs)
        self.cut = cut

    def _m(self, X: Array) -> Array:
        return (np.asarray(X)[:, 0] > self.cut).astype(float)

    def K(self, X: Array, X2: Array | None = None) -> Array:
        m2 = self._m(X if X2 is None else X2)
        return self._m(X)[:, None] * super().K(X, X2) * m2[None, :]

    def K_diag(self, X: Array) -> Array:
        return self._m(X) * super().K_diag(X)


def test_singular_marginal_in_a_fit_is_a_numerical_error_naming_it():
    """One class's kernel vanishes on a tenth of the inputs: their marginal covariances are
    singular, and the selection score (a KL divergence from the marginal) cannot factorise
    it."""
    X, y, _ = three_blobs(120)
    cut = float(np.quantile(X[:, 0], 0.1))
    kernels = [VanishingRBF(cut, lengthscale=np.sqrt(5.0), variance=2.0)] + [
        RBF(lengthscale=np.sqrt(5.0), variance=2.0) for _ in range(2)]
    s = IVMSettings(d_final=20, L=5, ep_sweeps=2, pool_size=40, n_init=2, gh_order=3)
    with pytest.raises(NumericalError, match="marginal covariance A") as info:
        run_inference(kernels, X, y, np.zeros(3), s, np.random.default_rng(0))
    assert info.value.quantity == "marginal covariance A"


def test_non_finite_liquid_mean_is_a_numerical_error_naming_it():
    rng = np.random.default_rng(7)
    X, C = rng.standard_normal((12, 2)), 3
    kernels = [RBF(lengthscale=1.0, variance=1.0) for _ in range(C)]
    I = rng.permutation(12)[:8]
    pi, b = rng.uniform(0.1, 2.0, (8, C)), rng.standard_normal((8, C))
    solid = SolidRepresentation.from_sites(kernels, X, I[:5], pi[:5], b[:5])
    EPRepresentation(solid, I[5:], pi[5:], b[5:])  # finite: builds
    b[6, 1] = np.inf
    with pytest.raises(NumericalError, match="not finite") as info:
        EPRepresentation(solid, I[5:], pi[5:], b[5:])
    assert info.value.quantity == "b~"


def test_projection_factor_failure_is_a_numerical_error_naming_it():
    """``I + S A S`` of an indefinite ``A``: Newton's LAPACK ``potrf`` fails."""
    A = -4.0 * np.eye(3)
    with pytest.raises(NumericalError, match="not positive definite") as info:
        _local(np.zeros(3), A, np.eye(3))
    assert info.value.quantity == "I + S A S"
