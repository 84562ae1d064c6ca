"""One batched kernel computation for ``C`` latents that share a kernel family.

The multi-class sparse methods keep one kernel and one inducing set ``Z_c [M, D]`` per latent.
When every latent's kernel has the same structure (one stationary kernel of one class, with
the same lengthscale form, alone or in a ``Sum`` with ``White``-type noise terms), the
covariances of all latents

    ``Kuu [C, M, M]``, ``Kuf [C, M, B]``, ``Kff_diag [C, B]``

and their vector-Jacobian products are computed here in one batched computation per step,
instead of one ``K`` / ``vjp`` call per latent and per summed part. Per-latent parameters are
stacked (log-lengthscales ``[C, D]`` or ``[C, 1]``, log-variances ``[C]``); a kernel object
shared by every latent gives identical rows, i.e. a broadcast. The inducing inputs are shifted
and scaled once (``A [C, M, D]``); the batch is shifted once (``[B, D]``, shared by every latent:
its lengthscales enter through ``(A / ell) X^T`` and ``G (X / ell)``, one product over all
latents, so no ``[C, B, D]`` array is formed), and the scaled inputs, squared distances and
``g(r2)`` are shared between the covariances and the VJPs.

``StackedKernels.of(kernels)`` returns ``None`` for latents with different kernel families (or
kernels this module does not batch: ``Linear``, products); those keep the per-latent path.

Inputs declared fixed (``Z`` not learned: svi and the vi-jj family) take the fixed-input mode:
``StackedKernels.fixed_covariances`` builds ``StackedCovariances`` of latents that share one
``gpinfer.kernels.fixed.FixedInputs`` (squared-distance kernels on numpy) from what is kept
there: isotropic, the raw squared distances, each matrix one pass
``var * exp(D * (-0.5 / ell^2))``, and a VJP (``vjp_fixed``) with no row sums or input
products, ``sum(dK * K)`` and ``sum(dK * K * D)`` per matrix; ARD, the centred inputs, scaled
per latent, and ``RBF.ard_lengthscale_gradient``. ``gpinfer.kernels.fixed.fixed_groups`` /
``fixed_matrices`` / ``fixed_gradient`` give svi and the vi-jj family one of these per group of
latents (``vjp_fixed`` over each latent's own gradient arrays).

Results equal the per-latent ``Kernel.K`` / ``Kernel.vjp`` to round-off
(``tests/kernels/test_stacked.py``). Arrays may be numpy or torch (``gpinfer.backend``);
parameters stay host floats and are moved once per evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast, overload

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.compile import compilable
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.combination import Sum
from gpinfer.kernels.stationary import RBF, Stationary, sqdist
from gpinfer.kernels.white import White

if TYPE_CHECKING:
    from gpinfer.kernels.fixed import FixedInputs


def _parts(kernel: Kernel) -> list[Kernel]:
    """The summed parts of ``kernel`` (itself when it is not a ``Sum``)."""
    return list(kernel.parts) if isinstance(kernel, Sum) else [kernel]


def _signature(kernel: Kernel) -> tuple | None:
    """What must agree between latents for one batched computation, or ``None`` when this
    module cannot batch the kernel: one stationary part (class, ARD, input dimension) plus any
    ``White``-type parts (class), in order."""
    sig: list[tuple] = []
    n_stationary = 0
    for part in _parts(kernel):
        if isinstance(part, Stationary):
            n_stationary += 1
            sig.append((type(part), part.ard, part.input_dim))
        elif isinstance(part, White):
            sig.append((type(part),))
        else:
            return None
    return tuple(sig) if n_stationary == 1 else None


@dataclass
class _Distances:
    """Shared intermediate results of one evaluation.

    ``A [C, M, D]`` the scaled inducing inputs ``(Z - shift) / ell``, ``Xs [B, D]`` the batch
    shifted alike (unscaled: shared by every latent), ``r2`` and ``g`` ``[C, M, M]`` (square)
    and ``[C, M, B]`` (cross), ``ell [C, 1, D']`` and ``var [C]`` the stationary part's
    lengthscales and variances on the arrays' device; kept so that the VJPs do not form them
    again: ``Xs2 = Xs * Xs [B, D]``, ``inv_ell2 = 1 / ell^2`` ``[C, D']`` and, on numpy,
    ``ell2 = ell^2`` ``[C, D']`` and ``vk = var`` as ``[C, 1, 1]``; on a device
    ``inv_ell = 1 / ell`` ``[C, D']`` (``g_Z``'s scaling inside one ``einsum``) instead of
    ``ell2`` and ``vk`` (``None``; its products take ``var`` inside one ``einsum``). The
    scaled inputs themselves are divided by ``ell`` on every backend: products with
    ``1 / ell`` there moved the float32 torch fits of vi-robustmax by 1.8e-4, against
    numpy's float64 (tests/backend/test_same_model.py allows 1e-4; 5.5e-5 with divisions).
    On numpy ``A`` is ``None`` once the distances are formed and ``Zs = Z - shift``
    ``[C, M, D]`` (unscaled) is kept instead: its VJP works on ``Zs``
    (``_host_lengthscales_and_inputs``), one array of ``[C, M, D]`` kept, not two.
    """

    A: Array | None
    Xs: Array
    r2_uu: Array
    g_uu: Array
    r2_uf: Array
    g_uf: Array
    ell: Array
    inv_ell: Array | None
    var: Array
    Xs2: Array
    ell2: Array | None
    inv_ell2: Array
    vk: Array | None
    Zs: Array | None = None


def _scaled_norms(X2: Array, inv: Array) -> Array:
    """``sum_d X2[b, d] / ell[c, 0, d]^2`` ``[C, B]`` for squared inputs ``X2 [B, D]`` and
    inverse squared lengthscales ``inv = 1 / ell^2`` ``[C, D]`` (ARD) or ``[C, 1]``
    (isotropic); on a device one ``einsum`` operator for ARD (no transposed view)."""
    if inv.shape[1] == 1:
        return inv * ops.namespace(X2).sum(X2, axis=1)[None, :]
    return ops.matmul_t(inv, X2)


def _twice_over_ell(X: Array, d: _Distances) -> Array:
    """``(2 / ell) X`` ``[C, M, D]`` (numpy in place: ``X`` itself; a device one ``einsum``
    operator with ``1 / ell`` and a kept 0-d ``2``)."""
    if d.inv_ell is not None:
        return ops.einsum("cmd,cd,->cmd", X, d.inv_ell, ops.constant(X, (2.0,), ()))
    X *= 2.0 / d.ell
    return X


def _times_variances(g: Array, var: Array, vk: Array | None) -> Array:
    """``var[c] g[c]`` ``[C, M, N]`` for ``g [C, M, N]``, ``var [C]`` (numpy: ``vk * g`` with
    ``vk = var [C, 1, 1]``; on a device one ``einsum`` operator, no reshaped view)."""
    return ops.einsum("cmn,c->cmn", g, var) if vk is None else vk * g


def transposed_cross(B: int, D: int) -> bool:
    """Whether numpy forms the cross product of the ``C M`` scaled inducing rows and ``B``
    batch rows of ``D`` inputs as ``Xs As^T`` ``[B, C M]`` (transposed by the distances'
    first pass) rather than as ``As Xs^T`` ``[C M, B]``: where ``D >= max(256, 2 B)``.

    OpenBLAS's ``gemm`` (one thread) is slower with the short ``B`` as the rows of its
    output, more so the longer the products (``D``), while the transposing pass costs
    ``C M B`` strided reads whatever ``D``. Product and first pass together, ``C = 10``, at
    ``M`` 50..400, ``B`` 50..1000, ``D`` 32..784 (144 shapes, two runs,
    ``benchmarks/engine_step.py --parts cross``, item 10): inside the rule the transposed
    form takes 0.68-0.98 of the time where the product costs 4 ms or more (MNIST size,
    ``M = B = 200``, ``D = 784``: 11.6 against 13.8 ms, 12.6 against 17.4), at most 4 % more
    at smaller ones (run-to-run noise: 0.04 ms); outside it loses up to 2.3x (``D = 32``,
    ``B = 1000``) or wins by at most 9 % (``B = 400``, ``D = 784``)."""
    return D >= max(256, 2 * B)


def _host_cross(As: np.ndarray, Xs: np.ndarray) -> np.ndarray:
    """``-2 As Xs^T`` ``[C, M, B]`` (a new C-ordered array) for numpy's ``As [C, M, D]`` and
    ``Xs [B, D]``: one product over the ``C M`` rows, in the layout ``transposed_cross``
    picks (the same dot products either way: the same values up to the order OpenBLAS sums
    them in, bit for bit at the shapes measured), then the exact product by ``-2``."""
    C, M, D = As.shape
    B = Xs.shape[0]
    if not transposed_cross(B, D):
        out = ops.matmul_t(As, Xs)  # numpy: one product over the C M rows
        out *= -2.0
        return out
    R = Xs @ ops.mT(np.reshape(As, (C * M, D)))  # [B, C M]
    return np.multiply(np.reshape(R, (B, C, M)).transpose(1, 2, 0), -2.0,
                       out=np.empty((C, M, B), dtype=R.dtype))


class StackedCovariances:
    """The covariances of ``C`` latents at ``Z [C, M, D]`` and a batch ``X [B, D]``, and their
    VJPs, from one set of scaled inputs and distances (see the module docstring).

    ``Kuu [C, M, M]`` (noise of ``White`` parts on its diagonal, no jitter), ``Kuf [C, M, B]``,
    ``Kff_diag [C, B]``. Memory: a few ``[C, M, D]`` and ``[C, M, B]`` arrays and one
    ``[B, D]``, independent of the number of training points: the batch is shifted once and
    shared by every latent (no ``[C, B, D]`` array), its lengthscales enter through products.

    Ownership of ``Kuf``: the VJPs of moving inputs never read it (they work on the kept
    distances and ``g``; at fixed inputs ``vjp_fixed`` does read it), so a caller that turns
    it into something else (``L^-1 Kuf``) may take it over with ``take_Kuf`` and write into
    it; the covariances then drop it and refuse a later ``Kuf`` read (a ``RuntimeError``: a
    reader that came after the owner would see the owner's values). ``Kuu`` and ``Kff_diag``
    are shared: never written by a reader.
    """

    def __init__(self, family: StackedKernels, Z: Array, X: Array, theta: Array | None = None):
        self.family, self.Z, self.X = family, Z, X
        #: the host parameters ``[C, P]`` read (``None`` when ``theta`` was given on the device)
        host = family.theta() if theta is None else None
        self.theta = host
        #: every parameter in natural units ``[C, P]`` (all are logs), moved once
        self.natural = (ops.like(Z, np.exp(host)) if host is not None
                        else ops.namespace(theta).exp(theta))
        self.d, self.Kuu, Kuf, self.Kff_diag = _forward(family, Z, X, self.natural)
        #: the fixed-input mode's distances (``at_fixed_inputs``; ``None`` here)
        self.fixed: _FixedDistances | None = None
        #: ``Kuf`` until ``take_Kuf`` hands it over (then ``None``)
        self._Kuf: Array | None = Kuf

    @property
    def Kuf(self) -> Array:
        """``Kuf [C, M, B]``, shared (read it, never write it); refused (``RuntimeError``)
        once ``take_Kuf`` has handed it over."""
        if self._Kuf is None:
            raise RuntimeError("Kuf was handed over (StackedCovariances.take_Kuf): its array "
                               "holds its owner's values now; read Kuf before it is taken")
        return self._Kuf

    def take_Kuf(self) -> Array:
        """``Kuf [C, M, B]`` handed over: the caller owns the array from now on and may write
        into it (e.g. solve ``L^-1 Kuf`` in place); these covariances drop it (a later ``Kuf``
        read is refused) and keep what their VJPs need. A later ``take_Kuf`` (the same
        covariances reused, e.g. a step prepared again at the same version and batch) gets a
        new array of the same values, formed again from the kept ``g_uf`` (``var g_uf``, the
        forward's own operation: no noise term enters ``Kuf``)."""
        Kuf, self._Kuf = self._Kuf, None
        if Kuf is None and self.fixed is not None:
            raise RuntimeError("Kuf at fixed inputs was handed over already: its VJP reads it, "
                               "so it is handed over once")
        if Kuf is None:
            Kuf = _times_variances(self.d.g_uf, self.d.var, self.d.vk)
        return Kuf

    @classmethod
    def at_fixed_inputs(cls, family: StackedKernels, inputs: FixedInputs,
                        cols: Array | None = None, rows: Array | None = None,
                        out: Array | None = None) -> StackedCovariances:
        """The fixed-input mode (``StackedKernels.fixed_covariances``): the covariances of the
        ``C`` latents of ``family`` at the inducing inputs ``inputs.Z [M, D]`` they share and
        the columns ``cols`` of ``inputs.X`` (``None``: all ``N``; ``rows``: ``X[cols]``
        ``[B, D]`` where already read), from ``inputs``' raw squared distances (ARD: from
        its centred inputs, scaled per latent). ``Kuf`` ``[C, M, B]`` has the layout of those
        distances; ``out`` (one isotropic latent): an ``[M, B]`` array of that layout that
        ``Kuf[0]`` is written into (a view of it). ``Z`` is
        ``inputs.Z`` broadcast to ``[C, M, D]``, ``X`` the whole ``inputs.X``. The VJP is
        ``vjp_fixed``, which reads ``Kuf`` for a ``dKuf``: ``take_Kuf`` hands it over at most
        once, and only where no such VJP follows (a ``Kuf`` read is refused after it)."""
        if not family.cached_distance_form:
            raise ValueError("the fixed-input mode needs a squared-distance kernel "
                             "(Stationary.sqdist_form) whose noise parts sit on the square "
                             "matrix too (White.on_square): StackedKernels.cached_distance_form")
        self = cls.__new__(cls)
        C = len(family.kernels)
        self.family, self.X = family, inputs.X
        self.Z = np.broadcast_to(inputs.Z, (C, *inputs.Z.shape))
        self.theta = family.theta()
        self.natural = np.exp(self.theta)
        self.fixed, self.Kuu, self._Kuf, self.Kff_diag = _fixed_forward(
            family, inputs, cols, rows, out)
        return self

    def vjp_fixed(self, dKuu: Array | Sequence[Array] | None,
                  dKuf: Array | Sequence[Array] | None,
                  dKff_diag: Array | Sequence[Array] | None,
                  Kuf_sums: Array | None = None) -> Array:
        """The parameter gradients ``[C, P]`` at fixed inputs (``at_fixed_inputs``) of
        ``sum(dKuu * Kuu) + sum(dKuf * Kuf) + sum(dKff_diag * Kff_diag)`` (``[C, M, M]``,
        ``[C, M, B]``, ``[C, B]``, or a sequence of each latent's array: no stacked copy;
        ``None`` is zero): per matrix ``sum(dK * K_se)`` and
        ``sum(dK * K_se * D)`` (``RBF.sqdist_gradient``). ``Kuf_sums [C, 2]`` (with
        ``dKuf=None``): each latent's ``(sum(dKuf * Kuf), sum(dKuf * Kuf * D))``, contracted by
        the caller with ``Kuf`` and the distances ``fixed.D_uf`` (isotropic only)."""
        if self.fixed is None:
            raise ValueError("vjp_fixed needs covariances at fixed inputs (at_fixed_inputs)")
        if Kuf_sums is not None and self.fixed.scaled is not None:
            raise ValueError("Kuf_sums needs an isotropic lengthscale (raw distances)")
        return _fixed_vjp(self, dKuu, dKuf, dKff_diag, Kuf_sums)

    @staticmethod
    def _sqdist(a2: Array, b2: Array, AB: Array, doubled: bool = False) -> Array:
        """``r2 = a2 + b2 - 2 AB`` ``[C, Ma, Mb]`` (in place on ``AB``), clipped at 0, for
        ``a2 [C, Ma, 1]`` and ``b2 [C, 1, Mb]``; ``doubled``: ``AB`` holds ``-2 AB`` already
        (``_host_cross``; the same values: the product by ``-2`` is exact)."""
        if doubled:
            AB += a2
        else:
            ops.scale_add_(AB, -2.0, a2)  # -2 AB + a2, one operator on a device
        AB += b2
        return ops.clip_below(AB, 0.0)

    def _batch_product(self, G: Array) -> Array:
        """``G Bx`` ``[C, M, D]`` for ``G [C, M, B]``, ``Bx = (X - shift) / ell`` the scaled
        batch of each latent: one product with the shared shifted batch, then the scales."""
        d = self.d
        out = ops.rows_matmul(G, d.Xs)
        out /= d.ell
        return out

    def vjp(self, dKuu: Array | None, dKuf: Array | None, dKff_diag: Array | None, *,
            inputs: bool = True, out_Z: Array | None = None) -> tuple[Array, Array | None]:
        """Gradients of ``sum(dKuu * Kuu) + sum(dKuf * Kuf) + sum(dKff_diag * Kff_diag)``:
        ``(g_params [C, P], g_Z [C, M, D] or None)``, ``P`` each kernel's unconstrained
        parameters in its own order; ``inputs=False`` skips ``g_Z``. ``None`` gradients are
        zero.

        With ``G = dK * dk/dr2`` (``G_uu`` symmetrised), row sums ``r`` and, summed over the
        two matrices, ``rA = 2 r_uu + r_uf``, ``H' = G_uu A + G_uf Bx`` and ``H = H' + G_uu A``:
        ``d/dlog ell = -2 (rA . A^2 + c_uf . Bx^2 - 2 sum_m A * H')`` (ARD; ``c_uf`` the column
        sums of ``G_uf``), ``-2 sum G * r2`` (isotropic) and ``g_Z = (2 / ell) (A * rA - H)``.
        ``out_Z``: on numpy a C-contiguous ``[C, M, D]`` array the caller owns (a view of its
        gradient vector) that ``g_Z`` is written into and returned as, where the matrices
        have gradients (no copy of ``C M D`` entries afterwards); other backends ignore it.
        A compiled region of the step (``gpinfer.backend.compile``). Covariances at fixed
        inputs (``at_fixed_inputs``) take ``vjp_fixed`` instead.
        """
        if self.fixed is not None:
            raise ValueError("covariances at fixed inputs have no input gradients: vjp_fixed")
        return _vjp(self, dKuu, dKuf, dKff_diag, inputs, out_Z)


@dataclass
class _FixedDistances:
    """What the fixed-input mode keeps for its VJP: each latent's stationary part alone,
    ``Kuu_se [C, M, M]`` (``Kuu`` without its noise); isotropic, the raw squared distances
    ``D_uu [M, M]`` and ``D_uf [M, B]`` (shared by the latents: ``FixedInputs``' cache); ARD,
    each latent's scaled inputs ``(A [B, D], Bz [M, D])``, the centred batch and inducing
    inputs divided by its lengthscales (``None`` where isotropic)."""

    Kuu_se: Array
    D_uu: Array | None
    D_uf: Array | None
    scaled: list[tuple[Array, Array]] | None


def _cross_like(D_uf: Array, C: int, out: Array | None) -> Array:
    """An ``[C, M, B]`` array whose slices have the layout of ``D_uf [M, B]`` (``out[None]``
    for one latent, where given with that layout: else unused, as ``scaled_exp``'s)."""
    if (out is not None and C == 1 and out.shape == D_uf.shape and out.strides == D_uf.strides
            and out.dtype == D_uf.dtype):
        return out[None]
    if D_uf.flags.f_contiguous and not D_uf.flags.c_contiguous:
        return np.empty((C, D_uf.shape[1], D_uf.shape[0])).transpose(0, 2, 1)
    return np.empty((C, *D_uf.shape))


def _exp_into(rbf: RBF, D: Array, scaled: bool, target: Array) -> None:
    """``target = rbf.K_from_sqdist(D, scaled)``, written in place where the layouts agree."""
    K = rbf.K_from_sqdist(D, scaled, out=target)
    if not np.shares_memory(K, target):
        target[...] = K


def _scaled_distances(rbf: RBF, Zc: Array, Xc: Array) -> tuple[Array, Array, Array, Array]:
    """``(D_uu [M, M], D_uf [M, B], A [B, D], Bz [M, D])`` of one ARD latent: the squared
    distances of its scaled inputs, ``Bz = Zc / ell`` and ``A = Xc / ell`` (the centred
    inducing inputs and batch)."""
    ell = np.asarray(rbf.lengthscale, dtype=float)
    Bz = Zc / ell  # [M, D]
    A = Xc / ell  # [B, D]
    return sqdist(Bz), sqdist(Bz, A), A, Bz


def _noise_variance(family: StackedKernels, c: int) -> float:
    """The summed variances of latent ``c``'s ``White``-type parts (0.0 without)."""
    return sum(parts[c].variance for _, parts in family.noise_parts())


def _fixed_forward(family: StackedKernels, inputs: FixedInputs, cols: Array | None,
                   rows: Array | None, out: Array | None
                   ) -> tuple[_FixedDistances, Array, Array, Array]:
    """``(kept, Kuu [C, M, M], Kuf [C, M, B], Kff_diag [C, B])`` of the fixed-input mode:
    per latent the kernel's one pass ``var * exp(D * (-0.5 / ell^2))`` over the raw squared
    distances (``RBF.K_from_sqdist``; ARD: ``var * exp(-D / 2)`` over those of the scaled
    inputs), into arrays of the distances' layout (``out``: isotropic, one latent)."""
    C, M = len(family.kernels), inputs.Z.shape[0]
    Kuu_se, Kuu = np.empty((C, M, M)), np.empty((C, M, M))
    ard = family.stationary[0].ard
    scaled: list[tuple[Array, Array]] = []
    if ard:  # the batch centred once (a gather, or out of core a subtraction), scaled per latent
        Xc = inputs.centred(cols, rows)
    else:  # the raw distances, one read for every latent
        D_uu, D_uf = inputs.D_uu, inputs.dist_uf(cols, rows)
    eye = np.eye(M)
    for c, part in enumerate(family.stationary):
        rbf = cast(RBF, part)
        if ard:
            D_uu, D_uf, A, Bz = _scaled_distances(rbf, inputs.Zc, Xc)
            scaled.append((A, Bz))
        if c == 0:
            Kuf = _cross_like(D_uf, C, None if ard else out)
            Kff_diag = np.empty((C, D_uf.shape[1]))
        _exp_into(rbf, D_uu, ard, Kuu_se[c])
        _exp_into(rbf, D_uf, ard, Kuf[c])
        noise = _noise_variance(family, c)
        np.add(Kuu_se[c], noise * eye, out=Kuu[c])
        Kff_diag[c] = rbf.variance + noise
        if ard:  # this latent's own distances, freed before the next latent's are formed
            del D_uu, D_uf
    kept = (_FixedDistances(Kuu_se, None, None, scaled) if ard
            else _FixedDistances(Kuu_se, D_uu, D_uf, None))
    return kept, Kuu, Kuf, Kff_diag


def _fixed_blocks(kept: _FixedDistances, c: int, rbf: RBF, dK: Array, K: Array, square: bool
                  ) -> tuple[float | Array, float]:
    """One matrix's ``(d/dlog ell, d/dlog var)`` of latent ``c`` from ``GK = dK * K_se``:
    isotropic ``sqdist_gradient(sum(GK), sum(GK * D))`` (the square block by a product, the
    cross block by one contraction: no ``[M, B]`` product), ARD
    ``ard_lengthscale_gradient`` of the scaled inputs."""
    GK = dK * K
    if kept.scaled is not None:
        A, Bz = kept.scaled[c]
        return rbf.ard_lengthscale_gradient(GK, Bz if square else A, Bz), float(np.sum(GK))
    if square:
        assert kept.D_uu is not None
        return rbf.sqdist_gradient(float(np.sum(GK)), float(np.sum(GK * kept.D_uu)))
    assert kept.D_uf is not None
    return rbf.sqdist_gradient(float(np.sum(GK)), float(np.einsum("ij,ij->", GK, kept.D_uf)))


def _fixed_vjp(cov: StackedCovariances, dKuu: Array | Sequence[Array] | None,
               dKuf: Array | Sequence[Array] | None,
               dKff_diag: Array | Sequence[Array] | None, Kuf_sums: Array | None) -> Array:
    """``StackedCovariances.vjp_fixed``: ``[C, P]``, each latent's gradient in its kernel's
    parameter order (the RBF's ``d/dlog ell`` (one or ``D``), ``d/dlog var``; each noise
    part's ``var_noise (trace(dKuu) + sum(dKff_diag))``)."""
    fam, kept = cov.family, cov.fixed
    assert kept is not None
    out = np.empty((len(fam.kernels), fam.offsets[-1][1]))
    for c, part in enumerate(fam.stationary):
        rbf = cast(RBF, part)
        g_ell: float | Array = 0.0
        g_var = g_noise = 0.0
        blocks = [] if dKuu is None else [(dKuu[c], kept.Kuu_se[c], True)]
        if dKuf is not None:
            blocks.append((dKuf[c], cov.Kuf[c], False))
        for dK, K, square in blocks:
            d_ell, d_var = _fixed_blocks(kept, c, rbf, dK, K, square)
            g_var += d_var
            g_ell = g_ell + d_ell
        if dKuu is not None:
            g_noise += float(np.trace(dKuu[c]))
        if Kuf_sums is not None:  # isotropic: the two contractions, formed by the caller
            d_ell, d_var = rbf.sqdist_gradient(float(Kuf_sums[c][0]), float(Kuf_sums[c][1]))
            g_var += d_var
            g_ell = g_ell + d_ell
        s_diag = 0.0 if dKff_diag is None else float(np.sum(dKff_diag[c]))
        for index, (start, stop) in enumerate(fam.offsets):
            if index == fam.stationary_index:
                out[c, start : stop - 1] = g_ell
                out[c, stop - 1] = g_var + rbf.variance * s_diag
            else:  # a noise part: d/dlog(variance)
                out[c, start] = fam.parts[index][c].variance * (g_noise + s_diag)
    return out


@compilable
def _forward(family: StackedKernels, Z: Array, X: Array, natural: Array
             ) -> tuple[_Distances, Array, Array, Array]:
    """``(distances, Kuu [C, M, M], Kuf [C, M, B], Kff_diag [C, B])`` of ``family`` at
    ``Z [C, M, D]``, ``X [B, D]`` with parameters ``natural [C, P]`` (device arrays only: a
    compiled region of the step)."""
    xp = ops.namespace(Z)
    C, M, D = Z.shape
    start, stop = family.offsets[family.stationary_index]
    ell_rows = natural[:, start : stop - 1]  # [C, D']
    ell = ell_rows[:, None, :]
    var = natural[:, stop - 1]
    # one shift for every latent and the batch (distances do not change)
    shift = ops.mean_rows(Z)
    Xs = X - shift
    Zs: Array | None = None
    # the one choice of form (two algorithms, each with its own roundings; the rest of the
    # forward and the VJP follow it through ``Zs``): numpy divides by the lengthscales, keeps
    # ``Zs`` and forms its products in place; a device multiplies by their inverses and
    # fuses its operators
    if ops.is_numpy(Z):  # A from Zs = Z - shift, kept for the VJP; |a|^2 the Gram's diagonal
        inv_ell, ell2 = None, ell_rows * ell_rows
        inv_ell2 = ops.reciprocal(ell2)
        Zs = Z - shift
        A = Zs / ell
        G_AA = ops.matmul_t(A, A)
        a2 = ops.copy(ops.diagonal(G_AA))
    else:  # a device's g_Z multiplies by the inverse lengthscales
        inv_ell, ell2 = ops.reciprocal(ell_rows), None
        inv_ell2 = inv_ell * inv_ell
        A = Z - shift
        A /= ell
        a2 = ops.einsum("cmd,cmd->cm", A, A)
        G_AA = ops.matmul_t(A, A)
    a2_col = a2[:, :, None]  # [C, M, 1], shared by both distances
    r2_uu = StackedCovariances._sqdist(a2_col, a2[:, None, :], G_AA)
    ops.fill_diagonal(r2_uu, 0.0)
    if Zs is not None:  # A is read no more: (Z - shift) / ell^2 in place
        A /= ell
        As, kept = A, None
    else:
        As, kept = A / ell, A  # (Z - shift) / ell^2: A . ((x - shift) / ell) = As . (x - shift)
    cross = ops.matmul_t(As, Xs) if Zs is None else _host_cross(As, Xs)
    del As
    Xs2 = Xs * Xs
    r2_uf = StackedCovariances._sqdist(a2_col, _scaled_norms(Xs2, inv_ell2)[:, None, :], cross,
                                       doubled=Zs is not None)
    proto = family.stationary[0]
    vk = xp.reshape(var, (C, 1, 1)) if Zs is not None else None
    d = _Distances(kept, Xs, r2_uu, proto._g(r2_uu), r2_uf, proto._g(r2_uf), ell, inv_ell, var,
                   Xs2, ell2, inv_ell2, vk, Zs)
    Kuu = _times_variances(d.g_uu, var, vk)
    Kuf = _times_variances(d.g_uf, var, vk)
    Kff_diag = ops.repeat_columns(var, X.shape[0])  # [C, B]
    for index, _ in family.noise_parts():
        first = family.offsets[index][0]
        noise = natural[:, first : first + 1]  # [C, 1]: one slice (a view, as [:, i, None])
        if family.noise_on_square[index]:
            ops.add_diagonal(Kuu, noise)
        Kff_diag += noise
    return d, Kuu, Kuf, Kff_diag


@compilable
def _vjp(cov: StackedCovariances, dKuu: Array | None, dKuf: Array | None,
         dKff_diag: Array | None, inputs: bool, out_Z: Array | None = None
         ) -> tuple[Array, Array | None]:
    """``StackedCovariances.vjp`` (a compiled region of the step): ``(g_params [C, P],
    g_Z [C, M, D] or None)`` from the matrices' weights ``G`` (``_weight_sums``)."""
    d = cov.d
    ard = cov.family.stationary[0].ard
    sum_ff = (None if dKff_diag is None
              else ops.namespace(cov.Z).sum(dKff_diag, axis=1))  # [C], shared
    # the square matrix first: the sums below run in this order
    pairs = [(dK, r2, g, square) for dK, r2, g, square in
             ((dKuu, d.r2_uu, d.g_uu, True), (dKuf, d.r2_uf, d.g_uf, False)) if dK is not None]
    host = d.Zs is not None  # numpy's form: products in place (``matmul_add_``)
    # numpy, a kernel with dg/dr2 = c g (RBF): var's gradient from the weights' sums
    per_g = cov.family.stationary[0].dg_dr2_per_g if host else None
    sums = _weight_sums(cov, pairs, need_products=(ard or inputs) and not host, per_g=per_g)
    d_var = (_variance_gradient(d, sum_ff, pairs) if per_g is None
             else _variance_from_totals(d, sum_ff, sums.total, per_g))
    if sums.rA is None or not (ard or inputs):
        d_ell = sums.d_ell
        g_Z = ops.zeros(cov.Z, tuple(cov.Z.shape)) if inputs else None
    elif host:
        d_ell, g_Z = _host_lengthscales_and_inputs(d, sums, ard, inputs, out_Z)
    elif ard:
        d_ell, g_Z = _ard_on_device(d, sums, inputs)
    else:
        d_ell, g_Z = _lengthscales_and_inputs(d, sums, inputs)
    return _parameter_gradients(cov, d_ell, d_var, sum_ff, dKuu), g_Z


Pair = tuple[Array, Array, Array, bool]  # (dK, r2, g, square) of one matrix


class _Sums(NamedTuple):
    """What the VJP's parameter and input gradients need of the weights ``G`` of both
    matrices: ``rA = 2 r_uu + r_uf`` ``[C, M]`` (row sums, ``None`` without matrix
    gradients), ``GA = G_uu A`` and ``GB = G_uf Bx`` ``[C, M, D]`` (``None`` where its matrix
    has no gradient or no products are asked for), the weights ``G_uu [C, M, M]`` and
    ``G_uf [C, M, B]`` (``None`` where its matrix has no gradient), the isotropic
    lengthscales' gradient ``d_ell [C, 1]`` (``None`` for ARD) and, where asked for
    (``per_g``), every weight of both matrices summed, ``total [C]`` (else ``None``)."""

    rA: Array | None
    GA: Array | None
    GB: Array | None
    G_uu: Array | None
    G_uf: Array | None
    d_ell: Array | None
    total: Array | None = None


def _variance_gradient(d: _Distances, sum_ff: Array | None, pairs: list[Pair]
                       ) -> Array | None:
    """``d/dlog var = var (sum(dKff_diag) + sum_k sum(dK_k * g_k))`` ``[C]`` (``None``
    without gradients), the sums from their first term (0 + x = x: no zeros, no addition);
    on a device each matrix's term one ``einsum`` operator with ``var``."""
    d_var = None if sum_ff is None else d.var * sum_ff
    for dK, _, g, _ in pairs:
        term = ops.scaled_inner(dK, g, d.var)
        if d_var is None:
            d_var = term
        else:
            d_var += term
    return d_var


def _variance_from_totals(d: _Distances, sum_ff: Array | None, total: Array | None,
                          per_g: float) -> Array | None:
    """``_variance_gradient`` of a kernel with ``dg/dr2 = per_g g`` (numpy): each matrix's
    ``var sum(dK * g)`` is ``sum(G) / per_g`` (``G = dK var dg/dr2``, its symmetric part
    summing alike), so the row sums of ``_weight_sums`` give it (``total [C]``) where an
    ``einsum`` over each matrix and ``dK`` did (the same sums in another order: round-off)."""
    d_var = None if sum_ff is None else d.var * sum_ff
    if total is None:
        return d_var
    term = total / per_g
    return term if d_var is None else d_var + term


def _weights(proto: Stationary, d: _Distances, pair: Pair, per_g: float | None = None
             ) -> Array:
    """``G = dK * var * dg/dr2`` ``[C, M, N]`` of one matrix, its symmetric part for the
    square one (both gradients see it only through that); on a device the products one
    ``einsum`` operator and the symmetric part one more (``ops.symmetrize``). ``per_g``
    (numpy, ``dg/dr2 = per_g g``): ``g (per_g var)`` in one pass (the same values: ``per_g``
    a power of two, its products exact)."""
    dK, r2, g, square = pair
    if d.vk is None:
        G = ops.einsum("cmn,cmn,c->cmn", proto._dg_dr2_from(r2, g), dK, d.var)
    elif per_g is not None:
        G = np.multiply(g, per_g * d.vk)
        G *= dK
    else:
        G = proto._dg_dr2_from(r2, g)
        G *= d.vk
        G *= dK
    return ops.symmetrize(G) if square else G


def _weight_sums(cov: StackedCovariances, pairs: list[Pair], need_products: bool,
                 per_g: float | None = None) -> _Sums:
    """``_Sums`` of the matrices' weights ``G`` (``_weights``): row sums (``G_uu``'s counted
    twice, doubled where they are added: ``2 r_uu + r_uf`` in one operator), the isotropic
    lengthscales' ``-2 sum G * r2``, with ``need_products`` ``G_uu A`` and ``G_uf Bx``, and
    with ``per_g`` (numpy) the row sums summed (``total``)."""
    d = cov.d
    xp = ops.namespace(cov.Z)
    proto = cov.family.stationary[0]
    rA = row_uu = GA = GB = G_uu = G_uf = d_ell = total = None
    for pair in pairs:
        _, r2, _, square = pair
        G = _weights(proto, d, pair, per_g)
        row = xp.sum(G, axis=2)  # [C, M]
        if per_g is not None:
            total = xp.sum(row, axis=1) if total is None else total + xp.sum(row, axis=1)
        if square:
            row_uu, G_uu = row, G
        else:
            rA = row if row_uu is None else ops.plus_scaled(row, row_uu, 2.0)
            G_uf = G
        if not proto.ard:
            term = xp.reshape(-2.0 * ops.einsum("cmn,cmn->c", G, r2), (r2.shape[0], 1))
            if d_ell is None:
                d_ell = term
            else:
                d_ell += term
        if need_products:
            assert d.A is not None  # a device's (numpy: ``_host_lengthscales_and_inputs``)
            if square:
                GA = G @ d.A
            else:
                GB = cov._batch_product(G)
    if rA is None and row_uu is not None:
        rA = 2.0 * row_uu
    return _Sums(rA, GA, GB, G_uu, G_uf, d_ell, total)


def _host_lengthscales_and_inputs(d: _Distances, sums: _Sums, ard: bool, inputs: bool,
                                  out_Z: Array | None = None
                                  ) -> tuple[Array | None, Array | None]:
    """``(d_ell [C, D'], g_Z [C, M, D] or None)`` on numpy from ``_Sums`` with row sums and
    weights (no products), in the unscaled ``Zs = Z - shift`` (``A = Zs / ell``,
    ``Bx = Xs / ell``): with ``W = rA Zs - 2 G_uu Zs - G_uf Xs`` ``[C, M, D]``,
    ``g_Z = (2 / ell^2) W`` and, for ARD,
    ``d/dlog ell = -(2 / ell^2) (sum_m Zs * (W - G_uf Xs) + c_uf . Xs^2)`` (``c_uf`` the column
    sums of ``G_uf``; isotropic: ``sums.d_ell``), the formulas of
    ``_lengthscales_and_inputs`` multiplied out. ``W`` is formed by two products: the first
    ``(diag(rA) - 2 G_uu) Zs`` (``G_uu``, the VJP's own symmetric array, scaled and its
    diagonal moved in place: an ``[C, M, M]`` pass instead of an ``[C, M, D]`` pass forming
    ``rA Zs``), the second added by ``gemm`` with ``beta = 1`` (``ops.matmul_add_``);
    ``sum_m Zs * G_uf Xs`` is the change of ``sum_m Zs * W`` over the second product
    (``t1 - t2``), so no ``G_uf Xs`` array is formed: one ``[C, M, D]`` array (the result)
    and three passes over it besides the products. Without ``G_uu``, ``W`` starts as
    ``rA Zs``. ``out_Z``: the array ``W`` is (``StackedCovariances.vjp``)."""
    assert d.Zs is not None and sums.rA is not None  # numpy's forward keeps Zs
    Zs = d.Zs
    out = out_Z if inputs else None
    if sums.G_uu is not None:  # (diag(rA) - 2 G_uu) Zs: one product, no pass over rA Zs
        H = sums.G_uu  # the VJP's own array, read no more
        H *= -2.0
        W = np.matmul(ops.add_diagonal(H, sums.rA), Zs, out=out)
    elif out is not None:
        W = np.multiply(Zs, sums.rA[:, :, None], out=out)  # rA Zs
    else:
        W = ops.scale_rows(Zs, sums.rA)  # rA Zs
    d_ell = sums.d_ell
    t1 = ops.einsum("cmd,cmd->cd", Zs, W) if ard else None
    if sums.G_uf is not None:
        ops.matmul_add_(W, sums.G_uf, d.Xs, -1.0)  # - G_uf Xs: one product for every latent
    if ard:
        assert t1 is not None and d.ell2 is not None  # numpy's
        if sums.G_uf is None:
            d_ell = t1
        else:  # sum_m Zs * (W - G_uf Xs) = 2 t2 - t1, plus c_uf . Xs^2
            d_ell = ops.einsum("cmd,cmd->cd", Zs, W)
            d_ell *= 2.0
            d_ell -= t1
            d_ell += ops.namespace(Zs).sum(sums.G_uf, axis=1) @ d.Xs2
        d_ell /= d.ell2
        d_ell *= -2.0
    if not inputs:
        return d_ell, None
    W *= (2.0 * d.inv_ell2)[:, None, :]
    return d_ell, W


def _lengthscales_and_inputs(d: _Distances, sums: _Sums, inputs: bool
                             ) -> tuple[Array | None, Array | None]:
    """``(d_ell [C, 1], g_Z [C, M, D] or None)`` from ``_Sums`` with row sums and products
    (an isotropic kernel on a device; ``d_ell`` is ``sums.d_ell``): ``H = 2 G_uu A + G_uf Bx``
    and ``g_Z = (2 / ell) (A * rA - H)``."""
    assert d.A is not None  # a device's
    GA, GB = sums.GA, sums.GB
    if not inputs:
        return sums.d_ell, None
    H = GB if GB is not None else GA  # G_uu A + G_uf Bx
    if GA is not None and GB is not None:
        H += GA
    AR = ops.scale_rows(d.A, sums.rA)  # A * rA[:, :, None]
    if GA is not None:  # H = G_uu A + G_uf Bx + G_uu A (in place)
        H += GA
    AR -= H
    return sums.d_ell, _twice_over_ell(AR, d)


def _ard_on_device(d: _Distances, sums: _Sums, inputs: bool) -> tuple[Array, Array | None]:
    """``_lengthscales_and_inputs`` for ARD on a device, in fewer operators (the same
    formulas, other roundings): with ``V = A * rA - 2 G_uu A - 2 G_uf Bx``,
    ``d/dlog ell = -2 (sum_m A * V + c_uf . Bx^2)`` (``c_uf . Bx^2`` one ``einsum`` with the
    kept ``1 / ell^2``) and ``g_Z = (2 / ell) (V + G_uf Bx)``."""
    xp = ops.namespace(d.A)
    V = ops.scale_rows(d.A, sums.rA)  # A * rA[:, :, None]
    for P in (sums.GA, sums.GB):
        if P is not None:
            ops.add_scaled_(V, P, -2.0)
    d_ell = ops.einsum("cmd,cmd->cd", d.A, V)
    if sums.G_uf is not None:  # c_uf . Bx^2 = (c_uf (X - shift)^2) / ell^2
        d_ell += ops.einsum("cn,nd,cd->cd", xp.sum(sums.G_uf, axis=1), d.Xs2, d.inv_ell2)
    d_ell *= -2.0
    if not inputs:
        return d_ell, None
    if sums.GB is not None:
        V += sums.GB
    return d_ell, _twice_over_ell(V, d)


def _parameter_gradients(cov: StackedCovariances, d_ell: Array | None, d_var: Array | None,
                         sum_ff: Array | None, dKuu: Array | None) -> Array:
    """Every latent's parameter gradients ``[C, P]`` in its kernel's order: the stationary
    part's ``[C, D']`` block (``d_ell``) and ``[C]`` column (``d_var``), each noise part's
    ``noise * (sum(dKff_diag) + trace(dKuu))`` column (``dKuu``'s only where the part sits on
    the square matrix); ``None`` gradients are zeros. Runs of adjacent columns are stacked at
    once (one operator, not one view each)."""
    fam = cov.family
    xp = ops.namespace(cov.Z)
    C = cov.Z.shape[0]
    if d_var is None:
        d_var = ops.zeros(cov.Z, (C,))
    if d_ell is None:
        d_ell = ops.zeros(cov.Z, (C, cov.d.inv_ell2.shape[1]))
    blocks: list[Array] = []
    columns: list[Array] = []

    def close_columns() -> None:
        if columns:
            blocks.append(xp.stack(columns, axis=1) if len(columns) > 1 else columns[0][:, None])
            columns.clear()

    for index in range(len(fam.parts)):
        if index == fam.stationary_index:
            close_columns()
            blocks.append(d_ell)
            columns.append(d_var)
            continue
        noise = cov.natural[:, fam.offsets[index][0]]
        total = sum_ff
        if dKuu is not None and fam.noise_on_square[index]:
            on_diag = ops.trace(dKuu)
            total = on_diag if total is None else total + on_diag
        columns.append(ops.zeros(cov.Z, (C,)) if total is None else noise * total)
    close_columns()
    return xp.concat(blocks, axis=1)


class StackedMatrixGradients(Sequence[MatrixGradients]):
    """Matrix gradients of ``C`` latents kept as stacks: ``Kuu [C, M, M]``, ``Kuf [C, M, B]``,
    ``Kff_diag [C, B]`` (each may be ``None``). A sequence of per-latent ``MatrixGradients``
    (views, made on access) for code that reads them one by one;
    ``hyper.parameter_gradient`` hands the stacks to one batched VJP as they are."""

    def __init__(self, Kuu: Array | None, Kuf: Array | None, Kff_diag: Array | None):
        self.Kuu, self.Kuf, self.Kff_diag = Kuu, Kuf, Kff_diag
        self._n = next(a.shape[0] for a in (Kuu, Kuf, Kff_diag) if a is not None)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, c: int) -> MatrixGradients: ...

    @overload
    def __getitem__(self, c: slice) -> list[MatrixGradients]: ...

    def __getitem__(self, c: int | slice) -> MatrixGradients | list[MatrixGradients]:
        if isinstance(c, slice):
            return [self[i] for i in range(self._n)[c]]
        if not -self._n <= c < self._n:
            raise IndexError(c)
        return MatrixGradients(Kuu=None if self.Kuu is None else self.Kuu[c],
                               Kuf=None if self.Kuf is None else self.Kuf[c],
                               Kff_diag=None if self.Kff_diag is None else self.Kff_diag[c])


class StackedKernels:
    """``C`` kernels of one family, evaluated together (``of`` builds one, or says no)."""

    def __init__(self, kernels: Sequence[Kernel], signature: tuple):
        self.kernels = list(kernels)
        per_latent = [_parts(k) for k in self.kernels]
        #: parts by position, each a list over the latents
        self.parts: list[list] = [list(p) for p in zip(*per_latent)]
        self.stationary_index = next(i for i, s in enumerate(signature)
                                     if issubclass(s[0], Stationary))
        self.stationary: list[Stationary] = self.parts[self.stationary_index]
        #: ``(start, stop)`` of each part's parameters in a kernel's unconstrained vector
        sizes = np.cumsum([0] + [p[0].n_params for p in self.parts])
        self.offsets = [(int(a), int(b)) for a, b in zip(sizes[:-1], sizes[1:])]
        #: whether a noise part sits on the square matrix (``White``) or only on ``Kff_diag``
        self.noise_on_square = [i != self.stationary_index and parts[0].on_square
                                for i, parts in enumerate(self.parts)]
        self._last: tuple[object, StackedCovariances] | None = None

    @classmethod
    def of(cls, kernels: Sequence[Kernel]) -> StackedKernels | None:
        """The batched form of ``kernels`` (one per latent), or ``None`` when their families
        differ or cannot be batched here (then use each kernel on its own)."""
        signatures = {_signature(k) for k in kernels}
        signature = signatures.pop() if len(signatures) == 1 else None
        return None if signature is None else cls(kernels, signature)

    def theta(self) -> np.ndarray:
        """Every latent's unconstrained parameters, ``[C, P]`` (host)."""
        return np.stack([k.get_unconstrained() for k in self.kernels])

    def noise_parts(self) -> list[tuple[int, list[White]]]:
        """``(position, parts over the latents)`` of the ``White``-type parts."""
        return [(i, p) for i, p in enumerate(self.parts) if i != self.stationary_index]

    @property
    def cached_distance_form(self) -> bool:
        """Whether the fixed-input mode's cached distances serve these kernels: the
        stationary part gives its matrices from squared distances (``Stationary.sqdist_form``,
        ``RBF``) and every noise part sits on the square matrix too (``White.on_square``)."""
        return self.stationary[0].sqdist_form and all(
            self.noise_on_square[i] for i, _ in self.noise_parts())

    def fixed_covariances(self, inputs: FixedInputs, cols: Array | None = None,
                          rows: Array | None = None, out: Array | None = None
                          ) -> StackedCovariances:
        """``StackedCovariances.at_fixed_inputs`` of these kernels (latents sharing
        ``inputs``, isotropic and ``cached_distance_form``): ``Kuu [C, M, M]``,
        ``Kuf [C, M, B]``, ``Kff_diag [C, B]`` at the columns ``cols`` (``None``: all) of the
        fixed ``X``, and ``vjp_fixed``."""
        return StackedCovariances.at_fixed_inputs(self, inputs, cols, rows, out)

    def covariances(self, Z: Array, X: Array, version: object = None,
                    theta: Array | None = None) -> StackedCovariances:
        """``StackedCovariances`` at ``Z [C, M, D]`` and ``X [B, D]`` with the kernels'
        current parameters. ``version``: a key that changes whenever the parameters or ``Z``
        do (e.g. ``HyperParameters.version``); the last result is reused while the key and
        the very objects ``Z`` and ``X`` are the same (no values compared). ``None``: always
        computed afresh. (The host parameters, ``[C, P]`` floats, are checked as well, so a
        kernel changed without a new version is never served stale values.) ``theta``: the
        parameters ``[C, P]`` on ``Z``'s device, used instead of the kernels' host values (the
        caller keeps them current: ``HyperParameters``; no host read)."""
        last = self._last
        if (version is not None and last is not None and last[0] == version
                and last[1].Z is Z and last[1].X is X
                and (theta is not None if last[1].theta is None
                     else theta is None and np.array_equal(last[1].theta, self.theta()))):
            return last[1]
        # released first (no local reference left either): one set of these arrays alive,
        # not two
        del last
        self._last = None
        cov = StackedCovariances(self, Z, X, theta)
        self._last = None if version is None else (version, cov)
        return cov
