"""Hyper-parameters as one flat vector, and matrix gradients turned into its gradient.

Every method optimises the same packed vector ``theta [P]``: for each distinct kernel its
unconstrained parameters, then (for sparse methods) the inducing inputs of each latent
(``Z_l [M_l, D]``, row-major), then the likelihood's unconstrained parameters. Blocks or single
entries can be held fixed; they are then absent from ``theta``.

``parameter_gradient`` applies the kernel vector-Jacobian products to an objective's
``MatrixGradients`` (one per latent):

* ``Kff [N, N]``      -> ``kernel.grad_params(X, None, G)``
* ``Kff_diag [N]``    -> ``kernel.grad_params_diag(X, G)``
* ``Kuu [M, M]``      -> ``kernel.grad_params(Z, None, G)`` and ``kernel.grad_inputs(Z, None, G)``
* ``Kuf [M, N]``      -> ``kernel.grad_params(Z, X, G)`` and ``kernel.grad_inputs(Z, X, G)``
* ``likelihood [Q]``  -> appended (summed over the latents' entries).

Inducing inputs may be arrays of another array-API namespace (torch on a CPU or GPU,
``gpinfer.backend``): ``theta`` and its gradient then live there too, so a stochastic optimiser
steps on the device; kernel and likelihood parameters are small and are read back to the host
(with ``device_kernels=True`` and one stacked kernel path the kernels' only when asked for:
``HyperParameters.kernels``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpinfer.backend import ops
from gpinfer.interfaces import Array, Likelihood, MatrixGradients
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.stacked import (
    StackedCovariances,
    StackedKernels,
    StackedMatrixGradients,
)
from gpinfer.parallel import map_latents

BoundPair = tuple[float | None, float | None]


def _prefixed(prefix: str, params: tuple[str, ...]) -> list[str]:
    """``prefix + p`` for every parameter name ``p``."""
    return [prefix + p for p in params]


def _grid_names(prefix: str, rows: int, cols: int) -> list[str]:
    """``prefix[m,d]`` for an ``[rows, cols]`` array, row-major."""
    return [f"{prefix}[{m},{d}]" for m in range(rows) for d in range(cols)]


def _distinct_kernels(kernels: list[Kernel]) -> tuple[list[Kernel], list[int]]:
    """The distinct kernel objects in order of first use and each latent's index among them
    (the same object for several latents ties them: one block in ``theta``)."""
    index: dict[int, int] = {}  # id of a distinct kernel -> its position
    of_latent = [index.setdefault(id(kern), len(index)) for kern in kernels]
    distinct = list({id(kern): kern for kern in kernels}.values())  # first-use order
    return distinct, of_latent


@dataclass(frozen=True)
class _Block:
    """One contiguous piece of the full (free and fixed) parameter vector."""

    kind: str  # "kernel", "inducing" or "likelihood"
    index: int  # distinct-kernel index or latent index (0 for the likelihood)
    start: int
    stop: int


class HyperParameters:
    """Kernels (one per latent), inducing inputs and likelihood parameters as ``theta [P]``.

    * ``kernels``: one kernel, or one per latent function ``L``. Passing the same object for
      several latents ties them: it appears once in ``theta`` and its gradients add up.
    * ``Z``: ``None`` (no inducing points), one array ``[M, D]`` (single latent), or one array
      per latent (``[M_l, D]`` each). Stored as copies; read them back from ``self.Z``.
    * ``likelihood``: its ``get_unconstrained()`` entries are appended (``None``: none).
    * ``optimize=False`` holds everything fixed (``P = 0``); ``optimize_inducing`` and
      ``optimize_likelihood`` hold those blocks fixed; ``fixed`` lists single entries by name.

    Names: ``kernel.<param>`` / ``Z[m,d]`` for one latent, ``kernel[l].<param>`` /
    ``Z[l][m,d]`` for several; ``likelihood.<param>``.
    """

    def __init__(
        self,
        kernels: Kernel | Sequence[Kernel],
        likelihood: Likelihood | None = None,
        Z: Array | Sequence[Array] | None = None,
        *,
        optimize: bool = True,
        optimize_inducing: bool = True,
        optimize_likelihood: bool = True,
        fixed: Iterable[str] = (),
        device_kernels: bool = False,
    ):
        self._kernels: list[Kernel] = [kernels] if isinstance(kernels, Kernel) else list(kernels)
        if not self._kernels:
            raise ValueError("HyperParameters needs at least one kernel")
        self.likelihood = likelihood
        self.Z: list[Array] | None = self._as_inducing(Z)
        self._distinct, self._kernel_of_latent = _distinct_kernels(self._kernels)
        blocks, learned = self._layout(optimize, optimize and optimize_inducing,
                                       optimize and optimize_likelihood)
        self._set_free(blocks, learned, set(fixed))
        self._blocks = blocks
        self._init_kernel_path(device_kernels)

    def _layout(self, learn_kernels: bool, learn_inducing: bool, learn_likelihood: bool
                ) -> tuple[list[_Block], list[bool]]:
        """The blocks of the full vector in order (every distinct kernel's, each latent's
        ``Z``, the likelihood's) and whether each is learned; sets ``_n_entries`` and the
        blocks' name makers (``_name_makers``: names built only when asked for)."""
        multi = self.n_latent > 1
        n_entries = 0
        learned: list[bool] = []
        blocks: list[_Block] = []
        self._name_makers: list[Callable[[], list[str]]] = []

        def add(kind: str, index: int, size: int, make: Callable[[], list[str]],
                learn: bool) -> None:
            nonlocal n_entries
            blocks.append(_Block(kind, index, n_entries, n_entries + size))
            learned.append(learn)
            self._name_makers.append(make)
            n_entries += size

        for j, kern in enumerate(self._distinct):
            prefix = f"kernel[{j}]" if len(self._distinct) > 1 else "kernel"
            add("kernel", j, len(kern.param_names), functools.partial(
                _prefixed, prefix + ".", tuple(kern.param_names)), learn_kernels)
        for l, z in enumerate(self.Z or []):
            prefix = f"Z[{l}]" if multi else "Z"
            add("inducing", l, int(z.shape[0]) * int(z.shape[1]), functools.partial(
                _grid_names, prefix, int(z.shape[0]), int(z.shape[1])), learn_inducing)
        if self.likelihood is not None:
            add("likelihood", 0, len(self.likelihood.param_names), functools.partial(
                _prefixed, "likelihood.", tuple(self.likelihood.param_names)),
                learn_likelihood)
        self._n_entries = n_entries
        self._names_cache: list[str] | None = None
        return blocks, learned

    def _set_free(self, blocks: list[_Block], learned: list[bool], fixed: set[str]) -> None:
        """The free-entry mask ``_free [n_entries]`` (learned blocks less the ``fixed``
        names; ``ValueError`` for an unknown name) and what packing can skip: no mask when
        every entry is free (``_all_free``) or the free ones are the leading blocks
        ``[0, P)`` (``_free_prefix``, e.g. kernels learned, ``Z`` fixed); which blocks hold a
        free entry (``_block_free``) and whether the inducing blocks are one contiguous run of
        free entries (``_inducing_run``), and ``P`` (``size``); the mask is fixed from here
        on: no per-step scans of its ``L M D`` entries."""
        self._free = np.zeros(self._n_entries, dtype=bool)
        for block, learn in zip(blocks, learned):
            self._free[block.start : block.stop] = learn
        if fixed:
            names = self._all_names
            unknown = sorted(fixed - set(names))
            if unknown:
                raise ValueError(f"unknown hyper-parameter name(s) {unknown}; known: {names}")
            self._free &= np.array([n not in fixed for n in names], dtype=bool)
        self._all_free = bool(np.all(self._free))  # then packing needs no mask (no copies)
        P, bounds = int(self._free.sum()), {b.stop for b in blocks}
        self._size = P
        self._free_prefix = (not self._all_free and P in bounds
                             and bool(np.all(self._free[:P])))
        self._block_free = [bool(np.any(self._free[b.start : b.stop])) for b in blocks]
        inducing = [b for b in blocks if b.kind == "inducing"]
        self._inducing_run = bool(
            inducing and all(a.stop == b.start for a, b in zip(inducing, inducing[1:]))
            and np.all(self._free[inducing[0].start : inducing[-1].stop]))

    def _init_kernel_path(self, device_kernels: bool) -> None:
        """The batched kernel path (``stacked``) and the state of kernel parameters kept on
        a device (``device_kernels``; see ``kernels``), from ``_blocks``."""
        blocks = self._blocks
        #: moves on every ``unpack`` (and ``touch``): the key of the batched covariances
        self.version = 0
        #: the latents' kernels as one batched computation (``None``: families differ, or no
        #: inducing inputs of one shape; then every latent is computed on its own)
        self.stacked: StackedKernels | None = None
        if self.Z is not None and len({tuple(z.shape) for z in self.Z}) == 1:
            self.stacked = StackedKernels.of(self._kernels)
        self._Z_stack: tuple[int, Array] | None = None
        #: kernel parameters kept on the device (see ``kernels``): only with one stacked
        #: kernel path, whose covariances take them from there
        self._defer_kernels = bool(device_kernels) and self.stacked is not None
        #: the kernel entries ``[K]`` (every distinct kernel's block, first in the layout) on
        #: the device as last unpacked, or ``None`` (the kernel objects hold them)
        self._device_kernels: Array | None = None
        self._kernel_stop = max([b.stop for b in blocks if b.kind == "kernel"], default=0)
        #: whether the kernel objects lag behind ``_device_kernels`` (``sync_host``)
        self._host_stale = False
        self._latent_theta: tuple[int, Array] | None = None
        self._latent_index: Array | None = None  # latent -> kernel row, on the device
        #: ``(version, theta [P])``: a vector handed over by ``unpack(owned=True)`` whose
        #: views are the kept kernel entries and the inducing stack (every entry free, no
        #: likelihood block): ``pack`` at that version copies it (one operator)
        self._owned: tuple[int, Array] | None = None
        #: ``(version, theta [P])`` on the host: the vector handed over by
        #: ``unpack(owned=True)`` whose views the latents' ``Z`` are (every entry free):
        #: ``pack(reuse=theta)`` at that version writes only the other entries into it
        self._inducing_of: tuple[int, Array] | None = None
        self._kernels_and_inducing_only = all(b.kind != "likelihood" for b in blocks)

    # -- kernel parameters on the device -----------------------------------------------------
    @property
    def kernels(self) -> list[Kernel]:
        """The kernels, one per latent, with their current parameters.

        With ``device_kernels=True`` (a caller whose arrays live on a device asks for it) and
        one stacked kernel path ``unpack`` leaves the kernel parameters in ``theta``'s
        namespace, where the stacked covariances read them:
        a step reads nothing back to the host. They are written into the kernel objects when
        someone asks for them here or calls ``sync_host`` (one read); an owner that holds the
        kernel objects itself calls ``sync_host`` before it reads them."""
        self.sync_host()
        return self._kernels

    def sync_host(self) -> None:
        """Write the kernel parameters kept on the device into the kernel objects (one read;
        nothing when they are current)."""
        if not self._host_stale or self._device_kernels is None:
            return
        host = ops.to_host(self._device_kernels).astype(float)
        for block in self._blocks:
            if block.kind == "kernel":
                self._distinct[block.index].set_unconstrained(host[block.start : block.stop])
        self._host_stale = False

    def _keep_kernels(self, full: Array, view: bool = False) -> bool:
        """With ``device_kernels`` (a caller on a device asks for it): keep the kernel entries
        of ``full [n_entries]`` there instead of writing them into the kernel objects (True
        when kept); ``view``: as a view of ``full`` (an array handed over, never written
        again) instead of a copy."""
        if (not self._defer_kernels or not self._kernel_stop
                or full.shape[0] < self._kernel_stop):  # a free prefix without every kernel
            return False
        kept = full[: self._kernel_stop]
        self._device_kernels = kept if view else ops.copy(kept)
        self._host_stale = True
        return True

    def _latent_parameters(self) -> Array | None:
        """Every latent's kernel parameters ``[L, P_k]`` on the device (tied latents repeat
        their kernel's row), or ``None`` when the kernel objects hold them."""
        if self._device_kernels is None:
            return None
        if self._latent_theta is None or self._latent_theta[0] != self.version:
            xp = ops.namespace(self._device_kernels)
            rows = xp.reshape(self._device_kernels, (len(self._distinct), -1))
            if self._kernel_of_latent != list(range(len(self._distinct))):  # tied latents
                if self._latent_index is None or self._latent_index.device != rows.device:
                    self._latent_index = ops.index_like(rows, self._kernel_of_latent)
                rows = rows[self._latent_index]
            self._latent_theta = (self.version, rows)
        return self._latent_theta[1]

    # -- the batched kernel path -------------------------------------------------------------
    def touch(self) -> None:
        """Say that kernels or inducing inputs changed other than by ``unpack`` (cached
        covariances are then not reused; kernel parameters kept on the device are dropped:
        the kernel objects hold them again)."""
        self.sync_host()
        self._device_kernels = None
        self.version += 1

    def inducing_stack(self) -> Array:
        """The inducing inputs as one stack ``[L, M, D]`` (formed once per version)."""
        Zs = self._inducing()
        if self._Z_stack is None or self._Z_stack[0] != self.version:
            self._Z_stack = (self.version, ops.namespace(Zs[0]).stack(Zs))
        return self._Z_stack[1]

    def covariances(self, X: Array) -> StackedCovariances | None:
        """The latents' ``Kuu``, ``Kuf`` at ``X [B, D]`` and ``Kff_diag``, with everything
        their VJPs share (``gpinfer.kernels.stacked``), computed once per ``version`` and
        batch object ``X``; ``None`` without a batched path. Shared by every caller at this
        version and batch: read them, never write them; ``Kuf`` may have been taken over
        (``StackedCovariances.take_Kuf``, e.g. by ``stacked_terms`` given these covariances):
        a ``Kuf`` read then raises ``RuntimeError``, and ``take_Kuf`` forms it again."""
        if self.stacked is None:
            return None
        return self.stacked.covariances(self.inducing_stack(), X, self.version,
                                        theta=self._latent_parameters())

    # -- construction helpers ----------------------------------------------------------------
    def _inducing(self) -> list[Array]:
        """``Z`` (there are inducing blocks only when it is set)."""
        if self.Z is None:
            raise ValueError("these hyper-parameters hold no inducing inputs")
        return self.Z

    def _likelihood(self) -> Likelihood:
        """The likelihood (there is a likelihood block only when it is set)."""
        if self.likelihood is None:
            raise ValueError("these hyper-parameters hold no likelihood")
        return self.likelihood

    def _as_inducing(self, Z: Array | Sequence[Array] | None) -> list[Array] | None:
        if Z is None:
            return None
        given: list[Any] = [Z] if getattr(Z, "ndim", None) == 2 else list(Z)
        Zs: list[Array] = [ops.copy(ops.as_array(z)) for z in given]
        if len(Zs) != self.n_latent:
            raise ValueError(f"got {len(Zs)} inducing-input arrays for {self.n_latent} latents")
        for l, z in enumerate(Zs):
            if z.ndim != 2:
                raise ValueError(f"Z[{l}] must be [M, D], got shape {z.shape}")
        return Zs

    # -- sizes and names ---------------------------------------------------------------------
    @property
    def n_latent(self) -> int:
        """Number of latent functions ``L`` (one kernel each)."""
        return len(self._kernels)

    @property
    def size(self) -> int:
        """``P``, the length of the packed (free) vector."""
        return self._size

    @property
    def _all_names(self) -> list[str]:
        """Names of every entry (formed on first use: ``Z`` holds ``L M D`` of them)."""
        if self._names_cache is None:
            self._names_cache = [n for make in self._name_makers for n in make()]
        return self._names_cache

    @property
    def names(self) -> list[str]:
        """Names of the ``P`` free entries, in packing order."""
        return [n for n, f in zip(self._all_names, self._free) if f]

    @property
    def n_entries(self) -> int:
        """Number of entries, free or fixed."""
        return self._n_entries

    @property
    def all_names(self) -> list[str]:
        """Names of every entry, free or fixed."""
        return list(self._all_names)

    def kernel_entries(self, contains: str) -> np.ndarray:
        """``[P]`` bool: which free entries are kernel parameters whose name contains
        ``contains`` (as ``contains in name`` over ``names``, without forming ``Z``'s names)."""
        full = np.zeros(self._n_entries, dtype=bool)
        for block, make in zip(self._blocks, self._name_makers):
            if block.kind == "kernel":
                full[block.start : block.stop] = [contains in n for n in make()]
        return full[self._free]

    # -- pack / unpack -----------------------------------------------------------------------
    def _reference(self) -> Array:
        """An array of the namespace and device ``theta`` lives on (the first ``Z``; numpy
        when there are no inducing inputs)."""
        return self.Z[0] if self.Z else np.zeros(0)

    def _full(self, stop: int | None = None) -> Array:
        """Every entry (free and fixed) read from the kernels, ``Z`` and the likelihood (with
        ``stop``, a block boundary: the entries before it)."""
        ref = self._reference()
        parts: list[Array] = []
        kept = self._device_kernels
        end = self._n_entries if stop is None else stop
        Z_stack = self._Z_stack if self._Z_stack and self._Z_stack[0] == self.version else None
        Z_stop = max([b.stop for b in self._blocks if b.kind == "inducing"], default=0)
        for block in self._blocks:
            if block.start >= end:
                break
            if block.kind == "kernel" and kept is not None:  # on the device (no host read)
                if block.start == 0:  # the kernel blocks lead, contiguous: one part
                    parts.append(kept if end >= self._kernel_stop else kept[:end])
            elif block.kind == "inducing" and Z_stack is not None and Z_stop <= end:
                if block.index == 0:  # the latents' Z are views of one current stack
                    parts.append(ops.namespace(ref).reshape(Z_stack[1], (-1,)))
            elif block.kind == "inducing":
                parts.append(ops.namespace(ref).reshape(self._inducing()[block.index], (-1,)))
            else:
                parts.append(ops.like(ref, self._host_entries(block)))
        return ops.namespace(ref).concat(parts) if parts else ops.zeros(ref, (0,))

    def _host_entries(self, block: _Block) -> np.ndarray:
        """A kernel or the likelihood block's entries read from its object (host float64)."""
        owner = self._distinct[block.index] if block.kind == "kernel" else self._likelihood()
        return np.asarray(owner.get_unconstrained(), float).reshape(-1)

    def _free_entries(self, full: Array) -> Array:
        """Indices of the free entries, on ``full``'s namespace and device."""
        return ops.index_like(full, np.flatnonzero(self._free))

    def pack(self, reuse: Array | None = None) -> Array:
        """The free entries as one vector ``theta [P]`` (a new array, on the namespace and
        device of ``Z``).

        ``reuse``: the host vector last handed to ``unpack(owned=True)``. While nothing has
        moved since (the same ``version``) the latents' ``Z`` are views of it: the other
        entries (kernels, likelihood; read from their objects, as without it) are written
        into it and it is returned, with no new ``[P]`` array and no copy of the inducing
        inputs. Its owner hands it over again (``unpack(owned=True)``) before anything
        else reads the inducing inputs. Any other array, or a version moved since: a new
        array, as without it."""
        if reuse is not None and self._refilled(reuse):
            return reuse
        if self._free_prefix:
            return self._full(self.size)  # a new array already
        owned = self._owned
        if owned is not None and owned[0] == self.version:  # its views hold every entry
            return ops.copy(owned[1])
        full = self._full()  # a new array already
        return full if self._all_free else full[self._free_entries(full)]

    def _refilled(self, theta: Array) -> bool:
        """Whether ``theta`` is ``_inducing_of``'s vector at this version; then its kernel and
        likelihood entries are written in from their objects (``_full``'s values)."""
        mark = self._inducing_of
        if mark is None or mark[0] != self.version or mark[1] is not theta:
            return False
        for block in self._blocks:  # every entry free: the blocks' places in ``theta``
            if block.kind != "inducing":
                theta[block.start : block.stop] = self._host_entries(block)
        return True

    @contextlib.contextmanager
    def installed(self, theta: Array) -> Iterator[None]:
        """``theta [P]`` written in (``unpack``) for the ``with`` block, the vector packed
        before it written back after it (also when the block raises)."""
        current = self.pack()
        self.unpack(theta)
        try:
            yield
        finally:
            self.unpack(current)

    def unpack(self, theta: Array, *, owned: bool = False) -> None:
        """Write ``theta [P]`` into the kernels, ``Z`` and the likelihood (fixed entries kept).

        ``owned=True``: the caller hands ``theta`` over (it neither reads nor writes it again),
        so the inducing inputs may be views of it instead of a copy (``P`` can be millions)."""
        # a float64 host vector is used as it is (not a converted copy): ``pack(reuse=)`` may
        # write into it and return it
        given = theta if ops.is_host_buffer(theta, ndim=1) else None
        theta = ops.as_array(theta)
        xp = ops.namespace(theta)
        theta = xp.reshape(theta, (-1,))
        if theta.shape[0] != self.size:
            raise ValueError(f"expected {self.size} hyper-parameters, got {theta.shape[0]}")
        self.version += 1
        if self._all_free or self._free_prefix:  # prefix: the fixed blocks are left alone
            full = theta
        else:
            full = self._full()
            full[self._free_entries(full)] = theta
        Z_stack = self._unpack_inducing_stack(full, xp, copy=not owned or not self._all_free)
        # (below, a block without free entries is skipped: with a free prefix ``full`` holds
        # only the free entries)
        view = owned and self._all_free
        kept = self._keep_kernels(full, view=view)
        self._owned = ((self.version, full) if view and kept and Z_stack is not None
                       and self._kernels_and_inducing_only else None)
        self._inducing_of = ((self.version, given) if view and Z_stack is not None
                             and given is not None else None)
        # the latents' Z as views of their stack (one operation on a device)
        Z_views = None if Z_stack is None else (
            list(ops.unbind(Z_stack)))
        for block, free in zip(self._blocks, self._block_free):
            if not free or (block.kind == "kernel" and kept):
                continue
            if block.kind == "inducing" and Z_views is not None:
                self._inducing()[block.index] = Z_views[block.index]
                continue
            piece = full[block.start : block.stop]
            if block.kind == "kernel":
                self._distinct[block.index].set_unconstrained(ops.to_host(piece).astype(float))
            elif block.kind == "inducing":
                Z = self._inducing()
                view = xp.reshape(piece, tuple(Z[block.index].shape))
                Z[block.index] = view if owned and self._all_free else ops.copy(view)
            else:
                self._likelihood().set_unconstrained(ops.to_host(piece).astype(float))
        if Z_stack is not None:
            self._Z_stack = (self.version, Z_stack)

    def _unpack_inducing_stack(self, full: Array, xp: object, copy: bool = True
                               ) -> Array | None:
        """The inducing entries of ``full`` as one stack ``[L, M, D]`` (copied, or with
        ``copy=False`` a view of ``full``) when they are one contiguous run of equally shaped,
        all free blocks (the latents' ``Z`` are then views of it); else ``None``."""
        if self.stacked is None or not self._inducing_run:
            return None
        blocks = [b for b in self._blocks if b.kind == "inducing"]
        start, stop = blocks[0].start, blocks[-1].stop
        shape = (len(blocks), *tuple(self._inducing()[0].shape))
        stack = xp.reshape(full[start:stop], shape)  # type: ignore[attr-defined]
        return ops.copy(stack) if copy else stack

    def bounds(
        self,
        kernel: BoundPair | None = None,
        inducing: BoundPair | None = None,
        likelihood: BoundPair | None = None,
    ) -> list[BoundPair]:
        """Box bounds for the ``P`` free entries, one ``(low, high)`` pair per block kind."""
        per_kind = {"kernel": kernel, "inducing": inducing, "likelihood": likelihood}
        out: list[BoundPair] = [(None, None)] * self._n_entries
        for block in self._blocks:
            pair = per_kind[block.kind] or (None, None)
            out[block.start : block.stop] = [pair] * (block.stop - block.start)
        return [b for b, f in zip(out, self._free) if f]

    def describe(self) -> dict[str, float]:
        """Every entry by name (unconstrained values), for logging."""
        return dict(zip(self._all_names, ops.to_host(self._full()).tolist()))

    # -- gradients ---------------------------------------------------------------------------
    def inducing_is_free(self, latent: int) -> bool:
        """Whether any inducing input of ``latent`` is learned (else its VJP is skipped)."""
        return any(free for b, free in zip(self._blocks, self._block_free)
                   if b.kind == "inducing" and b.index == latent)

    def gradient(self, X: Array, grads: MatrixGradients | Sequence[MatrixGradients],
                 n_jobs: int = 1, out: Array | None = None) -> Array:
        """Shortcut for ``parameter_gradient(self, X, grads, n_jobs, out)``."""
        return parameter_gradient(self, X, grads, n_jobs, out)


def _latent_gradients(
    kern: Kernel, X: Array, Z: Array | None, G: MatrixGradients, latent: int, need_Z: bool = True
) -> tuple[Array, Array | None]:
    """Kernel-parameter gradient ``[P_k]`` and inducing-input gradient ``[M, D]`` of one latent.

    With ``need_Z=False`` (inducing inputs held fixed) the input VJPs are not computed.
    """
    g_kern = ops.zeros(X, (kern.n_params,))
    g_Z = None
    if G.Kff is not None:
        g_kern += kern.grad_params(X, None, G.Kff)
    if G.Kff_diag is not None:
        g_kern += kern.grad_params_diag(X, G.Kff_diag)
    if G.Kuu is not None or G.Kuf is not None:
        if Z is None:
            raise ValueError(f"latent {latent} has Kuu/Kuf gradients but no inducing inputs Z")
        g_Z = ops.namespace(Z).zeros_like(Z) if need_Z else None
        for X2, dK in ((None, G.Kuu), (X, G.Kuf)):
            if dK is None:
                continue
            g_params, g_inputs = kern.vjp(Z, X2, dK, inputs=need_Z)
            g_kern += g_params
            if g_Z is not None:
                g_Z += g_inputs
    return g_kern, g_Z


def parameter_gradient(
    hp: HyperParameters, X: Array, grads: MatrixGradients | Sequence[MatrixGradients],
    n_jobs: int = 1, out: Array | None = None,
) -> Array:
    """Gradient ``[P]`` of an objective wrt ``hp.pack()`` from its matrix gradients.

    ``grads``: one ``MatrixGradients`` per latent (a single one for ``L = 1``); ``X [N, D]``
    the training inputs the matrices were computed from. Likelihood entries are summed over
    the latents that report them. ``n_jobs > 1`` runs the latents' kernel VJPs on that many
    threads (``gpinfer.parallel``; same result); latents sharing one kernel are then still
    safe, as kernels only cache what they compute from their arguments. ``out``: a float64
    numpy vector ``[P]`` of the caller's (e.g. the last step's gradient, no longer read) that
    the result may be written into and returned as, instead of a new array (where the
    gradient is formed in one host vector: stacked matrix gradients, every entry free, each
    latent's kernel and then each latent's ``Z``); its values are overwritten.
    """
    X_ref = ops.as_array(X)  # a backend array as it is
    if isinstance(grads, StackedMatrixGradients) and hp.stacked is not None:
        if len(grads) != hp.n_latent:
            raise ValueError(f"got {len(grads)} MatrixGradients for {hp.n_latent} latents")
        return _stacked_parameter_gradient(hp, X_ref, grads, out)
    grads_list = [grads] if isinstance(grads, MatrixGradients) else list(grads)
    if len(grads_list) != hp.n_latent:
        raise ValueError(f"got {len(grads_list)} MatrixGradients for {hp.n_latent} latents")
    if hp.stacked is not None and all(G.Kff is None for G in grads_list):
        return _stacked_parameter_gradient(hp, X_ref, grads_list)
    full = ops.zeros(X_ref, (hp.n_entries,))
    kernel_grads = [ops.zeros(X_ref, (k.n_params,)) for k in hp._distinct]
    Z_grads: list[Array | None] = [None] * hp.n_latent
    per_latent = map_latents(
        lambda l: _latent_gradients(hp.kernels[l], X, hp.Z[l] if hp.Z is not None else None,
                                    grads_list[l], l, need_Z=hp.inducing_is_free(l)),
        range(hp.n_latent), n_jobs)
    for l, (g_kern, g_Z) in enumerate(per_latent):
        kernel_grads[hp._kernel_of_latent[l]] += g_kern
        Z_grads[l] = g_Z
    return _assemble(hp, full, kernel_grads, Z_grads, _likelihood_gradient(X_ref, grads_list))


def _likelihood_gradient(ref: Array, grads: Sequence[MatrixGradients]) -> Array | None:
    """The latents' likelihood gradients summed (``None``: none reported), on ``ref``'s
    device."""
    lik_grad = None
    for G in grads:
        if G.likelihood is not None:
            g_lik = ops.like(ref, np.asarray(ops.to_host(G.likelihood), float).reshape(-1))
            lik_grad = g_lik if lik_grad is None else lik_grad + g_lik
    return lik_grad


def _stacked_parameter_gradient(hp: HyperParameters, X: Array,
                                grads: Sequence[MatrixGradients], out: Array | None = None
                                ) -> Array:
    """``parameter_gradient`` for latents with one batched kernel path: one stacked VJP of
    ``Kuu``, ``Kuf`` and ``Kff_diag`` for every latent (``HyperParameters.covariances``;
    ``StackedMatrixGradients`` are used as they are, a list is stacked; ``out``: see
    ``parameter_gradient``)."""
    cov = hp.covariances(X)
    assert cov is not None  # hp.stacked is set
    xp = ops.namespace(X)
    need_Z = any(hp.inducing_is_free(l) for l in range(hp.n_latent))
    L = hp.n_latent
    kinds = [b.kind for b in hp._blocks]
    full_out = _vector_for_inputs(hp, X, grads, need_Z, kinds, out)
    out_Z = None if full_out is None else _inducing_view(hp, full_out, cov)
    g_params, g_Z = cov.vjp(*_stacked_weights(cov, grads, xp), inputs=need_Z, out_Z=out_Z)
    lik_grad = None if isinstance(grads, StackedMatrixGradients) else _likelihood_gradient(
        X, grads)
    if full_out is not None and out_Z is not None and g_Z is not None:
        return _filled_vector(hp, full_out, out_Z, g_params, g_Z)
    if (hp._free_prefix and hp.size == hp._kernel_stop and kinds[:L] == ["kernel"] * L
            and hp._kernel_of_latent == list(range(L))):
        return xp.reshape(g_params, (-1,))  # only the kernels learned: their rows, in order
    if hp._all_free and g_Z is not None and _usual_layout(hp, kinds):
        # the usual layout: every latent's kernel, then every latent's Z: one concatenation
        parts = [xp.reshape(g_params, (-1,)), xp.reshape(g_Z, (-1,))]
        if len(kinds) > 2 * L:
            block = hp._blocks[2 * L]
            _check_likelihood_size(lik_grad, block)
            parts.append(lik_grad if lik_grad is not None
                         else ops.zeros(X, (block.stop - block.start,)))
        return xp.concat(parts)
    full = ops.zeros(X, (hp.n_entries,))
    kernel_grads: list[Array | None] = [None] * len(hp._distinct)
    for l, j in enumerate(hp._kernel_of_latent):
        g = kernel_grads[j]
        kernel_grads[j] = g_params[l] if g is None else g + g_params[l]
    Z_grads = [None if g_Z is None else g_Z[l] for l in range(L)]
    return _assemble(hp, full, kernel_grads, Z_grads, lik_grad)


def _stacked_weights(cov: StackedCovariances, grads: Sequence[MatrixGradients], xp: Any
                     ) -> tuple[Array | None, Array | None, Array | None]:
    """The VJP's weights ``(dKuu, dKuf, dKff_diag)`` of every latent: those of
    ``StackedMatrixGradients`` as they are, a list's stacked (zeros for a latent's ``None``
    where another latent has the matrix; ``None`` where none has it)."""

    def stack(name: str) -> Array | None:
        if isinstance(grads, StackedMatrixGradients):
            return getattr(grads, name)
        parts = [getattr(G, name) for G in grads]
        if all(p is None for p in parts):
            return None
        # Kuf's shape from the kept g_uf (a caller may have taken Kuf over: take_Kuf)
        ref = cov.Kuu if name == "Kuu" else cov.d.g_uf if name == "Kuf" else cov.Kff_diag
        return xp.stack([ops.zeros(ref, tuple(ref.shape[1:])) if p is None else p
                         for p in parts])

    return stack("Kuu"), stack("Kuf"), stack("Kff_diag")


def _usual_layout(hp: HyperParameters, kinds: list[str]) -> bool:
    """Whether the vector holds every latent's own kernel, then every latent's ``Z``."""
    L = hp.n_latent
    return (hp._kernel_of_latent == list(range(L))
            and kinds[: 2 * L] == ["kernel"] * L + ["inducing"] * L)


def _vector_for_inputs(hp: HyperParameters, X: Array, grads: Sequence[MatrixGradients],
                       need_Z: bool, kinds: list[str], out: Array | None = None
                       ) -> np.ndarray | None:
    """The gradient vector ``[n_entries]`` (``out`` when it is a contiguous float64 numpy
    vector of that length, else a new one; its values to be overwritten) whose ``Z`` blocks
    the VJP writes ``g_Z`` into (``_inducing_view``): on numpy, stacked gradients, every
    entry free and the usual layout (no concatenation of ``C M D`` entries); else ``None``."""
    into = (need_Z and hp._all_free and isinstance(grads, StackedMatrixGradients)
            and _usual_layout(hp, kinds))
    return ops.host_out(X, out, (hp.n_entries,)) if into else None


def _inducing_span(hp: HyperParameters) -> tuple[int, int]:
    """Where every latent's ``Z`` lies in the vector (usual layout): ``(start, stop)``."""
    return hp._blocks[hp.n_latent].start, hp._blocks[2 * hp.n_latent - 1].stop


def _inducing_view(hp: HyperParameters, full_out: np.ndarray, cov: StackedCovariances
                   ) -> np.ndarray:
    """The ``Z`` blocks of ``full_out`` (usual layout) as ``[C, M, D]``, a view."""
    Z_start, Z_stop = _inducing_span(hp)
    return np.reshape(full_out[Z_start:Z_stop], tuple(cov.Z.shape))


def _filled_vector(hp: HyperParameters, full_out: np.ndarray, out_Z: np.ndarray,
                   g_params: Array, g_Z: Array) -> np.ndarray:
    """``full_out`` with the kernels' rows, ``g_Z`` in its ``Z`` view ``out_Z`` (where the VJP
    did not write it there) and zeros after (a likelihood block: no gradient from stacked
    matrices)."""
    Z_start, Z_stop = _inducing_span(hp)
    full_out[:Z_start] = np.reshape(g_params, (-1,))
    if g_Z is not out_Z:
        out_Z[...] = g_Z
    full_out[Z_stop:] = 0.0
    return full_out


def _check_likelihood_size(lik_grad: Array | None, block: _Block) -> None:
    """``ValueError`` when the likelihood gradient does not fit its block."""
    if lik_grad is not None and lik_grad.shape[0] != block.stop - block.start:
        raise ValueError(
            f"likelihood gradient has {lik_grad.shape[0]} entries, expected "
            f"{block.stop - block.start}"
        )


def _assemble(hp: HyperParameters, full: Array, kernel_grads: Sequence[Array | None],
              Z_grads: Sequence[Array | None], lik_grad: Array | None) -> Array:
    """The gradient ``[P]`` from the blocks' pieces written into ``full [n_entries]``
    (zeros)."""
    for block in hp._blocks:
        if block.kind == "kernel":
            g_kern = kernel_grads[block.index]
            if g_kern is not None:
                full[block.start : block.stop] = g_kern
        elif block.kind == "inducing":
            g_Z = Z_grads[block.index]
            if g_Z is not None:
                full[block.start : block.stop] = ops.namespace(g_Z).reshape(g_Z, (-1,))
        elif lik_grad is not None:
            _check_likelihood_size(lik_grad, block)
            full[block.start : block.stop] = lik_grad
    return full if hp._all_free else full[hp._free_entries(full)]
