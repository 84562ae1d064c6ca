"""Inducing-input initialisation, once for every method: ``initial_inducing`` (random training
inputs or K-means centres, spec jj-taylor-svi §4.4; one default ``M``, one rule for ``M > N``).

``kmeans_inducing(X, M, rng)`` runs ``scipy.cluster.vq.kmeans2`` with k-means++ seeding on
``X [N, D]`` and returns the ``M`` centres ``Z [M', D]`` (duplicates dropped, so ``M' <= M``).
``inducing_inputs(spec, X, rng)`` turns a ``Problem.inducing`` value into k-means ``Z``.
"""

from __future__ import annotations

import numbers
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
from scipy.cluster.vq import kmeans2

from gpinfer.data.source import KMEANS_SUBSET, host_rows, sample_rows
from gpinfer.errors import InputError
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.fixed import FixedInputs, fast_family, generic_gradient, generic_matrices
from gpinfer.moved import renamed

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
# Old names (one release)
# --------------------------------------------------------------------------------------------


def _fixed_input_covariances(kernel: Kernel, Z: Array, X: Array,
                             share: SimpleNamespace | None = None) -> SimpleNamespace:
    """``FixedInputCovariances(kernel, Z, X, share)`` for one more release: one latent's
    covariances at ``FixedInputs(Z, X)`` (``share``'s where it holds ``Z``), a thin object over
    the fixed-input mode (``StackedKernels.fixed_covariances`` with ``C = 1``) or the generic
    functions, with the old calls: ``matrices(cols, out, rows)`` (``Kuu [M, M]``,
    ``Kuf [M, B]``, ``Kff_diag [B]``), ``kernel_gradient(Kuu, Kuf, Kff_diag, cols, Kuf_sums,
    rows)`` (``[P]``), ``release()``, ``fast``, ``ard``, ``contracts_kuf``,
    ``last_distances()``."""
    inputs = share.inputs if share is not None and share.inputs.holds(Z) else FixedInputs(Z, X)
    family = fast_family([kernel])
    ard = family is not None and family.stationary[0].ard
    if family is not None:
        inputs.prepare(ard)
    me = SimpleNamespace(kernel=kernel, inputs=inputs, Z=inputs.Z, X=inputs.X, last=None,
                         fast=family is not None, ard=ard,
                         contracts_kuf=family is not None and not ard)

    def matrices(cols: Array | None = None, out: Array | None = None,
                 rows: Array | None = None) -> tuple[Array, Array, Array]:
        if family is None:
            return generic_matrices(kernel, inputs.Z, inputs.rows(cols, rows))
        cov = me.last = family.fixed_covariances(inputs, cols, rows, out)
        return cov.Kuu[0], cov.Kuf[0], cov.Kff_diag[0]

    def kernel_gradient(Kuu: Array | None, Kuf: Array | None, Kff_diag: Array | None,
                        cols: Array | None = None, Kuf_sums: tuple[float, float] | None = None,
                        rows: Array | None = None) -> Array:
        if Kuf_sums is not None and not me.contracts_kuf:
            raise ValueError("Kuf_sums needs the isotropic RBF fast path (contracts_kuf)")
        if family is None:
            return generic_gradient(kernel, inputs.Z, inputs.rows(cols, rows), Kuu, Kuf,
                                    Kff_diag)
        if me.last is None:
            matrices(cols, rows=rows)
        sums = None if Kuf_sums is None else np.array([Kuf_sums], dtype=float)
        return me.last.vjp_fixed(*(None if G is None else [G] for G in (Kuu, Kuf, Kff_diag)),
                                 Kuf_sums=sums)[0]

    def last_distances() -> Array:
        if not me.contracts_kuf:
            raise ValueError("last_distances needs the isotropic RBF fast path (contracts_kuf)")
        if me.last is None:
            matrices()
        return me.last.fixed.D_uf

    me.matrices, me.kernel_gradient, me.last_distances = matrices, kernel_gradient, last_distances
    me.release = lambda: setattr(me, "last", None)
    return me


if not TYPE_CHECKING:  # at run time only: mypy keeps checking the imports from here
    __getattr__ = renamed(
        __name__, {"FixedInputCovariances": f"{__name__}:_fixed_input_covariances",
                   "DISTANCE_CACHE_MAX_ENTRIES":
                       "gpinfer.kernels.fixed:DISTANCE_CACHE_MAX_ENTRIES"},
        hint=" (build the covariances of every latent with "
             "gpinfer.kernels.fixed.fixed_groups / fixed_matrices / fixed_gradient)")
