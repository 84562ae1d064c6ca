"""Row sources: inputs ``X [N, D]`` read a block of rows at a time, never all at once.

A ``RowSource`` gives ``n_rows``, ``n_cols``, ``dtype``, ``rows(index) -> [B, D]`` (in the
source's dtype: float32 stays float32) and ``chunks(size)``. Three kinds:

* ``ArraySource``: a ``numpy.memmap`` or any 2-D array object with a numeric ``dtype`` and row
  indexing (``obj[index_array]``, ``obj[start:stop]``);
* ``ShardSource``: a list of ``.npy`` files (``np.save``) opened with ``mmap_mode="r"``, their
  rows one after the other;
* ``ParquetSource`` (``gpinfer.data.parquet``): the numeric columns of a Parquet dataset.

``as_source(X)`` turns what an estimator accepts out of core (a memmap, a list of ``.npy``
paths, a source) into a source, and ``None`` for in-memory input, which keeps its own path.
``scan`` checks a source in chunks, reading each chunk once, and gathers the column statistics
the estimator needs (``ColumnStats``); ``SourceRows`` is ``X`` as a method reads it (a row
subset, cast to float64 and standardised per batch).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.errors import InputError

Array = np.ndarray

__all__ = [
    "CHUNK_ROWS",
    "ArraySource",
    "ColumnStats",
    "RowSource",
    "ShardSource",
    "SourceRows",
    "as_source",
    "checked_block",
    "host_rows",
    "median_input",
    "sample_rows",
    "scan",
    "slice_rows",
]

#: rows per chunk for checks, statistics and prediction (20 columns: 5 MB of float64)
CHUNK_ROWS = 32_768


class RowSource:
    """Rows of an input matrix ``X [N, D]`` read on demand (see the module docstring)."""

    n_rows: int
    n_cols: int
    dtype: np.dtype
    #: how many files the rows are stored in (``.npy`` shards, Parquet files); ``None`` for
    #: a source that is one array (a memmap, an ``ArraySource``)
    shard_count: int | None = None
    #: the statistics of these rows (``ColumnStats``) set by a caller that has already checked
    #: every value (``gpinfer-run``'s one pass over its file): ``fit`` takes them instead of
    #: reading every row again (``gpinfer.out_of_core.checked_inputs``)
    checked: ColumnStats | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    def rows(self, index: Array | slice) -> Array:
        """Rows ``[B, D]`` at ``index`` (an int array ``[B]``, in its order, or a slice), in the
        source's dtype."""
        raise NotImplementedError

    def rows_as(self, index: Array | slice, dtype: Any) -> Array:
        """``rows(index)`` as a new C-ordered array ``[B, D]`` of ``dtype`` that the caller
        owns (and may change in place): ``np.array(self.rows(index), dtype=dtype)``. A source
        that can cast rows as it gathers them (``ArraySource``, ``ShardSource``) skips the
        copy in its own dtype; the values are the same bits."""
        return np.array(self.rows(index), dtype=dtype)

    def chunks(self, size: int | None = None) -> Iterator[tuple[int, Array]]:
        """``(start, rows [b, D])`` of consecutive blocks of at most ``size`` rows (None:
        ``CHUNK_ROWS``)."""
        size = size or CHUNK_ROWS
        for start in range(0, self.n_rows, size):
            yield start, self.rows(slice(start, min(start + size, self.n_rows)))

    def describe(self) -> str:
        """Where the rows come from, for messages."""
        return type(self).__name__


def _numeric_dtype(dtype: Any, what: str) -> np.dtype:
    """``dtype`` as a ``np.dtype`` when it is a real number type; else ``InputError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InputError(f"{what} has no numeric dtype (got {dtype!r})") from exc
    if dt.kind == "c":
        raise InputError(f"{what}: Complex data not supported; pass real-valued inputs")
    if dt.kind not in "biuf":
        raise InputError(f"{what} must hold numbers only; its dtype is {dt}")
    return dt


def _check_size(n: int, d: int, what: str) -> None:
    if n == 0:
        raise InputError(f"{what} has 0 sample(s) (shape=({n}, {d})) while a minimum of 1 is "
                         "required.")
    if d == 0:
        raise InputError(f"{what} has 0 feature(s) (shape=({n}, {d})) while a minimum of 1 is "
                         "required.")


class ArraySource(RowSource):
    """A ``numpy.memmap`` or any 2-D array object with a numeric ``dtype``, a ``shape`` and row
    indexing by an int array and by a slice (h5py, zarr, a user's wrapper). Rows at an index
    array are read in increasing order (sequential reads) and returned in the order asked."""

    def __init__(self, data: Any, name: str = "X"):
        shape = getattr(data, "shape", None)
        if shape is None or not hasattr(data, "__getitem__"):
            raise InputError(f"{name} must be an array with a shape and row indexing; got "
                             f"{type(data).__name__}")
        if len(shape) != 2:
            raise InputError(f"{name} must be a 2-D array [N, D]; got shape {tuple(shape)}")
        self.data, self.name = data, name
        self.n_rows, self.n_cols = int(shape[0]), int(shape[1])
        self.dtype = _numeric_dtype(getattr(data, "dtype", None), name)
        _check_size(self.n_rows, self.n_cols, name)

    def rows(self, index: Array | slice) -> Array:
        return self.rows_as(index, self.dtype)

    def rows_as(self, index: Array | slice, dtype: Any) -> Array:
        if isinstance(index, slice):
            block = np.array(self.data[index], dtype=dtype)
            release_pages(self.data)
            return block
        return _gather(lambda idx, out, at: _read_mapped(self.data, idx, out, at),
                       np.asarray(index, dtype=np.int64), self.n_cols, dtype)

    def describe(self) -> str:
        return f"{type(self.data).__name__} of shape {self.shape}"


def release_pages(array: Any) -> None:
    """Drop the pages of a ``numpy.memmap`` (or an ``np.load(mmap_mode="r")`` array) from this
    process's resident set (``madvise(MADV_DONTNEED)``; the operating system's page cache keeps
    them): read rows of a mapped file count in the RSS until then, so a scan or an epoch would
    otherwise make the whole file resident. Nothing for other arrays or where ``madvise`` is
    missing (the pages then stay, harmlessly, until the OS reclaims them)."""
    import mmap

    mapping = getattr(array, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mapping is not None and advice is not None and hasattr(mapping, "madvise"):
        try:
            mapping.madvise(advice)
        except (OSError, ValueError):  # closed or not advisable: the pages stay
            pass


#: rows of a memory map read between two ``release_pages``: each scattered row maps the
#: kernel's fault-around window (64 KB) of cached pages into the process
MAPPED_PIECE = 256


def _read_mapped(data: Any, index: Array, out: Array, at: Array | None) -> None:
    """Writes ``data[index]`` (sorted ``index [b]``) into the rows ``at [b]`` of ``out`` (None:
    its first ``b`` rows in order), cast to ``out``'s dtype. A memory map is read through its
    plain ``ndarray`` view (one copy, no ``numpy.memmap`` wrapper per read) in pieces of
    ``MAPPED_PIECE`` rows, each followed by ``release_pages``, so that the resident pages stay
    bounded whatever the batch size (5000 scattered rows would map up to 320 MB at once); any
    other array in one read."""
    mapped = getattr(data, "_mmap", None) is not None
    view = np.asarray(data) if mapped else data
    step = MAPPED_PIECE if mapped else max(index.size, 1)
    for lo in range(0, index.size, step):
        part = view[index[lo:lo + step]]
        if at is None:
            out[lo:lo + part.shape[0]] = part
        else:
            out[at[lo:lo + step]] = part
        release_pages(data)


def slice_rows(index: slice, n: int) -> Array:
    """The row numbers ``np.arange(n)[index]`` of a slice, without the ``[n]`` range (a chunk
    of a 1e7-row source would otherwise allocate 80 MB)."""
    return np.arange(*index.indices(n))


def _gather(read: Any, index: Array, n_cols: int, dtype: Any) -> Array:
    """The rows at ``index [B]`` as a new ``[B, n_cols]`` array of ``dtype``, in ``index``'s
    order, read in increasing row order: ``read(sorted_index, out, at)`` writes them into the
    rows ``at`` of ``out`` (None: in order; else the sorting permutation, so that no sorted copy
    is formed and unscrambled)."""
    out = np.empty((index.size, n_cols), dtype=dtype)
    if index.size < 2 or bool(np.all(index[1:] >= index[:-1])):
        read(index, out, None)
        return out
    order = np.argsort(index, kind="stable")
    read(index[order], out, order)
    return out


class ShardSource(RowSource):
    """A list of ``.npy`` files, each ``[N_k, D]`` with the same ``D`` and dtype, opened with
    ``mmap_mode="r"``; their rows one after the other (row ``i`` of the source is row
    ``i - offsets[k]`` of shard ``k``). ``InputError`` for a missing file, one that is not a
    2-D ``.npy`` array, another column count or dtype than the first shard's."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]], name: str = "X"):
        if len(paths) == 0:
            raise InputError(f"{name} is an empty list of shards; give at least one .npy file")
        self.name, self.paths = name, [Path(p) for p in paths]
        self.shards = [self._open(k, p) for k, p in enumerate(self.paths)]
        first = self.shards[0]
        for k, shard in enumerate(self.shards[1:], start=1):
            if shard.shape[1] != first.shape[1]:
                raise InputError(
                    f"{name}: shard {k} ({str(self.paths[k])!r}) has {shard.shape[1]} column(s) "
                    f"but shard 0 ({str(self.paths[0])!r}) has {first.shape[1]}; every shard "
                    "needs the same columns")
            if shard.dtype != first.dtype:
                raise InputError(
                    f"{name}: shard {k} ({str(self.paths[k])!r}) has dtype {shard.dtype} but "
                    f"shard 0 has {first.dtype}; mixed dtypes across shards (save every shard "
                    "with one dtype, e.g. float32)")
        self.shard_count = len(self.paths)
        self.offsets = np.cumsum([0] + [s.shape[0] for s in self.shards])
        self.n_rows, self.n_cols = int(self.offsets[-1]), int(first.shape[1])
        self.dtype = first.dtype
        _check_size(self.n_rows, self.n_cols, name)

    def _open(self, k: int, path: Path) -> Array:
        if not path.is_file():
            raise InputError(f"{self.name}: shard {k} not found: {str(path)!r}")
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"{self.name}: shard {k} ({str(path)!r}) is not a .npy array file "
                             f"(np.save): {exc}") from exc
        if isinstance(a, np.lib.npyio.NpzFile):  # an archive, not one array
            a.close()
            raise InputError(f"{self.name}: shard {k} ({str(path)!r}) is an .npz archive; give "
                             "one .npy file per shard")
        if a.ndim != 2:
            raise InputError(f"{self.name}: shard {k} ({str(path)!r}) must be 2-D [N_k, D]; "
                             f"got shape {a.shape}")
        _numeric_dtype(a.dtype, f"{self.name}: shard {k} ({str(path)!r})")
        return a

    def rows(self, index: Array | slice) -> Array:
        return self.rows_as(index, self.dtype)

    def rows_as(self, index: Array | slice, dtype: Any) -> Array:
        if isinstance(index, slice):
            index = slice_rows(index, self.n_rows)
        return _gather(self._read_sorted, np.asarray(index, dtype=np.int64), self.n_cols,
                       dtype)

    def _read_sorted(self, index: Array, out: Array, at: Array | None) -> None:
        """Writes the rows at a sorted ``index`` into the rows ``at`` of ``out`` (None: in
        order; consecutive rows of one shard read as one slice)."""
        if index.size and (index[0] < 0 or index[-1] >= self.n_rows):
            raise IndexError(f"row index out of range 0..{self.n_rows - 1}")
        shard_of = np.searchsorted(self.offsets, index, side="right") - 1
        for k in np.unique(shard_of):
            mine = np.flatnonzero(shard_of == k)
            local = index[mine] - self.offsets[k]
            dest = mine if at is None else at[mine]
            if local[-1] - local[0] + 1 == local.size and (
                    local.size < 2 or bool(np.all(local[1:] > local[:-1]))):  # no repeats
                out[dest] = self.shards[k][local[0]:local[-1] + 1]
                release_pages(self.shards[k])
            else:
                _read_mapped(self.shards[k], local, out, dest)

    def describe(self) -> str:
        return f"{len(self.paths)} .npy shard(s), {self.n_rows} rows x {self.n_cols} columns"


def _is_path(obj: Any) -> bool:
    return isinstance(obj, str | os.PathLike)


def as_source(X: Any, name: str = "X") -> RowSource | None:
    """``X`` as a ``RowSource`` when it is given out of core: a ``RowSource`` itself, a
    ``numpy.memmap``, a ``.npy`` path or a list/tuple of them (non-empty, every item a path);
    a Parquet file or directory path (``.parquet``) becomes a ``ParquetSource``. ``None`` for any
    other input (arrays, lists of numbers, DataFrames, tensors): the in-memory path."""
    if isinstance(X, RowSource):
        return X
    if isinstance(X, np.memmap):
        return ArraySource(X, name)
    if isinstance(X, list | tuple) and X and all(_is_path(p) for p in X):
        return ShardSource(X, name)
    if _is_path(X):
        from gpinfer.data.parquet import ParquetSource, is_parquet

        if is_parquet(X):
            return ParquetSource(X, name=name)
        if Path(X).suffix == ".npy":
            return ShardSource([X], name)
    return None


@dataclass
class ColumnStats:
    """Per-column statistics of ``X [N, D]`` from ``scan``: ``n`` rows, ``mean [D]``, ``m2
    [D]`` (sum of squared deviations from the mean), ``minimum [D]``, ``maximum [D]`` (float64).

    On one chunk they equal ``X.mean(0)``, ``X.std(0) ** 2 * n`` (``std`` gives the same bits
    as ``Standardizer``), ``X.min(0)``, ``X.max(0)``; chunks are merged by Chan et al.'s rule."""

    n: int
    mean: Array
    m2: Array
    minimum: Array
    maximum: Array

    @classmethod
    def of(cls, block: Array) -> ColumnStats:
        """The statistics of one float64 block ``[b, D]``."""
        mean = block.mean(axis=0)
        dev = block - mean
        return cls(block.shape[0], mean, (dev * dev).sum(axis=0), block.min(axis=0),
                   block.max(axis=0))

    def merge(self, other: ColumnStats) -> ColumnStats:
        """The statistics of both blocks' rows."""
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        m2 = self.m2 + other.m2 + delta * delta * (self.n * other.n / n)
        return ColumnStats(n, mean, m2, np.minimum(self.minimum, other.minimum),
                           np.maximum(self.maximum, other.maximum))

    @property
    def std(self) -> Array:
        """Population standard deviation ``[D]``."""
        return np.sqrt(self.m2 / self.n)


def checked_block(raw: Array, start: int, source: RowSource, name: str = "X") -> Array:
    """The chunk ``raw [b, D]`` (rows ``start..start+b-1`` of ``source``) as a float64 array;
    ``InputError`` naming the global row and column of its first NaN or inf."""
    block = np.array(raw, dtype=np.float64, order="C")
    finite = np.isfinite(block)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        col = int(np.flatnonzero(~finite[row])[0])
        raise InputError(
            f"{name} ({source.describe()}) contains NaN/inf values; first at row "
            f"{start + row}, column {col} ({block[row, col]}), found by the chunked check "
            f"(rows {start}..{start + block.shape[0] - 1}). Remove or impute them first.")
    return block


def scan(source: RowSource, name: str = "X", chunk_rows: int | None = None,
         select: Array | None = None) -> ColumnStats:
    """Check every value of ``source`` in chunks of ``chunk_rows`` rows (None: ``CHUNK_ROWS``),
    reading each chunk once, and return the ``ColumnStats`` (float64 accumulators) of its rows,
    or of the rows ``select`` marks (a boolean mask ``[N]``, e.g. a training part: every row is
    checked all the same). ``InputError`` at the first chunk with a NaN or inf, naming its
    global row and column, and when ``select`` marks no row."""
    stats: ColumnStats | None = None
    for start, raw in source.chunks(chunk_rows):
        block = checked_block(raw, start, source, name)
        if select is not None:
            block = block[select[start:start + block.shape[0]]]
            if block.shape[0] == 0:
                continue
        part = ColumnStats.of(block)
        stats = part if stats is None else stats.merge(part)
    if stats is None:
        raise InputError(f"{name} ({source.describe()}): no row selected for its statistics")
    return stats


class SourceRows:
    """``X [N, D]`` as a method reads it from a ``RowSource``: the rows ``index`` of the source
    (all of them when ``None``), each batch read, cast to float64 and standardised
    (``(x - mean) / scale``, ``[D]`` each, when given) on demand. ``X[rows]`` with an int array
    or a slice gives a float64 array ``[B, D]``; ``subset(rows)`` a lazy view of some rows.
    Turning it into one array (``np.asarray``) is refused: the point is never to hold all of X.
    """

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, source: RowSource, index: Array | None = None,
                 mean: Array | None = None, scale: Array | None = None):
        self.source, self.index, self.mean, self.scale = source, index, mean, scale
        n = source.n_rows if index is None else int(index.shape[0])
        self.shape = (n, source.n_cols)
        #: the column statistics of these rows as given (before scaling), where known
        self.stats: ColumnStats | None = None
        self._column_mean: Array | None = None  # ``column_mean``, once computed

    def __len__(self) -> int:
        return self.shape[0]

    def _global(self, rows: Any) -> Array | slice:
        if isinstance(rows, slice):
            return rows if self.index is None else self.index[rows]
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        return rows if self.index is None else self.index[rows]

    def __getitem__(self, rows: Any) -> Array:
        block = self.source.rows_as(self._global(rows), np.float64)  # cast as gathered
        if self.mean is not None:  # in place: the bits of (block - mean) / scale
            block -= self.mean
            block /= self.scale
        return block

    def subset(self, rows: Any) -> SourceRows:
        """The rows ``rows`` (an int array or a slice of this view's rows), lazily; all of
        them (``slice(None)``) without an index array (``N`` int64 values)."""
        if isinstance(rows, slice) and rows == slice(None):
            out = SourceRows(self.source, self.index, self.mean, self.scale)
            out.stats = self.stats
            return out
        glob = self._global(rows)
        if isinstance(glob, slice):
            glob = slice_rows(glob, self.source.n_rows)
        return SourceRows(self.source, glob, self.mean, self.scale)

    def chunks(self, size: int | None = None) -> Iterator[Array]:
        """Consecutive float64 blocks ``[b, D]`` of at most ``size`` rows (None:
        ``CHUNK_ROWS``)."""
        size = size or CHUNK_ROWS
        for start in range(0, self.shape[0], size):
            yield self[slice(start, min(start + size, self.shape[0]))]

    def column_mean(self) -> Array:
        """The column means ``[D]`` of these rows as they are read (scaled, float64), from one
        pass over them in chunks of ``CHUNK_ROWS``: the chunks' column sums added, over ``N``;
        ``X.mean(axis=0)`` of the rows in memory bit for bit when they fit in one chunk. Kept
        after the first call (a fit's latents share it)."""
        if self._column_mean is None:
            total = np.zeros(self.shape[1])
            for block in self.chunks():
                total += block.sum(axis=0)
            self._column_mean = total / self.shape[0]
        return self._column_mean

    def __array__(self, *args: Any, **kwargs: Any) -> Array:
        raise InputError(
            f"X ({self.source.describe()}) is read in batches and is never held in memory as one "
            "array; this step needs all of X at once (use a mini-batch method with batch_size)")


#: rows of an out-of-core ``X`` that k-means inducing inputs start from (``sample_rows``)
KMEANS_SUBSET = 50_000


def sample_rows(X: Any, limit: int) -> Any:
    """``X`` itself when it is in memory; for a ``SourceRows``, its rows as one float64 array:
    all of them when there are at most ``limit``, else ``limit`` rows drawn without replacement
    by ``np.random.default_rng(0)`` (a fixed, documented subsample: the fit's own random stream
    is not touched), in increasing row order."""
    if not isinstance(X, SourceRows):
        return X
    n = X.shape[0]
    if n <= limit:
        return X[slice(None)]
    return X[np.sort(np.random.default_rng(0).choice(n, limit, replace=False))]


def median_input(X: Any) -> Any:
    """What the median heuristic (``gpinfer.kernels.initialisation.median_distance``) reads:
    ``X`` itself, or for a ``SourceRows`` of at most ``MEDIAN_SUBSET`` rows those rows as one
    array (above that, ``median_distance`` draws its own subsample of rows by index)."""
    from gpinfer.kernels.initialisation import MEDIAN_SUBSET

    if isinstance(X, SourceRows) and X.shape[0] > MEDIAN_SUBSET:
        return X
    return sample_rows(X, MEDIAN_SUBSET)


def host_rows(X: Any) -> Any:
    """``X`` as a method reads its rows: a ``SourceRows`` as it is, anything else as a float64
    array (``np.asarray(X, dtype=float)``)."""
    return X if isinstance(X, SourceRows) else np.asarray(X, dtype=float)
