"""Quadratic (Jaakkola-Jordan / Taylor) sites and the collapsed inducing-point bound.

Spec jj-taylor-svi §2. Every likelihood term ``log p(y_i | f)`` is replaced by a quadratic
``s_i(f) = c_i + beta_i f - gamma_i f^2`` indexed by ``xi_i``; the optimal ``q(u) = N(mu, Sigma)``
is then closed form and the collapsed bound is (§2.6)

``F = sum c + 1/2 beta^T Knm B^-1 Kmn beta + 1/2 log|Kmm| - 1/2 log|B| - sum gamma_i Kt_ii``

with ``B = Kmm + 2 Kmn Gamma Knm`` and ``Kt_ii = K_ii - k_i^T Kmm^-1 k_i``. Evaluated with the
whitened recipe of §2.10: ``R = L_K^-1 Kmn``, ``C = I + 2 R Gamma R^T = L_C L_C^T``. The
``O(N M^2)`` passes run over cache-sized blocks of data rows (``row_blocks``), so that the
elementwise work around each BLAS call touches the block while it is in cache.

Labels are signs ``s [N]`` in ``{-1, +1}``. Shapes: ``M`` inducing points, ``N`` data points.
"""

from __future__ import annotations

import weakref
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
from scipy.special import expit, log_expit

from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.moved import renamed
from gpinfer.numerics import settings
from gpinfer.numerics.cholesky import chol_solve, jittered_cholesky, tri_solve
from gpinfer.numerics.quadrature import LogSigmoid, chunk_slices
from gpinfer.sites.stacked import StackedTerms

#: below this |xi| the JJ lambda and lambda' use their Taylor series (spec §2.8)
JJ_SERIES_CUT = 1e-3


def row_blocks(n: int, m: int) -> list[slice]:
    """Cache-sized slices of the rows of an ``[n, m]`` array (``settings.CACHE_BLOCK_FLOATS``)."""
    return list(chunk_slices(n, m, settings.CACHE_BLOCK_FLOATS))


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
    shape = xi.shape
    xi = xi.reshape(-1)
    small = np.abs(xi) < JJ_SERIES_CUT
    any_small = bool(small.any())
    safe = np.where(small, 1.0, xi) if any_small else xi
    tanh_half = np.tanh(0.5 * safe)
    lam = tanh_half / (4.0 * safe)
    sig_diff = 0.5 * tanh_half  # sigma(xi) - 1/2
    dlam = (safe * expit(safe) * expit(-safe) - sig_diff) / (2.0 * safe**2)
    if any_small:  # the series only where needed (same values as evaluating it everywhere)
        x = xi[small]
        lam[small] = 0.125 - x**2 / 96.0
        dlam[small] = -x / 48.0 + x**3 / 240.0
    return lam.reshape(shape), dlam.reshape(shape)


def jj_coefficients(xi: Array, s: Array) -> QuadraticCoefficients:
    """Jaakkola-Jordan sites for the logistic likelihood (table of spec §2.4)."""
    xi = np.asarray(xi, dtype=float)
    lam, dlam = jj_lambda(xi)
    xi2 = xi**2
    c = log_expit(xi) - 0.5 * xi + lam * xi2
    zeros = np.zeros_like(xi)
    return QuadraticCoefficients(c, 0.5 * np.asarray(s, float), lam, dlam * xi2, zeros, dlam)


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


#: the closed-form bound last built on each geometry (``CollapsedBound`` sets it): ``marginals``
#: of that bound's ``q(u)`` are its ``m_hat, S2_hat``, without another pass over the data
_CLOSED_FORM: weakref.WeakKeyDictionary[StackedTerms, weakref.ref[CollapsedBound]] = (
    weakref.WeakKeyDictionary())


def inducing_factors(Kuu: Array, Kuf: Array, Kff_diag: Array, work: Array | None = None
                     ) -> StackedTerms:
    """The inducing geometry shared by every bound at fixed kernel matrices (spec §2.10 steps
    1-2), one latent: ``Kuu [M, M]``, ``Kuf [M, N]``, ``Kff_diag [N]`` (kept on it),
    ``L = chol(Kuu)`` (jitter only when needed), ``A = R = L^-1 Kuf [M, N]`` and
    ``s = Kt = Kff_diag - ||r_i||^2 [N]`` (round-off clipped at 0).

    ``R`` is stored row-major by data point: ``A_T = R.T [N, M]`` is C-contiguous (``A`` is its
    transposed view), so that blocks of data points are contiguous for the blocked passes.
    ``work``: a C-contiguous float ``[N, M]`` array to hold ``A_T`` (else a new one).
    """
    Kuu = np.asarray(Kuu, dtype=float)
    Kuf = np.asarray(Kuf, dtype=float)
    Kff_diag = np.asarray(Kff_diag, dtype=float)
    L = jittered_cholesky(Kuu, name="Kuu").L
    M, N = Kuf.shape
    Kfu = Kuf.T
    usable = (work is not None and work.shape == (N, M) and work.dtype == np.float64
              and work.flags.c_contiguous and not np.shares_memory(work, Kuf))
    R_rows: Array = cast(Array, work) if usable else np.empty((N, M))
    rr = np.empty(N)
    L_F = np.asfortranarray(L)  # BLAS layout once, not per block
    for rows in row_blocks(N, M):  # R = L^-1 Kuf and ||r_i||^2, one cached block at a time
        block = R_rows[rows]
        np.copyto(block, Kfu[rows])
        tri_solve(L_F, block, right=True, transpose=True, overwrite=True)  # in place
        np.einsum("nm,nm->n", block, block, out=rr[rows])
    return StackedTerms(L=L, A=R_rows.T, s=np.maximum(Kff_diag - rr, 0.0), Kuu=Kuu, Kuf=Kuf,
                        Kff_diag=Kff_diag)


def release(factors: StackedTerms) -> None:
    """Make ``factors`` unusable: their ``[N, M]`` arrays are about to hold the factors of
    other kernel parameters (``gpinfer_jj.bound``); any later use fails."""
    _CLOSED_FORM.pop(factors, None)
    factors.release()


def marginals(factors: StackedTerms, mu: Array, Sigma: Array) -> tuple[Array, Array]:
    """Means and variances ``[N]`` of ``q(f_i)`` for any ``q(u) = N(mu, Sigma)`` (§2.10.7).

    When ``(mu, Sigma)`` is the closed-form ``q(u)`` of the last bound built on ``factors``
    (as in Alg. 1, whose Stage 1 starts from the previous ``q(u)``), its ``m_hat, S2_hat``
    are returned: the same marginals without another ``O(N M^2)`` pass.
    """
    last = _CLOSED_FORM.get(factors)
    b = last() if last is not None else None
    if b is not None and b.is_closed_form(mu, Sigma):
        return b.m_hat, b.S2_hat
    L, R_rows = factors.L, factors.A_T
    N, M = R_rows.shape
    nu = tri_solve(L, mu)
    Mw = tri_solve(L, tri_solve(L, Sigma).T)  # L^-1 Sigma L^-T
    mean = R_rows @ nu
    quad = np.empty(N)
    for rows in row_blocks(N, M):
        block = R_rows[rows]
        np.einsum("nm,nm->n", block, block @ Mw.T, out=quad[rows])
    var = factors.s + quad
    return mean, np.maximum(var, 0.0)


class CollapsedBound:
    """``F(theta, xi)`` of spec §2.6 at given factors and site coefficients, with its gradients.

    Attributes computed on construction: ``value``; lazily: ``mu_hat [M]``, ``Sigma_hat [M, M]``,
    ``m_hat [N]``, ``S2_hat [N]`` (the closed-form ``q(u)`` and its marginals, §2.5),
    ``matrix_gradients()`` (§2.7) and ``xi_gradient()`` (§2.8). ``kuu_gradient()`` and
    ``kuf_contraction(W)`` give the ``Kuu`` gradient and contractions of the ``Kuf`` gradient
    without forming the ``[M, N]`` matrix (for kernels whose VJP needs only those).
    """

    def __init__(self, factors: StackedTerms, coef: QuadraticCoefficients):
        self.factors = factors
        self.coef = coef
        R_rows, gamma = factors.A_T, coef.gamma
        N, M = R_rows.shape
        w = np.sqrt(2.0 * gamma)
        # A = 2 R Gamma R^T = Rg Rg^T with Rg = R sqrt(2 gamma): one symmetric rank-k update per
        # block of rows (syrk), the scaled block never leaves the cache
        A = np.zeros((M, M))
        Rb = np.zeros(M)  # R beta
        blocks = row_blocks(N, M)
        scratch = np.empty((min(N, blocks[0].stop), M))
        for rows in blocks:
            block = R_rows[rows]
            g = scratch[: rows.stop - rows.start]
            np.multiply(block, w[rows, None], out=g)
            A += g.T @ g
            Rb += coef.beta[rows] @ block
        del scratch
        self._A = A  # C - I
        self.C = A + np.eye(M)
        self.L_C = jittered_cholesky(self.C, name="C = I + 2 R Gamma R^T").L
        self.rho = tri_solve(self.L_C, Rb)
        self.value = float(
            np.sum(coef.c)
            + 0.5 * self.rho @ self.rho
            - np.sum(np.log(np.diag(self.L_C)))
            - gamma @ factors.s
        )
        self._v = tri_solve(self.L_C, self.rho, transpose=True)  # L_C^-T rho
        _CLOSED_FORM[factors] = weakref.ref(self)

    # -- closed-form q(u) and its marginals ---------------------------------------------------
    @cached_property
    def a(self) -> Array:
        """``a = B^-1 Kmn beta = Kmm^-1 mu_hat``, ``[M]``."""
        return tri_solve(self.factors.L, self._v, transpose=True)

    @property
    def whitened_mean(self) -> Array:
        """``L_K^-1 mu_hat = L_C^-T rho``, ``[M]``."""
        return self._v

    @cached_property
    def mu_hat(self) -> Array:
        return self.factors.L @ self._v

    @cached_property
    def Sigma_hat(self) -> Array:
        """``L_K C^-1 L_K^T``, ``[M, M]``."""
        W = tri_solve(self.L_C, self.factors.L.T)  # L_C^-1 L_K^T
        return W.T @ W

    @cached_property
    def m_hat(self) -> Array:
        return self.factors.A_T @ self._v

    @cached_property
    def S2_hat(self) -> Array:
        """``Kt + ||L_C^-1 r_i||^2``, ``[N]`` (blocked triangular solves; ``m_hat`` is computed
        in the same pass over ``R`` when it is not known yet)."""
        self._data_pass(None, marginals=True)
        return self.__dict__["S2_hat"]

    def _data_pass(self, W: Array | None, marginals: bool) -> float | None:
        """One blocked pass over the data rows: with ``marginals``, ``m_hat`` and ``S2_hat``
        (those not known yet, stored); with ``W [M, N]``, returns ``kuf_contraction(W)``."""
        fac = self.factors
        R_rows = fac.A_T
        N, M = R_rows.shape
        blocks = row_blocks(N, M)
        nb = min(N, blocks[0].stop)
        mean = np.empty(N) if "m_hat" not in self.__dict__ and (marginals or W is not None) \
            else None
        quad = np.empty(N) if marginals and "S2_hat" not in self.__dict__ else None
        V = np.empty((nb, M)) if quad is not None else None
        L_C = np.asfortranarray(self.L_C)
        if W is not None:
            assert fac.Kuf is not None  # kept by ``inducing_factors``
            Kfu, Wfu = fac.Kuf.T, np.asarray(W, dtype=float).T
            a, gamma = self.a, self.coef.gamma
            E, t, F = np.empty((nb, M)), np.empty(N), np.zeros((M, M))
        for rows in blocks:
            block, n = R_rows[rows], rows.stop - rows.start
            if mean is not None:
                np.matmul(block, self._v, out=mean[rows])
            if quad is not None and V is not None:  # ||L_C^-1 r_i||^2
                v = V[:n]
                np.copyto(v, block)
                tri_solve(L_C, v, right=True, transpose=True, overwrite=True)
                np.einsum("nm,nm->n", v, v, out=quad[rows])
            if W is not None:  # E = Kuf * W: t = E^T a, F += E Gamma R^T
                e = E[:n]
                np.multiply(Kfu[rows], Wfu[rows], out=e)
                np.matmul(e, a, out=t[rows])
                e *= gamma[rows, None]
                F += e.T @ block
        if mean is not None:
            self.__dict__["m_hat"] = mean
        if quad is not None:
            self.__dict__["S2_hat"] = fac.s + quad
        if W is None:
            return None
        return float(np.sum(self._P * F)) + float(t @ self._b)

    def kl(self) -> float:
        """``KL(q(u) || p(u))`` of the closed-form ``q(u) = (mu_hat, Sigma_hat)``, whitened:
        ``1/2 [tr(C^-1) + |L_K^-1 mu_hat|^2 - M + log|C|]`` (``O(M^3)``, no pass over the data)."""
        M = self.factors.L.shape[0]
        return float(0.5 * (np.trace(self._C_inv) + self._v @ self._v - M)
                     + np.sum(np.log(np.diag(self.L_C))))

    def is_closed_form(self, mu: Array, Sigma: Array) -> bool:
        """Whether ``(mu, Sigma)`` is this bound's ``(mu_hat, Sigma_hat)`` (if computed)."""
        if "mu_hat" not in self.__dict__ or "Sigma_hat" not in self.__dict__:
            return False
        return (np.shape(mu) == self.mu_hat.shape and np.shape(Sigma) == self.Sigma_hat.shape
                and np.array_equal(mu, self.mu_hat) and np.array_equal(Sigma, self.Sigma_hat))

    # -- gradients ---------------------------------------------------------------------------
    @cached_property
    def _C_inv(self) -> Array:
        return chol_solve(self.L_C, np.eye(self.factors.L.shape[0]))

    @cached_property
    def _P(self) -> Array:
        """``P = 2 L_K^-T (I - C^-1)``: ``dF/dKuf = P (R Gamma) + a b^T``."""
        M = self.factors.L.shape[0]
        return 2.0 * tri_solve(self.factors.L, np.eye(M) - self._C_inv, transpose=True)

    @cached_property
    def _b(self) -> Array:
        """``b = beta - 2 gamma m_hat``, ``[N]``."""
        return self.coef.beta - 2.0 * self.coef.gamma * self.m_hat

    def kuu_gradient(self) -> Array:
        """``dF/dKuu [M, M]`` (symmetric)."""
        L_K = self.factors.L
        M = L_K.shape[0]
        W = np.eye(M) - 0.5 * (self.C + self._C_inv)
        Y = tri_solve(L_K, W, transpose=True)  # L_K^-T W
        G_uu = -0.5 * np.outer(self.a, self.a) + tri_solve(L_K, Y.T, transpose=True).T
        return 0.5 * (G_uu + G_uu.T)

    def matrix_gradients(self) -> MatrixGradients:
        """``dF/dKuu`` (symmetric), ``dF/dKuf``, ``dF/dKff_diag = -gamma`` (spec §2.10 step 6)."""
        gamma = self.coef.gamma
        G_uf = self._P @ (self.factors.A * gamma)
        G_uf += np.outer(self.a, self._b)
        return MatrixGradients(Kff_diag=-gamma.copy(), Kuu=self.kuu_gradient(), Kuf=G_uf)

    def kuf_contraction(self, W: Array | None = None, marginals: bool = False) -> float:
        """``sum_ij (dF/dKuf)_ij Kuf_ij W_ij`` for ``W [M, N]`` (``None``: all ones), without
        forming ``dF/dKuf = P (R Gamma) + a b^T``.

        ``W = None``: ``Kuf = L_K R`` turns the sum into ``tr((I - C^-1)(C - I)) + m_hat . b``
        (``O(M^3)``). Otherwise ``sum(P * (E Gamma R^T)) + a^T E b`` with ``E = Kuf * W``, one
        blocked ``[M, N] x [N, M]`` product; with ``marginals``, the same pass over the data
        also gives ``S2_hat`` (and ``m_hat``) when they are not known yet.
        """
        if W is None:
            M = self.factors.L.shape[0]
            return float(np.sum((np.eye(M) - self._C_inv) * self._A) + self.m_hat @ self._b)
        value = self._data_pass(W, marginals)
        assert value is not None  # a pass with W returns the contraction
        return value

    def xi_gradient(self) -> Array:
        """``dF/dxi = c' + beta' m_hat - gamma' (m_hat^2 + S2_hat)``, ``[N]`` (envelope, §2.8)."""
        c = self.coef
        S2_hat = self.S2_hat  # first: its pass over R also gives m_hat
        return c.dc + c.dbeta * self.m_hat - c.dgamma * (self.m_hat**2 + S2_hat)


def site_elbo(factors: StackedTerms, coef: QuadraticCoefficients, mu: Array,
              Sigma: Array) -> float:
    """The site ELBO ``J(mu, Sigma, xi)`` of spec §2.4 for any ``q(u)``: sites minus KL."""
    mean, var = marginals(factors, mu, Sigma)
    data = np.sum(coef.c + coef.beta * mean - coef.gamma * (mean**2 + var))
    return float(data - gaussian_kl(factors.L, mu, Sigma))


def gaussian_kl(L_K: Array, mu: Array, Sigma: Array) -> float:
    """``KL(N(mu, Sigma) || N(0, L_K L_K^T))`` for ``mu [M]``, ``Sigma [M, M]``."""
    M = L_K.shape[0]
    L_S = jittered_cholesky(Sigma, name="Sigma").L
    P = tri_solve(L_K, L_S)
    nu = tri_solve(L_K, mu)
    logdet = 2.0 * np.sum(np.log(np.diag(L_K))) - 2.0 * np.sum(np.log(np.diag(L_S)))
    return float(0.5 * (np.sum(P * P) + nu @ nu - M + logdet))


if not TYPE_CHECKING:  # at run time only: mypy keeps checking the imports from here
    # ``InducingFactors(Kuu, Kuf, Kff_diag, work)`` is ``inducing_factors``; what it returns is
    # the one inducing geometry, whose attributes the warning names (the old ones are gone)
    __getattr__ = renamed(__name__, {"InducingFactors": f"{__name__}:inducing_factors"},
                          hint=" (a gpinfer.sites.stacked.StackedTerms: L_K is L, R is A, "
                               "R_rows is A_T, Kt is s, M and N are A.shape; "
                               "factors.marginals(mu, Sigma) is marginals(factors, mu, Sigma); "
                               "release(factors) also drops the closed-form link)")
