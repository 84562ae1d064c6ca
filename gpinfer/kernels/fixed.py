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
``sqdist_form`` (``RBF``), alone or summed with ``White`` parts with ``on_square``. Its formulas
are the kernel's (``RBF.K_from_sqdist``, ``sqdist_gradient``, ``ard_lengthscale_gradient``);
any other kernel falls back to ``kernel.K`` / ``kernel.grad_params`` (same results). The
batched covariances of moving inputs are ``gpinfer.kernels.stacked.StackedCovariances``; at
fixed inputs this mode is 5-7x faster at ``N = 2e5`` (``docs/design.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from gpinfer.data.source import SourceRows, host_rows
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.stacked import StackedKernels
from gpinfer.kernels.stationary import RBF, sqdist
from gpinfer.kernels.white import White

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

    Keeps the last matrices: ``kernel_gradient`` reuses them instead of recomputing distances
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
        if family is not None and not (family.stationary[0].sqdist_form and all(
                family.noise_on_square[i] for i, _ in family.noise_parts())):
            family = None  # batched alike, but not in the squared-distance form
        self.fast = family is not None
        self._parts = [] if family is None else [p[0] for p in family.parts]
        self._whites: list[White] = ([] if family is None
                                     else [p[0] for _, p in family.noise_parts()])
        self._rbf = -1 if family is None else family.stationary_index  # the RBF among the parts
        self._rbf_part = None if family is None else cast(RBF, family.stationary[0])
        self.ard = self._rbf_part is not None and self._rbf_part.ard
        if self.fast:  # the caches this kernel reads, formed now (not inside the first step)
            _ = (inputs.Zc, inputs.Xc) if self.ard else (inputs.D_uu, inputs.D_fu)
        #: the last ``(Kuu_rbf, Kuf_rbf, distances)``: raw ``D [M, N]``, or ARD ``(A, B)``
        self._last: tuple[Array, Array, Any] | None = None

    def _fast_rbf(self) -> RBF:
        """The RBF part of the fast path."""
        if self._rbf_part is None:
            raise ValueError("FixedCovariances: not an RBF (+ White) kernel")
        return self._rbf_part

    def matrices(self, cols: Array | None = None, out: Array | None = None,
                 rows: Array | None = None) -> tuple[Array, Array, Array]:
        """``(Kuu, Kuf, Kff_diag)`` at the kernel's current parameters (``cols``: a batch;
        ``rows``: its rows ``X[cols]`` ``[B, D]`` where already read).

        ``out``: an ``[M, N]`` array that ``Kuf`` may be written into, used when it has the
        layout of the cached distances (``Kuf`` is then ``out``; check with ``is``).
        """
        if not self.fast:
            Xb = self.inputs.rows(cols, rows)
            k = self.kernel
            return k.K(self.Z), k.K(self.Z, Xb), k.K_diag(Xb)
        rbf = self._fast_rbf()
        if self.ard:
            return self._matrices_ard(rbf, cols, rows)
        Kuu_se = rbf.K_from_sqdist(self.inputs.D_uu)
        D_uf = self.inputs.dist_uf(cols, rows)
        Kuf = rbf.K_from_sqdist(D_uf, out=out)
        noise = sum(p.variance for p in self._whites)
        Kuu = Kuu_se + noise * np.eye(self.Z.shape[0])
        n = self.X.shape[0] if cols is None else len(cols)
        self._last = (Kuu_se, Kuf, D_uf)
        return Kuu, Kuf, np.full(n, rbf.variance + noise)

    def _matrices_ard(self, rbf: RBF, cols: Array | None, rows: Array | None
                      ) -> tuple[Array, Array, Array]:
        ell = np.asarray(rbf.lengthscale, dtype=float)
        B = self.inputs.Zc / ell  # [M, D]
        A = self.inputs.centred(cols, rows) / ell  # [N, D]
        Kuu_se = rbf.K_from_sqdist(sqdist(B), scaled=True)
        Kuf = rbf.K_from_sqdist(sqdist(B, A), scaled=True)
        noise = sum(p.variance for p in self._whites)
        self._last = (Kuu_se, Kuf, (A, B))
        return Kuu_se + noise * np.eye(B.shape[0]), Kuf, np.full(A.shape[0], rbf.variance + noise)

    def release(self) -> None:
        """Drop the matrices kept from the last call (before computing new ones, so that their
        arrays can be freed or reused first)."""
        self._last = None

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
        if self._last is None:
            self.matrices()
        assert self._last is not None
        return self._last[2]

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
        if self._last is None:
            self.matrices(cols, rows=rows)
        assert self._last is not None
        Kuu_se, Kuf_se, D_uf = self._last
        rbf = self._fast_rbf()
        g_ell: float | Array = 0.0
        g_var = g_noise = 0.0
        if Kuu is not None:
            GK = Kuu * Kuu_se
            d_ell, d_var = self._rbf_gradient(
                rbf, GK, (D_uf[1], D_uf[1]) if self.ard else None,
                lambda: float(np.sum(GK * self.inputs.D_uu)))
            g_var += d_var
            g_ell = g_ell + d_ell
            g_noise += float(np.trace(Kuu))
        if Kuf is not None:
            GK = Kuf * Kuf_se
            d_ell, d_var = self._rbf_gradient(
                rbf, GK, D_uf if self.ard else None,
                lambda: float(np.einsum("ij,ij->", GK, D_uf)))
            g_var += d_var
            g_ell = g_ell + d_ell
        if Kuf_sums is not None:  # isotropic: the two contractions, formed by the caller
            d_ell, d_var = rbf.sqdist_gradient(float(Kuf_sums[0]), float(Kuf_sums[1]))
            g_var += d_var
            g_ell = g_ell + d_ell
        s_diag = 0.0 if Kff_diag is None else float(np.sum(Kff_diag))
        return self._in_parameter_order(rbf, g_ell, g_var + rbf.variance * s_diag,
                                        g_noise + s_diag)

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

    def _in_parameter_order(self, rbf: RBF, g_ell: float | Array, g_var: float,
                            g_noise: float) -> Array:
        """The fast path's gradient ``[P]`` in the kernel's parameter order: the RBF's
        ``d/dlog lengthscale`` (one or ``D``) and ``d/dlog variance``, each ``White``'s
        ``variance * g_noise``."""
        out: list[float] = []
        for i, p in enumerate(self._parts):
            if i == self._rbf:
                out += [*np.atleast_1d(g_ell), g_var]
            else:  # White: d/dlog(variance)
                out.append(cast(White, p).variance * g_noise)
        return np.array(out)

    @staticmethod
    def _rbf_gradient(rbf: RBF, GK: Array, ard: tuple[Array, Array] | None,
                      weighted: Callable[[], float]) -> tuple[float | Array, float]:
        """One block's ``(d/dlog lengthscale(s), d/dlog variance)`` of the RBF part from
        ``GK = G * K_se`` (``[M, M]`` or ``[M, B]``): ARD from the block's per-dimension
        inputs ``ard`` (``ard_lengthscale_gradient``), isotropic from ``sum(GK)`` and
        ``weighted() = sum(GK * D)`` (``sqdist_gradient``)."""
        if ard is not None:
            return rbf.ard_lengthscale_gradient(GK, *ard), float(np.sum(GK))
        return rbf.sqdist_gradient(float(np.sum(GK)), weighted())
