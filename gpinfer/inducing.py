"""Inducing-input initialisation, once for every method: ``initial_inducing`` (random training
inputs or K-means centres, spec jj-taylor-svi §4.4; one default ``M``, one rule for ``M > N``).

``kmeans_inducing(X, M, rng)`` runs ``scipy.cluster.vq.kmeans2`` with k-means++ seeding on
``X [N, D]`` and returns the ``M`` centres ``Z [M', D]`` (duplicates dropped, so ``M' <= M``).
``inducing_inputs(spec, X, rng)`` turns a ``Problem.inducing`` value into k-means ``Z``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from scipy.cluster.vq import kmeans2

from gpinfer.data.source import KMEANS_SUBSET, SourceRows, host_rows, sample_rows
from gpinfer.errors import InputError
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.stationary import RBF, Stationary, sqdist
from gpinfer.kernels.white import White

Array = np.ndarray

#: inducing points per latent when ``M`` is not given, for every method with inducing points
DEFAULT_M = 50
#: how inducing inputs start: distinct training inputs drawn at random, or k-means centres
INDUCING_INITS = ("random", "kmeans")
#: K-means iterations (Lloyd steps after k-means++ seeding)
KMEANS_ITERATIONS = 20
#: K-means runs on at most this many randomly chosen rows (the centres of a large set barely move)
KMEANS_MAX_ROWS = 20000


def kmeans_inducing(X: Array, M: int, rng: np.random.Generator,
                    iterations: int = KMEANS_ITERATIONS) -> Array:
    """``M`` K-means centres of ``X [N, D]``, ``[M', D]`` with duplicate centres removed.

    ``M`` at least the number ``U`` of distinct rows of ``X`` returns those ``U`` rows (every
    distinct point is its own centre; with duplicated rows, k-means++ would run out of points to
    draw and return NaN centres: issue 27). Raises ``InputError`` when ``M`` is not in ``1..N``.
    """
    X = np.asarray(X, dtype=float)
    n = X.shape[0]
    if isinstance(M, bool) or not isinstance(M, numbers.Integral) or not 1 <= int(M) <= n:
        raise InputError(
            f"the number of inducing points must be an integer in 1..N={n}; got M={M!r}"
        )
    if M == n:
        distinct = np.unique(X, axis=0)
        return X.copy() if len(distinct) == n else distinct
    rows = X if n <= KMEANS_MAX_ROWS else X[rng.choice(n, KMEANS_MAX_ROWS, replace=False)]
    distinct = np.unique(rows, axis=0)
    if len(distinct) <= M:
        return distinct
    seed = int(rng.integers(2**31 - 1))
    centres, _ = kmeans2(rows, int(M), iter=int(iterations), minit="++", seed=seed)
    unique = np.unique(centres, axis=0)
    return unique if len(unique) < M else centres


def inducing_inputs(spec: int | Array | None, X: Array, rng: np.random.Generator,
                    default: int = DEFAULT_M) -> Array:
    """Inducing inputs ``Z [M, D]`` from a ``Problem.inducing`` value (k-means centres; see
    ``initial_inducing``)."""
    return initial_inducing(spec, X, rng, init="kmeans", default=default)[0]


def initial_inducing(spec: int | Array | None, X: Array, rng: np.random.Generator,
                     n_latent: int = 1, *, init: str = "random", default: int = DEFAULT_M,
                     owner: str = "inducing inputs",
                     kmeans_iterations: int = KMEANS_ITERATIONS) -> list[Array]:
    """Starting inducing inputs ``Z_l [M, D]`` for each of ``n_latent`` latents: the one rule
    every method with inducing points follows.

    ``spec`` (``Problem.inducing``): ``None`` -> ``min(default, N)`` points; a count ``M`` in
    ``1..N`` (a count above ``N`` is an ``InputError``: there are not that many distinct
    training inputs to start from); an array ``[M, D]`` -> a copy for every latent.
    ``init``: ``"random"`` -> ``M`` distinct training inputs drawn independently for each
    latent; ``"kmeans"`` -> one set of k-means centres (``kmeans_inducing``), copied for every
    latent (``kmeans_iterations`` Lloyd steps). ``owner`` names the method in error messages.
    ``X`` may be a ``gpinfer.data.source.SourceRows`` (inputs out of core): random inputs are
    read by row, k-means runs on at most ``KMEANS_SUBSET`` of its rows (``sample_rows``).
    """
    X = host_rows(X)
    n, d = X.shape
    if init not in INDUCING_INITS:
        raise InputError(f"{owner}: inducing_init must be one of {list(INDUCING_INITS)}, "
                         f"got {init!r}")
    if spec is not None and np.ndim(spec) > 0:  # an array [M, D] (a count is a scalar)
        Z = np.asarray(spec, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != d or not 1 <= Z.shape[0] <= n:
            raise InputError(
                f"{owner}: inducing inputs must be [M, {d}] with 1 <= M <= N={n}; got shape "
                f"{Z.shape}"
            )
        if not np.all(np.isfinite(Z)):
            raise InputError(f"{owner}: inducing inputs hold non-finite values")
        return [Z.copy() for _ in range(n_latent)]
    M = min(int(default), n) if spec is None else spec
    if isinstance(M, bool) or not isinstance(M, numbers.Integral) or not 1 <= int(M) <= n:
        raise InputError(f"{owner}: the number of inducing points must be an integer in "
                         f"1..N={n}; got M={spec!r}")
    if init == "kmeans":
        Z = kmeans_inducing(sample_rows(X, KMEANS_SUBSET), int(M), rng, kmeans_iterations)
        return [Z.copy() for _ in range(n_latent)]
    return [X[rng.choice(n, int(M), replace=False)] for _ in range(n_latent)]


# --------------------------------------------------------------------------------------------
# Kernel matrices at fixed inputs (inducing inputs not learned)
# --------------------------------------------------------------------------------------------

#: cache the raw ``[M, N]`` squared distances when ``M * N`` is at most this (8 bytes each)
DISTANCE_CACHE_MAX_ENTRIES = 30_000_000


class FixedInputCovariances:
    """``Kuu [M, M]``, ``Kuf [M, N]``, ``Kff_diag [N]`` of one kernel at fixed ``Z`` and ``X``.

    Fast path for an ``RBF``, alone or summed with ``White`` parts (the spec §4.1 kernel; as the
    kernels declare it: ``Stationary.sqdist_form``, ``White.on_square``):
    isotropic, the raw squared distances are computed once and each call costs one ``exp`` over
    ``[M, N]``; with ARD lengthscales, one ``[M, N, D]`` product per call. The formulas are the
    kernel's own (``RBF.K_from_sqdist``, ``sqdist_gradient``, ``ard_lengthscale_gradient``);
    this class keeps the distances and the last matrices. ``kernel_gradient``
    reuses the matrices of the last call instead of
    recomputing distances and exponentials in the kernel VJP; in the isotropic case it also
    takes the two sums its ``Kuf`` part needs (``Kuf_sums``, with ``last_distances``) instead
    of the ``[M, N]`` gradient. Any other kernel falls back to
    ``kernel.K`` / ``kernel.grad_params`` (same results). ``cols`` selects a batch of columns;
    ``rows``, where given, are ``X[cols]`` as the caller already read them (bit for bit the
    rows the instance would gather: an out-of-core ``X`` is then read once per batch).
    ``share``: another instance built on the same ``Z`` and ``X`` whose distances are reused.

    ``X`` may be a ``gpinfer.data.source.SourceRows`` (inputs out of core): the centring shift
    is then its column mean from one pass in chunks (``SourceRows.column_mean``), no
    ``[M, N]`` distances are cached (memory stays independent of ``N``) and the ARD path
    centres each batch's rows as they are read; the formulas are the in-memory ones, so with
    the same shift and no cache (``M N`` above ``DISTANCE_CACHE_MAX_ENTRIES``) the matrices
    are the in-memory path's bit for bit.
    """

    _Zc: Array  # Z - shift (fast path)
    _Xc: Array | None  # X - shift (ARD fast path; None out of core: centred per batch)
    _D_uu: Array  # raw squared distances of Z (isotropic fast path)
    _shift: Array  # the mean of X (fast path)

    def __init__(self, kernel: Kernel, Z: Array, X: Array,
                 share: FixedInputCovariances | None = None):
        from gpinfer.kernels.combination import Sum

        self.kernel, self.Z, self.X = kernel, np.asarray(Z, float), host_rows(X)
        out_of_core = isinstance(self.X, SourceRows)
        parts = list(kernel.parts) if isinstance(kernel, Sum) else [kernel]
        # the kernels' own declarations: the squared-distance form (``Stationary.sqdist_form``:
        # RBF, not a subclass that changes ``_g``) and noise on the square matrix too
        # (``White.on_square``: not a noise on ``Kff_diag`` alone)
        rbf = [i for i, p in enumerate(parts) if isinstance(p, Stationary) and p.sqdist_form]
        self._whites = [p for p in parts if isinstance(p, White) and p.on_square]
        self.fast = len(rbf) == 1 and len(rbf) + len(self._whites) == len(parts)
        self._parts = parts
        self._rbf = rbf[0] if self.fast else -1  # the RBF's index among the parts
        self._rbf_part: RBF | None = cast(RBF, parts[rbf[0]]) if self.fast else None
        self._D_fu: Array | None = None  # [N, M]: batch rows gather contiguously
        self.ard = self._rbf_part is not None and self._rbf_part.ard
        if self.ard:  # ARD: distances depend on every lengthscale; scaled inputs per call
            shift = _column_mean(self.X)
            self._Xc = None if out_of_core else self.X - shift
            self._Zc, self._shift = self.Z - shift, shift
        elif self.fast and share is not None and share.fast and not share.ard:
            self._Zc, self._D_uu, self._D_fu = share._Zc, share._D_uu, share._D_fu
            self._shift = share._shift
        elif self.fast:
            shift = _column_mean(self.X)
            Zc = self.Z - shift
            self._Zc = Zc
            self._D_uu = sqdist(Zc)
            if not out_of_core and \
                    self.Z.shape[0] * self.X.shape[0] <= DISTANCE_CACHE_MAX_ENTRIES:
                self._D_fu = sqdist(self.X - shift, Zc)
            self._shift = shift
        #: the last ``(Kuu_rbf, Kuf_rbf, distances)``: raw ``D [M, N]``, or ARD ``(A, B)``
        self._last: tuple[Array, Array, Any] | None = None

    def _fast_rbf(self) -> RBF:
        """The RBF part of the fast path."""
        if self._rbf_part is None:
            raise ValueError("FixedInputCovariances: not an RBF (+ White) kernel")
        return self._rbf_part

    def _rows(self, cols: Array | None, rows: Array | None) -> Array:
        """``X[cols]`` (``cols`` None: all of ``X``): ``rows`` when the caller read them."""
        if rows is not None:
            return rows
        return self.X if cols is None else self.X[cols]

    def _dist_uf(self, cols: Array | None, rows: Array | None) -> Array:
        if self._D_fu is not None:
            return (self._D_fu if cols is None else self._D_fu[cols]).T
        return sqdist(self._Zc, self._rows(cols, rows) - self._shift)

    def matrices(self, cols: Array | None = None, out: Array | None = None,
                 rows: Array | None = None) -> tuple[Array, Array, Array]:
        """``(Kuu, Kuf, Kff_diag)`` at the kernel's current parameters (``cols``: a batch;
        ``rows``: its rows ``X[cols]`` ``[B, D]`` where already read).

        ``out``: an ``[M, N]`` array that ``Kuf`` may be written into, used when it has the
        layout of the cached distances (``Kuf`` is then ``out``; check with ``is``).
        """
        if not self.fast:
            Xb = self._rows(cols, rows)
            k = self.kernel
            return k.K(self.Z), k.K(self.Z, Xb), k.K_diag(Xb)
        rbf = self._fast_rbf()
        if self.ard:
            return self._matrices_ard(rbf, cols, rows)
        Kuu_se = rbf.K_from_sqdist(self._D_uu)
        D_uf = self._dist_uf(cols, rows)
        Kuf = rbf.K_from_sqdist(D_uf, out=out)
        noise = sum(p.variance for p in self._whites)
        Kuu = Kuu_se + noise * np.eye(self.Z.shape[0])
        n = self.X.shape[0] if cols is None else len(cols)
        self._last = (Kuu_se, Kuf, D_uf)
        return Kuu, Kuf, np.full(n, rbf.variance + noise)

    def _matrices_ard(self, rbf: RBF, cols: Array | None, rows: Array | None
                      ) -> tuple[Array, Array, Array]:
        ell = np.asarray(rbf.lengthscale, dtype=float)
        B = self._Zc / ell  # [M, D]
        if self._Xc is None:  # out of core: the batch centred as read (the same bits)
            Xc = self._rows(cols, rows) - self._shift
        else:
            Xc = self._Xc if cols is None else self._Xc[cols]
        A = Xc / ell  # [N, D]
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
        """Gradient wrt ``kernel.get_unconstrained()`` from matrix gradients ``dL/dKuu [M, M]``,
        ``dL/dKuf [M, N]`` (or its batch columns) and ``dL/dKff_diag [N]``, at the parameters
        of the last ``matrices`` call (``rows``: ``X[cols]`` where already read; only the
        generic fallback reads rows here).

        ``Kuf_sums`` (only where ``contracts_kuf``; then pass ``Kuf=None``):
        ``(sum(dL/dKuf * Kuf), sum(dL/dKuf * Kuf * D))`` with ``Kuf`` and ``D`` of the last
        ``matrices`` call, for a ``Kuf`` gradient that is cheaper to contract than to form.
        """
        if Kuf_sums is not None and not self.contracts_kuf:
            raise ValueError("Kuf_sums needs the isotropic RBF fast path (contracts_kuf)")
        if not self.fast:
            Xb = self._rows(cols, rows)
            k, g = self.kernel, np.zeros(self.kernel.n_params)
            if Kuu is not None:
                g += k.grad_params(self.Z, None, Kuu)
            if Kuf is not None:
                g += k.grad_params(self.Z, Xb, Kuf)
            if Kff_diag is not None:
                g += k.grad_params_diag(Xb, Kff_diag)
            return g
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
                lambda: float(np.sum(GK * self._D_uu)))
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
        g_noise += s_diag
        out: list[float] = []
        for i, p in enumerate(self._parts):
            if i == self._rbf:  # d/dlog(lengthscale) (one or D), d/dlog(variance)
                out += [*np.atleast_1d(g_ell), g_var + rbf.variance * s_diag]
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


def _column_mean(X: Array | SourceRows) -> Array:
    """The column means ``[D]`` of ``X``: ``X.mean(axis=0)``, or for inputs out of core one
    pass in chunks (``SourceRows.column_mean``)."""
    return X.column_mean() if isinstance(X, SourceRows) else X.mean(axis=0)
