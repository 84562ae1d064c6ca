"""The kernels' covariances at fixed inputs: inducing inputs ``Z [M, D]`` and training inputs
``X [N, D]`` declared fixed once, only kernel parameters learned (svi and the vi-jj family
with ``Z`` fixed; numpy).

``fixed_groups(kernels, Zs, X)`` groups the latents: those with equal inducing inputs share one
``FixedInputs``, the cache of everything that depends on the inputs alone, and where their
kernels are of one family one ``StackedKernels``; ``fixed_matrices`` gives every latent's
matrices (one ``StackedCovariances`` per group), ``fixed_gradient`` their kernel gradients
(one ``vjp_fixed`` per group over the latents' own gradient arrays). The cache holds:

- the centring shift (the column mean of ``X``) and ``Z - shift``;
- isotropic squared-distance kernels: the raw squared distances ``[M, M]`` and, in memory while
  ``M N <= DISTANCE_CACHE_MAX_ENTRIES``, ``[N, M]`` (batch rows gather contiguously), so that
  each call costs one ``exp`` over ``[M, B]``;
- ARD: the centred inputs ``X - shift`` ``[N, D]`` (each call one ``[M, B, D]``-free product of
  the scaled inputs).

Out of core (``X`` a ``gpinfer.data.source.SourceRows``) the shift is one pass in chunks, no
``[M, N]`` or ``[N, D]`` array is kept (memory independent of ``N``) and each batch is centred
as it is read; with the same shift and no cache the matrices are the in-memory path's bit for
bit.

The fast path is taken by the kernels' own declarations: one ``Stationary`` part with
``sqdist_form`` (``RBF``), alone or summed with ``White`` parts with ``on_square``
(``StackedKernels.cached_distance_form``). It is the fixed-input mode of the batched kernels,
``gpinfer.kernels.stacked.StackedCovariances.at_fixed_inputs`` / ``vjp_fixed``, whose formulas
are the kernel's (``RBF.K_from_sqdist``, ``sqdist_gradient``, ``ard_lengthscale_gradient``);
any other kernel falls back to the functions ``generic_matrices`` / ``generic_gradient``
(``kernel.K`` / ``kernel.grad_params``, same results). At fixed inputs this mode is 5-7x
faster at ``N = 2e5`` than the batched covariances of moving inputs (``docs/design.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from gpinfer.data.source import SourceRows, host_rows
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.stacked import StackedCovariances, StackedKernels
from gpinfer.kernels.stationary import sqdist

#: cache the raw ``[M, N]`` squared distances when ``M * N`` is at most this (8 bytes each)
DISTANCE_CACHE_MAX_ENTRIES = 30_000_000


class FixedInputs:
    """``Z [M, D]`` and ``X [N, D]`` (or a ``SourceRows``) declared fixed, with what depends on
    them alone, each formed on first use and kept: ``shift [D]`` (the column mean of ``X``),
    ``Zc = Z - shift`` ``[M, D]``, the raw squared distances ``D_uu [M, M]`` and ``D_fu [N, M]``
    (in memory, ``M N <= DISTANCE_CACHE_MAX_ENTRIES``; else ``None``) of the centred inputs,
    and the centred ``Xc = X - shift`` ``[N, D]`` (in memory; else ``None``: centred per
    batch). ``same_X``: inputs of other inducing inputs at the same ``X``, whose shift is
    taken (one pass over an out-of-core ``X``, not one per latent)."""

    def __init__(self, Z: Array, X: Array | SourceRows, same_X: FixedInputs | None = None):
        self.Z, self.X = np.asarray(Z, float), host_rows(X)
        self.out_of_core = isinstance(self.X, SourceRows)
        self._kept: dict[str, Any] = {}
        self._same_X = same_X

    def _keep(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._kept:
            self._kept[name] = make()
        return self._kept[name]

    def holds(self, Z: Array) -> bool:
        """Whether these are the inputs of inducing inputs ``Z [M, D]`` (equal values)."""
        Z = np.asarray(Z, float)
        return Z.shape == self.Z.shape and bool(np.array_equal(Z, self.Z))

    @property
    def shift(self) -> Array:
        """The column means ``[D]`` of ``X`` (out of core: one pass in chunks)."""
        X, other = self.X, self._same_X
        return self._keep("shift", lambda: other.shift if other is not None
                          else X.column_mean() if isinstance(X, SourceRows) else X.mean(axis=0))

    @property
    def Zc(self) -> Array:
        """``Z - shift`` ``[M, D]``."""
        return self._keep("Zc", lambda: self.Z - self.shift)

    @property
    def D_uu(self) -> Array:
        """Raw squared distances ``[M, M]`` of ``Zc``."""
        return self._keep("D_uu", lambda: sqdist(self.Zc))

    @property
    def D_fu(self) -> Array | None:
        """Raw squared distances ``[N, M]`` of the centred ``X`` and ``Zc`` (``None`` out of
        core or above ``DISTANCE_CACHE_MAX_ENTRIES``)."""
        def make() -> Array | None:
            if self.out_of_core or self.Z.shape[0] * self.X.shape[0] > \
                    DISTANCE_CACHE_MAX_ENTRIES:
                return None
            return sqdist(self.X - self.shift, self.Zc)
        return self._keep("D_fu", make)

    @property
    def Xc(self) -> Array | None:
        """``X - shift`` ``[N, D]`` (``None`` out of core)."""
        return self._keep("Xc", lambda: None if self.out_of_core else self.X - self.shift)

    def prepare(self, ard: bool) -> None:
        """Form now the caches the fixed-input mode reads (ARD: ``Zc``, ``Xc``; isotropic:
        ``D_uu``, ``D_fu``), not inside a first step."""
        _ = (self.Zc, self.Xc) if ard else (self.D_uu, self.D_fu)

    def rows(self, cols: Array | None, rows: Array | None) -> Array:
        """``X[cols]`` ``[B, D]`` (``cols`` None: all of ``X``): ``rows`` when the caller read
        them."""
        if rows is not None:
            return rows
        return self.X if cols is None else self.X[cols]

    def dist_uf(self, cols: Array | None, rows: Array | None) -> Array:
        """Raw squared distances ``[M, B]`` of ``Zc`` and the batch (a view of ``D_fu``'s
        where kept)."""
        D_fu = self.D_fu
        if D_fu is not None:
            return (D_fu if cols is None else D_fu[cols]).T
        return sqdist(self.Zc, self.rows(cols, rows) - self.shift)

    def centred(self, cols: Array | None, rows: Array | None) -> Array:
        """The batch centred, ``X[cols] - shift`` ``[B, D]`` (rows of ``Xc`` where kept)."""
        Xc = self.Xc
        if Xc is None:  # out of core: the batch centred as read (the same bits)
            return self.rows(cols, rows) - self.shift
        return Xc if cols is None else Xc[cols]


#: latents ``ls`` (indices) at one ``FixedInputs``, with their batched kernels in the
#: cached-distance form (``StackedKernels``; ``None``: one latent off the fast path, whose
#: kernel gives its own matrices and gradient: ``generic_matrices`` / ``generic_gradient``)
FixedGroup = tuple[list[int], FixedInputs, StackedKernels | None]


def fast_family(kernels: Sequence[Kernel]) -> StackedKernels | None:
    """The batched kernels of ``kernels`` when the fixed-input mode serves them (one family
    in the squared-distance form, ``StackedKernels.cached_distance_form``), else ``None``."""
    family = StackedKernels.of(kernels)
    return family if family is not None and family.cached_distance_form else None


def fixed_groups(kernels: Sequence[Kernel], Zs: Sequence[Array], X: Array | SourceRows
                 ) -> list[FixedGroup]:
    """The latents (``kernels[l]`` at ``Zs[l] [M_l, D]`` and ``X``) in groups for the
    fixed-input mode: latents with equal inducing inputs share one ``FixedInputs`` (one
    distance cache; all of them one shift) and, where their kernels batch in the
    squared-distance form with an isotropic lengthscale, one ``StackedKernels`` (one
    ``StackedCovariances`` per call: one gather of the batch's distances for all of them);
    otherwise each latent is a group of its own (its kernel batched alone, or ``None``: the
    generic functions). ARD latents stay alone: their distances are their own (scaled per
    latent), and one group would form each latent's next to all ``C`` cross matrices (one
    ``[M, B]`` array more at the peak than one latent at a time). The caches the fast groups
    read are formed here, not in a first step."""
    shared: list[FixedInputs] = []
    members: list[list[int]] = []
    for l, Z in enumerate(Zs):
        at = next((i for i, s in enumerate(shared) if s.holds(Z)), None)
        if at is None:
            shared.append(FixedInputs(Z, X, same_X=shared[0] if shared else None))
            members.append([])
            at = len(shared) - 1
        members[at].append(l)
    groups: list[FixedGroup] = []
    for inputs, ls in zip(shared, members):
        family = fast_family([kernels[l] for l in ls])
        if len(ls) > 1 and (family is None or family.stationary[0].ard):
            groups.extend(([l], inputs, fast_family([kernels[l]])) for l in ls)
        else:
            groups.append((ls, inputs, family))
    for _, inputs, family in groups:
        if family is not None:
            inputs.prepare(family.stationary[0].ard)
    return groups


def generic_matrices(kernel: Kernel, Z: Array, Xb: Array) -> tuple[Array, Array, Array]:
    """``(Kuu [M, M], Kuf [M, B], Kff_diag [B])`` of a kernel off the fast path at ``Z`` and
    the batch rows ``Xb [B, D]`` (``kernel.K``)."""
    return kernel.K(Z), kernel.K(Z, Xb), kernel.K_diag(Xb)


def generic_gradient(kernel: Kernel, Z: Array, Xb: Array, Kuu: Array | None,
                     Kuf: Array | None, Kff_diag: Array | None) -> Array:
    """The gradient ``[P]`` wrt ``kernel.get_unconstrained()`` of a kernel off the fast path
    from ``dL/dKuu [M, M]``, ``dL/dKuf [M, B]``, ``dL/dKff_diag [B]`` at ``Z`` and the batch
    rows ``Xb [B, D]`` (``kernel.grad_params``; ``None`` is zero)."""
    g = np.zeros(kernel.n_params)
    if Kuu is not None:
        g += kernel.grad_params(Z, None, Kuu)
    if Kuf is not None:
        g += kernel.grad_params(Z, Xb, Kuf)
    if Kff_diag is not None:
        g += kernel.grad_params_diag(Xb, Kff_diag)
    return g


def fixed_matrices(groups: Sequence[FixedGroup], kernels: Sequence[Kernel],
                   cols: Array | None = None, rows: Array | None = None
                   ) -> tuple[list[StackedCovariances | None], list[Array], list[Array], Array]:
    """Every latent's covariances at the columns ``cols`` of the fixed ``X`` (``None``: all;
    ``rows``: ``X[cols]`` ``[B, D]`` where already read): ``(covs, Kuu, Kuf, Kff_diag)``,
    one ``StackedCovariances`` per group (``None`` for a generic one; kept for
    ``fixed_gradient``), per latent ``Kuu [M, M]`` and ``Kuf [M, B]`` (views of the group's
    ``[C, ...]`` arrays), and ``Kff_diag [L, B]``."""
    L = sum(len(g[0]) for g in groups)
    Kuu: list[Array] = [np.empty(0)] * L
    Kuf: list[Array] = [np.empty(0)] * L
    diag: list[Array] = [np.empty(0)] * L
    covs: list[StackedCovariances | None] = []
    for ls, inputs, family in groups:
        if family is None:
            l = ls[0]
            Kuu[l], Kuf[l], diag[l] = generic_matrices(kernels[l], inputs.Z,
                                                       inputs.rows(cols, rows))
            covs.append(None)
            continue
        cov = family.fixed_covariances(inputs, cols, rows)
        covs.append(cov)
        for i, l in enumerate(ls):
            Kuu[l], Kuf[l], diag[l] = cov.Kuu[i], cov.Kuf[i], cov.Kff_diag[i]
    return covs, Kuu, Kuf, np.stack(diag)


def _arrays(per_latent: list[Array | None]) -> list[Array] | None:
    """The latents' gradient arrays of one matrix, ``None`` when no latent has one (zero)."""
    if all(a is None for a in per_latent):
        return None
    if any(a is None for a in per_latent):
        raise ValueError("matrix gradients given for some latents of a group, not all")
    return cast(list[Array], per_latent)


def fixed_gradient(groups: Sequence[FixedGroup], covs: Sequence[StackedCovariances | None],
                   kernels: Sequence[Kernel], grads: Sequence[MatrixGradients],
                   cols: Array | None = None, rows: Array | None = None) -> Array:
    """Every latent's kernel gradient, concatenated in latent order (each in its kernel's
    unconstrained order), from its matrix gradients ``grads[l]`` (``[M, M]``, ``[M, B]``,
    ``[B]``) at the covariances ``covs`` of ``fixed_matrices`` (same ``cols`` / ``rows``):
    one ``vjp_fixed`` per group over the latents' own arrays (no stacked copy)."""
    out: list[Array] = [np.empty(0)] * len(kernels)
    for (ls, inputs, _), cov in zip(groups, covs):
        if cov is None:
            G = grads[ls[0]]
            out[ls[0]] = generic_gradient(kernels[ls[0]], inputs.Z, inputs.rows(cols, rows),
                                          G.Kuu, G.Kuf, G.Kff_diag)
            continue
        dKuu, dKuf, dKff = (_arrays([getattr(grads[l], name) for l in ls])
                            for name in ("Kuu", "Kuf", "Kff_diag"))
        g = cov.vjp_fixed(dKuu, dKuf, dKff)
        for i, l in enumerate(ls):
            out[l] = g[i]
    return np.concatenate(out)
