"""The operations the array API standard lacks, mapped once per namespace (numpy, torch).

Every function takes arrays of one namespace and returns arrays of it (on the same device):

* linear algebra on stacks ``[..., M, M]``: ``cholesky`` (with a per-matrix failure report
  instead of an exception), ``solve_triangular`` (lower factors, optionally transposed;
  ``solve_triangular_with``: a stack and a vector, one solve per factor on numpy),
  ``cho_inverse``; numpy keeps its tuned paths (one BLAS ``trsm`` / LAPACK ``potri`` per
  matrix on Fortran views), torch calls its batched kernels;
* special functions: ``log_ndtr``, ``ndtr``, ``expit``, ``log_expit``, ``erfcx``,
  ``logsumexp``;
* ``einsum``, ``outer``, ``scale_columns`` / ``scale_rows``, power-of-two scaled sums
  (``scale_add_``, ``add_scaled_``, ``plus_scaled``), ``add_product``, ``rsub``,
  ``max_abs``, ``symmetrize`` (one operator each on a device), ``mT`` (last two axes swapped),
  ``diagonal``, ``add_diagonal``, ``scaled_plus_diagonal``, and writes into existing arrays
  (``multiply_into``, ``sqrt_into``, ``clip_below``, ``fill_diagonal``) where a temporary of
  millions of entries would cost a pass over memory;
* moving values: ``like`` (host values onto an array's namespace, device and dtype),
  ``index_like`` (host or backend labels as an index of the namespace), ``as_array`` /
  ``flat`` / ``zeros_vector`` (host values as float64 numpy, backend arrays where they live),
  ``holds_like`` (kept state that takes a value in place), ``to_host``, ``scalar``,
  ``all_finite``, ``torch_view``,
  ``is_host_buffer`` / ``host_out`` (a host vector numpy writes a result into; none on a
  device), ``maybe_any`` (a host test without a device sync);
* one operation, each namespace's form, so that backend-neutral code never tests which
  library a value belongs to: ``rows_matmul`` / ``matmul_t`` / ``mean_rows`` / ``trace`` /
  ``scaled_inner`` (numpy's reshaped ``gemm`` and views, a device's one ``einsum``),
  ``vecmat`` / ``matvec`` (batched row / column products: numpy's ``@``, a device's one
  ``einsum``), ``einsum_transposed``, ``scaled_einsum``, ``polyval`` (Horner on numpy, one
  product of powers on a device), ``masked_entries`` /
  ``set_masked`` (numpy on the masked entries only, in place; a device on every entry with a
  select), ``piecewise_or_whole`` (numpy's two formulas on their entries, a device's one
  formula valid everywhere); numpy's fast paths behind one name each (``class_counts``,
  ``converge_rows``: a row-wise iteration that compacts converged rows on the host,
  ``floored``, ``potrf_matrix``);
* checks without a device sync each (``checks_for``: the open context a check joins): inside
  ``deferred_checks()`` the checks of
  ``require_positive``, ``require_finite`` and ``cholesky(..., check=True, error=...)`` on device
  arrays are collected as 0-d values, each with the host test it must pass (one reduction per
  check, no flag formed on the device), and read in one transfer with the values the caller
  needs (``DeferredChecks.flush``), which raises the first failed check's error; on numpy,
  and outside such a context, every check runs at once. The training loop opens one context per
  step and reads it once, at the step's end, with the objective and the site change (or one
  per ``read_every`` steps). A context opened with ``redo=True`` lets a check whose immediate
  form has a host fallback (Kuu's Cholesky with jitter escalation) be deferred too: its
  failure raises ``RedoStep``, and the caller redoes the computation from a kept snapshot in
  a context without ``redo``, where the fallback runs at once, as it always did.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import array_api_compat
import numpy as np
from scipy import special
from scipy.linalg import solve_triangular as _scipy_solve_triangular
from scipy.linalg.blas import dgemm, dsymm, dsymv, dtrmm, dtrsm, sgemm, ssymm, ssymv, strmm, strsm
from scipy.linalg.lapack import dpotrf, dpotri, dtrtri, dtrtrs, spotrf, spotri, strtri

from gpinfer.errors import NumericalError

Array = Any
_NUMPY = array_api_compat.array_namespace(np.zeros(0))


def namespace(*arrays: Array) -> Any:
    """The array-API namespace of ``arrays`` (``array_api_compat.numpy`` or ``.torch``)."""
    if all(type(a) is np.ndarray for a in arrays):  # the default backend, on every call
        return _NUMPY
    return array_api_compat.array_namespace(*arrays)


_HOST_TYPES = (np.ndarray, np.generic, float, int)  # a tuple, not a union: torch.compile traces it


def is_numpy(x: Array) -> bool:
    """Whether ``x`` is a numpy array (or scalar)."""
    return isinstance(x, _HOST_TYPES)


def is_array(x: Any) -> bool:
    """Whether ``x`` is an array of some array-API namespace (numpy or torch)."""
    return array_api_compat.is_array_api_obj(x)


def _torch() -> Any:
    import torch

    return torch


def _is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (the backend arrays; no import of torch where none is
    loaded: then there is none)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def like(ref: Array, values: Any) -> Array:
    """Host ``values`` (array or scalar) as an array of ``ref``'s namespace, device and
    floating dtype."""
    if is_numpy(ref):
        return np.asarray(values, dtype=np.result_type(ref, np.float32))
    torch = _torch()
    if isinstance(values, torch.Tensor):
        return values.to(device=ref.device, dtype=ref.dtype)
    host = np.asarray(values)
    if not host.flags.writeable:  # torch warns on read-only buffers (cached constants)
        host = host.copy()
    return torch.as_tensor(host, dtype=ref.dtype, device=ref.device)


def index_like(ref: Array, idx: Any) -> Array:
    """Integer ``idx`` as an index array of ``ref``'s namespace: host values as int64 on its
    device; an index array already of a backend namespace (torch labels) as it is."""
    if is_numpy(ref):
        return np.asarray(idx, dtype=np.int64)
    if _is_tensor(idx):
        return idx
    return _torch().as_tensor(np.asarray(idx, dtype=np.int64), device=ref.device)


def class_counts(y: Array, C: int) -> Array:
    """How many labels ``y [n]`` (ints ``0..C-1``) hold each class, float64 ``[C]`` on ``y``'s
    namespace and device (numpy: ``bincount``; a device: one comparison against ``0..C-1``
    and a sum, no sync)."""
    if is_numpy(y):
        return np.bincount(y, minlength=C).astype(float)
    xp = namespace(y)
    return xp.sum(xp.astype(y[:, None] == arange(y, C), xp.float64), axis=0)


def converge_rows(step: Callable[..., tuple[Array, ...]], fixed: tuple[Array, ...],
                  state: tuple[Array, ...], max_iter: int) -> tuple[Array, ...]:
    """A row-wise iteration: ``(*state, done) = step(*fixed, *state)`` on arrays ``[B, ...]``
    (``done [B]``: the rows that have converged), at most ``max_iter`` steps; returns the
    final ``state``. On numpy a row stops at its own convergence: each step runs on the rows
    still moving only (gathered, and written back into ``state``'s arrays in place); on a
    device every row steps until all have converged (no data-dependent shapes; one read of
    ``done`` per step)."""
    if not is_numpy(state[0]):
        xp = namespace(*state)
        for _ in range(max_iter):
            out = step(*fixed, *state)
            state = out[:-1]
            if bool(xp.all(out[-1])):
                break
        return state
    moving = np.arange(state[0].shape[0])  # rows still iterating
    for _ in range(max_iter):
        *new, done = step(*(a[moving] for a in fixed), *(s[moving] for s in state))
        for s, value in zip(state, new):
            s[moving] = value
        moving = moving[~done]
        if moving.size == 0:
            break
    return state


def floored(x: Array, low: float) -> Array:
    """``max(x, low)`` elementwise as a new array (numpy's ufunc; torch's ``clamp``: one
    operator, where the array API's ``clip`` costs numpy a wrapper's checks)."""
    return np.maximum(x, low) if is_numpy(x) else x.clamp(min=low)


def as_array(x: Any, dtype: Any = float) -> Array:
    """``x`` as an array: host values (a numpy array, a scalar, a sequence) as a numpy array
    of ``dtype`` (no copy where ``x`` already is one); an array of a backend namespace (a
    torch tensor) where it lives, as it is (``dtype=float``: a tensor of integers or booleans
    as float64)."""
    if not _is_tensor(x):
        return np.asarray(x, dtype=dtype)
    if dtype is float and not x.is_floating_point():
        return x.to(_torch().float64)
    return x


def flat(x: Any, copy: bool = False) -> Array:
    """``x`` as a flat vector ``[P]``: host values as a fresh float64 numpy copy; an array of
    a backend namespace reshaped on its device (a view where it can be; ``copy``: a fresh
    array, as on the host)."""
    if not _is_tensor(x):
        return np.array(x, dtype=float).reshape(-1)
    out = x.reshape(-1)
    return out.clone() if copy else out


def zeros_vector(x: Any) -> Array:
    """Zeros ``[P]`` where ``x`` (``P`` entries) lives: float64 numpy for host values, else on
    ``x``'s namespace, device and dtype."""
    ref = as_array(x)
    return zeros(ref, (math.prod(ref.shape),))


def holds_like(kept: Any, ref: Any) -> bool:
    """Whether ``kept`` (state an optimiser or a loop keeps between calls) is an array of
    ``ref``'s library and shape, so that it takes ``ref``'s values in place; else the caller
    makes its state anew where ``ref`` lives (``ref`` host values or an array of any namespace;
    ``kept`` may be None)."""
    return type(kept) is type(ref) and tuple(kept.shape) == tuple(ref.shape)


def checks_for(x: Array) -> DeferredChecks | None:
    """The open ``deferred_checks`` context that a check of ``x`` joins: ``None`` for host
    values (their checks run at once) and outside such a context."""
    return None if is_numpy(x) else pending_checks()


def torch_view(x: Array) -> Any:
    """``x`` as a torch tensor sharing its memory (a numpy array: ``torch.from_numpy``; a
    tensor: itself, detached), e.g. for a collective of ``torch.distributed`` in place."""
    torch = _torch()
    return x.detach() if isinstance(x, torch.Tensor) else torch.from_numpy(x)


def backend_name(x: Array) -> str:
    """The name of ``x``'s array library: ``"numpy"`` for host values, else ``"torch"``."""
    return "torch" if _is_tensor(x) else "numpy"


def _kept(cache: dict[Any, Any], key: Any, make: Callable[[], Any], limit: int = 64) -> Any:
    """``cache[key]``, made by ``make()`` the first time it is asked for and kept (callers only
    read it); past ``limit`` entries the cache starts afresh (a bound on what stays alive)."""
    out = cache.get(key)
    if out is None:
        if len(cache) > limit:
            cache.clear()
        out = cache[key] = make()
    return out


_ARANGES: dict[tuple[str, int], Array] = {}


def arange(ref: Array, n: int) -> Array:
    """``0 .. n-1`` as int64 on ``ref``'s namespace and device (on a device: made once per
    device and length and kept; callers only read it)."""
    if is_numpy(ref):
        return np.arange(n, dtype=np.int64)
    if tracing():  # inside a compiled region: part of its graph
        return _torch().arange(n, device=ref.device)
    return _kept(_ARANGES, (str(ref.device), n),
                 lambda: _torch().arange(n, device=ref.device))


_IDENTITIES: dict[tuple[str, str, int], Array] = {}


def _identity(ref: Array, n: int) -> Array:
    """The ``n x n`` identity on ``ref``'s device and dtype (a device array: made once per
    device, dtype and size and kept, like ``arange``; callers only read it)."""
    if tracing():  # inside a compiled region: part of its graph
        return eye(ref, n)
    return _kept(_IDENTITIES, (str(ref.device), str(ref.dtype), n), lambda: eye(ref, n),
                 limit=16)


_CONSTANTS: dict[tuple[str, str, tuple[float, ...], tuple[int, ...] | None], Array] = {}


def constant(ref: Array, values: tuple[float, ...], shape: tuple[int, ...] | None = None
             ) -> Array:
    """The host ``values`` as a 1-D array (or one of ``shape``, e.g. ``(-1, 1, 1)`` for a
    column that broadcasts over matrices) of ``ref``'s namespace, device and floating dtype;
    on a device moved once per device, dtype, values and shape and kept (callers only read
    it: no reshape operator per use)."""
    if not is_numpy(ref) and tracing():  # inside a compiled region: a constant of its graph
        # (from the host tuple: a numpy array's tolist() of floats breaks the graph)
        out = _torch().tensor(values, dtype=ref.dtype, device=ref.device)
        return out if shape is None else out.reshape(shape)
    host = np.array(values) if shape is None else np.reshape(np.array(values), shape)
    if is_numpy(ref):
        return like(ref, host)
    return _kept(_CONSTANTS, (str(ref.device), str(ref.dtype), values, shape),
                 lambda: like(ref, host))


#: the profiler's name for a read of device values on the host (``to_host``): on a CPU the
#: read is free and leaves no aten event, so benchmarks count this range as a device sync
HOST_READ = "gpinfer::host_read"


def to_host(x: Array) -> np.ndarray:
    """``x`` as a numpy array on the host (no copy for numpy; a device array is read inside a
    profiler range named ``HOST_READ``)."""
    if is_numpy(x):
        return np.asarray(x)
    with _torch().profiler.record_function(HOST_READ):
        return (x.detach() if x.requires_grad else x).cpu().numpy()


def scalar(x: Array) -> float:
    """A 0-d array (or one-element array) as a Python float."""
    return float(x) if is_numpy(x) else float(x.item())


# -- host values and per-namespace forms (kernels, hyper-parameters, numerics) -----------------


def maybe_any(mask: Array) -> bool:
    """Whether ``mask`` may hold a True entry, decided without a device sync: numpy reads it
    (False when none is True); on a device always True (the caller's masked form runs)."""
    return bool(np.any(mask)) if is_numpy(mask) else True


def is_host_buffer(x: Any, ndim: int | None = None) -> bool:
    """Whether ``x`` is a C-contiguous, writable float64 numpy array (of ``ndim`` axes where
    given): a host buffer a result may be written into, or a caller's vector used as it is."""
    return (type(x) is np.ndarray and x.dtype == np.float64 and x.flags.c_contiguous
            and x.flags.writeable and (ndim is None or x.ndim == ndim))


def host_out(ref: Array, out: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """A float64 host array of ``shape`` for a result over ``ref``'s namespace that numpy
    writes in place: ``out`` when it is such a buffer (``is_host_buffer``) of that shape (its
    values to be overwritten), else a new one; ``None`` on a device (its results stay
    there)."""
    if not is_numpy(ref):
        return None
    return out if is_host_buffer(out) and out.shape == shape else np.empty(shape)


def piecewise_or_whole(mask_of: Callable[..., Array], f_in: Callable[..., Array],
                       f_out: Callable[..., Array], whole: Callable[..., Array],
                       *args: Array) -> Array:
    """numpy: ``piecewise(mask_of(*args), f_in, f_out, *args)`` (each function on its own
    entries only); other namespaces: ``whole(*args)`` on every entry (one formula valid
    everywhere: no mask and no select on a device)."""
    if not is_numpy(args[0]):
        return whole(*args)
    return piecewise(mask_of(*args), f_in, f_out, *args)


def masked_entries(mask: Array, x: Array, fill: float) -> Array:
    """The entries of ``x`` (shaped like ``mask``) that ``set_masked`` writes from: a numpy
    array (not 0-d) those where ``mask`` only, ``x[mask]``; otherwise every entry,
    ``where(mask, x, fill)`` (``fill`` keeps the unused ones finite: no select of a NaN, no
    NaN in a gradient)."""
    if is_numpy(x) and x.ndim > 0:
        return x[mask]
    return namespace(x).where(mask, x, fill)


def set_masked(mask: Array, out: Array, values: Array) -> Array:
    """``out`` with ``values`` (a function of ``masked_entries(mask, ...)``) where ``mask``: a
    numpy array (not 0-d, which the caller owns) in place, ``out[mask] = values``, and
    returned; otherwise a new ``where(mask, values, out)``."""
    if is_numpy(out) and out.ndim > 0:
        out[mask] = values
        return out
    return namespace(out).where(mask, values, out)


def polyval(coefs: tuple[float, ...], z: Array) -> Array:
    """``sum_n coefs[n] z^n`` elementwise: numpy by Horner's rule (a pass per term over the
    entries), a device as one product of the powers of ``z`` with the coefficients (a few
    operators whatever the number of terms; the same sum to round-off)."""
    if is_numpy(z):
        out = coefs[-1] + 0.0 * z
        for b in coefs[-2::-1]:
            out = out * z + b
        return out
    powers = z[..., None] ** constant(z, tuple(float(n) for n in range(len(coefs))))
    return powers @ constant(z, coefs)


def rows_matmul(X: Array, Y: Array) -> Array:
    """``X @ Y`` ``[C, M, N]`` for ``X [C, M, K]`` and ``Y [K, N]`` as one product over the
    ``C M`` rows: numpy reshapes to one ``gemm``; torch's ``matmul`` folds the leading axes
    itself (the same ``gemm``, without two reshape operators)."""
    if not is_numpy(X):
        return X @ Y
    C, M, K = X.shape
    return np.reshape(np.reshape(X, (C * M, K)) @ Y, (C, M, Y.shape[1]))


def matmul_t(U: Array, V: Array) -> Array:
    """``U V^T`` over the last two axes: ``[C, M, N]`` for ``U [C, M, D]`` and ``V [C, N, D]``
    or ``[N, D]`` (shared by every matrix), ``[M, N]`` for ``U [M, D]``, ``V [N, D]``. numpy:
    ``@`` with the transposed view (``rows_matmul`` for a shared ``V``: one product over the
    ``C M`` rows); a device: one ``einsum`` operator (no view)."""
    if is_numpy(U):
        return rows_matmul(U, mT(V)) if U.ndim == 3 and V.ndim == 2 else U @ mT(V)
    return _torch().einsum(_MATMUL_T_SPECS[U.ndim, V.ndim], U, V)


#: ``matmul_t``'s ``einsum`` by the operands' numbers of axes
_MATMUL_T_SPECS = {(3, 3): "cmd,cnd->cmn", (3, 2): "cmd,nd->cmn", (2, 2): "md,nd->mn"}


def mean_rows(X: Array) -> Array:
    """The mean ``[D]`` of the rows of ``X [..., D]`` over every leading axis (torch: one
    reduction over those axes, the same sum as over the reshaped rows; numpy: the reshaped
    rows)."""
    if not is_numpy(X):
        return X.mean(dim=tuple(range(X.ndim - 1)))
    return np.mean(np.reshape(X, (-1, X.shape[-1])), axis=0)


def trace(X: Array) -> Array:
    """The traces ``[C]`` of ``X [C, M, M]`` (on a device one ``einsum`` operator; numpy the
    sums of the diagonal views)."""
    if is_numpy(X):
        return np.sum(diagonal(X), axis=1)
    return _torch().einsum("cmm->c", X)


def scaled_inner(A: Array, B: Array, v: Array) -> Array:
    """``v[c] sum_mn A[c, m, n] B[c, m, n]`` ``[C]`` for ``A``, ``B`` ``[C, M, N]`` and ``v``
    ``[C]`` (numpy: the sums, then the product by ``v``; a device: one ``einsum`` operator)."""
    if is_numpy(A):
        return v * np.einsum("cmn,cmn->c", A, B)
    return _torch().einsum("cmn,cmn,c->c", A, B, v)



def all_finite(*arrays: Array) -> bool:
    """Whether every entry of every array is finite (host arrays: ``_host_finite``; device
    arrays: one reduction and one device sync for all of them)."""
    on_device = [a for a in arrays if not is_numpy(a)]
    if not all(_host_finite(a) for a in arrays if is_numpy(a)):
        return False
    if not on_device:
        return True
    torch = _torch()
    if len(on_device) == 1:
        return bool(torch.isfinite(on_device[0]).all())
    return bool(torch.stack([torch.isfinite(a).all() for a in on_device]).all())


#: from this many entries on, a contiguous float host array is checked by its sum of squares
_FINITE_BY_DOT_FROM = 4096


def _host_finite(a: Any) -> bool:
    """Whether every entry of the host value ``a`` is finite. A contiguous float array of
    ``_FINITE_BY_DOT_FROM`` entries or more: its sum of squares ``v . v`` first (one BLAS
    ``dot``, one read of the array, no temporary), finite exactly when every entry is (a NaN
    or an infinity makes it NaN or infinite; squares add no cancellation); only where it is
    not (a non-finite entry, or finite entries whose squares or their sum overflow: beyond
    about ``1e154`` in float64, ``1e19`` in float32) the entrywise test, which decides; every
    other input (other dtypes, strided views, ndarray subclasses, whose ``ravel`` and ``@``
    differ) the entrywise test alone. Measured on one thread (caches flushed between calls,
    medians of 25): a ``[1.57 M]`` vector 1.50-1.55 -> 0.86-0.87 ms, ``[10, 200, 200]``
    0.47-0.49 -> 0.35 ms."""
    if (type(a) is np.ndarray and a.size >= _FINITE_BY_DOT_FROM  # no subclass (matrix, ma)
            and a.dtype in (np.float64, np.float32)
            and (a.flags.c_contiguous or a.flags.f_contiguous)):
        v = a.ravel(order="K")  # a view (contiguous)
        # every flag ignored: an overflow is decided below, and tiny finite entries (squares
        # underflowing) must not raise under a caller's ``np.errstate(under="raise")``
        with np.errstate(all="ignore"):
            if np.isfinite(v @ v):
                return True
    return bool(np.all(np.isfinite(a)))


def all_positive(x: Array) -> bool:
    """Whether every entry of ``x`` is finite and ``> 0`` (one device sync)."""
    if is_numpy(x):
        return bool(np.all(np.isfinite(x)) and np.all(x > 0.0))
    return bool(((x > 0.0) & (x < math.inf)).all())


class RedoStep(Exception):
    """A deferred check failed whose immediate form would have taken a host fallback instead
    of failing (see ``deferred_checks(redo=True)``): the caller restores the state the
    computation started from and redoes it without ``redo``."""


#: what a check's 0-d value must satisfy on the host (its read is the only place it is tested)
Test = Callable[[float], bool]


def _true(v: float) -> bool:
    """A flag (bool read as 0 or 1) that holds."""
    return v != 0


def _finite(v: float) -> bool:
    """A finite value (an array's largest magnitude, minimum or maximum: NaN and infinities
    propagate into them)."""
    return math.isfinite(v)


def _positive(v: float) -> bool:
    """A finite value ``> 0`` (the minimum of an array whose maximum is checked finite)."""
    return 0.0 < v < math.inf


def _zero(v: float) -> bool:
    """A value ``== 0`` (the largest LAPACK status of a batch of factorisations)."""
    return v == 0


class DeferredChecks:
    """Checks on device arrays collected as 0-d values and read together (see
    ``deferred_checks``): each value comes with the host test it must pass (a flag, the largest
    magnitude, minimum or maximum of arrays, a LAPACK status: one reduction per check, no flag
    formed on the device) and the error for a failure. The order of ``require`` calls is the
    order in which failures are reported, so the first failed check of a computation names the
    problem, as an immediate check would have. ``redo``: the owner answers ``RedoStep`` by
    redoing the computation (checks with a host fallback may then be deferred as well)."""

    def __init__(self, redo: bool = False) -> None:
        self.redo = redo
        self._flags: list[Array] = []
        self._tests: list[Test] = []
        self._errors: list[Callable[[], Exception]] = []

    def require(self, flag: Array, error: Callable[[], Exception], test: Test = _true) -> None:
        """Remember ``flag`` (a 0-d device array; by default a bool that must hold, else a value
        that must pass ``test`` on the host) and the error for a failure."""
        self._flags.append(flag)
        self._tests.append(test)
        self._errors.append(error)

    def flush(self, *values: Array) -> list[float]:
        """Read every pending check and ``values`` (0-d arrays) in one transfer; raise the
        error of the first failed check, else return the values as floats."""
        flags, tests, errors = self._flags, self._tests, self._errors
        self._flags, self._tests, self._errors = [], [], []
        device = [v for v in values if not is_numpy(v)]
        if not flags and not device:
            return [float(v) for v in values]
        # one stack of checks and values (promoted to their widest dtype: flags, LAPACK
        # statuses and each array's extremes are exact in it)
        host = to_host(_torch().stack(flags + device)).tolist()  # 1 sync
        for v, test, error in zip(host, tests, errors):
            if not test(v):
                raise error()
        read = iter(host[len(flags):])
        return [float(v) if is_numpy(v) else float(next(read)) for v in values]


_DEFERRED: contextvars.ContextVar[DeferredChecks | None] = contextvars.ContextVar(
    "gpinfer_deferred_checks", default=None)


@contextlib.contextmanager
def deferred_checks(redo: bool = False) -> Iterator[DeferredChecks]:
    """A context in which checks of device arrays are collected instead of read one by one;
    what is still pending at its end is read then (one sync). Use ``flush`` inside it to read
    the checks together with the values a computation returns, before anything that a failed
    check must not reach (a state update). Contexts do not nest: an inner one collects its
    own checks. ``redo=True``: the caller catches ``RedoStep`` from the read and redoes the
    computation (see the module doc); only the training loop does."""
    checks = DeferredChecks(redo)
    token = _DEFERRED.set(checks)
    try:
        yield checks
    finally:
        _DEFERRED.reset(token)
    checks.flush()


def pending_checks() -> DeferredChecks | None:
    """The open ``deferred_checks`` context, if any."""
    return _DEFERRED.get()


#: checks met while ``torch.compile`` traces a compiled region (``gpinfer.backend.compile``):
#: a list that is never replaced (the compiled code appends to it); the region's wrapper hands
#: them on after each call (``hand_over_traced_checks``)
_TRACED: list[tuple[Array, Callable[[], Exception], Test]] = []


def tracing() -> bool:
    """Whether ``torch.compile`` is tracing the code that calls this (False without torch)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())


def _require(flag: Array, error: Callable[[], Exception], test: Test = _true) -> None:
    """A device check (``flag`` must pass ``test`` on the host): collected while tracing a
    compiled region, deferred inside ``deferred_checks``, else read at once."""
    if tracing():
        _TRACED.append((flag, error, test))
        return
    checks = pending_checks()
    if checks is not None:
        checks.require(flag, error, test)
    elif not test(float(flag)):
        raise error()


def require(flag: Array, error: Callable[[], Exception]) -> None:
    """Raise ``error()`` unless ``flag`` holds: a host flag (a numpy or Python bool) at once;
    a 0-d bool device array deferred inside ``deferred_checks``, collected while tracing, else
    read at once."""
    if is_numpy(flag):
        if not flag:
            raise error()
        return
    _require(flag, error)


def hand_over_traced_checks(discard: bool = False) -> None:
    """The checks a compiled region collected, in order, to the open ``deferred_checks``
    context (or read at once outside one); ``discard``: dropped (the region failed to
    compile and runs again eagerly)."""
    pending = [] if discard else list(_TRACED)
    _TRACED.clear()
    for flag, error, test in pending:
        _require(flag, error, test)


def _extremes(x: Array, low: Test) -> list[tuple[Array, Test]]:
    """The checks that every entry of the device array ``x`` passes ``low`` at its minimum
    and is finite at its maximum: one reduction (``aminmax``; NaN propagates into both, an
    infinity into one of them), none for an empty array."""
    if x.numel() == 0:
        return []
    lo, hi = _torch().aminmax(x)
    return [(lo, low), (hi, _finite)]


def _finite_checks(arrays: tuple[Array, ...] | list[Array]) -> list[tuple[Array, Test]]:
    """The checks that every entry of the device ``arrays`` is finite: their largest
    magnitudes, one ``_foreach_norm`` of order inf for all of them (one operator; NaN
    propagates into it, on a GPU too, and an infinity is its own largest magnitude), none for
    an empty array or one of integers or booleans (always finite)."""
    full = [a for a in arrays if a.numel() and (a.is_floating_point() or a.is_complex())]
    if not full:
        return []
    return [(n, _finite) for n in _torch()._foreach_norm(full, math.inf)]


def require_positive(x: Array, error: Callable[[], Exception]) -> None:
    """Raise ``error()`` unless every entry of ``x`` is finite and ``> 0`` (deferred on a
    device inside ``deferred_checks``)."""
    if is_numpy(x):
        if not all_positive(x):
            raise error()
        return
    _require_all(_extremes(x, _positive), error)  # min > 0, max < inf: one reduction


def require_finite(error: Callable[[], Exception], *arrays: Array) -> None:
    """Raise ``error()`` unless every entry of every array is finite (deferred on a device
    inside ``deferred_checks``; host values among them, numpy arrays or Python floats, are
    checked at once)."""
    host = [a for a in arrays if is_numpy(a)]
    device = [a for a in arrays if not is_numpy(a)]
    if not all_finite(*host):
        raise error()
    if device:  # (host values alone: no context to look up)
        _require_all(_finite_checks(device), error)


def _read_checks(checks: list[tuple[Array, Test]]) -> bool:
    """Whether every ``(value, test)`` passes, read at once (one transfer for all)."""
    if not checks:
        return True
    host = to_host(_torch().stack([v for v, _ in checks])).tolist()
    return all(test(v) for v, (_, test) in zip(host, checks))


def _require_all(checks: list[tuple[Array, Test]], error: Callable[[], Exception]) -> None:
    """``_require`` of every ``(value, test)`` with the same error: inside
    ``deferred_checks`` (or while tracing) each is kept on its own (the read stacks them all
    anyway; the first failed one raises, as their conjunction would), else one read."""
    if tracing() or pending_checks() is not None:
        for flag, test in checks:
            _require(flag, error, test)
    elif not _read_checks(checks):
        raise error()


def einsum(spec: str, *operands: Array) -> Array:
    """``einsum`` (not in the standard) of one namespace."""
    if is_numpy(operands[0]):
        return np.einsum(spec, *operands)
    return _torch().einsum(spec, *operands)


def outer(u: Array, v: Array) -> Array:
    """``u[..., :, None] * v[..., None, :]`` ``[..., m, n]`` for ``u [..., m]``,
    ``v [..., n]`` (on a device one ``einsum`` operator instead of two views and a product:
    the same products, laid out alike)."""
    if is_numpy(u):
        return u[..., :, None] * v[..., None, :]
    return _torch().einsum("...m,...n->...mn", u, v)


def scale_columns(X: Array, v: Array) -> Array:
    """``X [..., m, n] * v[..., None, :]`` for ``v [..., n]`` (column ``j`` of each matrix
    times ``v[..., j]``; on a device one ``einsum`` operator instead of a view and a
    product: the same products, laid out alike)."""
    if is_numpy(X):
        return X * v[..., None, :]
    return _torch().einsum("...mn,...n->...mn", X, v)


def scale_rows(X: Array, v: Array) -> Array:
    """``X [..., m, n] * v[..., :, None]`` for ``v [..., m]`` (row ``i`` of each matrix times
    ``v[..., i]``; on a device one ``einsum`` operator, as ``scale_columns``)."""
    if is_numpy(X):
        return X * v[..., :, None]
    return _torch().einsum("...mn,...m->...mn", X, v)


def mT(X: Array) -> Array:
    """The last two axes swapped (a view): ``[..., a, b] -> [..., b, a]``."""
    return np.swapaxes(X, -1, -2) if is_numpy(X) else X.mT


def unbind(X: Array) -> tuple[Array, ...]:
    """The views ``X[0], X[1], ...`` along the first axis (on a device one ``unbind``
    operator, where each index is one ``select``)."""
    return tuple(X) if is_numpy(X) else _torch().unbind(X, 0)


def symmetrize(X: Array) -> Array:
    """``(X + X^T) / 2`` over the last two axes, ``X [..., M, M]`` (a new array; on numpy one
    temporary, halved in place).

    On a device one operator, ``lerp(X, X^T, 0.5) = X^T - (X^T - X) / 2`` (with the
    transposed view: two, where the sum and the halving were three). Where ``X_ij`` and
    ``X_ji`` are within a factor 2 of each other (a matrix symmetric up to round-off, the
    usual input) the difference is exact and both forms round the same midpoint once: the
    same bits, and a symmetric result; elsewhere they differ by an ulp of the difference."""
    if not is_numpy(X):
        return X.lerp(X.mT, 0.5)
    out = X + mT(X)
    out *= 0.5
    return out


def symmetrize_(X: Array) -> Array:
    """``X = (X + X^T) / 2`` over the last two axes, in place on ``X [..., M, M]``, which the
    caller owns; returns ``X`` (the values of ``symmetrize``). numpy (a C-ordered ``X``): one
    matrix at a time, its transpose copied into one matrix-sized buffer, added and halved
    while the matrix is in cache, where ``symmetrize`` forms a new stack (numpy's own
    ``X + X^T`` in place buffers the overlapping transpose in small blocks: at ``[10, 200,
    200]`` on one thread 565 -> 365 us, at ``[10, 100, 100]`` 120 -> 83 us, the same bits);
    otherwise ``symmetrize``'s new array."""
    if not is_numpy(X) or not X.flags.c_contiguous or not X.flags.writeable:
        return symmetrize(X)
    buffer = np.empty(X.shape[-2:], dtype=X.dtype)
    for matrix in X.reshape((-1,) + X.shape[-2:]):
        np.copyto(buffer, matrix.T)
        matrix += buffer
        matrix *= 0.5
    return X


def diagonal(X: Array) -> Array:
    """Diagonals ``[..., M]`` of ``X [..., M, M]`` (a view)."""
    if is_numpy(X):
        return np.diagonal(X, axis1=-2, axis2=-1)
    return _torch().diagonal(X, dim1=-2, dim2=-1)


def _diagonal_matrix(ref: Array, n: int, value: float) -> Array:
    """``value`` on the diagonal of an ``n x n`` matrix with ``-0.0`` elsewhere (``x + (-0.0)``
    is ``x`` for every ``x``, signed zeros included), on ``ref``'s device and dtype: made
    once per device, dtype, size and value and kept (callers only read it)."""
    def make() -> Array:
        out = full(ref, (n, n), -0.0)
        diagonal(out).fill_(value)
        return out

    return _kept(_DIAGONALS, (str(ref.device), str(ref.dtype), n, float(value)), make,
                 limit=16)


_DIAGONALS: dict[tuple[str, str, int, float], Array] = {}


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def add_diagonal(X: Array, value: Any) -> Array:
    """``X [..., M, M]`` with ``value`` (scalar or ``[..., M]``) added to its diagonal, in
    place; returns ``X``. (On a device a scalar is added as a kept diagonal matrix: one
    operator, the same values.)"""
    if not is_numpy(X):
        if _scalar(value) and not tracing():
            X += _diagonal_matrix(X, X.shape[-1], value)
        else:  # the diagonal is a writable view
            diagonal(X).add_(value)
        return X
    M = X.shape[-1]
    i = np.arange(M)
    X[..., i, i] += value
    return X


def plus_diagonal(X: Array, value: float) -> Array:
    """``X [..., M, M]`` with the scalar ``value`` added to its diagonal, as a new array
    (``X`` is left alone; on a device one operator, where a copy and an in-place addition
    are three)."""
    if not is_numpy(X) and not tracing():
        return X + _diagonal_matrix(X, X.shape[-1], value)
    return add_diagonal(copy(X), value)


def scaled_plus_diagonal(a: Array, X: Array, value: float) -> Array:
    """``a X + value I`` as a new array for ``X [..., M, M]`` and factors ``a`` that
    broadcast against it (e.g. ``[..., 1, 1]``), ``value`` a scalar (on a device one
    ``addcmul`` onto a kept diagonal matrix, where a product and an addition are two)."""
    if not is_numpy(X) and not tracing():
        return _torch().addcmul(_diagonal_matrix(X, X.shape[-1], value), a, X)
    return add_diagonal(a * X, value)


def zeros(ref: Array, shape: tuple[int, ...]) -> Array:
    """Zeros of ``shape`` on ``ref``'s namespace, device and dtype."""
    xp = namespace(ref)
    return xp.zeros(shape, dtype=ref.dtype, device=array_api_compat.device(ref))


def empty(ref: Array, shape: tuple[int, ...]) -> Array:
    """An uninitialised array of ``shape`` on ``ref``'s namespace, device and dtype (for
    outputs written in full: it reuses the allocator's memory instead of fresh zero pages)."""
    xp = namespace(ref)
    return xp.empty(shape, dtype=ref.dtype, device=array_api_compat.device(ref))


def full(ref: Array, shape: tuple[int, ...], value: float) -> Array:
    """``value`` everywhere in ``shape``, on ``ref``'s namespace, device and dtype."""
    xp = namespace(ref)
    return xp.full(shape, value, dtype=ref.dtype, device=array_api_compat.device(ref))


def eye(ref: Array, n: int) -> Array:
    """The ``n x n`` identity on ``ref``'s namespace, device and dtype."""
    xp = namespace(ref)
    return xp.eye(n, dtype=ref.dtype, device=array_api_compat.device(ref))


def clip_below(X: Array, low: float) -> Array:
    """``max(X, low)`` elementwise, in place (``X`` is returned)."""
    if is_numpy(X):
        return np.maximum(X, low, out=X)
    return X.clamp_(min=low)


def fill_diagonal(X: Array, value: float) -> Array:
    """``X [..., M, M]`` with ``value`` on its diagonal(s), in place (``X`` is returned)."""
    if X.ndim > 2:
        if not is_numpy(X):
            diagonal(X).fill_(value)
            return X
        i = np.arange(X.shape[-1])
        X[..., i, i] = value
        return X
    if is_numpy(X):
        np.fill_diagonal(X, value)
        return X
    X.fill_diagonal_(value)
    return X


def state_token(x: Array) -> Any:
    """What identifies the values of ``x`` cheaply for memoisation: ``None`` for host values
    (numpy, Python numbers and sequences: compare values), ``(id, version)`` for a torch
    tensor (its version counter moves on every in-place change)."""
    return None if is_numpy(x) or not is_array(x) else (id(x), x._version)


def piecewise(mask: Array, f_in: Any, f_out: Any, *args: Array) -> Array:
    """``f_in(*args)`` where ``mask``, ``f_out(*args)`` elsewhere (``args`` shaped like
    ``mask``). numpy evaluates each function on its own entries only (one transcendental per
    entry); other namespaces evaluate both everywhere and select (no data-dependent shapes on
    a GPU), so both functions must stay finite on every entry."""
    if not is_numpy(mask):
        return namespace(mask).where(mask, f_in(*args), f_out(*args))
    out = np.empty(mask.shape, dtype=np.result_type(*args))
    rest = ~mask
    out[mask] = f_in(*(a[mask] for a in args))
    out[rest] = f_out(*(a[rest] for a in args))
    return out


def take_columns(X: Array, idx: Array) -> Array:
    """``X[i, idx[i, j]]`` ``[n, k]`` for ``X [n, m]`` and integer ``idx [n, k]``."""
    if is_numpy(X):
        return np.take_along_axis(X, idx, axis=1)
    return X.gather(1, idx)


def reciprocal(x: Array) -> Array:
    """``1 / x`` elementwise (a new array; on a device one operator, where ``1.0 / x`` is a
    reciprocal and a product by one)."""
    return 1.0 / x if is_numpy(x) else x.reciprocal()


def repeat_columns(v: Array, n: int) -> Array:
    """``[C, n]``: ``v [C]`` in every column (a new, writable array)."""
    if is_numpy(v):
        out = np.empty((v.shape[0], n), dtype=v.dtype)
        out[...] = v[:, None]
        return out
    return v[:, None].repeat(1, n)


def max_abs(x: Array) -> Array:
    """``max |x|`` over every entry, a 0-d array (on a device one operator, the infinity
    norm: the same value, NaN propagated)."""
    if is_numpy(x):
        return np.max(np.abs(x))
    return _torch().linalg.vector_norm(x, math.inf)


def rsub(x: Array, value: float, alpha: float = 1.0) -> Array:
    """``value - alpha x`` elementwise (a new array; on a device one operator, where the
    expression is two or three)."""
    if is_numpy(x):
        return value - alpha * x
    return _torch().rsub(x, value, alpha=alpha)


def scale_add_(X: Array, alpha: float, base: Array) -> Array:
    """``X = alpha X + base`` in place (``base`` broadcasts against ``X``); returns ``X``.
    ``alpha`` is a power of two (``-2.0``, ...): the product is exact, so the one fused
    operator on a device (``torch.add(base, X, alpha=)``) gives the values of the two steps
    numpy keeps (``X *= alpha; X += base``) bit for bit."""
    if is_numpy(X):
        X *= alpha
        X += base
        return X
    return _torch().add(base, X, alpha=alpha, out=X)


def add_scaled_(base: Array, X: Array, alpha: float, scratch: Array | None = None) -> Array:
    """``base += alpha X`` in place; returns ``base``. ``alpha`` a power of two (exact
    product: one operator on a device, ``base.add_(X, alpha=)``, the same values as numpy's
    two steps); ``scratch``: an array like ``X`` numpy may overwrite with ``alpha X`` (no
    temporary)."""
    if is_numpy(base):
        base += alpha * X if scratch is None else multiply_into(X, alpha, scratch)
        return base
    return base.add_(X, alpha=alpha)


def plus_scaled(base: Array, X: Array, alpha: float) -> Array:
    """``base + alpha X`` as a new array, ``alpha`` a power of two (exact product: one
    operator on a device, the same values as numpy's two steps)."""
    if is_numpy(base):
        return alpha * X + base
    return _torch().add(base, X, alpha=alpha)


def add_product(base: Array | float, x: Array, y: Array, value: float = 1.0) -> Array:
    """``base + value x y`` elementwise as a new array (``base`` an array or a host float,
    broadcast against ``x y``), ``value`` a power of two or ``-1`` (an exact product): on a
    device one operator (``addcmul``, a float ``base`` a kept 0-d constant), where the
    expression is two or three; numpy forms ``x y`` and adds (the same values as
    ``base + x * y`` or ``base - x * y``)."""
    if is_numpy(x):
        p = x * y
        if value != 1.0:
            p *= value
        return base + p
    b = base if is_array(base) else constant(x, (float(base),), ())
    return _torch().addcmul(b, x, y, value=value)


def multiply_into(a: Array, b: Array | float, out: Array) -> Array:
    """``out = a * b`` without a temporary (the standard has no ``out=``); returns ``out``."""
    if is_numpy(out):
        return np.multiply(a, b, out=out)
    return _torch().mul(a, b, out=out)


def sqrt_into(a: Array, out: Array) -> Array:
    """``out = sqrt(a)`` without a temporary; returns ``out``."""
    if is_numpy(out):
        return np.sqrt(a, out=out)
    return _torch().sqrt(a, out=out)


def copy(X: Array) -> Array:
    """A copy of ``X`` (contiguous)."""
    return X.copy() if is_numpy(X) else X.clone()


# -- linear algebra -----------------------------------------------------------------------------


def cholesky(K: Array, *also_finite: Array, overwrite: bool = False, check: bool = False,
             error: Callable[[], Exception] | None = None) -> tuple[Array, np.ndarray | bool]:
    """Lower Cholesky factors of ``K [..., M, M]`` and a host bool array ``failed [...]``
    (True where a matrix is not positive definite; its factor is then undefined): the one
    factorisation (``jittered_cholesky`` adds the jitter escalation and the errors).
    ``check``: ``K`` and every array of ``also_finite`` checked finite too, ``failed`` one
    Python bool for all of it (the caller then finds out which): on a device one reduction and
    one sync; with ``error`` inside ``deferred_checks`` (or while tracing) none: ``failed`` is
    False and the check raises ``error()`` when the pending checks are read (numpy checks at
    once). ``overwrite``: the caller owns ``K`` and reads it no more (numpy's stacks are then
    factorised in place where the layout allows; ``K`` is undefined after).

    numpy: a float64 matrix by LAPACK ``potrf`` without ``scipy.linalg.cholesky``'s checks (0.7
    against 4.6 us at ``[3, 3]``); stacks of order ``_POTRF_LOOP_FROM`` on by one ``potrf``
    per matrix in place on the Fortran views of one C-ordered copy (``U^T U`` of ``K^T = K``:
    ``U^T = L``; a non-finite diagonal failed); smaller stacks by numpy's own loop."""
    if not is_numpy(K):
        L, info = _torch().linalg.cholesky_ex(K)
        if not check:
            return L, to_host(info > 0).reshape(K.shape[:-2])
        # the largest status (0: all factorised), the largest magnitudes: read on the host
        checks = [(info.max(), _zero), *_finite_checks((K, *also_finite))]
        if error is not None and (tracing() or pending_checks() is not None):
            _require_all(checks, error)
            return L, False
        return L, not _read_checks(checks)
    if potrf_matrix(K):  # (its own tests: a few us each)
        if check and not (np.isfinite(K).all()
                          and (not also_finite or all_finite(*also_finite))):
            return K, True
        L, info = dpotrf(K, lower=1, clean=1)
        return L, (info != 0) if check else _FAILED[info != 0]
    if check and not all_finite(K, *also_finite):
        return K, True
    small = K.ndim == 2 or K.shape[-1] < _POTRF_LOOP_FROM
    if small:  # numpy's own loop; where it stops, one call per matrix finds which failed
        try:
            return np.linalg.cholesky(K), False if check else np.zeros(K.shape[:-2], bool)
        except np.linalg.LinAlgError:
            if check:
                return K, True
    own = (not small and overwrite and K.flags.c_contiguous and K.flags.writeable
           and K.dtype in (np.float32, np.float64))
    flat = (K.reshape((-1,) + K.shape[-2:]) if own
            else np.array(K.reshape((-1,) + K.shape[-2:]), order="C", copy=True))
    potrf = spotrf if flat.dtype == np.float32 else dpotrf
    failed = np.zeros(flat.shape[0], dtype=bool)
    for c in range(flat.shape[0]):
        if small:
            try:
                flat[c] = np.linalg.cholesky(flat[c])
            except np.linalg.LinAlgError:
                failed[c] = True
            continue
        res, info = potrf(flat[c].T, lower=0, overwrite_a=1, clean=1)
        if not np.shares_memory(res, flat[c]):  # the wrapper copied (not expected)
            flat[c] = res.T
        failed[c] = info != 0
    failed |= ~np.isfinite(np.diagonal(flat, axis1=-2, axis2=-1)).all(axis=-1)
    return flat.reshape(K.shape), bool(failed.any()) if check else failed.reshape(K.shape[:-2])


def potrf_matrix(K: Array) -> bool:
    """Whether ``cholesky`` factorises ``K`` as one matrix by the host's LAPACK ``potrf`` on
    ``K`` itself (a non-empty float64 numpy ``[M, M]``): the answer a host retry of ``K`` (a
    copy in float64) would give again."""
    return K.ndim == 2 and is_numpy(K) and K.dtype == np.float64 and K.size > 0


#: ``cholesky``'s failure mask of one matrix (read-only 0-d arrays, made once), by its value
_FAILED = {flag: np.broadcast_to(np.array(flag), ()) for flag in (False, True)}

#: from this order on, numpy stacks are factorised by one LAPACK ``potrf`` per matrix in place
#: (``cholesky``): at ``[10, 200, 200]`` on one thread 2.2 ms against 3.4 ms for
#: ``np.linalg.cholesky`` (its copies in and out around each call); below, numpy's own loop
#: (many small matrices, e.g. ``[200, 9, 9]``: a Python call per matrix would cost more)
_POTRF_LOOP_FROM = 64


def solve_triangular(L: Array, B: Array, *, transpose: bool = False,
                     L_T: Array | None = None, right: bool = False,
                     overwrite: bool = False) -> Array:
    """``L^-1 B`` (``L^-T B`` with ``transpose``) for lower-triangular ``L [..., M, M]`` and
    ``B [..., M, k]`` (stacks with the same leading axes; ``[M]`` for one matrix); ``right``:
    ``B L^-1`` (``B L^-T``) for ``B [..., k, M]`` (a device: one operator, no transposed
    views): the one triangular solve. ``L_T``: ``mT(L)`` where the caller keeps it (a device
    forms no view per solve). ``overwrite``: the caller owns ``B`` and reads it no more (numpy
    may solve in place on it). No finiteness check (the factor's is the caller's).

    numpy: a float64 matrix by LAPACK ``trtrs`` (``scipy.linalg.solve_triangular``'s call,
    the same bits, without its checks: 1.5 against 7.3 us at ``[4, 4]``), ``NumericalError``
    for a zero on ``L``'s diagonal; ``B L^-T`` of a C-ordered float64 ``B [k, M]`` with
    ``overwrite`` one BLAS ``trsm`` on its Fortran view, returning ``B`` (a Fortran-ordered
    ``L`` is not copied); stacks by one ``trsm`` per matrix in place on the Fortran views of
    one C-ordered copy of ``B`` (``overwrite``: ``B`` itself where it is a writable C-ordered
    array of ``L``'s dtype; at ``M`` in the hundreds cheaper than inverting ``L``: OpenBLAS's
    ``trtri`` is slow); other dtypes and shapes by scipy (its ``ValueError`` names a shape
    mismatch)."""
    if not is_numpy(L):
        torch = _torch()
        if transpose:  # L^T: the caller's view, or one formed here
            return torch.linalg.solve_triangular(L.mT if L_T is None else L_T, B, upper=True,
                                                 left=not right)
        return torch.linalg.solve_triangular(L, B, upper=False, left=not right)
    if right:
        if (transpose and overwrite and L.ndim == B.ndim == 2 and B.flags.c_contiguous
                and B.flags.writeable and B.dtype == np.float64):
            if B.size:  # B L^-T: (L^-1 B^T)^T, solved on B's Fortran view
                res = dtrsm(1.0, L, B.T, side=0, lower=1, overwrite_b=1)
                if not np.shares_memory(res, B):  # the wrapper had to copy (not expected)
                    B[...] = res.T
            return B
        # B L^-1 = (L^-T B^T)^T, the last two axes swapped
        return mT(solve_triangular(L, mT(B), transpose=not transpose))
    if L.ndim > 2:  # C-ordered [c, M, k]: out[c].T the Fortran view solved in place
        Lf, Bf = L.reshape((-1,) + L.shape[-2:]), B.reshape((-1,) + B.shape[-2:])
        own = overwrite and Bf.flags.c_contiguous and Bf.flags.writeable and Bf.dtype == L.dtype
        out = Bf if own else Bf.copy()
        trsm = strsm if out.dtype == np.float32 else dtrsm
        for c in range(Lf.shape[0]):
            # X^T L^T = B^T (or X^T L = B^T) on the row-major views: side right, upper L^T
            res = trsm(1.0, Lf[c].T, out[c].T, side=1, lower=0, trans_a=int(transpose),
                       overwrite_b=1)
            if not np.shares_memory(res, out[c]):  # the wrapper copied (not expected)
                out[c] = res.T
        return out.reshape(B.shape)
    # (shapes checked here: LAPACK reports a mismatch as info < 0 and returns B unsolved)
    if not (L.dtype == np.float64 and B.dtype == np.float64 and B.size and B.ndim <= 2
            and L.shape[0] == L.shape[1] == B.shape[0]):
        return _scipy_solve_triangular(L, B, lower=True, trans=1 if transpose else 0,
                                       check_finite=False)
    if L.flags.f_contiguous:
        X, info = dtrtrs(L, B, lower=1, trans=int(transpose), overwrite_b=int(overwrite))
    else:  # C order: L^T is the Fortran-ordered upper factor (scipy's dispatch)
        X, info = dtrtrs(L.T, B, lower=0, trans=int(not transpose), overwrite_b=int(overwrite))
    if info > 0:
        raise NumericalError(f"triangular solve: zero on the factor's diagonal (row {info - 1})",
                             quantity="triangular factor")
    return X


def solve_triangular_with(L: Array, A: Array, v: Array) -> tuple[Array, Array]:
    """``(L^-1 A [C, M, n], L^-1 v [C, M])`` for lower factors ``L [C, M, M]``, ``A [C, M, n]``
    (or ``[M, n]``, the same for every factor) and ``v [C, M]``: numpy one solve of ``[A, v]``
    per factor, in place on one new array (both results views of it); a device two batched
    solves."""
    C, M, n = L.shape[0], A.shape[-2], A.shape[-1]
    if not is_numpy(L):
        R = solve_triangular(L, A if A.ndim == 3 else namespace(A).broadcast_to(A, (C, M, n)))
        return R, solve_triangular(L, v[..., None])[..., 0]
    Av = np.empty((C, M, n + 1), dtype=L.dtype)
    Av[..., :n] = A
    Av[..., n] = v
    Rz = solve_triangular(L, Av, overwrite=True)
    return Rz[..., :n], Rz[..., n]


def vecmat(v: Array, A: Array) -> Array:
    """``v^T A`` ``[..., k]`` for ``v [..., M]`` and ``A [..., M, k]`` (one stack each, the
    same leading axes): numpy's batched ``@`` of the row vectors, a device's one einsum (no
    views)."""
    if is_numpy(v):
        return (v[..., None, :] @ A)[..., 0, :]
    return _torch().einsum("...m,...mk->...k", v, A)


def matvec(A: Array, v: Array) -> Array:
    """``A v`` ``[..., M]`` for ``A [..., M, k]`` and ``v [..., k]`` (one stack each, the same
    leading axes): numpy's batched ``@`` of the column vectors, a device's one einsum (no
    views)."""
    if is_numpy(v):
        return (A @ v[..., None])[..., 0]
    return _torch().einsum("...mk,...k->...m", A, v)


def einsum_transposed(spec: str, *operands: Array) -> Array:
    """The einsum of ``spec`` (a two-axis output ``ab``) as its transpose ``[b, a]``: a
    device's einsum writes it so (one operator, no transposed view); numpy's is the
    transposed view of the spec's own einsum (its roundings, its layout)."""
    if is_numpy(operands[0]):
        return mT(np.einsum(spec, *operands))
    inputs, out = spec.split("->")
    return _torch().einsum(f"{inputs}->{out[::-1]}", *operands)


def scaled_einsum(alpha: float, spec: str, *operands: Array) -> Array:
    """``alpha * einsum(spec, ...)`` for a power of two ``alpha`` (an exact scaling): numpy
    scales the einsum's result; a device takes ``alpha`` inside the einsum as a kept 0-d
    operand (one operator, the same values)."""
    if is_numpy(operands[0]):
        return alpha * np.einsum(spec, *operands)
    inputs, out = spec.split("->")
    return _torch().einsum(f"{inputs},->{out}", *operands, constant(operands[0], (alpha,), ()))


def tri_matmul(T: Array, X: Array, *, transpose: bool = False, right: bool = False,
               overwrite: bool = False, T_T: Array | None = None) -> Array:
    """``op(T) X`` (``X op(T)`` with ``right``), ``op(T) = T^T`` with ``transpose``, for
    lower-triangular ``T [..., M, M]`` and ``X [..., M, k]`` (``[..., k, M]`` with ``right``),
    one stack or matrix each with the same leading axes; a new array, or with ``overwrite``
    (a caller that owns ``X`` and reads it no more) possibly ``X`` itself, written in place.

    On numpy one BLAS ``trmm`` per matrix, in place on the Fortran view of one C-ordered copy
    of ``X``: half the FLOP of a general product, measured 1.45x faster than ``@`` at
    ``M = 200`` on one thread (1.9 vs 2.8 ms for ``[10, 200, 200] @ [10, 200, 200]``), and
    equal to it up to the order of the triangle's non-zero terms. Other namespaces: ``@`` (the
    same operators as before: no triangular product in the standard). ``T_T``: ``mT(T)``
    where the caller keeps it (a device then forms no transposed view; numpy ignores it).
    """
    if not is_numpy(T) or T.shape[:-2] != X.shape[:-2]:  # a device, or broadcast stacks
        A = (mT(T) if T_T is None else T_T) if transpose else T
        return X @ A if right else A @ X
    dtype = np.result_type(T, X)
    if overwrite and X.dtype == dtype and X.flags.c_contiguous and X.flags.writeable:
        out = X
    else:
        out = np.array(X, order="C", dtype=dtype)
    if T.ndim == 2:
        T2, out2 = T[None, ...], out[None, ...]
    else:
        T2 = T.reshape((-1,) + T.shape[-2:])
        out2 = out.reshape((-1,) + out.shape[-2:])
    trmm = strmm if out.dtype == np.float32 else dtrmm
    # on the row-major views: (T X)^T = X^T T^T (side right), (X T)^T = T^T X^T (side left),
    # with T^T the upper factor of T's Fortran view
    side, trans = (0 if right else 1), (1 if transpose else 0)
    for c in range(T2.shape[0]):
        res = trmm(1.0, T2[c].T, out2[c].T, side=side, lower=0, trans_a=trans, overwrite_b=1)
        if not np.shares_memory(res, out2[c]):  # the wrapper copied (not expected)
            out2[c] = res.T
    return out


def matmul_add_(out: Array, X: Array, Y: Array, alpha: float) -> Array:
    """``out += alpha X @ Y`` in place; returns ``out``. ``out [..., m, n]``, ``X [..., m, k]``
    and ``Y [..., k, n]`` or ``[k, n]`` (shared by every matrix of the stack); ``alpha`` a
    power of two or ``-1`` (an exact product).

    On numpy (``out`` C-contiguous) one BLAS ``gemm`` per matrix with ``beta = 1`` on the
    Fortran view of ``out`` (``out^T += alpha Y^T X^T``): no ``[..., m, n]`` product formed and
    added (a temporary and two passes over memory), the same sums up to the order of the
    additions; a ``Y`` shared by the stack makes it one ``gemm`` of ``[C m, k] @ [k, n]``.
    Other namespaces: ``out.add_(X @ Y, alpha=)`` (the same operators as before)."""
    if not is_numpy(out):
        return out.add_(X @ Y, alpha=alpha)
    if not out.flags.c_contiguous:
        raise ValueError("matmul_add_: out must be C-contiguous")
    gemm = sgemm if out.dtype == np.float32 else dgemm
    if Y.ndim == 2 and out.ndim > 2:  # one product over the stack's rows
        X = np.reshape(X, (-1, X.shape[-1]))
        out2, X2, Y2 = np.reshape(out, (-1, out.shape[-1]))[None], X[None], Y[None]
    else:
        out2 = np.reshape(out, (-1,) + out.shape[-2:])
        X2 = np.reshape(X, (-1,) + X.shape[-2:])
        Y2 = np.reshape(Y, (-1,) + Y.shape[-2:])
    for c in range(out2.shape[0]):
        a, trans_a = _fortran_operand(Y2[c])
        b, trans_b = _fortran_operand(X2[c])
        res = gemm(alpha, a, b, beta=1.0, c=out2[c].T, trans_a=trans_a, trans_b=trans_b,
                   overwrite_c=1)
        if not np.shares_memory(res, out2[c]):  # the wrapper copied (not expected)
            out2[c] = res.T
    return out


def _fortran_operand(M: np.ndarray) -> tuple[np.ndarray, int]:
    """``M^T`` as a BLAS operand without a copy where the layout allows: ``(M.T, 0)`` for a
    C-contiguous ``M`` (its Fortran view), ``(M, 1)`` for a Fortran-contiguous one (``op =``
    transpose), else a C-ordered copy's view."""
    if M.T.flags.f_contiguous:
        return M.T, 0
    if M.flags.f_contiguous:
        return M, 1
    return np.ascontiguousarray(M).T, 0


def prefers_tri_inverse(L: Array) -> bool:
    """Whether the several solves of one step with the same triangular factor ``L`` should
    use its inverse (``tri_inverse``, then products) rather than one ``trsm`` each: on numpy
    yes (one thread, measured at C = 10: ``trsm`` of ``[M, 200]`` right-hand sides 1.43 ms at
    M = 100 and 4.8 ms at M = 200, against ``trtri`` 0.71 / 4.6 ms once plus 0.76 / 3.1 ms per
    product, and a step makes six such solves); on a device not yet measured: solves."""
    return is_numpy(L)


def tri_inverse(L: Array) -> Array:
    """``L^-1`` ``[..., M, M]`` of lower-triangular factors ``L`` with a positive diagonal
    (LAPACK ``trtri`` per matrix on numpy, in two halves from order ``_TRTRI_SPLIT_FROM`` on:
    ``_tri_inverse_into``; a triangular solve with the identity on torch)."""
    if not is_numpy(L):
        return _torch().linalg.solve_triangular(L, _identity(L, L.shape[-1]), upper=False)
    flat = L.reshape((-1,) + L.shape[-2:])
    if flat.shape[-1] < _TRTRI_SPLIT_FROM:
        return _trtri_stack(flat).reshape(L.shape)
    out = np.zeros_like(flat)
    for c in range(flat.shape[0]):
        if not _tri_inverse_into(flat[c], out[c]):
            raise ValueError(f"tri_inverse: singular triangular factor (matrix {c})")
    return out.reshape(L.shape)


#: from this order on numpy inverts a triangular matrix in two halves (``_tri_inverse_into``):
#: OpenBLAS's ``trtri`` reaches 7 GFLOP/s at order 200 on one thread; two of order 100 and
#: two ``gemm`` for the off-diagonal block take 2.7 ms against 4.0 at ``[10, 200, 200]``
_TRTRI_SPLIT_FROM = 128


def _tri_inverse_into(L: np.ndarray, out: np.ndarray) -> bool:
    """``out = L^-1`` for one lower factor ``L [M, M]`` (``out`` zero above the diagonal):
    ``[L11 0; L21 L22]^-1 = [L11^-1 0; -L22^-1 L21 L11^-1  L22^-1]``, LAPACK's own blocking
    one level up, with ``trtri`` for the halves and two ``gemm`` for the off-diagonal block;
    ``False`` for a singular factor."""
    h = L.shape[-1] // 2
    trtri = strtri if L.dtype == np.float32 else dtrtri
    inv11, info11 = trtri(L[:h, :h], lower=1)
    inv22, info22 = trtri(L[h:, h:], lower=1)
    if info11 != 0 or info22 != 0:
        return False
    out[:h, :h] = inv11
    out[h:, h:] = inv22
    np.negative(inv22 @ (L[h:, :h] @ inv11), out=out[h:, :h])
    return True


def _trtri_stack(flat: np.ndarray) -> np.ndarray:
    """``L^-1`` of a numpy stack ``flat [n, M, M]`` of lower factors: one LAPACK ``trtri``
    per matrix (``ValueError`` for a singular one)."""
    out = np.empty(flat.shape, dtype=flat.dtype)
    trtri = strtri if flat.dtype == np.float32 else dtrtri
    for c in range(flat.shape[0]):
        inv, info = trtri(flat[c], lower=1)
        if info != 0:
            raise ValueError(f"tri_inverse: singular triangular factor (matrix {c})")
        out[c] = inv
    return out


def cho_inverse(LB: Array, *, overwrite: bool = False) -> tuple[Array, bool]:
    """``(L_B L_B^T)^-1`` ``[..., M, M]`` from lower factors ``LB`` and whether it failed
    (a singular factor; on a device never reported: ``T^T T`` with ``T = L_B^-1`` from one
    triangular solve, which has no error check to read, where ``cholesky_inverse`` reads its
    LAPACK status on the host: a sync). ``overwrite``: the caller owns ``LB`` and reads it no
    more: numpy then inverts a writable C-ordered float stack in place and returns ``LB``
    itself (its factors are gone; on a failure partly inverted); else one C-ordered copy."""
    if not is_numpy(LB):
        T = _torch().linalg.solve_triangular(LB, _identity(LB, LB.shape[-1]), upper=False)
        return T.mT @ T, False
    # one C-ordered stack inverted in place (a copy, or LB itself with overwrite): potri on
    # each matrix's Fortran view (LB LB^T = U^T U with U = LB^T) writes the inverse into U's
    # upper triangle, which is the stack's lower one; no per-matrix copy in the wrapper and
    # none out of it (measured at [10, 200, 200] on one thread: 5.02 -> 4.45 ms, the same
    # values; the stack's own copy 0.22 ms more)
    own = (overwrite and LB.flags.c_contiguous and LB.flags.writeable
           and LB.dtype in (np.float32, np.float64))
    flat = LB.reshape((-1,) + LB.shape[-2:])
    out = flat if own else np.array(flat, order="C", copy=True)
    potri = spotri if out.dtype == np.float32 else dpotri
    upper = _strict_upper(out.shape[-1])
    for c in range(out.shape[0]):
        inv, info = potri(out[c].T, lower=0, overwrite_c=1)
        if info != 0:
            return (LB if own else out.reshape(LB.shape)), True
        if not np.shares_memory(inv, out[c]):  # the wrapper copied (not expected)
            out[c] = inv.T
        # the lower triangle mirrored while the matrix is in cache (a masked copy: no index
        # arrays gathered and scattered); the same values
        np.copyto(out[c], out[c].T, where=upper)
    return (LB if own else out.reshape(LB.shape)), False


def cho_inverse_terms(LB: Array, v: Array, X: Array | None = None, *, summed: bool = False,
                      overwrite: bool = False
                      ) -> tuple[Array, Array | None, Array | None, bool]:
    """What a caller reads of ``B_c^-1 = (L_c L_c^T)^-1`` for lower factors ``LB [C, M, M]``
    without keeping the inverses: ``(w [C, M], Y [C, M, n] or None, S [M, M] or None,
    failed)`` with ``w_c = B_c^-1 v_c`` (``v [C, M]``), ``Y_c = B_c^-1 X_c`` for one ``X [M, n]``
    shared by every matrix or one ``X [C, M, n]`` per matrix (``None`` without ``X``) and
    ``S = sum_c B_c^-1`` (``summed``; else ``None``); ``failed``: a singular factor.
    ``overwrite``: the caller owns ``LB`` and reads it no more (numpy inverts a writable
    C-ordered stack in place, one triangle per matrix: ``LB`` is then undefined; else
    LAPACK's wrapper copies each matrix).

    On numpy one pass over the matrices: LAPACK ``potri`` (one triangle of ``B_c^-1``), then
    BLAS ``symv`` and ``symm`` on that triangle and ``S`` (C-ordered) summed in class order in
    the inverses' Fortran order, mirrored once,
    where ``cho_inverse`` copies and mirrors every inverse into a stack (the same ``S`` bits as
    summing that stack; ``w``, ``Y`` equal to round-off to products with it). Other namespaces:
    from ``cho_inverse``.
    """
    if not is_numpy(LB):
        B_inv, failed = cho_inverse(LB)
        w = einsum("cmk,ck->cm", B_inv, v)
        Y = None if X is None else namespace(LB).matmul(B_inv, X)
        return w, Y, (namespace(LB).sum(B_inv, axis=0) if summed else None), failed
    C, M = LB.shape[0], LB.shape[-1]
    own = overwrite and LB.flags.c_contiguous and LB.flags.writeable
    single = LB.dtype == np.float32
    potri, symv, symm = (spotri, ssymv, ssymm) if single else (dpotri, dsymv, dsymm)
    w = np.empty((C, M), dtype=LB.dtype)
    Y = None if X is None else np.empty((C, M, X.shape[-1]), dtype=LB.dtype)
    # S in the inverses' own (Fortran) order: each sum reads them in memory order, where a
    # C-ordered S read them transposed (10 sums at M = 100: 59 -> 28 us; M = 200: 311 -> 151)
    S = np.zeros((M, M), dtype=LB.dtype, order="F") if summed else None
    for c in range(C):
        # the upper triangle of B_c^-1 (Fortran order; with ``own`` in LB[c]'s own memory)
        inv, info = potri(LB[c].T, lower=0, overwrite_c=int(own))
        if info != 0:
            return w, Y, S, True
        w[c] = symv(1.0, inv, v[c], lower=0)
        if X is not None and Y is not None:  # (B^-1 X)^T = X^T B^-1 into Y[c]'s Fortran view
            Xc = X[c] if X.ndim == 3 else X
            res = symm(1.0, inv, mT(Xc), side=1, lower=0, beta=0.0, c=Y[c].T, overwrite_c=1)
            if not np.shares_memory(res, Y[c]):  # the wrapper copied (not expected)
                Y[c] = res.T
        if S is not None:
            S += inv  # its upper triangle is the sum's (the lower one, stale, is overwritten)
    if S is not None:
        np.copyto(S, S.T, where=_strict_upper(M).T)  # the strict lower triangle
        S = S.T  # C-ordered: exactly symmetric, so the same values as S
    return w, Y, S, False


_UPPER: dict[int, np.ndarray] = {}


def _strict_upper(M: int) -> np.ndarray:
    """The mask ``[M, M]`` of the entries above the diagonal, made once per ``M`` and kept
    (callers only read it)."""
    return _kept(_UPPER, M, lambda: np.triu(np.ones((M, M), dtype=bool), 1))


# -- special functions --------------------------------------------------------------------------


def log_ndtr(x: Array) -> Array:
    """``log Phi(x)``, accurate in both tails."""
    return special.log_ndtr(x) if is_numpy(x) else _torch().special.log_ndtr(x)


def ndtr(x: Array) -> Array:
    """``Phi(x)``, the standard normal CDF."""
    return special.ndtr(x) if is_numpy(x) else _torch().special.ndtr(x)


def expit(x: Array) -> Array:
    """The logistic sigmoid ``1 / (1 + exp(-x))``."""
    return special.expit(x) if is_numpy(x) else _torch().special.expit(x)


def log_expit(x: Array) -> Array:
    """``log sigma(x) = -log(1 + exp(-x))``, accurate in both tails."""
    return special.log_expit(x) if is_numpy(x) else _torch().nn.functional.logsigmoid(x)


def erfcx(x: Array) -> Array:
    """``exp(x^2) erfc(x)``."""
    return special.erfcx(x) if is_numpy(x) else _torch().special.erfcx(x)


def logsumexp(x: Array, axis: int) -> Array:
    """``log sum exp`` along ``axis``."""
    if is_numpy(x):
        return special.logsumexp(x, axis=axis)
    return _torch().logsumexp(x, dim=axis)


def __getattr__(name: str) -> Any:
    """``checked_cholesky(K, *also_finite, error=None, overwrite=False)`` (the factors, or
    ``None`` on a failure), deprecated for ``cholesky(K, *also_finite, check=True, ...)`` (the
    factors and one bool): works for one more release."""
    if name != "checked_cholesky":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn("gpinfer.backend.ops.checked_cholesky is deprecated: use cholesky(K, ..., "
                  "check=True), which answers (L, failed); the old name works for one more "
                  "release", DeprecationWarning, stacklevel=2)

    def old(K: Array, *also_finite: Array, error: Callable[[], Exception] | None = None,
            overwrite: bool = False) -> Array | None:
        L, failed = cholesky(K, *also_finite, check=True, error=error, overwrite=overwrite)
        return None if failed else L

    return old
