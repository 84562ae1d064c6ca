"""``lr``: label regression, GP regression on the +-1 labels (spec §2.7, pitfall P23).

``w = sigma_n^-2``, ``alpha = (K + sigma_n^2 I)^-1 y``; predictions squashed by the trial's
likelihood. Evidence: the Jensen bound ``J(q_LR)``, maximised over ``sigma_n in [0.5, 2]`` by a
bounded 1-D search on ``log sigma_n`` (or a fixed ``noise``), evaluated at ``O(N^2)`` per
value through one eigendecomposition of ``K`` (``LRNoisePath``). Gradient wrt ``K`` (all
dependencies; ``C = (K + sigma_n^2 I)^-1``):

    G = sym(s2 (C a_m) alpha^T + s2^2 C D_v C - 1/2 C + 1/2 s2 C^2 - 1/2 alpha alpha^T
            + (C K alpha) alpha^T)

and ``dJ/dsigma_n^2`` (for the envelope argument and its test).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np
from scipy.optimize import minimize_scalar

from gpinfer.errors import InputError
from gpinfer.interfaces import Array, BaselineMeasure, Likelihood
from gpinfer.options import Option, bounds, real
from gpinfer.sites.dense import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseBinaryMethod, DenseSolution
from gpinfer.sites.jensen import jensen_bound


class LRFit(NamedTuple):
    """Label regression at one noise level: algebra, alpha, ``J(q_LR)``."""

    algebra: DiagonalSiteAlgebra
    alpha: Array
    jensen: float


def label_regression(K: Array, y: Array, likelihood: Likelihood, noise_var: float) -> LRFit:
    """LR posterior and ``J(q_LR)`` for noise variance ``sigma_n^2``; ``y [N]`` 0/1."""
    alg = DiagonalSiteAlgebra.from_kernel_matrix(K, np.full(y.shape[0], 1.0 / noise_var))
    alpha = alg.R_matvec(2.0 * y - 1.0)
    return LRFit(alg, alpha, jensen_bound(likelihood, y, alg, alpha))


class LRNoisePath:
    """``J(q_LR)`` as a function of ``sigma_n^2`` at ``O(N^2)`` per value (noise search).

    With ``K = U Dg(lam) U^T`` (``lam`` clipped at 0; one ``eigh``) and ``c = U^T t``
    (``t = 2y - 1``): ``m = U Dg(lam / (lam + s2)) c``, ``dg V = (U o U)(lam s2 / (lam + s2))``,
    ``alpha^T m = sum c^2 lam / (lam + s2)^2``, ``log|B| = sum log(1 + lam / s2)``,
    ``tr(B^-1) = sum s2 / (lam + s2)`` -- the same ``J`` as ``label_regression(...).jensen``.
    """

    def __init__(self, K: Array, y: Array, likelihood: Likelihood):
        lam, U = np.linalg.eigh(K)
        self.lam, self.U, self.U2 = np.maximum(lam, 0.0), U, U * U
        self.c = U.T @ (2.0 * y - 1.0)
        self.y, self.lik = y, likelihood

    def __call__(self, noise_var: float) -> float:
        lam, s2 = self.lam, float(noise_var)
        shrink = lam / (lam + s2)
        m = self.U @ (shrink * self.c)
        v = self.U2 @ (shrink * s2)
        e0 = self.lik.expected_log_prob(self.y, m, np.maximum(v, 0.0)).value
        return float(np.sum(e0) - 0.5 * np.sum(self.c**2 * shrink / (lam + s2))
                     - 0.5 * np.sum(np.log1p(lam / s2)) - 0.5 * np.sum(s2 / (lam + s2))
                     + 0.5 * lam.size)


def lr_kernel_gradient(fit: LRFit, y: Array, likelihood: Likelihood,
                       noise_var: float) -> tuple[Array, tuple[Array, ...]]:
    """``dJ/dK [N, N]`` of ``J(q_LR)`` (spec §2.7) and the pieces ``(C, C^2, a_m, a_v)`` that
    ``lr_gradients`` reuses."""
    alg, alpha = fit.algebra, fit.alpha
    K, s2 = alg.K, noise_var
    C = alg.R()
    m = K @ alpha
    e = likelihood.expected_log_prob(y, m, np.maximum(alg.posterior_var_diag(), 0.0))
    a_m, a_v = e.dmean, e.dvar
    Ca, KCa = C @ a_m, C @ m
    C2 = C @ C
    G = (s2 * np.outer(Ca, alpha) + s2**2 * (C * a_v[None, :]) @ C - 0.5 * C + 0.5 * s2 * C2
         - 0.5 * np.outer(alpha, alpha) + np.outer(KCa, alpha))
    return 0.5 * (G + G.T), (C, C2, a_m, a_v)


def lr_gradients(fit: LRFit, y: Array, likelihood: Likelihood,
                 noise_var: float) -> tuple[Array, float]:
    """``(dJ/dK [N, N], dJ/dsigma_n^2)`` of ``J(q_LR)`` (spec §2.7)."""
    G, (C, C2, a_m, a_v) = lr_kernel_gradient(fit, y, likelihood, noise_var)
    alpha, K, s2, n = fit.alpha, fit.algebra.K, noise_var, y.shape[0]
    KC = K @ C
    trC = np.trace(C)
    dJ = (-a_m @ (KC @ alpha) + np.einsum("ij,ji->i", KC, KC) @ a_v - 0.5 * (trC - n / s2)
          - 0.5 * (trC - s2 * np.trace(C2)) + alpha @ (KC @ alpha))
    return G, float(dJ)


class LabelRegressionMethod(DenseBinaryMethod):
    """Label regression; evidence ``J(q_LR)`` (and the regression evidence in ``extra``).

    Options: ``noise`` (``None``: choose ``sigma_n`` in ``noise_bounds`` maximising ``J``; a
    number: fixed ``sigma_n``), ``noise_bounds`` ((0.5, 2)), plus the driver's options.
    """

    name: ClassVar[str] = "lr"
    #: its probabilities squash a regression on +-1 targets (at most about Phi(1) = 0.84 with
    #: noise sigma_n >= 0.5): the fit guard judges it by its training error, not its NLL
    #: (``Method.baseline_measure``)
    baseline_measure: ClassVar[BaselineMeasure] = "error"
    option_spec: ClassVar[dict[str, Option]] = {
        **DenseBinaryMethod.driver_options,
        "noise": real(None, "(0, inf)", none=True, doc="fixed sigma_n (None: chosen in bounds)"),
        "noise_bounds": bounds((0.5, 2.0), "(0, inf)", doc="search interval of sigma_n"),
    }

    def _noise(self, K: Array, y: Array, likelihood: Likelihood) -> float:
        if self.options["noise"] is not None:
            sn = float(self.options["noise"])
            if not sn > 0:
                raise InputError(f"lr: noise (sigma_n) must be positive, got {sn}")
            return sn
        lo, hi = (float(b) for b in self.options["noise_bounds"])
        if not 0 < lo < hi:
            raise InputError(f"lr: noise_bounds must be 0 < low < high, got {(lo, hi)}")
        path = LRNoisePath(K, y, likelihood)
        res = minimize_scalar(
            lambda ls: -path(np.exp(2 * ls)),
            bounds=(np.log(lo), np.log(hi)), method="bounded", options={"xatol": 1e-4})
        return float(np.exp(res.x))

    def solve(self, K: Array, y: Array, likelihood: Likelihood, warm: Any) -> DenseSolution:
        sn = self._noise(K, y, likelihood)
        fit = label_regression(K, y, likelihood, sn**2)
        t = 2.0 * y - 1.0
        reg = float(-0.5 * t @ fit.alpha - 0.5 * fit.algebra.log_det_B - y.shape[0] * np.log(sn)
                    - 0.5 * y.shape[0] * np.log(2 * np.pi))
        alg, alpha = fit.algebra, fit.alpha
        return DenseSolution(
            log_evidence=fit.jensen,
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, alpha.copy()),
            gradient=lambda: lr_kernel_gradient(fit, y, likelihood, sn**2)[0],
            extra={"noise": sn, "regression_evidence": reg},
            state={"alpha": alpha.copy(), "noise": np.array(sn)},
        )
