"""Mini-batch index iteration and streaming of rows from (possibly memory-mapped) arrays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.errors import InputError

Array = np.ndarray


class MiniBatches:
    """Index batches ``[B]`` over ``n`` rows, epoch by epoch.

    ``iter(mb)`` yields one epoch: every index in ``0..n-1`` exactly once, split into
    ``ceil(n / batch_size)`` batches (the last one smaller when ``batch_size`` does not divide
    ``n``, unless ``drop_last``), in a fresh random order from ``rng`` each epoch when
    ``shuffle``. ``epochs(k)`` chains ``k`` epochs (``None``: forever).
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        rng: np.random.Generator,
        shuffle: bool = True,
        drop_last: bool = False,
    ):
        if not isinstance(n, int | np.integer) or n < 1:
            raise InputError(f"MiniBatches: n must be a positive integer, got {n!r}")
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(
                f"MiniBatches: batch_size must be a positive integer, got {batch_size!r}"
            )
        if batch_size > n:
            raise InputError(
                f"MiniBatches: batch_size {batch_size} is larger than the number of rows {n}"
            )
        if not isinstance(rng, np.random.Generator):
            raise InputError(
                f"MiniBatches: rng must be a numpy.random.Generator, got {type(rng).__name__}"
            )
        self.n = int(n)
        self.batch_size = int(batch_size)
        self.rng = rng
        self.shuffle = shuffle
        self.drop_last = drop_last

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[Array]:
        """One epoch's index batches ``[B]`` (int64). The epoch's order is held as the
        narrowest of int32 / int64 that indexes ``n`` rows (``[n]`` int32: 40 MB at
        ``n = 1e7`` instead of 80): shuffling ``arange(n)`` of either type in place draws the
        same numbers from ``rng`` and gives the same order as ``rng.permutation(n)``."""
        order = np.arange(self.n, dtype=_order_dtype(self.n))
        if self.shuffle:
            self.rng.shuffle(order)
        for b in range(len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size].astype(np.int64)

    def epochs(self, n_epochs: int | None = 1) -> Iterator[Array]:
        """Batches of ``n_epochs`` consecutive epochs (``None``: without end)."""
        e = 0
        while n_epochs is None or e < n_epochs:
            yield from self
            e += 1


def _order_dtype(n: int) -> type[np.signedinteger[Any]]:
    """int32 when it indexes ``n`` rows, else int64."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def stream_batches(
    X: Any,
    y: Any,
    batch_size: int,
    rng: np.random.Generator,
    shuffle: bool = True,
    n_epochs: int | None = 1,
    drop_last: bool = False,
) -> Iterator[tuple[Array, Array]]:
    """Yield ``(X_batch [B, D], y_batch [B])`` copies, reading only the rows of each batch.

    ``X`` and ``y`` may be arrays or ``np.load(..., mmap_mode="r")`` memory maps (any object
    with ``shape`` and fancy indexing by an index array); the whole array is never read. Within
    a batch the rows come in increasing index order (sequential reads from disk); which rows
    form a batch follows ``MiniBatches``.
    """
    nx, ny = _rows(X, "X"), _rows(y, "y")
    if nx != ny:
        raise InputError(f"stream_batches: X has {nx} rows but y has {ny}")
    batches = MiniBatches(nx, batch_size, rng, shuffle=shuffle, drop_last=drop_last)
    for idx in batches.epochs(n_epochs):
        idx = np.sort(idx)
        yield np.array(X[idx], dtype=np.float64), np.array(y[idx])


def _rows(a: Any, label: str) -> int:
    shape = getattr(a, "shape", None)
    if not shape:
        raise InputError(f"stream_batches: {label} must be an array with a first dimension")
    return int(shape[0])


def open_memmap_dataset(path_X_npy: str | Path, path_y_npy: str | Path) -> tuple[Array, Array]:
    """Open ``X [N, D]`` and ``y [N]`` saved with ``np.save`` as read-only memory maps.

    Nothing is read until rows are indexed. Raises ``InputError`` for a missing file, a file
    that is not ``.npy``, or mismatched shapes.
    """
    out = []
    for label, path, ndim in (("X", path_X_npy, 2), ("y", path_y_npy, 1)):
        p = Path(path)
        if not p.is_file():
            raise InputError(f"open_memmap_dataset: {label} file not found: {str(p)!r}")
        try:
            a = np.load(p, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(
                f"open_memmap_dataset: {str(p)!r} is not a .npy array file (np.save): {exc}"
            ) from exc
        if isinstance(a, np.lib.npyio.NpzFile):  # an archive, not one array
            a.close()
            raise InputError(
                f"open_memmap_dataset: {str(p)!r} is an .npz archive; memory maps need one "
                ".npy file per array (np.save)"
            )
        if a.ndim != ndim:
            raise InputError(
                f"open_memmap_dataset: {label} in {str(p)!r} must be {ndim}-D, got shape {a.shape}"
            )
        out.append(a)
    X, y = out
    if X.shape[0] != y.shape[0]:
        raise InputError(f"open_memmap_dataset: X has {X.shape[0]} rows but y has {y.shape[0]}")
    return X, y
