"""The collapsed JJ / Taylor bound as a function of the packed hyper-parameters and ``xi``.

Spec jj-taylor-svi §2.6-2.8. ``CollapsedObjective`` owns the data, the signs, the kernel and the
inducing inputs (through ``gpinfer.hyper.HyperParameters``) and gives ``F`` with its gradient
with respect to ``theta [P]`` and, for the hybrid/full variants, ``xi [N]``.
"""

from __future__ import annotations

import numpy as np

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.inducing import FixedInputCovariances
from gpinfer.interfaces import Array, Likelihood
from gpinfer.kernels.base import Kernel
from gpinfer.posterior import InducingPosterior
from gpinfer.sites.quadratic import (
    CollapsedBound,
    InducingFactors,
    QuadraticCoefficients,
    jj_coefficients,
    taylor_coefficients,
)

KINDS = ("jj", "taylor")


class CollapsedObjective:
    """``F(theta, xi)`` for ``X [N, D]``, signs ``s [N]``, one kernel and inducing inputs ``Z``.

    ``kind``: ``"jj"`` (logistic likelihood only) or ``"taylor"`` (any Bernoulli link).
    """

    def __init__(self, kind: str, X: Array, s: Array, kernel: Kernel, Z: Array,
                 likelihood: Likelihood, hp: HyperParameters):
        if kind not in KINDS:
            raise InputError(f"unknown quadratic-site kind {kind!r}; known: {KINDS}")
        link = getattr(likelihood, "link", None)
        if kind == "jj" and getattr(likelihood, "name", "") != "logit":
            raise InputError(
                f"the Jaakkola-Jordan bound needs the logistic likelihood ('logit'); got "
                f"{type(likelihood).__name__}"
            )
        if kind == "taylor" and link is None:
            raise InputError(
                f"the Taylor sites need a Bernoulli likelihood with a link; got "
                f"{type(likelihood).__name__}"
            )
        self.kind, self.X, self.s, self.kernel = kind, X, s, kernel
        self.likelihood, self.link, self.hp = likelihood, link, hp
        self.n_eval = 0
        # fixed Z, only kernel parameters learned: cached distances and a fused kernel VJP
        free = set(hp.names)
        kernel_names = [f"kernel.{p}" for p in kernel.param_names]
        self._fast = (hp.n_latent == 1 and not hp.inducing_is_free(0)
                      and free <= set(kernel_names))
        self._kernel_free = np.array([n in free for n in kernel_names], dtype=bool)
        self._cov = FixedInputCovariances(kernel, Z, X) if self._fast else None

    @property
    def Z(self) -> Array:
        return self.hp.Z[0]

    def coefficients(self, xi: Array) -> QuadraticCoefficients:
        if self.kind == "jj":
            return jj_coefficients(xi, self.s)
        return taylor_coefficients(xi, self.s, self.link)

    def factors(self) -> InducingFactors:
        """Kernel matrices and their factorisation at the current hyper-parameters."""
        if self._cov is not None:
            return InducingFactors(*self._cov.matrices())
        return InducingFactors(self.kernel.K(self.Z), self.kernel.K(self.Z, self.X),
                               self.kernel.K_diag(self.X))

    def bound(self, xi: Array, factors: InducingFactors | None = None) -> CollapsedBound:
        return CollapsedBound(factors or self.factors(), self.coefficients(xi))

    def xi_rule(self, mean: Array, var: Array) -> Array:
        """Stage-1 ``xi``: ``sqrt(m^2 + S^2)`` (JJ, eq. 15) or ``m`` (Taylor rule, §2.5)."""
        return np.sqrt(mean**2 + var) if self.kind == "jj" else mean.copy()

    def value_and_grad(self, theta: Array, xi: Array, with_xi: bool = False
                       ) -> tuple[float, Array]:
        """``F`` and ``dF/dtheta [P]`` (with ``with_xi``: ``[P + N]``, ``dF/dxi`` appended)."""
        self.n_eval += 1
        self.hp.unpack(theta)
        b = self.bound(xi)
        G = b.matrix_gradients()
        if self._cov is not None:
            grad = self._cov.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag)[self._kernel_free]
        else:
            grad = parameter_gradient(self.hp, self.X, G)
        if with_xi:
            grad = np.concatenate([grad, b.xi_gradient()])
        return b.value, grad

    def posterior(self, xi: Array) -> InducingPosterior:
        """``q(u) = (mu_hat, Sigma_hat)(xi; theta)`` at the current hyper-parameters (§2.11)."""
        b = self.bound(xi)
        return InducingPosterior(self.likelihood, [self.kernel.copy()], [self.Z.copy()],
                                 [b.mu_hat], [b.Sigma_hat])
