"""Inducing-input initialisation: K-means centres of the training inputs (spec jj-taylor-svi §4.4).

``kmeans_inducing(X, M, rng)`` runs ``scipy.cluster.vq.kmeans2`` with k-means++ seeding on
``X [N, D]`` and returns the ``M`` centres ``Z [M', D]`` (duplicates dropped, so ``M' <= M``).
``inducing_inputs(spec, X, rng)`` turns a ``Problem.inducing`` value into ``Z``.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.cluster.vq import kmeans2

from gpinfer.errors import InputError
from gpinfer.numerics import settings
from gpinfer.numerics.quadrature import chunk_slices

Array = np.ndarray

#: K-means iterations (Lloyd steps after k-means++ seeding)
KMEANS_ITERATIONS = 20
#: K-means runs on at most this many randomly chosen rows (the centres of a large set barely move)
KMEANS_MAX_ROWS = 20000


def kmeans_inducing(X: Array, M: int, rng: np.random.Generator) -> Array:
    """``M`` K-means centres of ``X [N, D]``, ``[M', D]`` with duplicate centres removed.

    ``M == N`` returns a copy of ``X`` (every point is its own centre). Raises ``InputError`` when
    ``M`` is not in ``1..N``.
    """
    X = np.asarray(X, dtype=float)
    n = X.shape[0]
    if isinstance(M, bool) or not isinstance(M, numbers.Integral) or not 1 <= M <= n:
        raise InputError(
            f"the number of inducing points must be an integer in 1..N={n}; got M={M!r}"
        )
    if M == n:
        return X.copy()
    rows = X if n <= KMEANS_MAX_ROWS else X[rng.choice(n, KMEANS_MAX_ROWS, replace=False)]
    seed = int(rng.integers(2**31 - 1))
    centres, _ = kmeans2(rows, int(M), iter=KMEANS_ITERATIONS, minit="++", seed=seed)
    unique = np.unique(centres, axis=0)
    return unique if len(unique) < M else centres


def inducing_inputs(spec: int | Array | None, X: Array, rng: np.random.Generator,
                    default: int = 100) -> Array:
    """Inducing inputs ``Z [M, D]`` from a ``Problem.inducing`` value.

    ``None``: ``min(default, N)`` K-means centres; an integer ``M``: ``M`` centres; an array:
    used as given (``[M, D]`` with ``M <= N`` and the training ``D``).
    """
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    if spec is None:
        return kmeans_inducing(X, min(int(default), n), rng)
    if isinstance(spec, np.ndarray):
        Z = np.asarray(spec, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != d or not 1 <= Z.shape[0] <= n:
            raise InputError(
                f"inducing inputs must be [M, {d}] with 1 <= M <= N={n}; got shape {Z.shape}"
            )
        if not np.all(np.isfinite(Z)):
            raise InputError("inducing inputs hold non-finite values")
        return Z.copy()
    return kmeans_inducing(X, spec, rng)


# --------------------------------------------------------------------------------------------
# Kernel matrices at fixed inputs (inducing inputs not learned)
# --------------------------------------------------------------------------------------------

#: cache the raw ``[M, N]`` squared distances when ``M * N`` is at most this (8 bytes each)
DISTANCE_CACHE_MAX_ENTRIES = 30_000_000


def _sqdist(A: Array, B: Array) -> Array:
    """Squared Euclidean distances ``[Na, Nb]`` (expanded form, clipped at 0)."""
    r2 = np.sum(A * A, axis=1)[:, None] + np.sum(B * B, axis=1)[None, :] - 2.0 * (A @ B.T)
    return np.maximum(r2, 0.0, out=r2)


def _scaled_exp(D: Array, scale: float, factor: float, out: Array | None = None) -> Array:
    """``factor * exp(scale * D)`` in D's memory layout, in cache-sized blocks (one pass over
    memory instead of three; the same operations in the same order as the unblocked form).
    ``out``: an array of D's shape and strides to write into (else a new one)."""
    if out is None or out.shape != D.shape or out.strides != D.strides or out.dtype != D.dtype:
        out = np.empty_like(D)
    view_in, view_out = (D.T, out.T) if D.flags.f_contiguous and not D.flags.c_contiguous \
        else (D, out)
    if view_in.ndim != 2 or view_in.shape[0] == 0:
        np.multiply(D, scale, out=out)
        np.exp(out, out=out)
        out *= factor
        return out
    for rows in chunk_slices(view_in.shape[0], view_in.shape[1], settings.CACHE_BLOCK_FLOATS):
        block = view_out[rows]
        np.multiply(view_in[rows], scale, out=block)
        np.exp(block, out=block)
        block *= factor
    return out


class FixedInputCovariances:
    """``Kuu [M, M]``, ``Kuf [M, N]``, ``Kff_diag [N]`` of one kernel at fixed ``Z`` and ``X``.

    Fast path for an ``RBF``, alone or summed with ``White`` parts (the spec §4.1 kernel):
    isotropic, the raw squared distances are computed once and each call costs one ``exp`` over
    ``[M, N]``; with ARD lengthscales, one ``[M, N, D]`` product per call. ``kernel_gradient``
    reuses the matrices of the last call instead of
    recomputing distances and exponentials in the kernel VJP; in the isotropic case it also
    takes the two sums its ``Kuf`` part needs (``Kuf_sums``, with ``last_distances``) instead
    of the ``[M, N]`` gradient. Any other kernel falls back to
    ``kernel.K`` / ``kernel.grad_params`` (same results). ``cols`` selects a batch of columns.
    ``share``: another instance built on the same ``Z`` and ``X`` whose distances are reused.
    """

    def __init__(self, kernel, Z: Array, X: Array, share: FixedInputCovariances | None = None):
        from gpinfer.kernels import RBF, White
        from gpinfer.kernels.combination import Sum

        self.kernel, self.Z, self.X = kernel, np.asarray(Z, float), np.asarray(X, float)
        parts = kernel.parts if isinstance(kernel, Sum) else [kernel]
        rbf = [i for i, p in enumerate(parts) if type(p) is RBF]
        white = [i for i, p in enumerate(parts) if type(p) is White]
        self.fast = len(rbf) == 1 and len(rbf) + len(white) == len(parts)
        self._parts, self._rbf, self._white = parts, (rbf or [None])[0], white
        self._D_fu: Array | None = None  # [N, M]: batch rows gather contiguously
        self.ard = self.fast and parts[rbf[0]].ard
        if self.ard:  # ARD: distances depend on every lengthscale; scaled inputs per call
            shift = self.X.mean(axis=0)
            self._Xc, self._Zc = self.X - shift, self.Z - shift
        elif self.fast and share is not None and share.fast and not share.ard:
            self._Zc, self._D_uu, self._D_fu = share._Zc, share._D_uu, share._D_fu
            self._shift = share._shift
        elif self.fast:
            shift = self.X.mean(axis=0)
            Zc = self.Z - shift
            self._Zc = Zc
            self._D_uu = _sqdist(Zc, Zc)
            np.fill_diagonal(self._D_uu, 0.0)
            if self.Z.shape[0] * self.X.shape[0] <= DISTANCE_CACHE_MAX_ENTRIES:
                self._D_fu = _sqdist(self.X - shift, Zc)
            self._shift = shift
        self._last: tuple | None = None

    def _dist_uf(self, cols: Array | None) -> Array:
        if self._D_fu is not None:
            return (self._D_fu if cols is None else self._D_fu[cols]).T
        Xb = self.X if cols is None else self.X[cols]
        return _sqdist(self._Zc, Xb - self._shift)

    def matrices(self, cols: Array | None = None, out: Array | None = None
                 ) -> tuple[Array, Array, Array]:
        """``(Kuu, Kuf, Kff_diag)`` at the kernel's current parameters (``cols``: a batch).

        ``out``: an ``[M, N]`` array that ``Kuf`` may be written into, used when it has the
        layout of the cached distances (``Kuf`` is then ``out``; check with ``is``).
        """
        if not self.fast:
            Xb = self.X if cols is None else self.X[cols]
            k = self.kernel
            return k.K(self.Z), k.K(self.Z, Xb), k.K_diag(Xb)
        rbf = self._parts[self._rbf]
        if self.ard:
            return self._matrices_ard(rbf, cols)
        inv2l2 = -0.5 / float(rbf.lengthscale) ** 2
        var = rbf.variance
        Kuu_se = np.exp(inv2l2 * self._D_uu)
        Kuu_se *= var
        D_uf = self._dist_uf(cols)
        Kuf = _scaled_exp(D_uf, inv2l2, var, out)
        noise = sum(self._parts[i].variance for i in self._white)
        Kuu = Kuu_se + noise * np.eye(self.Z.shape[0])
        n = self.X.shape[0] if cols is None else len(cols)
        self._last = (Kuu_se, Kuf, D_uf)
        return Kuu, Kuf, np.full(n, var + noise)

    def _matrices_ard(self, rbf, cols: Array | None) -> tuple[Array, Array, Array]:
        ell = np.asarray(rbf.lengthscale, dtype=float)
        B = self._Zc / ell  # [M, D]
        A = (self._Xc if cols is None else self._Xc[cols]) / ell  # [N, D]
        Kuu_se = np.exp(-0.5 * _sqdist(B, B))
        np.fill_diagonal(Kuu_se, 1.0)
        Kuu_se *= rbf.variance
        Kuf = np.exp(-0.5 * _sqdist(B, A))
        Kuf *= rbf.variance
        noise = sum(self._parts[i].variance for i in self._white)
        self._last = (Kuu_se, Kuf, (A, B))
        return Kuu_se + noise * np.eye(B.shape[0]), Kuf, np.full(A.shape[0], rbf.variance + noise)

    @staticmethod
    def _ard_lengthscale_gradient(H: Array, A: Array, B: Array) -> Array:
        """``sum_ij H_ij (b_jd - a_id)^2`` per dimension ``d``, ``H [M, N]``, ``B [M, D]``,
        ``A [N, D]`` (``dK/dlog l_d = K (a_d - b_d)^2`` for the RBF)."""
        return H.sum(axis=1) @ (B * B) + H.sum(axis=0) @ (A * A) - 2.0 * np.einsum(
            "md,md->d", B, H @ A)

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
        return self._last[2]

    def kernel_gradient(self, Kuu: Array | None, Kuf: Array | None, Kff_diag: Array | None,
                        cols: Array | None = None,
                        Kuf_sums: tuple[float, float] | None = None) -> Array:
        """Gradient wrt ``kernel.get_unconstrained()`` from matrix gradients ``dL/dKuu [M, M]``,
        ``dL/dKuf [M, N]`` (or its batch columns) and ``dL/dKff_diag [N]``, at the parameters
        of the last ``matrices`` call.

        ``Kuf_sums`` (only where ``contracts_kuf``; then pass ``Kuf=None``):
        ``(sum(dL/dKuf * Kuf), sum(dL/dKuf * Kuf * D))`` with ``Kuf`` and ``D`` of the last
        ``matrices`` call, for a ``Kuf`` gradient that is cheaper to contract than to form.
        """
        if Kuf_sums is not None and not self.contracts_kuf:
            raise ValueError("Kuf_sums needs the isotropic RBF fast path (contracts_kuf)")
        if not self.fast:
            Xb = self.X if cols is None else self.X[cols]
            k, g = self.kernel, np.zeros(self.kernel.n_params)
            if Kuu is not None:
                g += k.grad_params(self.Z, None, Kuu)
            if Kuf is not None:
                g += k.grad_params(self.Z, Xb, Kuf)
            if Kff_diag is not None:
                g += k.grad_params_diag(Xb, Kff_diag)
            return g
        if self._last is None:
            self.matrices(cols)
        Kuu_se, Kuf_se, D_uf = self._last
        g_ell: float | Array = 0.0
        g_var = g_noise = 0.0
        if self.ard:
            A, B = D_uf
            ard_grad = self._ard_lengthscale_gradient
        else:
            ell2 = float(self._parts[self._rbf].lengthscale) ** 2
        if Kuu is not None:
            GK = Kuu * Kuu_se
            g_var += float(np.sum(GK))
            g_ell = g_ell + (ard_grad(GK, B, B) if self.ard
                             else float(np.sum(GK * self._D_uu)) / ell2)
            g_noise += float(np.trace(Kuu))
        if Kuf is not None:
            GK = Kuf * Kuf_se
            g_var += float(np.sum(GK))
            g_ell = g_ell + (ard_grad(GK, A, B) if self.ard
                             else float(np.einsum("ij,ij->", GK, D_uf)) / ell2)
        if Kuf_sums is not None:  # isotropic: dK/dlog l = K * D / l^2, dK/dlog var = K
            g_var += float(Kuf_sums[0])
            g_ell = g_ell + float(Kuf_sums[1]) / ell2
        s_diag = 0.0 if Kff_diag is None else float(np.sum(Kff_diag))
        g_noise += s_diag
        out: list[float] = []
        for i, p in enumerate(self._parts):
            if i == self._rbf:  # d/dlog(lengthscale) (one or D), d/dlog(variance)
                out += [*np.atleast_1d(g_ell), g_var + p.variance * s_diag]
            else:  # White: d/dlog(variance)
                out.append(p.variance * g_noise)
        return np.array(out)
