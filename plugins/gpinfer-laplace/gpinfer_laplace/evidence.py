"""Laplace log evidence and its gradient wrt K (spec binary §2.1, pitfalls P1 and P2).

At the mode ``f_hat = K alpha`` with ``w = -d2 log p``, ``B = I + sW K sW = L L^T``:

    log Z_LA = sum_i log p(y_i | f_i) - 1/2 alpha^T f - sum_i log L_ii          (P1: minus)

Its gradient has an explicit part and an implicit part through ``W(f_hat(theta))``:

* explicit: ``1/2 alpha^T dK alpha - 1/2 tr(R dK)``, ``R = (K + W^-1)^-1``;
* ``d log Z_LA / d f_i = +1/2 V_ii d3 log p(y_i | f_i)`` =: ``s2_i``                 (P2: plus)
* ``d f_hat / d theta = (I + K W)^-1 dK g = (I - K R) dK g``;

so with ``u = (I - R K) s2``:  ``G = 1/2 alpha alpha^T - 1/2 R + 1/2 (u g^T + g u^T)``.
"""

from __future__ import annotations

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Array, MatrixGradients, ObjectiveValue
from gpinfer_laplace.sites import LaplaceSites


def laplace_gradient(sites: LaplaceSites) -> Array:
    """``G = d log Z_LA / d K [N, N]`` (symmetric) at the current mode of ``sites``."""
    g, _, d3 = sites.derivatives()
    alg = sites.algebra
    alpha = sites.alpha
    R = alg.R()
    s2 = 0.5 * alg.posterior_var_diag() * d3
    u = s2 - R @ (sites.K @ s2)
    G = 0.5 * np.outer(alpha, alpha) - 0.5 * R + 0.5 * (np.outer(u, g) + np.outer(g, u))
    return G


class LaplaceEvidence:
    """``log Z_LA`` and ``MatrixGradients(Kff=G)`` at the current mode of a ``LaplaceSites``.

    The gradient is exact at the mode; converge the sites first (``sites.run()``). No
    mini-batch mode: ``batch`` must be None.
    """

    has_gradient = True

    def __init__(self, with_gradient: bool = True):
        self.with_gradient = with_gradient

    def evaluate(self, sites: LaplaceSites, batch: Array | None = None) -> ObjectiveValue:
        if batch is not None:
            raise InputError("LaplaceEvidence has no mini-batch mode (batch must be None)")
        value = sites.log_evidence()
        if not np.isfinite(value):
            raise NumericalError(f"log Z_LA is {value}", iteration=sites.n_steps,
                                 quantity="log Z_LA")
        if not self.with_gradient:
            return ObjectiveValue(value=value)
        G = laplace_gradient(sites)
        if not np.all(np.isfinite(G)):
            raise NumericalError("d log Z_LA / dK has non-finite entries",
                                 iteration=sites.n_steps, quantity="dlogZ/dK")
        return ObjectiveValue(value=value, gradients=MatrixGradients(Kff=G))
