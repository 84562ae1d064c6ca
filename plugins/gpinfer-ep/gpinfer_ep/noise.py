"""Latent white noise that stays off ``Kuu``: the ``noise_in_Kuu = false`` model (spec ep-sep P10).

With the default model the noise ``sigma_0`` is a ``White`` term: on the diagonal of ``Kuu`` and
in ``kappa`` (so in the FITC variances ``s_i``), never in ``Kuf``. ``LatentNoise`` puts it in
``kappa = K_diag`` only, so ``s_i = kappa_i - ||a_i||^2`` carries it while ``Kuu`` and ``Kuf`` do
not; at ``Z = X`` the directions become ``e_i`` and ``s_i = sigma_0`` (oracle O11b).
"""

from __future__ import annotations

from gpinfer.backend import ops
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.checks import input_pair, matrix_gradient
from gpinfer.kernels.combination import Combination
from gpinfer.kernels.white import White


class LatentNoise(White):
    """``K(X) = 0`` and ``K(X, X2) = 0``; ``K_diag(X) = variance`` (noise of each evaluation).

    Not a covariance in the usual sense: only the diagonal ``kappa`` of the latent values sees
    the noise, square matrices (``Kuu``) do not. Parameters (log ``variance``), ``K_diag`` and
    its VJPs are ``White``'s; the VJPs of ``K`` are zero, so the noise gradient flows only
    through ``MatrixGradients.Kff_diag``. A subclass of ``White`` so that "the kernel has a
    noise term" checks see it; code that needs the ``Kuu`` noise tests ``type(p) is White``.
    """

    on_square = False

    def __repr__(self) -> str:
        return f"LatentNoise(variance={self.variance:.6g})"

    def K(self, X: Array, X2: Array | None = None) -> Array:
        X, X2 = input_pair(X, X2, None, "LatentNoise")
        return ops.zeros(X, (X.shape[0], X.shape[0] if X2 is None else X2.shape[0]))

    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        X, X2 = input_pair(X, X2, None, "LatentNoise")
        matrix_gradient(dK, (X.shape[0], X.shape[0] if X2 is None else X2.shape[0]))
        return ops.zeros(X, (1,))


def latent_noise(kernel: Kernel) -> Kernel:
    """A copy of ``kernel [any]`` with every ``White`` part (at any depth of sums and products)
    replaced by ``LatentNoise`` of the same variance."""
    if type(kernel) is White:
        return LatentNoise(variance=kernel.variance)
    kernel = kernel.copy()
    if isinstance(kernel, Combination):
        kernel.parts = [latent_noise(p) for p in kernel.parts]
    return kernel
