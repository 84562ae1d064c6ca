"""Class-batched inducing-space algebra: the per-class matrices of ``gpinfer.sites.inducing``
stacked over the ``C`` latents, one BLAS call per operation across classes.

The multi-class sparse methods keep one inducing set, one ``Kuu`` and one Gaussian per class,
and repeat the same ``O(M^3 + M^2 n)`` algebra for every class. Here that algebra is written
once on stacks: ``L [C, M, M]`` (chol of ``Kuu``), ``A [C, M, n]`` (``L^-1 Kuf``), site sums
``P_w [C, M, M]``, ``h_w [C, M]`` in whitened coordinates. Each factor is computed once per
class per step (one stacked LAPACK call); the triangular solves run as one BLAS ``trsm`` per
class on views of the stacks, except the step's six with ``L``, which numpy does by products
with ``L^-1`` (``StackedTerms.L_inv``, one ``trtri``); products with a triangular factor
(``L^T Lam L``, ``L^-T S L^-1``, ``L^-1 Kuf``) run as ``trmm`` on numpy
(``ops.tri_matmul``), and ``B^-1`` comes from LAPACK ``potri`` once per Gaussian. (SEP's
evaluation on numpy takes the cavity's ``B^-1 A`` as one product with its ``B^-1``
(``paired_by_inverse``: at ``M = 200`` one ``potri`` and one product cost less than the
two ``trsm`` of ``[M, n]`` with ``L_B``); the update's cavity keeps its one ``trsm``,
cheaper than ``trtri`` or ``potri`` and a product.) Results equal the
per-class code of ``gpinfer.sites.inducing`` to round-off (tests/sites/test_stacked.py).

The functions take arrays of any array-API namespace (numpy, or torch on a CPU or GPU:
``gpinfer.backend``); what the standard lacks (stacked triangular solves, Cholesky with a
failure report, ``potri``, ``einsum``) is mapped once in ``gpinfer.backend.ops``, where numpy
keeps its tuned BLAS/LAPACK calls.

Symbols as in ``gpinfer.sites.inducing``: ``B = I + a P_w = L_B L_B^T`` for a scale ``a`` per
class (1 for ``q``, the cavity fraction for SEP's cavity), ``w = B^-1 a h_w``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.compile import compilable
from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.stacked import (
    StackedCovariances,
    StackedKernels,
    StackedMatrixGradients,
)
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer.sites.inducing import inducing_jitter, site_factor


def transpose(X: Array) -> Array:
    """The last two axes swapped (a view): ``[C, a, b] -> [C, b, a]``."""
    return ops.mT(X)


def symmetrize(X: Array) -> Array:
    """``(X + X^T) / 2`` over the last two axes, ``X [..., M, M]`` (``ops.symmetrize``: on a
    device one operator)."""
    return ops.symmetrize(X)


def cho_inverse_stack(LB: Array, *, overwrite: bool = False) -> Array:
    """``(L_B L_B^T)^-1`` ``[C, M, M]`` from lower factors ``LB [C, M, M]`` (LAPACK ``potri``
    on numpy); ``overwrite``: the caller owns ``LB`` and reads it no more (numpy may invert it
    in place: ``ops.cho_inverse``)."""
    out, failed = ops.cho_inverse(LB, overwrite=overwrite)
    if failed:
        raise NumericalError("singular Cholesky factor", quantity="B")
    return out


@dataclass(eq=False)  # identity: a use may key caches by its geometry (arrays do not compare)
class StackedTerms:
    """The inducing-space geometry: kernel quantities of every latent at inputs ``X [n, D]``.

    ``L [C, M, M]``: chol of ``Kuu`` (noise + jitter on the diagonal); ``A [C, M, n]``: whitened
    cross-covariances ``L^-1 Kuf``; ``s [C, n]``: FITC variances; ``L_inv``: ``L^-1`` where
    the backend solves a step's several systems with ``L`` by products
    (``ops.prefers_tri_inverse``), else ``None`` (one triangular solve each).

    The methods take any leading axes: one latent's terms are the same class over
    ``L [M, M]``, ``A [M, n]``, ``s [n]`` (``latent(c)``: views of latent ``c``;
    ``latent_terms`` builds one, ``stack`` stacks several).
    """

    L: Array
    A: Array
    s: Array
    L_inv: Array | None = None
    #: the kernel matrices at ``(Z, X)`` where a use keeps them (``None`` where not):
    #: ``Kuu [C, M, M]`` as given (without the jitter ``L`` may carry), ``Kuf [C, M, n]``,
    #: ``Kff_diag [C, n]``
    Kuu: Array | None = field(default=None, repr=False, compare=False)
    Kuf: Array | None = field(default=None, repr=False, compare=False)
    Kff_diag: Array | None = field(default=None, repr=False, compare=False)
    #: ``transpose(L)``, formed on first use (``L_T``) and kept: one view for every ``L^-T``
    #: solve of the step (an operator each on a device)
    _L_T: Array | None = field(default=None, init=False, repr=False, compare=False)

    #: ``transpose(A)``, formed on first use (``A_T``) and kept, as ``L_T``
    _A_T: Array | None = field(default=None, init=False, repr=False, compare=False)

    #: ``W = L^-T A``, formed on first use (``W``) and kept
    _W: Array | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def W(self) -> Array:
        """The ``u``-space directions ``W = Kuu^-1 Kuf = L^-T A`` ``[C, M, n]`` (formed on
        first use, kept)."""
        if self._W is None:
            self._W = tri_solve(self.L, self.A, transpose=True)
        return self._W

    @property
    def L_T(self) -> Array:
        """``L^T`` ``[C, M, M]`` (a view of ``L``, kept)."""
        if self._L_T is None:
            self._L_T = transpose(self.L)
        return self._L_T

    @property
    def A_T(self) -> Array:
        """``A^T`` ``[C, n, M]`` (a view of ``A``, kept: the update's and the gradient's
        products share it)."""
        if self._A_T is None:
            self._A_T = transpose(self.A)
        return self._A_T

    def latent(self, c: int) -> StackedTerms:
        """Latent ``c``'s terms: ``L [M, M]``, ``A [M, n]``, ``s [n]`` (views; the kept
        kernel matrices too)."""
        def row(a: Array | None) -> Array | None:
            return None if a is None else a[c]

        return StackedTerms(L=self.L[c], A=self.A[c], s=self.s[c], L_inv=row(self.L_inv),
                            Kuu=row(self.Kuu), Kuf=row(self.Kuf), Kff_diag=row(self.Kff_diag))

    def latents(self) -> list[StackedTerms]:
        """``latent(c)`` for every latent ``c`` (views)."""
        return [self.latent(c) for c in range(self.L.shape[0])]

    def release(self) -> None:
        """Make the data-sized arrays unusable (``A``, a kept ``Kuf`` and their views): a use
        that reuses their memory for other numbers calls this first, and any later read of
        them fails (``TypeError``, ``AttributeError``)."""
        self.A = self.Kuf = None  # type: ignore[assignment]
        self._A_T = self._W = None

    @classmethod
    def stack(cls, latents: Sequence[StackedTerms]) -> StackedTerms:
        """One latent's terms each (``L [M, M]``, ``A [M, n]``, ``s [n]``) stacked over the
        latents (``L_inv`` where every latent has one; kept kernel matrices are not
        stacked)."""
        xp = ops.namespace(latents[0].L)
        invs = [t.L_inv for t in latents]
        return cls(L=xp.stack([t.L for t in latents]), A=xp.stack([t.A for t in latents]),
                   s=xp.stack([t.s for t in latents]),
                   L_inv=None if any(i is None for i in invs) else xp.stack(invs))

    def to_whitened(self, Lam: Array, h: Array, *, symmetric: bool = True
                    ) -> tuple[Array, Array]:
        """``(L^T Lam L [C, M, M], L^T h [C, M])`` from ``u``-space site sums (two triangular
        products: ``ops.tri_matmul``); ``symmetric=False``: the products as they come, not
        symmetrised (for a caller that symmetrises what it makes of them)."""
        LamL = ops.tri_matmul(self.L, Lam, right=True)
        LtLamL = ops.tri_matmul(self.L, LamL, transpose=True, overwrite=True, T_T=self.L_T)
        hL = ops.vecmat(h, self.L)  # (L^T h)^T = h^T L
        return (symmetrize(LtLamL) if symmetric else LtLamL), hL

    def to_u_space(self, P_w: Array, h_w: Array) -> tuple[Array, Array]:
        """Inverse of ``to_whitened``: ``(L^-T P_w L^-1, L^-T h_w)``."""
        return self.sandwich(P_w), self.unwhiten(h_w[..., None])[..., 0]

    def sandwich(self, S: Array, *, overwrite: bool = False) -> Array:
        """``L^-T S L^-1`` ``[C, M, M]`` for symmetric ``S [C, M, M]`` (symmetrised);
        ``overwrite``: the caller owns ``S`` and reads it no more (numpy's products with
        ``L^-1`` then run in place on it: no ``[C, M, M]`` copy)."""
        if self.L_inv is not None:  # symmetrised in place: the products' own array
            return ops.symmetrize_(ops.tri_matmul(
                self.L_inv, self.unwhiten(S, overwrite=overwrite), right=True, overwrite=True))
        T = ops.solve_triangular(self.L, S, transpose=True, L_T=self.L_T, overwrite=overwrite)
        # (L^-T S) L^-1: one solve from the right (numpy: L^-T T^T on a C-ordered copy of T^T,
        # transposed back; the symmetrised values are the same either way)
        return symmetrize(ops.solve_triangular(self.L, T, right=True))

    def unwhiten(self, X: Array, *, overwrite: bool = False) -> Array:
        """``L^-T X`` ``[C, M, k]`` (whitened-space gradients to ``u``-space); ``overwrite``:
        the caller owns ``X`` and reads it no more (it may be written in place)."""
        if self.L_inv is not None:
            return ops.tri_matmul(self.L_inv, X, transpose=True, overwrite=overwrite)
        return ops.solve_triangular(self.L, X, transpose=True, L_T=self.L_T, overwrite=overwrite)


def stacked_covariances(kernels: Sequence[Kernel], Zs: Sequence[Array] | Array, X: Array
                        ) -> tuple[Array, Array, Array]:
    """``(Kuu [C, M, M], Kuf [C, M, n], Kff_diag [C, n])`` of the class kernels with inducing
    inputs ``Zs`` (``[M, D]`` each, or one stack ``[C, M, D]``) at ``X [n, D]``, without
    jitter: one batched computation when the kernels share a family
    (``gpinfer.kernels.stacked``), else one per class."""
    family = StackedKernels.of(kernels)
    xp = ops.namespace(X)
    if family is not None:
        Z = xp.stack(list(Zs)) if isinstance(Zs, list | tuple) else cast(Array, Zs)
        cov = family.covariances(Z, X)
        return cov.Kuu, cov.Kuf, cov.Kff_diag
    return (xp.stack([k.K(Z) for k, Z in zip(kernels, Zs)]),
            xp.stack([k.K(Z, X) for k, Z in zip(kernels, Zs)]),
            xp.stack([k.K_diag(X) for k in kernels]))


def stacked_terms(kernels: Sequence[Kernel], Zs: Sequence[Array] | Array, X: Array, *,
                  jitter: float | None = None, iteration: int | None = None,
                  covariances: StackedCovariances | None = None) -> StackedTerms:
    """``StackedTerms`` of the class kernels with inducing inputs ``Zs[c] [M, D]`` (or one
    stack ``[C, M, D]``) at ``X [n, D]`` (arrays of one namespace).

    As ``latent_terms`` for every class: ``Kuu = k(Z) + jitter I``,
    ``kappa = k_diag(X) + jitter``, ``s`` floored at ``jitter`` (None: ``inducing_jitter`` of
    the inputs' dtype). ``covariances``: the kernels' batched covariances at ``(Zs, X)``
    already computed (``HyperParameters.covariances``, shared with the gradient's VJPs);
    otherwise ``stacked_covariances``. Of the given covariances ``Kuf`` is taken over
    (``StackedCovariances.take_Kuf``: ``A`` is solved in place of it on numpy, and the
    covariances refuse a later ``Kuf`` read); ``Kuu`` and ``Kff_diag`` are left unchanged
    (``Kuu`` plus the jitter is a new array, factorised in place: ``jittered_cholesky``'s
    ``again``).
    """
    jitter = inducing_jitter(X) if jitter is None else jitter
    again: Callable[[], Array] | None = None
    if covariances is not None:
        Kuf, Kff_diag = covariances.take_Kuf(), covariances.Kff_diag
        # a new array (the shared covariances stay), factorised in place: formed again from
        # the shared Kuu where the rare jitter escalation needs its values
        again = partial(ops.plus_diagonal, covariances.Kuu, jitter)
        Kuu = again()
    else:
        Kuu, Kuf, Kff_diag = stacked_covariances(kernels, Zs, X)
        ops.add_diagonal(Kuu, jitter)
    L = jittered_cholesky(Kuu, name="Kuu", iteration=iteration, again=again).L
    L_inv = ops.tri_inverse(L) if ops.prefers_tri_inverse(L) else None
    # Kuf is this function's own (taken over, or formed here): A in place of it
    A = (ops.solve_triangular(L, Kuf, overwrite=True) if L_inv is None
         else ops.tri_matmul(L_inv, Kuf, overwrite=True))
    s = Kff_diag + jitter
    s -= ops.einsum("cmn,cmn->cn", A, A)
    return StackedTerms(L=L, A=A, s=ops.clip_below(s, jitter), L_inv=L_inv)


def latent_terms(kernel: Kernel, Z: Array, X: Array, *, jitter: float | None = None,
                 iteration: int | None = None) -> StackedTerms:
    """One latent's ``StackedTerms`` (``L [M, M]``, ``A [M, n]``, ``s [n]``) of ``kernel``
    with inducing inputs ``Z [M, D]`` at ``X [n, D]`` (numpy; gfitc's per-class terms).

    ``Kuu = kernel.K(Z) + jitter I`` (a ``White`` term adds its noise there); ``Kuf`` never gets
    noise; ``kappa = kernel.K_diag(X) + jitter``; ``s`` floored at ``jitter`` (None:
    ``inducing_jitter`` of ``X``'s dtype). ``NumericalError`` if ``Kuu`` cannot be factorised.
    """
    jitter = inducing_jitter(X) if jitter is None else jitter
    Kuu = kernel.K(Z) + jitter * np.eye(Z.shape[0])
    L = jittered_cholesky(Kuu, name="Kuu", iteration=iteration).L
    A = tri_solve(L, kernel.K(Z, X))
    s = kernel.K_diag(X) + jitter - np.sum(A * A, axis=0)
    return StackedTerms(L=L, A=A, s=np.maximum(s, jitter))


class Scales(NamedTuple):
    """The factors ``a`` of ``StackedGaussians`` in the shapes they broadcast in:
    ``matrix [..., 1, 1]`` (times ``P_w``) and ``vector [..., 1]`` (times ``h_w``), kept
    constants (``scales``): no reshape operator per use."""

    matrix: Array
    vector: Array


def scales(ref: Array, values: tuple[float, ...], lead: tuple[int, ...]) -> Scales:
    """``Scales`` of the host ``values`` (``lead`` = ``(C,)``, or ``(2, C)`` for
    ``StackedGaussians.paired``) on ``ref``'s backend (on a device moved once and kept)."""
    return Scales(ops.constant(ref, values, (*lead, 1, 1)), ops.constant(ref, values, (*lead, 1)))


def finite_sums(P_w: Array, h_w: Array, iteration: int | None = None) -> None:
    """``NumericalError`` (quantity ``"B"``, ``site_factor``'s) unless the whitened sums
    ``P_w [C, M, M]``, ``h_w [C, M]`` are finite: one check for every ``StackedGaussians`` of
    them (``B = I + a P_w`` is finite for a finite ``a`` in ``[0, 1]`` when ``P_w`` is)."""
    if not ops.all_finite(P_w, h_w):
        raise NumericalError("site sums are not finite", iteration=iteration, quantity="B")


class StackedGaussians:
    """``q_c(u) = N(L w_c, L B_c^-1 L^T)`` for every class, ``B_c = I + a_c P_w[c]``.

    ``P_w [C, M, M]``, ``h_w [C, M]`` whitened site sums; ``scale [C]`` the factors ``a_c``
    (``None``: 1), or ``Scales`` of them (with leading axes ``[2, C]``: both Gaussians of
    ``paired`` in one stack). ``NumericalError`` (quantity ``"B"``) when some ``B_c`` is not
    positive definite. ``inverse``: ``B^-1`` formed at once (numpy ``potri``) and the means
    ``w = B^-1 (a h_w)`` one product with it, for a caller that reads ``B_inv`` anyway (where
    the two triangular solves per class of ``B_inv_vec`` would cost more; equal to
    round-off). ``means=False``: the factors only, ``w`` left to the caller. ``finite``: the
    caller checked ``P_w`` and ``h_w`` finite (``finite_sums``: one check for every Gaussian of
    the same sums); numpy then factorises ``B`` without a second check. ``prior``: the prior
    precision ``Q [M, M]`` of the coordinates the sums are in, where they are not whitened on
    the step's own factor (``Frame``: ``B_c = Q + a_c P_w[c]``; ``None``: ``Q = I``).
    ``consume`` (numpy, with ``inverse``): ``B^-1`` formed in place of the factors
    (``ops.cho_inverse(overwrite=True)``: no ``[C, M, M]`` copy; their log-determinants taken
    first, for ``log_norm_ratio``), for a caller that reads no ``LB`` afterwards (``LB`` then
    raises ``ValueError``).
    """

    _LB: Array | None

    def __init__(self, P_w: Array, h_w: Array, scale: Array | Scales | None = None, *,
                 iteration: int | None = None, inverse: bool = False, means: bool = True,
                 finite: bool = False, prior: Array | None = None, consume: bool = False):
        self._make_h_w: Callable[[], Array] | None = None  # a view's (``_view``)
        self._B_inv_sum: Array | None = None
        self._log_det: Array | None = None  # sum log diag(L_B) [...], where taken early
        if scale is None:  # a = 1: no product
            def make_B() -> Array:
                return ops.plus_diagonal(P_w, 1.0) if prior is None else P_w + prior
            self._h_w: Array | None = h_w
        else:
            if isinstance(scale, Scales):
                a_matrix, a_vector = scale
            else:
                a = ops.like(P_w, scale)  # (a device's own array: itself)
                a_matrix, a_vector = ops.namespace(a).reshape(a, (-1, 1, 1)), a[:, None]

            def make_B() -> Array:
                if prior is None:
                    return ops.scaled_plus_diagonal(a_matrix, P_w, 1.0)
                B = a_matrix * P_w
                B += prior
                return B
            self._h_w = a_vector * h_w
        # a new B, factorised in place (formed again where a failure is diagnosed)
        self.LB = site_factor(make_B(), h_w, iteration=iteration, again=make_B,
                              finite=finite).L
        self._LB_T: Array | None = None  # formed on first use (``B_inv_vec``'s solve)
        self._B_inv: Array | None = None
        if consume and inverse:  # B^-1 in place of L_B, its log|.| kept
            self._B_inv = cho_inverse_stack(self._consumed_factors(), overwrite=True)
        self.w: Array
        if not means:  # the caller sets ``w`` (``_inverted_pair``)
            return
        if not inverse:
            self.w = self.B_inv_vec(self.h_w)
        else:
            self.w = ops.matvec(self.B_inv(), self.h_w)

    @classmethod
    def paired(cls, P_w: Array, h_w: Array, pair: Scales, *, iteration: int | None = None
               ) -> tuple[StackedGaussians, StackedGaussians, Array]:
        """``(q, cav, log_norm_ratio [2, C])``: the Gaussians of the site sums ``P_w``,
        ``h_w`` with scale 1 (``q``) and with the cavity scales ``a [C]`` (``cav``), and
        their log-norm ratios (row 0: ``q``'s), from ``pair``, the ``Scales`` of
        ``(1, ..., 1, a_1, ..., a_C)`` with leading axes ``[2, C]``.

        Both live in one ``[2, C]`` stack: one Cholesky, one check, one ``B^-1`` (an
        evaluation reads ``q``'s in its gradients and, with a shared ``Z``, the cavity's)
        with the means one product with it (equal to round-off to the solves)
        and one log-norm ratio, and the two are views of it: the evaluation's form on a
        device. (numpy's evaluations invert in place of the factors instead, without stacks:
        ``paired_by_inverse``, ``shared_paired``; the two separate ``StackedGaussians`` this
        equals are the tests' oracle, tests/sites/test_stacked.py.)
        """
        both = cls(P_w, h_w, pair, iteration=iteration, inverse=True)
        (LB_q, LB_cav), (w_q, w_cav) = ops.unbind(both.LB), ops.unbind(both.w)
        B_inv_q, B_inv_cav = ops.unbind(both.B_inv())
        q = cls._view(LB_q, w_q, h_w, B_inv_q)
        cav = cls._view(LB_cav, w_cav, lambda: both.h_w[1], B_inv_cav)
        return q, cav, both.log_norm_ratio()

    @classmethod
    def _view(cls, LB: Array, w: Array, h_w: Array | Callable[[], Array], B_inv: Array
              ) -> StackedGaussians:
        """A ``StackedGaussians`` of given factors, means, shifts and inverses (views of a
        larger stack), its ``LB_T`` (and ``h_w`` where a callable is given) formed on first
        use."""
        out = cls.__new__(cls)
        out.LB, out.w, out._B_inv, out._LB_T, out._B_inv_sum = LB, w, B_inv, None, None
        out._log_det = None
        out._h_w, out._make_h_w = (None, h_w) if callable(h_w) else (h_w, None)
        return out

    @property
    def LB(self) -> Array:
        """The lower factors ``L_B [C, M, M]`` of ``B`` (``ValueError`` where ``consume``
        inverted them in place)."""
        if self._LB is None:
            raise ValueError("StackedGaussians: the factors were inverted in place (consume)")
        return self._LB

    @LB.setter
    def LB(self, value: Array) -> None:
        self._LB = value

    def _consumed_factors(self) -> Array:
        """``L_B [C, M, M]`` handed over to a caller that inverts it in place: its
        log-determinants kept first (for ``log_norm_ratio``), every later read of ``LB`` (and
        of what needs it) then refused (``consume``, ``_inverted_pair``)."""
        LB = self.LB
        self._log_det = self._log_det_of(LB)
        self._LB = None
        return LB

    @staticmethod
    def _log_det_of(LB: Array) -> Array:
        """``sum_m log L_B[..., m, m]`` ``[...]`` (half of each ``log|B|``)."""
        return ops.namespace(LB).sum(ops.namespace(LB).log(ops.diagonal(LB)), axis=-1)

    @property
    def h_w(self) -> Array:
        """The scaled whitened shifts ``a h_w`` ``[C, M]`` (a view's: formed on first
        use)."""
        if self._h_w is None:
            assert self._make_h_w is not None  # a view's: set by ``_view``
            self._h_w = self._make_h_w()
        return self._h_w

    @property
    def LB_T(self) -> Array:
        """``transpose(LB)``, formed on first use and kept: every ``L_B^-T`` solve shares
        it."""
        if self._LB_T is None:
            self._LB_T = transpose(self.LB)
        return self._LB_T

    def B_inv_vec(self, v: Array) -> Array:
        """``B^-1 v`` ``[C, M]`` for ``v [C, M]`` (two triangular solves: a device's
        ``cholesky_solve`` reads its LAPACK status on the host, a sync)."""
        half = ops.solve_triangular(self.LB, v[..., None])
        return ops.solve_triangular(self.LB, half, transpose=True, L_T=self.LB_T)[..., 0]

    def B_inv(self) -> Array:
        """``B^-1`` ``[C, M, M]`` (computed once)."""
        if self._B_inv is None:
            self._B_inv = cho_inverse_stack(self.LB)
        return self._B_inv

    def B_inv_sum(self) -> Array:
        """``sum_c B_c^-1`` ``[M, M]`` over the leading axis (of ``B_inv``, unless it was formed
        without it: ``shared_paired``)."""
        if self._B_inv_sum is None:  # (no read of LB: a consumed q has its B^-1)
            B_inv = self.B_inv()
            self._B_inv_sum = ops.namespace(B_inv).sum(B_inv, axis=0)
        return self._B_inv_sum

    def project(self, A: Array, *, means_by_point: bool = False,
                variances_by_point: bool = False) -> tuple[Array, Array, Array]:
        """Means ``mu = A^T w [C, n]``, variances ``v = ||L_B^-1 a||^2 [C, n]`` and
        ``R = L_B^-1 A [C, M, n]`` along whitened directions ``A [C, M, n]``.
        ``means_by_point`` (``variances_by_point``): ``mu`` (``v``) as ``[n, C]``, the
        transposed view of the same values (on a device the einsum's own output: no transpose
        operator). (numpy's evaluation takes ``B^-1 A`` in place of ``R``, from its pass of
        ``potri``: ``paired_by_inverse``.)"""
        R = ops.solve_triangular(self.LB, A)
        return (self._by_point("cmn,cm", A, self.w, means_by_point),
                self._by_point("cmn,cmn", R, R, variances_by_point), R)

    @staticmethod
    def _by_point(spec: str, x: Array, y: Array, by_point: bool) -> Array:
        """The einsum ``spec -> cn`` of ``x``, ``y``; ``by_point``: as ``[n, C]``
        (``ops.einsum_transposed``)."""
        if by_point:
            return ops.einsum_transposed(spec + "->cn", x, y)
        return ops.einsum(spec + "->cn", x, y)

    def log_norm_ratio(self) -> Array:
        """``G(q_c) - G(prior)`` per class ``[C]`` (spec ep-sep §2.6)."""
        log_det = self._log_det_of(self.LB) if self._log_det is None else self._log_det
        spec = "cm,cm->c" if self.w.ndim == 2 else "acm,acm->ac"  # [C], or [2, C] (paired)
        # b - a, the same value as -a + b (one operator fewer on a device)
        return ops.scaled_einsum(0.5, spec, self.w, self.h_w) - log_det

    def moments(self, L: Array) -> tuple[Array, Array]:
        """``(m [C, M], V [C, M, M])`` in ``u``-space given ``L [C, M, M] = chol(Kuu)``:
        ``m = L w``, ``V = L B^-1 L^T = T^T T`` with ``T = L_B^-1 L^T``."""
        T = ops.solve_triangular(self.LB, ops.copy(transpose(L)), overwrite=True)  # a fresh copy
        return (L @ self.w[..., None])[..., 0], transpose(T) @ T


def paired_by_inverse(P_w: Array, h_w: Array, pair: Scales, A: Array,
                      iteration: int | None = None
                      ) -> tuple[StackedGaussians, StackedGaussians, Array,
                                 tuple[Array, Array, Array]]:
    """numpy's per-class evaluation: ``(q, cav, log_norm_ratio [2, C], (mu [n, C], v [C, n],
    B_cav^-1 A [C, M, n]))``, what ``StackedGaussians.paired(P_w, h_w, pair)`` and the
    cavity's ``B^-1 A`` (one product with its ``B^-1``) give for ``A [C, M, n]``
    (``_inverted_pair``: neither Gaussian's factors kept, ``q``'s ``B^-1`` a stack, which the
    gradient reads)."""
    q, cav, lnr, BiA = _inverted_pair(P_w, h_w, pair, A, iteration, q_stack=True)
    by_point = StackedGaussians._by_point
    return q, cav, lnr, (by_point("cmn,cm", A, cav.w, True),
                         by_point("cmn,cmn", A, BiA, False), BiA)


def _inverted_pair(P_w: Array, h_w: Array, pair: Scales, A: Array, iteration: int | None, *,
                   q_stack: bool, prior: Array | None = None
                   ) -> tuple[StackedGaussians, StackedGaussians, Array, Array]:
    """numpy: ``(q, cav, log_norm_ratio [2, C], B_cav^-1 A [C, M, n])`` of the site sums
    ``P_w``, ``h_w`` (one finiteness check for both; ``pair`` as ``StackedGaussians.paired``'s,
    ``prior`` as ``StackedGaussians``'), with both Gaussians inverted in place of their factors
    (``LB`` of either then raises ``ValueError``; log-determinants taken first): the cavity's
    means and ``B^-1 A`` for ``A [M, n]`` shared or ``[C, M, n]`` per class in one pass over
    the classes (``ops.cho_inverse_terms(overwrite=True)``: ``potri``, then ``symv`` /
    ``symm`` on one triangle while it is in cache; no stack of ``B^-1``, no mirror; equal to
    round-off); ``q``'s ``B^-1`` a stack with ``q_stack`` (``consume``: the per-class gradient
    reads it), else its means and ``sum_c B_c^-1`` from the same pass (``B_inv_sum``: what
    the shared gradient reads; the same bits as summing the stack)."""
    finite_sums(P_w, h_w, iteration)  # one finiteness check for both
    q = StackedGaussians(P_w, h_w, iteration=iteration, inverse=q_stack, means=q_stack,
                         finite=True, prior=prior, consume=q_stack)
    cav = StackedGaussians(P_w, h_w, Scales(pair.matrix[1], pair.vector[1]),
                           iteration=iteration, means=False, finite=True, prior=prior)
    q_failed = False
    if not q_stack:
        q.w, _, q._B_inv_sum, q_failed = ops.cho_inverse_terms(
            q._consumed_factors(), q.h_w, summed=True, overwrite=True)
    cav.w, BiA, _, cav_failed = ops.cho_inverse_terms(cav._consumed_factors(), cav.h_w, A,
                                                      overwrite=True)
    if q_failed or cav_failed or BiA is None:
        raise NumericalError("singular Cholesky factor", iteration=iteration, quantity="B")
    return q, cav, np.stack([q.log_norm_ratio(), cav.log_norm_ratio()]), BiA


def cavity_moments(P_w: Array, h_w: Array, scale: Scales, A: Array,
                   iteration: int | None = None, *, prior: Array | None = None
                   ) -> tuple[Array, Array]:
    """``(mu [n, C], v [n, C])``: the means and variances along the whitened directions
    ``A [C, M, n]`` (or ``[M, n]`` shared by every class) of the ``C`` Gaussians
    ``StackedGaussians(P_w, h_w, scale)`` (``P_w [C, M, M]``, ``h_w [C, M]``;
    ``NumericalError`` as there), as ``project`` (``means_by_point``, ``variances_by_point``;
    equal to round-off), with ``R = L_B^-1 A``, ``z = L_B^-1 a h_w``: ``mu = R^T z``,
    ``v = colsum(R * R)``, where ``project`` needs ``w = B^-1 a h_w`` (one more solve per
    class) and ``mu = A^T w``. (The site update's cavity: it reads no ``w`` and no ``B^-1``.)
    ``prior``: as ``StackedGaussians``' (sums kept on an older factor: ``Frame``, with ``A``
    its directions ``Frame.A``)."""
    # L_B (the sums checked finite with B: "site sums are not finite"), a h_w
    g = StackedGaussians(P_w, h_w, scale, iteration=iteration, means=False, prior=prior)
    R, z = ops.solve_triangular_with(g.LB, A, g.h_w)  # numpy: one solve of [A, a h_w]
    by_point = StackedGaussians._by_point
    return by_point("cmn,cm", R, z, True), by_point("cmn,cmn", R, R, True)


@compilable
def stacked_matrix_gradients(terms: StackedTerms, q: StackedGaussians, lik: StackedGaussians,
                             R: Array, a_sum: Array, b_sum: Array, e_sum: Array | None = None,
                             *, inverse_applied: bool = False) -> StackedMatrixGradients:
    """``dlogZ_q / d(Kuu, Kuf, diag Kff)`` of every class:
    the per-class gradients of spec ep-sep §2.7 (the oracle ``tests/sites/class_gradients.py``)
    on stacks.

    ``q``: the posteriors; ``lik``: the Gaussians held fixed in the likelihood term (EP: ``q``;
    SEP: the shared cavities) with ``R = L_B^-1 A [C, M, n]`` from ``lik.project`` (with
    ``inverse_applied``: ``B_g^-1 A`` itself, from ``paired_by_inverse``, which
    numpy then consumes: written in place); ``a_sum``,
    ``b_sum``, ``e_sum`` ``[C, n]``: per-point sums, already multiplied by any mini-batch scale
    (``e_sum=None``: SEP's ``E = 2 B``). Returns the classes' gradients as stacks
    (``StackedMatrixGradients``: ``Kuu [C, M, M]``, ``Kuf [C, M, n]``, ``Kff_diag [C, n]``, also
    a sequence of one ``MatrixGradients`` per class). With ``B_g^-1 A`` from one solve,
    ``X = w a_sum^T + B_g^-1 A diag(E) - 2 A diag(B)`` and
    ``A X^T = (A a_sum) w^T + A diag(E) (B_g^-1 A)^T - 2 A diag(B) A^T``, where
    ``sym(A X^T) + A diag(B) A^T`` enters as the one product ``A (X + A diag B)^T``,
    symmetrised with the rest by ``sandwich`` (numpy: one ``gemm`` where the pieces took two
    and a ``symmetrize``).
    (A compiled region of the step: ``gpinfer.backend.compile``.)
    """
    A = terms.A
    AB = ops.scale_columns(A, b_sum)  # A diag(B), [C, M, n]
    BiA = R if inverse_applied else ops.solve_triangular(lik.LB, R, transpose=True, L_T=lik.LB_T)
    if ops.is_numpy(A):
        X, cross = _numpy_cross(A, AB, lik.w, BiA, a_sum, b_sum, e_sum)
        # inner on the product's own array (read no more): -2 cross + B^-1 + w w^T (a rank-one
        # gemm, no outer product formed), less the prior, halved: no [C, M, M] temporaries
        inner = ops.scale_add_(cross, -2.0, q.B_inv())
        ops.matmul_add_(inner, q.w[..., :, None], q.w[..., None, :], 1.0)
        ops.add_diagonal(inner, -1.0)  # the prior term
        inner *= 0.5
    else:
        # the sums below run in place, in the order of the formulas; the outer and
        # column-scaled products are one operator each on a device (ops.outer, ...). SEP's
        # E = 2 B enters as an exact factor 2 of the products with diag(B) (the same values as
        # forming 2 B first: scaling by 2 commutes with every rounding)
        X = ops.outer(lik.w, a_sum)
        if e_sum is None:
            T = ops.scale_columns(BiA, b_sum)
            ops.add_scaled_(X, T, 2.0, scratch=T)  # X += B_g^-1 A diag(2 B)
        else:
            T = ops.scale_columns(BiA, e_sum)
            X += T
        # sym(A X^T) - S_B = sym(A Y^T), Y = X + AB: one product (G_K is symmetrised)
        X -= AB
        cross = ops.einsum("cmn,ckn->cmk", A, X)
        X -= AB
        del T
        inner = ops.outer(q.w, q.w)
        inner += q.B_inv()  # B^-1 + w w^T (q keeps its B^-1)
        ops.add_diagonal(inner, -1.0)  # the prior term
        inner *= 0.5
        inner -= cross
    G_K = terms.sandwich(inner, overwrite=True)  # L^-T inner L^-1 (inner read no more)
    G_uf = terms.unwhiten(X, overwrite=True)
    return StackedMatrixGradients(Kuu=G_K, Kuf=G_uf, Kff_diag=b_sum)


def _numpy_cross(A: Array, AB: Array, w: Array, BiA: Array, a_sum: Array, b_sum: Array,
                 e_sum: Array | None) -> tuple[Array, Array]:
    """numpy's ``(X [C, M, n], A (X + A diag B)^T [C, M, M])`` of
    ``stacked_matrix_gradients``, in place on arrays it owns: ``X = B_g^-1 A diag(E)`` on
    ``BiA = B_g^-1 A`` itself (read no more; SEP's
    ``E = 2 B`` an exact factor 2), ``+ w a_sum^T`` one rank-one ``gemm`` per class into it (no
    outer product formed), then ``X - A diag(B)`` for the cross product and ``X - 2 A diag(B)``
    (no ``[C, M, n]`` temporaries)."""
    X = BiA
    X *= (2.0 * b_sum if e_sum is None else e_sum)[..., None, :]
    ops.matmul_add_(X, w[..., :, None], a_sum[..., None, :], 1.0)
    X -= AB
    cross = A @ ops.mT(X)  # sym(A X^T) - S_B = sym(A Y^T), Y = X + AB (G_K is symmetrised)
    X -= AB
    return X, cross


# -- one kernel and one Z shared by every class (sep's ``shared_inducing``) ----------------------
# New functions only: the per-class algebra above runs unchanged on broadcast views of the one
# class's terms; beyond the kernel work (one Kuu, one Cholesky, one L^-1 Kuf) the shared A saves
# products and solves per class: the classes' summed gradients (one sandwich), the cavity
# projection by B^-1 and one product, the site precisions in one product, and whitened sums
# read on the factor they were made on (``Frame``: one latent's prior term and directions) or
# moved to the next step's factor (``rebased``) instead of a round trip through u-space.


@dataclass(eq=False)
class SharedTerms(StackedTerms):
    """``StackedTerms`` of ``C`` classes sharing one kernel and one ``Z``: ``L``, ``A``, ``s``
    and ``L_inv`` are read-only broadcast views ``[C, ...]`` of ``one``'s ``[1, ...]`` arrays
    (no copies), so the per-class site algebra runs on them as it is; ``one`` keeps the single
    factor for ``shared_matrix_gradients`` (the classes' summed gradients)."""

    one: StackedTerms | None = field(default=None, repr=False, compare=False)


def shared_terms(one: StackedTerms, C: int) -> SharedTerms:
    """``one`` (``StackedTerms`` with leading axis 1: ``L [1, M, M]``, ``A [1, M, n]``,
    ``s [1, n]``) broadcast over ``C`` classes (views: ``SharedTerms``)."""
    xp = ops.namespace(one.A)

    def wide(a: Array) -> Array:
        return xp.broadcast_to(a, (C, *a.shape[1:]))

    return SharedTerms(L=wide(one.L), A=wide(one.A), s=wide(one.s),
                       L_inv=None if one.L_inv is None else wide(one.L_inv), one=one)


class Basis(NamedTuple):
    """The factor whitened sums were formed on, without the terms' data-sized arrays (what a
    state keeps across steps, and a snapshot holds: ``A [C, M, n]`` is not kept alive):
    ``L [C, M, M]`` and ``L_inv`` (or ``None``) of ``StackedTerms``; ``classes``: ``C`` for
    ``SharedTerms`` (then ``L``, ``L_inv`` are the one latent's ``[1, M, M]``), else
    ``None``."""

    L: Array
    L_inv: Array | None
    classes: int | None

    def to_u_space(self, P_w: Array, h_w: Array) -> tuple[Array, Array]:
        """``StackedTerms.to_u_space`` on this factor: ``(L^-T P_w L^-1, L^-T h_w)``."""
        C = self.L.shape[0] if self.classes is None else 1
        M = self.L.shape[-1]
        one = StackedTerms(L=self.L, A=ops.empty(self.L, (C, M, 0)), s=ops.empty(self.L, (C, 0)),
                           L_inv=self.L_inv)
        terms = one if self.classes is None else shared_terms(one, self.classes)
        return terms.to_u_space(P_w, h_w)


def basis(terms: StackedTerms) -> Basis:
    """The ``Basis`` of ``terms`` (``SharedTerms``: the one latent's factor)."""
    if isinstance(terms, SharedTerms) and terms.one is not None:
        return Basis(terms.one.L, terms.one.L_inv, terms.L.shape[0])
    return Basis(terms.L, terms.L_inv, None)


def rebased(old: Basis, new: StackedTerms) -> StackedTerms:
    """Terms whose factor is ``T = L^-1 L'`` ``[C, M, M]`` (lower triangular) for ``old``'s
    factor ``L`` and ``new``'s ``L'`` (both per class, or both shared: ``T`` of the one
    latent's factors, broadcast over the classes): their ``to_whitened`` maps sums whitened
    by ``L`` to the same sums whitened by ``L'`` (``L'^T Lam L' = T^T (L^T Lam L) T``: three
    triangular products per class, ``T`` and ``T^T P_w T``, where ``Lam = L^-T P_w L^-1`` and
    back take four); ``A``, ``s`` are ``new``'s. On numpy ``T`` is one ``trmm`` with ``old``'s
    ``L_inv``; without it (a device) one triangular solve."""
    if old.classes is not None:
        assert isinstance(new, SharedTerms) and new.one is not None  # from ``shared_terms``
        T = _factor_ratio(old, new.one.L)
        xp = ops.namespace(T)
        return StackedTerms(L=xp.broadcast_to(T, new.L.shape), A=new.A, s=new.s)
    return StackedTerms(L=_factor_ratio(old, new.L), A=new.A, s=new.s)


def _factor_ratio(old: Basis, L_new: Array) -> Array:
    """``L^-1 L'`` ``[..., M, M]`` for ``old``'s factor ``L`` and ``L_new = L'``."""
    if old.L_inv is not None:
        return ops.tri_matmul(old.L_inv, L_new)
    return ops.solve_triangular(old.L, L_new)


#: how far a kept frame's prior precision ``Q`` may drift from ``I`` (Frobenius norm) before
#: its sums are rebased (``kept_frame``): ``cond(Q) <= (1 + d) / (1 - d) = 3``, so the
#: step's factorisations see at most 3x the conditioning of the step's own ``B`` (digits,
#: ``M = 100``, batches of 200, Adam at 0.01: 7 rebases in 71 steps, 8 epochs)
FRAME_DRIFT = 0.5


class Frame(NamedTuple):
    """Shared whitened sums read on the older factor ``L_o`` they were made on, where the
    step's factor is ``L`` (``Kuu = L L^T``), instead of moved onto ``L`` (``rebased``: the
    ``2 C`` triangular products ``T^T P_c T``).

    The sums ``P_o = L_o^T Lam L_o`` ``[C, M, M]``, ``h_o = L_o^T h`` ``[C, M]`` are those of
    the coordinates ``v`` of ``u = L_o v``. With ``U = L^-1 L_o`` (lower triangular), the
    step's whitened sums are ``P_w = L^T Lam L = U^-T P_o U^-1`` and ``h_w = U^-T h_o``, so

    * ``B = I + a P_w = U^-T B_o U^-1`` with ``B_o = Q + a P_o`` and ``Q = U^T U =
      L_o^T Kuu^-1 L_o`` (the prior precision of ``v``: ``prior`` of ``StackedGaussians``);
      ``B^-1 = U B_o^-1 U^T``;
    * with the directions ``A_o = U^T A = L_o^T Kuu^-1 Kuf`` ``[M, n]`` (``A = L^-1 Kuf``):
      ``w = B^-1 a h_w = U w_o``, ``w_o = B_o^-1 a h_o``; the moments ``mu = A^T w =
      A_o^T w_o`` and ``v = diag(A^T B^-1 A) = diag(A_o^T B_o^-1 A_o)``; ``B^-1 A =
      U B_o^-1 A_o``;
    * a batch's sites ``A diag(tau) A^T = U^-T (A_o diag(tau) A_o^T) U^-1`` and
      ``A nu = U^-T A_o nu``: added to ``keep * P_o`` as ``A_o diag(tau) A_o^T`` and
      ``A_o nu`` (the sums stay on ``L_o``); the site change ``h_w' - h_w =
      U^-T (h_o' - h_o)`` (``to_step``);
    * ``log|B| = log|B_o| - 2 log|U|`` and ``w^T a h_w = w_o^T a h_o``: each class's
      log-norm ratio is ``B_o``'s plus ``log|U|`` (``log_det``);
    * the classes' summed gradients (``shared_matrix_gradients``) read
      ``Y = sum_c (w_c a_c^T + B_c^-1 A diag E_c) = U Y_o`` ``[M, n]`` and
      ``sum_c (w_c w_c^T + B_c^-1) = U (sum_c w_oc w_oc^T + B_oc^-1) U^T`` ``[M, M]``: three
      triangular products of one latent's arrays move them onto ``L``, the rest as before.

    Cost per step at digits' size (``C = 10``, ``M = 100``, ``n = 200``, one thread, in the
    step): ``U``, ``Q`` and ``A_o`` 0.3 ms and the gradients' three products 0.13 against the
    rebase's 0.73 (``benchmarks/engine_step.py``, item 9). The
    factorisations see ``cond(B_o) <= cond(Q) cond(B)``: a frame is kept while ``Q`` is near
    ``I`` (``kept_frame``). ``basis``: the frame's factor (the sums' ``Basis``); ``U``, ``Q``
    ``[M, M]``; ``A``: ``A_o`` ``[M, n]``; ``log_det``: ``log|U|``.
    """

    basis: Basis
    U: Array
    Q: Array
    A: Array
    log_det: float

    def to_step(self, d_o: Array) -> Array:
        """``U^-T d_o`` for ``d_o [C, M]`` (changes of ``h_o``), as ``[M, C]``: the same
        vectors on the step's factor."""
        return ops.solve_triangular(self.U, ops.mT(d_o), transpose=True)


def kept_frame(old: Basis, new: StackedTerms, drift: float = FRAME_DRIFT) -> Frame | None:
    """The ``Frame`` in which the step of ``new`` (``SharedTerms``) reads shared sums whitened
    on ``old``'s factor, or ``None`` where they are to be moved (``rebased``): per-class sums
    (``U`` would be ``C`` products), no ``L^-1`` kept (``ops.prefers_tri_inverse``: not on a
    device, where reading the drift would also be a sync), or ``||Q - I||_F > drift``
    (``FRAME_DRIFT``)."""
    if (old.classes is None or not isinstance(new, SharedTerms) or new.one is None
            or new.one.L_inv is None):
        return None
    U = ops.tri_matmul(new.one.L_inv[0], old.L[0])  # L^-1 L_o
    Q = ops.symmetrize_(ops.tri_matmul(U, U, transpose=True))
    if not np.linalg.norm(ops.plus_diagonal(Q, -1.0)) <= drift:  # NaN too: rebase
        return None
    return Frame(old, U, Q, ops.tri_matmul(U, new.one.A[0], transpose=True),
                 float(np.sum(np.log(np.diagonal(U)))))


def shared_site_products(A: Array, tau: Array) -> Array:
    """``A diag(tau[:, c]) A^T`` ``[C, M, M]`` for every class from the shared ``A [M, n]``
    and ``tau [n, C]``: one product ``A [M, n] @ [n, C M]`` (the columns of ``A^T`` scaled
    per class side by side), where a product per class would take ``C`` (the same sums; a
    view of the ``[M, C M]`` result)."""
    xp = ops.namespace(A)
    n, C, M = tau.shape[0], tau.shape[1], A.shape[0]
    scaled = tau[:, :, None] * ops.mT(A)[:, None, :]  # [n, C, M]
    out = xp.reshape(A @ xp.reshape(scaled, (n, C * M)), (M, C, M))
    return xp.permute_dims(out, (1, 0, 2))


def shared_project(g: StackedGaussians, A: Array) -> tuple[Array, Array, Array]:
    """``(mu [n, C], v [C, n], B^-1 A [C, M, n])``: the means and variances of ``g`` (``C``
    Gaussians) along the whitened directions ``A [M, n]`` shared by every class, as
    ``g.project`` of ``A`` broadcast (``means_by_point``) but with ``B^-1 A`` in place of
    ``R = L_B^-1 A``: ``B^-1`` from ``g.B_inv`` (``potri``), then one product for every class
    (``[C M, M] @ [M, n]``) and ``v = colsum(A * B^-1 A)``, where ``R`` and then ``B^-1 A``
    would take two triangular solves per class (what ``shared_matrix_gradients`` reads)."""
    B_inv = g.B_inv()
    C, M = B_inv.shape[0], B_inv.shape[1]
    xp = ops.namespace(A)
    BiA = xp.reshape(xp.reshape(B_inv, (C * M, M)) @ A, (C, M, A.shape[-1]))
    return _shared_moments(A, g.w, BiA)


def _shared_moments(A: Array, w: Array, BiA: Array) -> tuple[Array, Array, Array]:
    """``(mu = A^T w [n, C], v = colsum(A * B^-1 A) [C, n], BiA)`` from ``A [M, n]``,
    ``w [C, M]`` and ``BiA = B^-1 A [C, M, n]``."""
    return ops.mT(A) @ ops.mT(w), ops.einsum("mn,cmn->cn", A, BiA), BiA


def shared_paired(P_w: Array, h_w: Array, pair: Scales, A: Array,
                  iteration: int | None = None, *, frame: Frame | None = None
                  ) -> tuple[StackedGaussians, StackedGaussians, Array, tuple[Array, Array, Array]]:
    """``(q, cav, log_norm_ratio [2, C], (mu [n, C], v [C, n], B_cav^-1 A [C, M, n]))``: what
    ``StackedGaussians.paired(P_w, h_w, pair)`` and ``shared_project(cav, A)``
    give, for the classes' summed gradients (``shared_matrix_gradients``, which read ``q``'s
    means and ``B_inv_sum`` and the cavity's means and ``B^-1 A``), ``A [M, n]`` shared.

    On numpy neither Gaussian keeps a stack of ``B^-1`` nor its factors (``_inverted_pair``):
    one pass over the classes each, in place of the factors, gives ``q``'s means and
    ``sum_c B_c^-1`` (the same bits as summing the stack) and the cavity's means and
    ``B^-1 A`` (equal to round-off). On a device as those two calls (one stack).

    ``frame``: the sums are kept on an older factor (``Frame``, numpy): the Gaussians of
    ``B_o = Q + a P_w`` along ``A = frame.A``, their means ``w_o`` and ``B_o^-1 A_o`` in that
    frame, the log-norm ratios the step's (``+ log|U|``).
    """
    if not ops.is_numpy(P_w):
        assert frame is None  # ``kept_frame``: numpy only
        q, cav, lnr = StackedGaussians.paired(P_w, h_w, pair, iteration=iteration)
        return q, cav, lnr, shared_project(cav, A)
    q, cav, lnr, BiA = _inverted_pair(P_w, h_w, pair, A, iteration, q_stack=False,
                                      prior=None if frame is None else frame.Q)
    if frame is not None:
        lnr += frame.log_det
    return q, cav, lnr, _shared_moments(A, cav.w, BiA)


@compilable
def shared_matrix_gradients(one: StackedTerms, q: StackedGaussians, lik: StackedGaussians,
                            BiA: Array, a_sum: Array, b_sum: Array, e_sum: Array | None = None,
                            *, frame: Frame | None = None) -> StackedMatrixGradients:
    """The classes' summed ``dlogZ_q / d(Kuu, Kuf, diag Kff)`` when every class has the same
    ``Kuu``, ``Kuf`` (``one``: their terms, leading axis 1): ``stacked_matrix_gradients`` of
    the broadcast terms summed over the classes, ``Kuu [1, M, M]``, ``Kuf [1, M, n]``,
    ``Kff_diag [1, n]`` (equal to round-off; ``q``, ``lik``, ``a_sum``, ``b_sum``, ``e_sum``
    per class as there, with ``BiA = B_g^-1 A [C, M, n]`` of ``lik`` from ``shared_project``
    in place of ``R``).

    With ``A`` shared, every sum over classes of a product with ``A`` is one product with the
    summed factor: ``Y = sum_c (w_c a_c^T + B_c^-1 A diag(E_c))`` ``[M, n]`` gives
    ``sum_c X_c = Y - 2 A diag(sum_c b_c)`` and ``sum_c A X_c^T = A Y^T - 2 S`` with
    ``S = A diag(sum_c b_c) A^T``, so ``sum_c inner_c = (W^T W + sum_c B_c^-1 - C I) / 2
    - sym(A Y^T) + S``, where ``sym(A Y^T) - S = sym(A (Y - A diag(sum_c b_c))^T)`` is one
    product; then one ``L^-T . L^-1`` and one ``L^-T .`` instead of ``C``.

    ``frame``: ``q``, ``lik`` and ``BiA`` are those of sums kept on an older factor
    (``Frame``: ``w_o``, ``B_o^-1``, ``B_o^-1 A_o``); ``Y_o`` and ``sum_c (w w^T + B^-1)`` are
    moved onto the step's factor (``U Y_o``, ``U (.) U^T``: three triangular products).
    """
    A = one.A[0]  # [M, n]
    C = BiA.shape[0]
    xp = ops.namespace(A)
    if e_sum is None:  # SEP: E = 2 B
        Y = ops.einsum("cmn,cn->mn", BiA, b_sum)
        Y *= 2.0
    else:
        Y = ops.einsum("cmn,cn->mn", BiA, e_sum)
    Y += ops.mT(lik.w) @ a_sum  # sum_c w_c a_c^T
    b = xp.sum(b_sum, axis=0)  # [n]
    AB = A * b  # A diag(sum_c b_c)
    inner = ops.mT(q.w) @ q.w  # sum_c w_c w_c^T
    inner += q.B_inv_sum()
    if frame is not None:  # on the step's factor: U Y_o, U (.) U^T
        Y = ops.tri_matmul(frame.U, Y, overwrite=True)
        inner = ops.tri_matmul(frame.U, ops.tri_matmul(frame.U, inner, right=True,
                                                       transpose=True, overwrite=True),
                               overwrite=True)
    ops.add_diagonal(inner, -float(C))  # the prior terms
    inner *= 0.5
    Y -= AB  # sym(A Y^T) - S = sym(A (Y - A diag(b))^T): one product (S is symmetric)
    inner -= symmetrize(A @ ops.mT(Y))
    Y -= AB  # sum_c X_c = Y - 2 A diag(b)
    G_K = one.sandwich(inner[None])
    G_uf = one.unwhiten(Y[None], overwrite=True)
    return StackedMatrixGradients(Kuu=G_K, Kuf=G_uf, Kff_diag=b[None])


def __getattr__(name: str) -> Any:
    """``stacked_cholesky`` and ``tri_solve_stack``, deprecated for
    ``gpinfer.numerics.cholesky.jittered_cholesky(K, name=..., part=...).L`` and
    ``gpinfer.backend.ops.solve_triangular`` (issue 23: one Cholesky, one triangular solve):
    they work for one more release."""
    new: Any
    if name == "tri_solve_stack":
        new, use = ops.solve_triangular, "gpinfer.backend.ops.solve_triangular"
    elif name == "stacked_cholesky":
        new = _stacked_cholesky
        use = "gpinfer.numerics.cholesky.jittered_cholesky(K, name=..., part=...).L"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"gpinfer.sites.stacked.{name} is deprecated: use {use}; the old name works "
                  "for one more release", DeprecationWarning, stacklevel=2)
    return new


def _stacked_cholesky(K: Array, name: str, iteration: int | None = None, *,
                      unit: str = "class", first: int = 0,
                      again: Callable[[], Array] | None = None) -> Array:
    """The deprecated ``stacked_cholesky``, its old signature (``name`` by position or by
    keyword): ``jittered_cholesky(K, name=name, part=unit, ...).L``."""
    return jittered_cholesky(K, name=name, iteration=iteration, part=unit, first=first,
                             again=again).L
