"""Views of a row source (``gpinfer.data.source``) that the experiment runner reads: some of its
rows (a train or test part, ``IndexedSource``) and its rows standardised (``ScaledSource``),
each still read a block of rows at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpinfer.data.source import RowSource, slice_rows

if TYPE_CHECKING:
    from gpinfer.data.splits import Standardizer

Array = np.ndarray

__all__ = ["IndexedSource", "ScaledSource", "row_index"]


def row_index(rows: Array, n: int) -> Array:
    """The row numbers ``rows`` as int32 when ``n < 2**31`` (half the memory of int64 for a
    part of a large source), else int64."""
    return np.asarray(rows, dtype=np.int32 if n < 2**31 else np.int64)


class IndexedSource(RowSource):
    """The rows ``index [n]`` (row numbers of ``source``, in that order) of ``source`` as a
    source of ``n`` rows, in the source's dtype; its row ``i`` is the source's row
    ``index[i]``."""

    def __init__(self, source: RowSource, index: Array):
        self.source, self.index = source, row_index(index, source.n_rows)
        self.n_rows, self.n_cols = int(self.index.shape[0]), source.n_cols
        self.dtype, self.shard_count = source.dtype, source.shard_count

    def rows(self, index: Array | slice) -> Array:
        return self.source.rows(self._source_rows(index))

    def rows_as(self, index: Array | slice, dtype: Any) -> Array:
        return self.source.rows_as(self._source_rows(index), dtype)

    def _source_rows(self, index: Array | slice) -> Array:
        """The source's row numbers (int64) of this view's rows ``index``."""
        if isinstance(index, slice):
            index = slice_rows(index, self.n_rows)
        return self.index[np.asarray(index, dtype=np.int64)].astype(np.int64)

    def describe(self) -> str:
        return f"{self.n_rows} rows of {self.source.describe()}"


class ScaledSource(RowSource):
    """The rows of ``source`` as float64, standardised by ``scaler`` (``(x - mean_) / scale_``,
    ``[D]`` each; the same bits as ``scaler.transform`` of those rows in memory)."""

    dtype = np.dtype(np.float64)

    def __init__(self, source: RowSource, scaler: Standardizer):
        self.source, self.scaler = source, scaler
        self.n_rows, self.n_cols = source.n_rows, source.n_cols
        self.shard_count = source.shard_count

    def rows(self, index: Array | slice) -> Array:
        block = self.source.rows_as(index, np.float64)  # a new array, cast as gathered
        block -= self.scaler.mean_  # in place: the bits of (block - mean_) / scale_
        block /= self.scaler.scale_
        return block

    def rows_as(self, index: Array | slice, dtype: Any) -> Array:
        if np.dtype(dtype) == self.dtype:  # ``rows`` is already a new float64 array
            return self.rows(index)
        return super().rows_as(index, dtype)

    def describe(self) -> str:
        return f"standardised {self.source.describe()}"
