"""The generic Jensen lower bound and the envelope gradient of diagonal-site Gaussians.

Spec binary §1.4: for ``q(f) = N(m, V)``, ``V = (K^-1 + W)^-1`` with ``W = Dg(w)``,

    J(q) = sum_i E_0(y_i, m_i, V_ii) - 1/2 alpha^T m - sum_i log L_ii - 1/2 ||L^-1||_F^2 + n/2

(``m = K alpha``, ``B = I + sW K sW = L L^T``), a lower bound on ``log Z`` with
``log Z - J = KL(q || p(f | y))``. ``gaussian_site_gradient`` is ``G = 1/2 (alpha alpha^T - R)``,
the gradient wrt ``K`` of every diagonal-site objective at its fixed point (EP, KL, VB, TAP).
"""

from __future__ import annotations

import numpy as np

from gpinfer.interfaces import Array, Likelihood
from gpinfer.sites.dense import DiagonalSiteAlgebra


def jensen_bound(likelihood: Likelihood, y: Array, algebra: DiagonalSiteAlgebra,
                 alpha: Array) -> float:
    """``J(q)`` for ``q = N(K alpha, (K^-1 + W)^-1)``; ``y [N]`` labels, ``alpha [N]``."""
    m = algebra.K @ alpha
    v = algebra.posterior_var_diag()
    e0 = likelihood.expected_log_prob(y, m, np.maximum(v, 0.0)).value
    return float(np.sum(e0) - 0.5 * alpha @ m - 0.5 * algebra.log_det_B
                 - 0.5 * algebra.trace_B_inv + 0.5 * algebra.n)


def jensen_bound_general(likelihood: Likelihood, y: Array, m: Array, v: Array,
                         quad_m: float, log_det_VKinv: float, trace_VKinv: float) -> float:
    """``J(q)`` for any Gaussian from its pieces (FV's full-``W`` Gaussian, spec §2.6).

    ``m, v [N]`` marginal means and variances, ``quad_m = m^T K^-1 m``,
    ``log_det_VKinv = log|V K^-1|``, ``trace_VKinv = tr(V K^-1)``.
    """
    e0 = likelihood.expected_log_prob(y, m, np.maximum(v, 0.0)).value
    n = m.shape[0]
    return float(np.sum(e0) - 0.5 * quad_m + 0.5 * (n + log_det_VKinv - trace_VKinv))


def gaussian_site_gradient(algebra: DiagonalSiteAlgebra, alpha: Array) -> Array:
    """``G = dL/dK = 1/2 (alpha alpha^T - R)`` ``[N, N]``, ``R = (K + W^-1)^-1`` (symmetric)."""
    return 0.5 * (np.outer(alpha, alpha) - algebra.R())
