"""The kernels' covariances at fixed inputs: inducing inputs ``Z [M, D]`` and training inputs
``X [N, D]`` declared fixed once, only kernel parameters learned (svi and the vi-jj family
with ``Z`` fixed; numpy).

``fixed_covariances(kernels, Zs, X)`` builds one ``FixedCovariances`` per latent; latents with
equal inducing inputs share one ``FixedInputs``, the cache of everything that depends on the
inputs alone:

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
any other kernel falls back to ``kernel.K`` / ``kernel.grad_params`` (same results). At fixed
inputs this mode is 5-7x faster at ``N = 2e5`` than the batched covariances of moving inputs
(``docs/design.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpinfer.data.source import SourceRows, host_rows
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


def fixed_covariances(kernels: Sequence[Kernel], Zs: Sequence[Array], X: Array | SourceRows
                      ) -> list[FixedCovariances]:
    """One ``FixedCovariances`` per latent (``kernels[l]`` at ``Zs[l] [M_l, D]`` and ``X``);
    latents with equal inducing inputs share one ``FixedInputs`` (one distance cache), all of
    them one shift."""
    shared: list[FixedInputs] = []
    out: list[FixedCovariances] = []
    for kernel, Z in zip(kernels, Zs):
        inputs = next((s for s in shared if s.holds(Z)), None)
        if inputs is None:
            inputs = FixedInputs(Z, X, same_X=shared[0] if shared else None)
            shared.append(inputs)
        out.append(FixedCovariances(kernel, inputs))
    return out


class FixedCovariances:
    """``Kuu [M, M]``, ``Kuf [M, N]``, ``Kff_diag [N]`` of one kernel at ``FixedInputs``, and
    their gradients wrt the kernel's parameters (see the module docstring).

    The fast path is the batched kernels' fixed-input mode for this one latent
    (``StackedKernels.fixed_covariances``, ``StackedCovariances.vjp_fixed``); the last
    covariances are kept: ``kernel_gradient`` reuses them instead of recomputing distances
    and exponentials in the kernel VJP; in the isotropic case it also takes the two sums its
    ``Kuf`` part needs (``Kuf_sums``, with ``last_distances``) instead of the ``[M, N]``
    gradient. ``cols`` selects a batch of columns; ``rows``, where given, are ``X[cols]`` as
    the caller already read them (bit for bit the rows the instance would gather: an
    out-of-core ``X`` is then read once per batch).
    """

    def __init__(self, kernel: Kernel, inputs: FixedInputs):
        self.kernel, self.inputs = kernel, inputs
        self.Z, self.X = inputs.Z, inputs.X
        # the batched kernels' reading of the parts (one stationary part, ``White``-type
        # noise), and the kernels' own declarations: the squared-distance form
        # (``Stationary.sqdist_form``: RBF, not a subclass that changes ``_g``) and noise on
        # the square matrix too (``White.on_square``: not a noise on ``Kff_diag`` alone)
        family = StackedKernels.of([kernel])
        if family is not None and not family.cached_distance_form:
            family = None  # batched alike, but not in the squared-distance form
        self._family = family
        self.fast = family is not None
        self.ard = family is not None and family.stationary[0].ard
        if self.fast:  # the caches this kernel reads, formed now (not inside the first step)
            _ = (inputs.Zc, inputs.Xc) if self.ard else (inputs.D_uu, inputs.D_fu)
        #: the last covariances of the fast path (the batched kernels' fixed-input mode)
        self._stacked: StackedCovariances | None = None

    def matrices(self, cols: Array | None = None, out: Array | None = None,
                 rows: Array | None = None) -> tuple[Array, Array, Array]:
        """``(Kuu, Kuf, Kff_diag)`` at the kernel's current parameters (``cols``: a batch;
        ``rows``: its rows ``X[cols]`` ``[B, D]`` where already read).

        ``out``: an ``[M, N]`` array that ``Kuf`` may be written into, used on the isotropic
        fast path when it has the layout of the cached distances (``Kuf`` is then a view of
        ``out``: check with ``np.shares_memory``).
        """
        if self._family is None:
            Xb = self.inputs.rows(cols, rows)
            k = self.kernel
            return k.K(self.Z), k.K(self.Z, Xb), k.K_diag(Xb)
        cov = self._stacked = self._family.fixed_covariances(self.inputs, cols, rows, out)
        return cov.Kuu[0], cov.Kuf[0], cov.Kff_diag[0]

    def release(self) -> None:
        """Drop the matrices kept from the last call (before computing new ones, so that their
        arrays can be freed or reused first)."""
        self._stacked = None

    @property
    def contracts_kuf(self) -> bool:
        """Whether ``kernel_gradient`` accepts ``Kuf_sums`` (isotropic fast path): its ``Kuf``
        part needs only ``sum(G * Kuf_rbf)`` and ``sum(G * Kuf_rbf * D)``, ``D`` the squared
        distances of ``last_distances()``."""
        return self.fast and not self.ard

    def last_distances(self) -> Array:
        """Squared distances ``D [M, N]`` (or the batch's) of the last ``matrices`` call
        (isotropic fast path)."""
        if not self.contracts_kuf:
            raise ValueError("last_distances needs the isotropic RBF fast path (contracts_kuf)")
        if self._stacked is None:
            self.matrices()
        assert self._stacked is not None and self._stacked.fixed is not None
        D_uf = self._stacked.fixed.D_uf
        assert D_uf is not None  # the isotropic fast path's
        return D_uf

    def kernel_gradient(self, Kuu: Array | None, Kuf: Array | None, Kff_diag: Array | None,
                        cols: Array | None = None,
                        Kuf_sums: tuple[float, float] | None = None,
                        rows: Array | None = None) -> Array:
        """Gradient ``[P]`` wrt ``kernel.get_unconstrained()`` from matrix gradients
        ``dL/dKuu [M, M]``, ``dL/dKuf [M, N]`` (or its batch columns) and
        ``dL/dKff_diag [N]``, at the parameters of the last ``matrices`` call (``rows``:
        ``X[cols]`` where already read; only the generic fallback reads rows here).

        ``Kuf_sums`` (only where ``contracts_kuf``; then pass ``Kuf=None``):
        ``(sum(dL/dKuf * Kuf), sum(dL/dKuf * Kuf * D))`` with ``Kuf`` and ``D`` of the last
        ``matrices`` call, for a ``Kuf`` gradient that is cheaper to contract than to form.
        """
        if Kuf_sums is not None and not self.contracts_kuf:
            raise ValueError("Kuf_sums needs the isotropic RBF fast path (contracts_kuf)")
        if not self.fast:
            return self._generic_gradient(Kuu, Kuf, Kff_diag, self.inputs.rows(cols, rows))
        if self._stacked is None:
            self.matrices(cols, rows=rows)
        assert self._stacked is not None
        Kuu_c, Kuf_c, Kff_c = (None if G is None else G[None] for G in (Kuu, Kuf, Kff_diag))
        sums = None if Kuf_sums is None else np.array([Kuf_sums], dtype=float)
        return self._stacked.vjp_fixed(Kuu_c, Kuf_c, Kff_c, Kuf_sums=sums)[0]

    def _generic_gradient(self, Kuu: Array | None, Kuf: Array | None, Kff_diag: Array | None,
                          Xb: Array) -> Array:
        """``kernel_gradient`` of a kernel off the fast path (``kernel.grad_params``), at the
        batch rows ``Xb [B, D]``."""
        k, g = self.kernel, np.zeros(self.kernel.n_params)
        if Kuu is not None:
            g += k.grad_params(self.Z, None, Kuu)
        if Kuf is not None:
            g += k.grad_params(self.Z, Xb, Kuf)
        if Kff_diag is not None:
            g += k.grad_params_diag(Xb, Kff_diag)
        return g
