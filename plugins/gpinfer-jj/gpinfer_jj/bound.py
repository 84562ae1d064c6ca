"""The collapsed JJ / Taylor bound as a function of the packed hyper-parameters and ``xi``.

Spec jj-taylor-svi §2.6-2.8. ``CollapsedObjective`` owns the data, the signs, the kernel and the
inducing inputs (through ``gpinfer.hyper.HyperParameters``) and gives ``F`` with its gradient
with respect to ``theta [P]`` and, for the hybrid/full variants, ``xi [N]``.

Cost at large ``N`` (``O(N M^2)`` per evaluation): the factors ``L_K, R = L_K^-1 Kuf`` (the
inducing geometry ``StackedTerms``: ``L``, ``A``; ``quadratic.inducing_factors``) are kept for the
last kernel parameters (``xi`` moves at every hybrid evaluation, they only with
``theta``) and the last bound for the last ``xi``, so that Stage 1, the first L-BFGS-B
evaluation and ``q(u)`` after Stage 2 reuse them; the ``[N, M]`` arrays are recycled; for the
isotropic RBF (+ White) kernel the ``Kuf`` part of the kernel VJP is two contractions of
``dF/dKuf`` (``CollapsedBound.kuf_contraction``), never the ``[M, N]`` matrix itself.
"""

from __future__ import annotations

import numpy as np

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import Array, Likelihood, SiteState
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.fixed import FixedInputs, fixed_groups, generic_gradient, generic_matrices
from gpinfer.kernels.stacked import StackedCovariances, StackedKernels
from gpinfer.likelihoods.bernoulli import as_bernoulli
from gpinfer.posterior import InducingPosterior
from gpinfer.sites.stacked import StackedTerms
from gpinfer_jj.quadratic import (
    CollapsedBound,
    QuadraticCoefficients,
    inducing_factors,
    jj_coefficients,
    release,
    taylor_coefficients,
)

KINDS = ("jj", "taylor")


class _WorkArrays:
    """Recycled ``[N, M]`` arrays for the kernel matrix ``Kuf`` and ``R`` of a factorisation.

    A new array of that size costs the kernel's page zeroing (about a quarter of the triangular
    solve that fills it) at every ``theta``. Ownership is explicit: ``CollapsedObjective``
    gives the arrays of the factorisation it replaces back only after ``quadratic.release``
    has made that factorisation unusable, so a factors object or bound kept from earlier kernel
    parameters fails loudly if used, instead of reading memory that now holds other numbers.
    """

    def __init__(self, shape: tuple[int, int]):
        self.shape = shape
        self._free: list[Array] = []

    def take(self) -> Array:
        return self._free.pop() if self._free else np.empty(self.shape)

    def give(self, arrays: tuple[Array, ...]) -> None:
        self._free.extend(a for a in arrays if a.shape == self.shape and a.flags.c_contiguous)


class CollapsedObjective:
    """``F(theta, xi)`` for ``X [N, D]``, signs ``s [N]``, one kernel and inducing inputs ``Z``.

    ``kind``: ``"jj"`` (logistic likelihood only) or ``"taylor"`` (any Bernoulli link).
    """

    def __init__(self, kind: str, X: Array, s: Array, kernel: Kernel, Z: Array,
                 likelihood: Likelihood, hp: HyperParameters):
        if kind not in KINDS:
            raise InputError(f"unknown quadratic-site kind {kind!r}; known: {KINDS}")
        bernoulli = as_bernoulli(likelihood, f"the {kind} sites")
        if kind == "jj" and not bernoulli.supports({"jaakkola_jordan"}):
            raise InputError(
                f"the Jaakkola-Jordan bound needs the logistic likelihood ('logit'); got "
                f"{type(likelihood).__name__}"
            )
        link = bernoulli.link
        self.kind, self.X, self.s, self.kernel = kind, X, s, kernel
        self.labels = (s > 0).astype(np.int64)  # class indices [N] of the signs
        self.likelihood, self.link, self.hp = likelihood, link, hp
        self.n_eval = 0
        # fixed Z, only kernel parameters learned: cached distances and a fused kernel VJP
        free = set(hp.names)
        kernel_names = [f"kernel.{p}" for p in kernel.param_names]
        self._fast = (hp.n_latent == 1 and not hp.inducing_is_free(0)
                      and free <= set(kernel_names))
        self._kernel_free = np.array([n in free for n in kernel_names], dtype=bool)
        # the one latent's cached inputs and batched kernels (``None``: off the fast path)
        group = fixed_groups([kernel], [Z], X)[0] if self._fast else None
        self._inputs: FixedInputs | None = None if group is None else group[1]
        self._family: StackedKernels | None = None if group is None else group[2]
        #: the covariances of the last factors (the fixed-input mode; read by the VJP)
        self._cov: StackedCovariances | None = None
        # the factors of the last kernel parameters and Z, and the last bound built on them:
        # xi moves at every hybrid evaluation but the kernel matrices, L_K and R only with theta,
        # and Stage 1, the first L-BFGS-B evaluation and q(u) after Stage 2 revisit a point
        self._factors: StackedTerms | None = None
        self._factors_key: tuple[bytes, bytes] | None = None
        self._bound: CollapsedBound | None = None
        self._bound_xi: Array | None = None
        self._work = _WorkArrays((X.shape[0], Z.shape[0]))
        self._buffers: tuple[Array, ...] = ()  # the arrays the current factors live in

    @property
    def Z(self) -> Array:
        """The inducing inputs ``[M, D]`` (``hp.Z[0]``, always set here)."""
        Z = self.hp.Z
        if Z is None:
            raise ValueError("the collapsed bound's hyper-parameters hold no inducing inputs")
        return Z[0]

    def coefficients(self, xi: Array) -> QuadraticCoefficients:
        if self.kind == "jj":
            return jj_coefficients(xi, self.s)
        return taylor_coefficients(xi, self.s, self.link)

    def _parameters_key(self) -> tuple[bytes, bytes]:
        return (np.asarray(self.kernel.get_unconstrained(), dtype=float).tobytes(),
                np.asarray(self.Z, dtype=float).tobytes())

    def factors(self) -> StackedTerms:
        """Kernel matrices and their factorisation at the current hyper-parameters (the last
        ones are kept: computed again only when the kernel parameters or ``Z`` changed)."""
        key = self._parameters_key()
        if self._factors is not None and key == self._factors_key:
            return self._factors
        if self._factors is not None:  # its arrays are reused below: no use of it from now on
            release(self._factors)
            self._work.give(self._buffers)
        self._factors = self._bound = self._bound_xi = None
        kuf_rows, r_rows = self._work.take(), self._work.take()
        self._cov = None  # released first: its arrays freed before new ones are formed
        if self._family is not None:
            assert self._inputs is not None
            cov = self._cov = self._family.fixed_covariances(self._inputs, out=kuf_rows.T)
            matrices = (cov.Kuu[0], cov.Kuf[0], cov.Kff_diag[0])
        else:  # the kernel's own matrices (``Z`` equal to the cached inputs' where fixed)
            matrices = generic_matrices(self.kernel, self.Z, self.X)
        fac = inducing_factors(*matrices, work=r_rows)
        self._factors, self._factors_key, self._buffers = fac, key, (kuf_rows, r_rows)
        return fac

    def bound(self, xi: Array, factors: StackedTerms | None = None) -> CollapsedBound:
        """The bound at ``xi`` (the last one is kept and returned again for the same ``xi`` and
        factors)."""
        fac = self.factors() if factors is None else factors
        last, last_xi = self._bound, self._bound_xi
        if (fac is self._factors and last is not None and last.factors is fac
                and last_xi is not None and np.array_equal(last_xi, xi)):
            return last
        b = CollapsedBound(fac, self.coefficients(xi))
        if fac is self._factors:
            self._bound, self._bound_xi = b, np.array(xi, dtype=float)
        return b

    def xi_rule(self, mean: Array, var: Array) -> Array:
        """Stage-1 ``xi``: ``sqrt(m^2 + S^2)`` (JJ, eq. 15) or ``m`` (Taylor rule, §2.5)."""
        return np.sqrt(mean**2 + var) if self.kind == "jj" else mean.copy()

    def value_and_grad(self, theta: Array, xi: Array, with_xi: bool = False
                       ) -> tuple[float, Array]:
        """``F`` and ``dF/dtheta [P]`` (with ``with_xi``: ``[P + N]``, ``dF/dxi`` appended)."""
        self.n_eval += 1
        self.hp.unpack(theta)
        b = self.bound(xi)
        cov = self._cov
        D_uf = None if cov is None or cov.fixed is None else cov.fixed.D_uf
        if cov is not None and D_uf is not None:
            # the isotropic RBF VJP needs two contractions of dF/dKuf, not the [M, N] matrix;
            # the pass over the data that gives the one with the distances also gives S2_hat
            s_ell = b.kuf_contraction(D_uf, marginals=with_xi)
            s_var = b.kuf_contraction(None)
            grad = cov.vjp_fixed([b.kuu_gradient()], None, [-b.coef.gamma],
                                 Kuf_sums=np.array([[s_var, s_ell]]))[0][self._kernel_free]
        elif cov is not None:
            G = b.matrix_gradients()
            dKuu, dKuf, dKff = (None if a is None else [a] for a in (G.Kuu, G.Kuf, G.Kff_diag))
            grad = cov.vjp_fixed(dKuu, dKuf, dKff)[0][self._kernel_free]
        elif self._inputs is not None:
            G = b.matrix_gradients()
            grad = generic_gradient(self.kernel, self._inputs.Z, self._inputs.X, G.Kuu, G.Kuf,
                                    G.Kff_diag)[self._kernel_free]
        else:
            grad = parameter_gradient(self.hp, self.X, b.matrix_gradients())
        xi_grad = b.xi_gradient() if with_xi else None
        if with_xi:
            grad = np.concatenate([grad, xi_grad])
        return b.value, grad

    def posterior(self, xi: Array) -> InducingPosterior:
        """``q(u) = (mu_hat, Sigma_hat)(xi; theta)`` at the current hyper-parameters (§2.11)."""
        b = self.bound(xi)
        return InducingPosterior(self.likelihood, [self.kernel.copy()], [self.Z.copy()],
                                 [b.mu_hat], [b.Sigma_hat])


class XiSites(SiteState):
    """Stage 1's sites at fixed ``theta`` (spec jj-taylor-svi §2.5, Alg. 1): the expansion
    points ``xi [N]`` of ``objective``'s quadratic sites and the closed-form ``q(u)`` they
    give. One ``update`` is one round: ``xi`` from the current marginals (``xi_rule``; a
    ``damping`` below 1 mixes it with the last ``xi``), then the bound at it and its marginals
    ``m_hat, S2_hat``; it returns ``max|Delta xi|`` (``inf`` on the first round).

    ``mean, var [N]``: the marginals the first round starts from; ``factors``: the bound's
    factors at the current ``theta``. After a run: ``xi`` and ``bound`` (the last round's)."""

    def __init__(self, objective: CollapsedObjective, factors: StackedTerms, mean: Array,
                 var: Array):
        self.objective, self.factors = objective, factors
        self.mean, self.var = mean, var
        self.xi: Array | None = None
        self.bound: CollapsedBound | None = None

    def update(self, damping: float, iteration: int) -> float:
        xi = self.objective.xi_rule(self.mean, self.var)
        last = self.xi
        if damping < 1.0 and last is not None:
            xi = (1.0 - damping) * last + damping * xi
        b = self.objective.bound(xi, self.factors)
        # S2_hat before m_hat: the pass over R that gives the variances gives the means too
        self.var, self.mean = b.S2_hat, b.m_hat
        self.xi, self.bound = xi, b
        return float("inf") if last is None else float(np.max(np.abs(xi - last), initial=0.0))
