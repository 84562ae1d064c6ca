"""Parquet datasets as a row source (``pyarrow``): the numeric columns of one ``.parquet`` file
or a directory of them, read a block of rows at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.data.source import CHUNK_ROWS, RowSource, slice_rows
from gpinfer.errors import InputError

Array = np.ndarray

__all__ = ["ParquetSource", "is_parquet"]


def is_parquet(path: Any) -> bool:
    """Whether ``path`` names a ``.parquet`` file or a directory holding ``.parquet`` files."""
    if not isinstance(path, str | os.PathLike):
        return False
    p = Path(path)
    if p.suffix == ".parquet":
        return True
    return p.is_dir() and any(p.glob("*.parquet"))


class ParquetSource(RowSource):
    """The columns ``columns`` (default: all) of a Parquet dataset as ``X [N, D]``; rows in the
    dataset's order (its files sorted by name). Every column must be numeric (integer or
    floating point; ``InputError`` naming the first other one); ``dtype`` is NumPy's common
    type of the columns, raised to a float type that holds integer columns exactly (float32
    columns stay float32). A null value reads as NaN, which the chunked check reports by row
    and column."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | None = None,
                 name: str = "X"):
        import pyarrow as pa
        import pyarrow.dataset as ds

        p = Path(path)
        if not p.exists():
            raise InputError(f"{name}: Parquet dataset not found: {str(p)!r}")
        try:
            self.dataset = ds.dataset(str(p), format="parquet")
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{name}: {str(p)!r} is not a Parquet dataset: {exc}") from exc
        schema = self.dataset.schema
        names = list(schema.names) if columns is None else list(columns)
        missing = [c for c in names if c not in schema.names]
        if missing:
            raise InputError(f"{name}: Parquet dataset {str(p)!r} has no column(s) {missing}; "
                             f"its columns: {list(schema.names)}")
        for col in names:
            kind = schema.field(col).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise InputError(
                    f"{name}: column {col!r} of Parquet dataset {str(p)!r} is not numeric (type "
                    f"{kind}); X takes numeric columns only: pass columns=[...] without it, or "
                    "encode it as numbers first")
        self.path, self.name, self.columns = p, name, names
        self.shard_count = len(self.dataset.files)
        self.dtype = np.result_type(*[schema.field(c).type.to_pandas_dtype() for c in names])
        if self.dtype.kind in "iu":  # a null in an integer column must read as NaN: the
            # smallest float type holding its values exactly (int8/16: float32, wider: float64)
            self.dtype = np.result_type(self.dtype, np.float32)
        self.n_rows, self.n_cols = int(self.dataset.count_rows()), len(names)
        if self.n_rows == 0 or self.n_cols == 0:
            raise InputError(f"{name}: Parquet dataset {str(p)!r} has shape "
                             f"({self.n_rows}, {self.n_cols}); it needs rows and columns")

    def _array(self, table: Any) -> Array:
        out = np.empty((table.num_rows, self.n_cols), dtype=self.dtype)
        for j, col in enumerate(self.columns):
            out[:, j] = table.column(col).to_numpy(zero_copy_only=False)
        return out

    def rows(self, index: Array | slice) -> Array:
        if isinstance(index, slice):
            index = slice_rows(index, self.n_rows)
        index = np.asarray(index, dtype=np.int64)
        return self._array(self.dataset.take(index, columns=self.columns))

    def chunks(self, size: int | None = None) -> Iterator[tuple[int, Array]]:
        """Blocks of exactly ``size`` rows (the last one fewer), as every source gives them,
        whatever the dataset's row groups: record batches are streamed and regrouped."""
        size = size or CHUNK_ROWS
        start, buffer = 0, np.empty((size, self.n_cols), dtype=self.dtype)
        filled = 0
        for batch in self.dataset.to_batches(columns=self.columns, batch_size=size):
            block = self._array(batch)
            while block.shape[0]:
                take = min(size - filled, block.shape[0])
                buffer[filled:filled + take], block = block[:take], block[take:]
                filled += take
                if filled == size:
                    yield start, buffer.copy()
                    start, filled = start + size, 0
        if filled:
            yield start, buffer[:filled].copy()

    def describe(self) -> str:
        return f"Parquet dataset {str(self.path)!r}, {self.n_rows} rows x {self.n_cols} columns"
