"""Stationary kernels: RBF, Matérn 3/2 and Matérn 5/2, isotropic or with ARD lengthscales.

Inputs may be arrays of any array-API namespace (numpy, or torch on a CPU or GPU:
``gpinfer.backend``); values and products come back on the inputs' namespace and device, the
parameters stay host floats. Each is ``k(x, x') = variance * g(r2)`` with the scaled squared
distance

    r2 = sum_d ((x_d - x'_d) / lengthscale_d)^2.

The ``Stationary`` base owns the distances, the lengthscale (one, or one per input dimension),
the variance and every vector-Jacobian product; a subclass supplies only ``g(r2)`` and
``dg/dr2``, both finite at ``r2 = 0`` (so coincident points give finite gradients and no
``sqrt(0)`` derivative ever appears).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.errors import InputError
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.checks import (
    indexed_names,
    input_pair,
    matrix_gradient,
    natural_output,
    natural_values,
    unconstrained_vector,
)
from gpinfer.numerics import settings
from gpinfer.numerics.quadrature import chunk_slices

#: sqrt(3), the Matérn 3/2 distance scale
SQRT3 = float(np.sqrt(3.0))
#: sqrt(5), the Matérn 5/2 distance scale
SQRT5 = float(np.sqrt(5.0))
#: most entries (input copies, ``r2`` and ``g``) one memo slot keeps (32 MB); larger are not kept
_MEMO_MAX_ENTRIES = 1 << 22


def sqdist(A: Array, B: Array | None = None) -> Array:
    """Squared Euclidean distances ``[Na, Nb]`` between rows (expanded form, clipped at 0);
    ``B = None``: ``A`` against itself, with an exact zero diagonal."""
    xp = ops.namespace(A)
    Bm = A if B is None else B
    r2 = xp.sum(A * A, axis=1)[:, None] + xp.sum(Bm * Bm, axis=1)[None, :] - 2.0 * (A @ ops.mT(Bm))
    ops.clip_below(r2, 0.0)
    if B is None:
        ops.fill_diagonal(r2, 0.0)
    return r2


def scaled_exp(D: Array, scale: float, factor: float, out: Array | None = None) -> Array:
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


class _Distances(NamedTuple):
    """What ``Stationary._distances`` computed and the arguments it computed it from."""

    X: Array
    X2: Array | None
    log_lengthscale: Array
    A: Array
    B: Array | None
    r2: Array
    g: Array
    #: ``ops.state_token`` of ``X`` and ``X2`` (backend arrays are matched by identity and
    #: version, numpy arrays by value)
    tokens: tuple = (None, None)

    def matches(self, X: Array, X2: Any) -> bool:
        if (ops.state_token(X), None if X2 is None else ops.state_token(X2)) != self.tokens:
            return False
        if self.tokens[0] is not None:  # backend arrays: the same objects, unchanged
            return X is self.X and X2 is self.X2
        if np.shape(X) != self.X.shape or not np.array_equal(X, self.X):
            return False
        if X2 is None or self.X2 is None:
            return X2 is None and self.X2 is None
        return np.shape(X2) == self.X2.shape and np.array_equal(X2, self.X2)


#: the squared-distance form's methods (``Stationary.sqdist_form``; ``RBF``'s)
_SQDIST_METHODS = ("K_from_sqdist", "sqdist_gradient", "ard_lengthscale_gradient")


class Stationary(Kernel):
    """``k(x, x') = variance * g(r2)`` with isotropic (scalar) or ARD (``[D]``) lengthscales.

    Parameters (unconstrained, logs): ``lengthscale`` or ``lengthscale[0..D-1]``, then
    ``variance``.
    """

    #: ``c`` where ``dg/dr2 = c g`` for every ``r2`` (a power of two, so products with it are
    #: exact), else ``None``: ``_dg_dr2_from`` is then ``c g`` and the stacked path takes
    #: ``var``'s gradient from the weights' sums (``gpinfer.kernels.stacked``). A subclass
    #: that changes ``_g`` without setting it again gets ``None`` (``__init_subclass__``: the
    #: general ``_dg_dr2``); ``tests/kernels/test_kernels.py`` checks every declared one
    dg_dr2_per_g: ClassVar[float | None] = None
    #: whether the class gives its matrices from squared distances with its own
    #: ``K_from_sqdist``, ``sqdist_gradient`` and ``ard_lengthscale_gradient`` (``RBF``'s form:
    #: the cached-distance path at fixed inputs, ``gpinfer.kernels.fixed``, takes only such a
    #: kernel). A subclass that changes ``_g`` without setting it again gets ``False``
    #: (``__init_subclass__``: RBF's formulas are not its own); declaring it without the three
    #: methods is a ``TypeError`` at class creation
    sqdist_form: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "_g" in own:  # a new g: the inherited shortcuts no longer hold unless declared again
            if "dg_dr2_per_g" not in own:
                cls.dg_dr2_per_g = None
            if "sqdist_form" not in own:
                cls.sqdist_form = False
        missing = [name for name in _SQDIST_METHODS if not callable(getattr(cls, name, None))]
        if cls.sqdist_form and missing:
            raise TypeError(f"{cls.__name__} declares sqdist_form (the cached-distance path at "
                            f"fixed inputs) without {', '.join(missing)}")

    def __init__(self, lengthscale: float | Iterable[float] = 1.0, variance: float = 1.0):
        owner = type(self).__name__
        ell = natural_values(lengthscale, "lengthscale", owner)
        var = natural_values(variance, "variance", owner)
        if var.ndim:
            raise InputError(f"{owner} variance must be a scalar, got {var.tolist()}")
        self._ard = ell.ndim == 1
        self._log_lengthscale = np.log(np.atleast_1d(ell))
        self._log_variance = float(np.log(var))

    # -- the shape of the kernel, supplied by subclasses -------------------------------------
    @abc.abstractmethod
    def _g(self, r2: Array) -> Array:
        """``k / variance`` as a function of ``r2 [N, N2]`` (``g(0) = 1``)."""

    @abc.abstractmethod
    def _dg_dr2(self, r2: Array) -> Array:
        """``d g / d r2`` at ``r2 [N, N2]``, finite at ``r2 = 0``."""

    def _dg_dr2_from(self, r2: Array, g: Array) -> Array:
        """``d g / d r2`` as a new array, given ``g = g(r2)`` as well (a kernel whose
        derivative follows from ``g``, ``dg_dr2_per_g``, saves its transcendental passes)."""
        c = self.dg_dr2_per_g
        return self._dg_dr2(r2) if c is None else c * g

    # -- natural values ----------------------------------------------------------------------
    @property
    def ard(self) -> bool:
        """Whether there is one lengthscale per input dimension."""
        return self._ard

    @property
    def input_dim(self) -> int | None:
        """``D`` for ARD lengthscales, None for an isotropic kernel (any ``D``)."""
        return self._log_lengthscale.size if self._ard else None

    @property
    def lengthscale(self) -> float | Array:
        """The lengthscale: a float, or ``[D]`` for ARD."""
        ell = np.exp(self._log_lengthscale)
        return ell.copy() if self._ard else float(ell[0])

    @property
    def variance(self) -> float:
        """The amplitude ``sigma_f^2``."""
        return float(np.exp(self._log_variance))

    # -- parameters --------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return indexed_names("lengthscale", self._log_lengthscale, self._ard) + ["variance"]

    def get_unconstrained(self) -> Array:
        return np.append(self._log_lengthscale, self._log_variance)

    def set_unconstrained(self, theta: Array) -> None:
        theta = unconstrained_vector(theta, self.n_params, type(self).__name__)
        self._log_lengthscale = theta[:-1].copy()
        self._log_variance = float(theta[-1])

    def describe(self) -> dict[str, float | list[float]]:
        return {
            "lengthscale": natural_output(self._log_lengthscale, self._ard),
            "variance": self.variance,
        }

    # -- scaled squared distances ------------------------------------------------------------
    def _scaled(self, X: object, X2: object | None) -> tuple[Array, Array | None]:
        """Checked inputs divided by the lengthscales, ``A [N, D]`` and ``B [N2, D]`` (or None).

        Both are shifted by the mean of ``X`` first (distances do not change), which keeps the
        expanded form of ``r2`` accurate for inputs far from the origin.
        """
        X, X2 = input_pair(X, X2, self.input_dim, type(self).__name__)
        ell = ops.like(X, np.exp(self._log_lengthscale))
        shift = ops.namespace(X).mean(X, axis=0)
        A = (X - shift) / ell
        B = None if X2 is None else (X2 - shift) / ell
        return A, B

    @staticmethod
    def _r2(A: Array, B: Array | None) -> Array:
        """``r2 [N, N2]`` between rows of ``A`` and ``B`` (None: ``A`` itself, zero diagonal)."""
        return sqdist(A, B)

    def _distances(self, X: object, X2: object | None) -> _Distances:
        """Scaled inputs, ``r2`` and ``g(r2)`` of ``(X, X2)``, remembered for the next call.

        A covariance and its vector-Jacobian product are nearly always evaluated at the same
        inputs and parameters (a sparse method's ``Kuu``, ``Kuf`` and then their VJPs), so the
        last result for a symmetric and for a cross pair is kept with copies of the inputs and
        lengthscales it came from and reused only when all of them are equal (values compared,
        so arrays changed in place never hit a stale entry).
        """
        slot = X2 is None
        memo = self.__dict__.setdefault("_memo", {})
        hit = memo.get(slot)  # one read: another thread may replace the entry meanwhile
        if (hit is not None and hit.matches(X, X2)
                and np.array_equal(hit.log_lengthscale, self._log_lengthscale)):
            return hit
        A, B = self._scaled(X, X2)
        r2 = self._r2(A, B)
        X_, X2_ = cast(Array, X), cast("Array | None", X2)  # checked by _scaled above
        tokens = (ops.state_token(X_), None if X2_ is None else ops.state_token(X2_))
        if tokens[0] is not None:  # backend arrays: remembered by identity and version
            entry = _Distances(X_, X2_, self._log_lengthscale.copy(), A, B, r2, self._g(r2),
                               tokens)
            memo[slot] = entry
            return entry
        kept = np.size(X_) + (0 if X2_ is None else np.size(X2_)) + 2 * r2.size
        if kept > _MEMO_MAX_ENTRIES:  # large inputs (prediction, dense N x N): recompute
            return _Distances(X_, X2_, self._log_lengthscale, A, B, r2, self._g(r2))
        entry = _Distances(np.array(X, dtype=float), None if X2 is None else np.array(X2, float),
                           self._log_lengthscale.copy(), A, B, r2, self._g(r2))
        memo[slot] = entry
        return entry

    def __getstate__(self) -> dict:
        """Copies and pickles leave the distance memo behind (it can be ``[N, N2]``)."""
        state = dict(self.__dict__)
        state.pop("_memo", None)
        return state

    # -- covariances -------------------------------------------------------------------------
    def K(self, X: Array, X2: Array | None = None) -> Array:
        return self.variance * self._distances(X, X2).g

    def K_diag(self, X: Array) -> Array:
        X, _ = input_pair(X, None, self.input_dim, type(self).__name__)
        return ops.full(X, (X.shape[0],), self.variance)

    # -- vector-Jacobian products ------------------------------------------------------------
    def _distance_gradient(self, X: Array, X2: Array | None, dK: Array
                           ) -> tuple[Array, Array | None, Array, Array, Array]:
        """Scaled inputs, ``r2``, ``dK * K`` and ``G = dK * dK/dr2`` (all ``[N, N2]``)."""
        dist = self._distances(X, X2)
        A, B, r2 = dist.A, dist.B, dist.r2
        dK = matrix_gradient(dK, r2.shape)
        var = self.variance
        dK_times_K = dK * (var * dist.g)
        G = dK * (var * self._dg_dr2(r2))
        return A, B, r2, dK_times_K, G

    def grad_params(self, X: Array, X2: Array | None, dK: Array) -> Array:
        return self._params_from(*self._distance_gradient(X, X2, dK))

    def _params_from(
        self, A: Array, B: Array | None, r2: Array, dK_times_K: Array, G: Array,
        GB: Array | None = None,
    ) -> Array:
        """Parameter gradient ``[P]`` from the pieces of ``_distance_gradient``
        (``GB = G @ B [N, D]`` when the caller has it already)."""
        # d r2 / d log(lengthscale_d) = -2 (a_d - b_d)^2 with a, b the scaled inputs
        xp = ops.namespace(G)
        if self._ard:
            Bm = A if B is None else B
            if GB is None:
                GB = G @ Bm
            per_dim = (
                xp.sum(G, axis=1) @ (A * A)
                + xp.sum(G, axis=0) @ (Bm * Bm)
                - 2.0 * ops.einsum("nd,nd->d", A, GB)
            )
            d_log_ell = -2.0 * per_dim
        else:
            d_log_ell = xp.reshape(-2.0 * xp.sum(G * r2), (1,))
        return xp.concat([d_log_ell, xp.reshape(xp.sum(dK_times_K), (1,))])

    def grad_params_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = input_pair(X, None, self.input_dim, type(self).__name__)
        dK_diag = matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        xp = ops.namespace(dK_diag)
        return xp.concat([ops.zeros(dK_diag, (self._log_lengthscale.size,)),
                          xp.reshape(self.variance * xp.sum(dK_diag), (1,))])

    def grad_inputs(self, X: Array, X2: Array | None, dK: Array) -> Array:
        A, B, _, _, G = self._distance_gradient(X, X2, dK)
        return self._inputs_from(A, B, G)

    def _inputs_from(self, A: Array, B: Array | None, G: Array, GB: Array | None = None) -> Array:
        """Input gradient ``[N, D]`` from the scaled inputs and ``G = dK * dK/dr2``
        (``GB = G @ B`` for a cross-covariance when the caller has it already)."""
        if B is None:  # X is both arguments: rows and columns both count
            G = G + ops.mT(G)
            B = A
            GB = None
        # d r2_ab / d x_ad = 2 (a_d - b_d) / lengthscale_d
        ell = ops.like(G, np.exp(self._log_lengthscale))
        if GB is None:
            GB = G @ B
        return (2.0 / ell) * (A * ops.namespace(G).sum(G, axis=1)[:, None] - GB)

    def vjp(
        self, X: Array, X2: Array | None, dK: Array, *, inputs: bool = True
    ) -> tuple[Array, Array | None]:
        """Both gradients from one computation of the distances and ``g``, ``dg/dr2`` (and,
        for a cross-covariance with ARD, one product ``G @ B`` shared by the two)."""
        A, B, r2, dK_times_K, G = self._distance_gradient(X, X2, dK)
        if B is None and inputs and self._ard:
            # X against itself: both gradients depend on G only through its symmetric part
            # (r2 and K are symmetric), so one product (G_sym @ A) serves the two of them
            G = 0.5 * (G + ops.mT(G))
            GA = G @ A
            ell = ops.like(G, np.exp(self._log_lengthscale))
            g_inputs = (4.0 / ell) * (A * ops.namespace(G).sum(G, axis=1)[:, None] - GA)
            return self._params_from(A, None, r2, dK_times_K, G, GA), g_inputs
        GB = G @ B if (B is not None and inputs and self._ard) else None
        g_inputs = self._inputs_from(A, B, G, GB) if inputs else None
        return self._params_from(A, B, r2, dK_times_K, G, GB), g_inputs

    def grad_inputs_diag(self, X: Array, dK_diag: Array) -> Array:
        X, _ = input_pair(X, None, self.input_dim, type(self).__name__)
        matrix_gradient(dK_diag, (X.shape[0],), "dK_diag")
        return ops.namespace(X).zeros_like(X)


# --------------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------------


class RBF(Stationary):
    """Squared exponential: ``k = variance * exp(-r2 / 2)``.

    Besides the ``Stationary`` interface, the squared-distance form that cached-distance fast
    paths use (``gpinfer.kernels.fixed``): ``K_from_sqdist`` (one ``exp`` over
    precomputed distances), ``sqdist_gradient`` and ``ard_lengthscale_gradient`` (the parameter
    gradients from contractions of a matrix gradient with ``K``).
    """

    dg_dr2_per_g: ClassVar[float | None] = -0.5
    sqdist_form: ClassVar[bool] = True

    def _g(self, r2: Array) -> Array:
        return ops.namespace(r2).exp(-0.5 * r2)

    def _dg_dr2(self, r2: Array) -> Array:
        return -0.5 * ops.namespace(r2).exp(-0.5 * r2)

    def K_from_sqdist(self, D: Array, scaled: bool = False, out: Array | None = None) -> Array:
        """``K`` from squared distances ``D [M, N]``: raw ones (isotropic lengthscale only),
        ``variance * exp(-D / (2 l^2))``, or those of inputs already divided by the lengthscales
        (``scaled``), ``variance * exp(-D / 2)``. ``out``: see ``scaled_exp``."""
        if scaled:
            scale = -0.5
        elif self.ard:
            raise InputError("RBF.K_from_sqdist with raw distances needs an isotropic lengthscale")
        else:
            scale = -0.5 * self._inverse_squared_lengthscale()
        return scaled_exp(D, scale, self.variance, out)

    def _inverse_squared_lengthscale(self) -> float:
        """``1 / l^2`` of an isotropic lengthscale; ``inf`` once ``l`` underflows to 0 (a
        diverging optimiser), so that the matrices turn non-finite and the caller's checks
        report it, instead of a ``ZeroDivisionError``."""
        l2 = float(self.lengthscale) ** 2
        return 1.0 / l2 if l2 > 0.0 else float("inf")

    def sqdist_gradient(self, sum_GK: float, sum_GKD: float) -> tuple[float, float]:
        """``(d/dlog lengthscale, d/dlog variance)`` of ``sum(G * K)`` (isotropic) from the
        contractions ``sum(G * K)`` and ``sum(G * K * D)`` with the raw squared distances ``D``:
        ``dK/dlog l = K D / l^2``, ``dK/dlog variance = K``."""
        return sum_GKD * self._inverse_squared_lengthscale(), sum_GK

    @staticmethod
    def ard_lengthscale_gradient(H: Array, A: Array, B: Array) -> Array:
        """``d/dlog l_d`` of ``sum(G * K)``, ``H = G * K [M, N]``, for the scaled inputs
        ``B [M, D]`` and ``A [N, D]``: ``sum_ij H_ij (b_jd - a_id)^2`` (``dK/dlog l_d =
        K (a_d - b_d)^2``)."""
        return H.sum(axis=1) @ (B * B) + H.sum(axis=0) @ (A * A) - 2.0 * np.einsum(
            "md,md->d", B, H @ A)


class Matern32(Stationary):
    """Matérn 3/2: ``k = variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``, ``r = sqrt(r2)``.

    ``dg/dr2 = -(3/2) exp(-sqrt(3) r)``, finite at ``r = 0``.
    """

    def _g(self, r2: Array) -> Array:
        xp = ops.namespace(r2)
        s = SQRT3 * xp.sqrt(r2)
        return (1.0 + s) * xp.exp(-s)

    def _dg_dr2(self, r2: Array) -> Array:
        xp = ops.namespace(r2)
        return -1.5 * xp.exp(-SQRT3 * xp.sqrt(r2))


class Matern52(Stationary):
    """Matérn 5/2: ``k = variance * (1 + sqrt(5) r + 5 r2 / 3) exp(-sqrt(5) r)``, ``r = sqrt(r2)``.

    ``dg/dr2 = -(5/6) (1 + sqrt(5) r) exp(-sqrt(5) r)``, finite at ``r = 0``.
    """

    def _g(self, r2: Array) -> Array:
        xp = ops.namespace(r2)
        s = SQRT5 * xp.sqrt(r2)
        return (1.0 + s + (5.0 / 3.0) * r2) * xp.exp(-s)

    def _dg_dr2(self, r2: Array) -> Array:
        xp = ops.namespace(r2)
        s = SQRT5 * xp.sqrt(r2)
        return -(5.0 / 6.0) * (1.0 + s) * xp.exp(-s)
