"""Quadratic (Jaakkola-Jordan / Taylor) sites and the collapsed inducing-point bound.

Spec jj-taylor-svi §2. Every likelihood term ``log p(y_i | f)`` is replaced by a quadratic
``s_i(f) = c_i + beta_i f - gamma_i f^2`` indexed by ``xi_i``; the optimal ``q(u) = N(mu, Sigma)``
is then closed form and the collapsed bound is (§2.6)

``F = sum c + 1/2 beta^T Knm B^-1 Kmn beta + 1/2 log|Kmm| - 1/2 log|B| - sum gamma_i Kt_ii``

with ``B = Kmm + 2 Kmn Gamma Knm`` and ``Kt_ii = K_ii - k_i^T Kmm^-1 k_i``. Evaluated with the
whitened recipe of §2.10: ``R = L_K^-1 Kmn``, ``C = I + 2 R Gamma R^T = L_C L_C^T``.

Labels are signs ``s [N]`` in ``{-1, +1}``. Shapes: ``M`` inducing points, ``N`` data points.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import numpy as np
from scipy.special import expit, log_expit

from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, tri_solve
from gpinfer.numerics.quadrature import LogSigmoid

#: below this |xi| the JJ lambda and lambda' use their Taylor series (spec §2.8)
JJ_SERIES_CUT = 1e-3


class QuadraticCoefficients(NamedTuple):
    """``(c, beta, gamma)`` of the sites and their derivatives wrt ``xi``; each ``[N]``."""

    c: Array
    beta: Array
    gamma: Array
    dc: Array
    dbeta: Array
    dgamma: Array


def jj_lambda(xi: Array) -> tuple[Array, Array]:
    """``lambda(xi) = tanh(xi/2) / (4 xi)`` and ``lambda'(xi)``, each ``[N]`` (spec §2.2, §2.8).

    Series ``1/8 - xi^2/96`` and ``-xi/48 + xi^3/240`` for ``|xi| < JJ_SERIES_CUT``; the sigmoid
    form of ``lambda'`` elsewhere (finite for any ``xi``).
    """
    xi = np.asarray(xi, dtype=float)
    small = np.abs(xi) < JJ_SERIES_CUT
    safe = np.where(small, 1.0, xi)
    lam = np.where(small, 0.125 - xi**2 / 96.0, np.tanh(0.5 * safe) / (4.0 * safe))
    sig_diff = 0.5 * np.tanh(0.5 * safe)  # sigma(xi) - 1/2
    dlam_big = (safe * expit(safe) * expit(-safe) - sig_diff) / (2.0 * safe**2)
    dlam = np.where(small, -xi / 48.0 + xi**3 / 240.0, dlam_big)
    return lam, dlam


def jj_coefficients(xi: Array, s: Array) -> QuadraticCoefficients:
    """Jaakkola-Jordan sites for the logistic likelihood (table of spec §2.4)."""
    xi = np.asarray(xi, dtype=float)
    lam, dlam = jj_lambda(xi)
    c = log_expit(xi) - 0.5 * xi + lam * xi**2
    zeros = np.zeros_like(xi)
    return QuadraticCoefficients(c, 0.5 * np.asarray(s, float), lam, dlam * xi**2, zeros, dlam)


def taylor_coefficients(xi: Array, s: Array, link: LogSigmoid) -> QuadraticCoefficients:
    """Second-order Taylor sites of ``log sig(s f)`` around ``f = xi`` (spec §2.3-2.4, §2.8).

    ``phi = l'(xi)``, ``psi = -l''(xi)/2``; ``beta = phi + 2 psi xi``, ``gamma = psi``,
    ``c = l(xi) - phi xi - psi xi^2``. Needs a log-concave link (``psi > 0``).
    """
    xi = np.asarray(xi, dtype=float)
    s = np.asarray(s, dtype=float)
    l0, d1, d2, d3 = link.derivatives(s * xi, 3)
    phi, psi, dpsi = s * d1, -0.5 * d2, -0.5 * s * d3
    c = l0 - phi * xi - psi * xi**2
    return QuadraticCoefficients(
        c, phi + 2.0 * psi * xi, psi, -dpsi * xi**2, 2.0 * xi * dpsi, dpsi
    )


class InducingFactors:
    """Factorisations shared by every bound at fixed kernel matrices (spec §2.10 steps 1-2).

    ``Kuu [M, M]``, ``Kuf [M, N]``, ``Kff_diag [N]``. ``L_K = chol(Kuu)`` (jitter only when
    needed), ``R = L_K^-1 Kuf [M, N]``, ``Kt = Kff_diag - ||r_i||^2 [N]`` (round-off clipped at 0).
    """

    def __init__(self, Kuu: Array, Kuf: Array, Kff_diag: Array):
        self.Kuu = np.asarray(Kuu, dtype=float)
        self.Kuf = np.asarray(Kuf, dtype=float)
        self.Kff_diag = np.asarray(Kff_diag, dtype=float)
        self.L_K = jittered_cholesky(self.Kuu, name="Kuu").L
        self.R = tri_solve(self.L_K, self.Kuf)
        self.Kt = np.maximum(self.Kff_diag - np.einsum("mn,mn->n", self.R, self.R), 0.0)

    @property
    def M(self) -> int:
        return self.Kuu.shape[0]

    def marginals(self, mu: Array, Sigma: Array) -> tuple[Array, Array]:
        """Means and variances ``[N]`` of ``q(f_i)`` for any ``q(u) = N(mu, Sigma)`` (§2.10.7)."""
        nu = tri_solve(self.L_K, mu)
        Mw = tri_solve(self.L_K, tri_solve(self.L_K, Sigma).T)  # L_K^-1 Sigma L_K^-T
        mean = self.R.T @ nu
        var = self.Kt + np.einsum("mn,mn->n", self.R, Mw @ self.R)
        return mean, np.maximum(var, 0.0)


class CollapsedBound:
    """``F(theta, xi)`` of spec §2.6 at given factors and site coefficients, with its gradients.

    Attributes computed on construction: ``value``; lazily: ``mu_hat [M]``, ``Sigma_hat [M, M]``,
    ``m_hat [N]``, ``S2_hat [N]`` (the closed-form ``q(u)`` and its marginals, §2.5),
    ``matrix_gradients()`` (§2.7) and ``xi_gradient()`` (§2.8).
    """

    def __init__(self, factors: InducingFactors, coef: QuadraticCoefficients):
        self.factors = factors
        self.coef = coef
        R, gamma = factors.R, coef.gamma
        M = factors.M
        Rg = R * np.sqrt(2.0 * gamma)
        self.C = Rg @ Rg.T  # Rg @ Rg.T runs as one symmetric rank-k update (syrk)
        self.C[np.diag_indices(M)] += 1.0
        del Rg
        self.L_C = jittered_cholesky(self.C, name="C = I + 2 R Gamma R^T").L
        self.rho = tri_solve(self.L_C, R @ coef.beta)
        self.value = float(
            np.sum(coef.c)
            + 0.5 * self.rho @ self.rho
            - np.sum(np.log(np.diag(self.L_C)))
            - gamma @ factors.Kt
        )
        self._v = tri_solve(self.L_C, self.rho, transpose=True)  # L_C^-T rho

    # -- closed-form q(u) and its marginals ---------------------------------------------------
    @cached_property
    def a(self) -> Array:
        """``a = B^-1 Kmn beta = Kmm^-1 mu_hat``, ``[M]``."""
        return tri_solve(self.factors.L_K, self._v, transpose=True)

    @cached_property
    def mu_hat(self) -> Array:
        return self.factors.L_K @ self._v

    @cached_property
    def Sigma_hat(self) -> Array:
        """``L_K C^-1 L_K^T``, ``[M, M]``."""
        W = tri_solve(self.L_C, self.factors.L_K.T)  # L_C^-1 L_K^T
        return W.T @ W

    @cached_property
    def m_hat(self) -> Array:
        return self.factors.R.T @ self._v

    @cached_property
    def S2_hat(self) -> Array:
        V = tri_solve(self.L_C, self.factors.R)
        return self.factors.Kt + np.einsum("mn,mn->n", V, V)

    # -- gradients ---------------------------------------------------------------------------
    def matrix_gradients(self) -> MatrixGradients:
        """``dF/dKuu`` (symmetric), ``dF/dKuf``, ``dF/dKff_diag = -gamma`` (spec §2.10 step 6)."""
        L_K, R = self.factors.L_K, self.factors.R
        gamma, beta = self.coef.gamma, self.coef.beta
        M = self.factors.M
        C_inv = chol_solve(self.L_C, np.eye(M))
        W = np.eye(M) - 0.5 * (self.C + C_inv)
        Y = tri_solve(L_K, W, transpose=True)  # L_K^-T W
        G_uu = -0.5 * np.outer(self.a, self.a) + tri_solve(L_K, Y.T, transpose=True).T
        G_uu = 0.5 * (G_uu + G_uu.T)
        P = 2.0 * tri_solve(L_K, np.eye(M) - C_inv, transpose=True)  # 2 L_K^-T (I - C^-1)
        G_uf = P @ (R * gamma)
        G_uf += np.outer(self.a, beta - 2.0 * gamma * self.m_hat)
        return MatrixGradients(Kff_diag=-gamma.copy(), Kuu=G_uu, Kuf=G_uf)

    def xi_gradient(self) -> Array:
        """``dF/dxi = c' + beta' m_hat - gamma' (m_hat^2 + S2_hat)``, ``[N]`` (envelope, §2.8)."""
        c = self.coef
        return c.dc + c.dbeta * self.m_hat - c.dgamma * (self.m_hat**2 + self.S2_hat)


def site_elbo(factors: InducingFactors, coef: QuadraticCoefficients, mu: Array,
              Sigma: Array) -> float:
    """The site ELBO ``J(mu, Sigma, xi)`` of spec §2.4 for any ``q(u)``: sites minus KL."""
    mean, var = factors.marginals(mu, Sigma)
    data = np.sum(coef.c + coef.beta * mean - coef.gamma * (mean**2 + var))
    return float(data - gaussian_kl(factors.L_K, mu, Sigma))


def gaussian_kl(L_K: Array, mu: Array, Sigma: Array) -> float:
    """``KL(N(mu, Sigma) || N(0, L_K L_K^T))`` for ``mu [M]``, ``Sigma [M, M]``."""
    M = L_K.shape[0]
    L_S = jittered_cholesky(Sigma, name="Sigma").L
    P = tri_solve(L_K, L_S)
    nu = tri_solve(L_K, mu)
    logdet = 2.0 * np.sum(np.log(np.diag(L_K))) - 2.0 * np.sum(np.log(np.diag(L_S)))
    return float(0.5 * (np.sum(P * P) + nu @ nu - M + logdet))
