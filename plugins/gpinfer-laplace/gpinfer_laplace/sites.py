"""The Laplace mode: safeguarded Newton in the alpha parameterisation (spec binary §2.1).

``Psi(f) = log p(y | f) - 1/2 f^T K^-1 f`` is maximised over ``f = K alpha`` (``K^-1`` is never
formed). One Newton step from ``f`` with ``w = -d2 log p(y|f)``, ``g = d log p(y|f)``:

    b = w * f + g
    alpha_new = b - s * B^-1 (s * K b)          # (K^-1 + W)^-1 b = K alpha_new, s = sqrt(w)
    d = alpha_new - alpha; eta = 1; halve eta while Psi(alpha + eta d) < Psi(alpha) - slack

and ``Psi(alpha) = -1/2 alpha^T f + sum log p(y | f)``. Converged when ``|Delta Psi| <= tol``.
``slack = PSI_ROUNDOFF * max(1, |Psi|)`` lets full steps through near the mode, where the change
of ``Psi`` is below its round-off (the mode must be accurate for ``log|B|`` and the gradient).
``LaplaceSites.run`` takes its steps on the engine's inner site schedule
(``gpinfer.training.inner.InnerSchedule``: the test ``|Delta Psi| <= tol``, the cap).
"""

from __future__ import annotations

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Array, SiteState
from gpinfer.kernels.base import Kernel
from gpinfer.likelihoods.base import ScalarLikelihood
from gpinfer.posterior import DenseSitePosterior
from gpinfer.sites import DiagonalSiteAlgebra
from gpinfer.training.inner import InnerSchedule

#: step halvings tried before a Newton step is declared unable to increase Psi
MAX_HALVINGS = 40
#: relative decrease of Psi that the line search treats as round-off (a full Newton step near
#: the mode changes Psi by less than its rounding error; rejecting it would leave the mode, and
#: with it log|B|, inaccurate at the 1e-6 level)
PSI_ROUNDOFF = 1e-11


class LaplaceSites(SiteState):
    """Mode ``f_hat = K alpha`` and curvatures ``w = -d2 log p(y | f_hat)`` of the posterior.

    * ``K [N, N]``: prior covariance; ``y [N]``: labels as the likelihood takes them (0/1);
      ``likelihood``: needs ``log_prob(y, f)`` and ``log_prob_derivatives(y, f, order=3)``.
    * ``tol``: convergence threshold on ``|Delta Psi|``; ``max_newton``: steps per ``run()``.
    * ``alpha0 [N]``: optional initial alpha (default zero).
    * ``kernel``, ``X [N, D]``: optional; only ``posterior()`` needs them.
    * ``weights [N]``: optional positive weights of the points' ``log p(y_i | f_i)`` in ``Psi``
      (and so in ``log Z_LA``; weight 2 is the point twice, exactly); ``None``: all one.

    ``set_kernel_matrix(K)`` swaps the prior covariance and keeps the current alpha as a warm
    start when it gives a larger ``Psi`` than ``alpha = 0``.
    """

    def __init__(
        self,
        K: Array,
        y: Array,
        likelihood: ScalarLikelihood,
        *,
        tol: float = 1e-9,
        max_newton: int = 100,
        alpha0: Array | None = None,
        kernel: Kernel | None = None,
        X: Array | None = None,
        weights: Array | None = None,
    ):
        self.y = np.asarray(y)
        self.weights = None if weights is None else np.asarray(weights, dtype=float)
        self.kernel = kernel
        self.X = X
        self.likelihood = likelihood
        self.tol = float(tol)
        self.max_newton = int(max_newton)
        self.n_steps = 0  # Newton steps since the last set_kernel_matrix (or construction)
        self.last_change = np.inf
        self.last_step_size = np.nan
        self._converged = False
        n = self.y.shape[0]
        self.K = self._check_K(K, n)
        alpha = np.zeros(n) if alpha0 is None else np.array(alpha0, dtype=float).reshape(n)
        self._set_alpha(alpha)

    # -- state -------------------------------------------------------------------------------
    @staticmethod
    def _check_K(K: Array, n: int) -> Array:
        K = np.asarray(K, dtype=float)
        if K.shape != (n, n):
            raise InputError(f"K must be [{n}, {n}] for {n} labels, got {K.shape}")
        if not np.all(np.isfinite(K)):
            raise NumericalError("the kernel matrix K has non-finite entries", quantity="K")
        return K

    def _psi(self, alpha: Array, iteration: int | None = None) -> tuple[float, Array]:
        """``Psi`` at ``alpha [N]`` and the matching ``f = K alpha [N]``."""
        f = self.K @ alpha
        if not np.all(np.isfinite(f)):
            raise NumericalError("latent values f = K alpha are not finite (Psi undefined)",
                                 iteration=iteration, quantity="f")
        log_p = self.likelihood.log_prob(self.y, f)
        if self.weights is not None:
            log_p = self.weights * log_p
        psi = float(np.sum(log_p) - 0.5 * alpha @ f)
        if not np.isfinite(psi):
            raise NumericalError(f"Laplace objective Psi is {psi}", iteration=iteration,
                                 quantity="Psi")
        return psi, f

    def _set_alpha(self, alpha: Array, psi: float | None = None, f: Array | None = None) -> None:
        if psi is None or f is None:
            psi, f = self._psi(alpha)
        self.alpha, self.f, self.psi = alpha, f, psi
        self._derivs: tuple[Array, Array, Array] | None = None
        self._algebra: DiagonalSiteAlgebra | None = None

    def set_kernel_matrix(self, K: Array) -> None:
        """New prior covariance ``K [N, N]``; warm start from the current alpha or from zero."""
        self.K = self._check_K(K, self.y.shape[0])
        psi_warm, f_warm = self._psi(self.alpha)
        zero = np.zeros_like(self.alpha)
        psi_zero, f_zero = self._psi(zero)
        if psi_warm >= psi_zero:
            self._set_alpha(self.alpha, psi_warm, f_warm)
        else:
            self._set_alpha(zero, psi_zero, f_zero)
        self.n_steps = 0
        self.last_change = np.inf
        self._converged = False

    # -- quantities at the current f ---------------------------------------------------------
    def derivatives(self) -> tuple[Array, Array, Array]:
        """Derivatives 1-3 of ``log p(y | f)`` (times the weights) wrt ``f`` at the current
        ``f``, ``[N]`` each."""
        if self._derivs is None:
            d = self.likelihood.log_prob_derivatives(self.y, self.f, order=3)
            d1, d2, d3 = (np.asarray(v, dtype=float) for v in d[:3])
            if self.weights is not None:
                d1, d2, d3 = (self.weights * v for v in (d1, d2, d3))
            for name, v in (("first", d1), ("second", d2), ("third", d3)):
                if not np.all(np.isfinite(v)):
                    raise NumericalError(
                        f"{name} derivative of log p(y|f) is not finite at the current mode",
                        iteration=self.n_steps, quantity=f"d{name[0]} log p",
                    )
            self._derivs = (d1, d2, d3)
        return self._derivs

    @property
    def w(self) -> Array:
        """Curvatures ``w = -d2 log p(y | f) [N]`` at the current ``f``."""
        return -self.derivatives()[1]

    @property
    def algebra(self) -> DiagonalSiteAlgebra:
        """The B-trick for ``K`` and ``w`` at the current ``f`` (cached until ``f`` moves)."""
        if self._algebra is None:
            self._algebra = DiagonalSiteAlgebra.from_kernel_matrix(
                self.K, self.w, iteration=self.n_steps
            )
        return self._algebra

    def log_evidence(self) -> float:
        """``log Z_LA = sum log p(y|f) - 1/2 alpha^T f - 1/2 log|B|`` at the current ``f``."""
        return self.psi - 0.5 * self.algebra.log_det_B

    # -- updates -----------------------------------------------------------------------------
    def update(self, damping: float = 1.0, iteration: int = 0, *,
               batch: Array | None = None) -> float:
        """One safeguarded Newton step whose first trial length is ``damping`` (1: the full
        Newton step); returns ``|Delta Psi|``."""
        if batch is not None:
            raise InputError("the Laplace approximation has no mini-batch mode (batch: None)")
        it = self.n_steps + 1
        g, _, _ = self.derivatives()
        alg = self.algebra
        b = alg.w * self.f + g
        d = alg.posterior_solve(b) - self.alpha
        eta, psi_old = float(damping), self.psi
        slack = PSI_ROUNDOFF * max(1.0, abs(psi_old))
        for _ in range(MAX_HALVINGS):
            alpha_try = self.alpha + eta * d
            psi_try, f_try = self._psi(alpha_try, iteration=it)
            if psi_try >= psi_old - slack:
                break
            eta *= 0.5
        else:  # no step increases Psi: we are at the mode to working precision
            self.n_steps = it
            self.last_change, self.last_step_size, self._converged = 0.0, 0.0, True
            return 0.0
        self._set_alpha(alpha_try, psi_try, f_try)
        self.n_steps = it
        self.last_change = abs(psi_try - psi_old)
        self.last_step_size = eta
        self._converged = self.last_change <= self.tol
        return self.last_change

    def run(self, max_steps: int | None = None) -> int:
        """Newton steps until converged or ``max_steps`` (default ``max_newton``) on the inner
        site schedule; the count."""
        if self._converged:
            return 0
        limit = self.max_newton if max_steps is None else int(max_steps)
        return InnerSchedule(tol=self.tol, max_updates=limit).run(self).updates

    def snapshot(self) -> Array:
        return self.alpha.copy()

    def restore(self, snapshot: object) -> None:
        self._set_alpha(np.array(snapshot, dtype=float))

    @property
    def converged(self) -> bool:
        return self._converged

    def stationarity(self) -> float:
        """``max |alpha - g(f)|``, zero at the mode (spec binary §7.5 item 17)."""
        return float(np.max(np.abs(self.alpha - self.derivatives()[0]), initial=0.0))

    # -- prediction --------------------------------------------------------------------------
    def posterior(self, kernel: Kernel | None = None, X: Array | None = None) -> DenseSitePosterior:
        """``q(f) = N(K alpha, (K^-1 + W)^-1)`` for prediction (needs ``kernel``, ``X [N, D]``)."""
        kernel = kernel if kernel is not None else self.kernel
        X = X if X is not None else self.X
        if kernel is None or X is None:
            raise ValueError("LaplaceSites.posterior needs the kernel and training inputs X")
        return self.algebra.posterior(self.likelihood, kernel, X, self.alpha.copy())
