"""Mini-batch indices per epoch and streaming rows from memory-mapped arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpinfer.data import MiniBatches, open_memmap_dataset, stream_batches
from gpinfer.data.minibatch import _order_dtype
from gpinfer.errors import InputError


def test_every_index_once_per_epoch_with_partial_last_batch():
    mb = MiniBatches(23, 5, np.random.default_rng(0))
    assert len(mb) == 5
    epoch1 = list(mb)
    epoch2 = list(mb)
    for epoch in (epoch1, epoch2):
        assert [len(b) for b in epoch] == [5, 5, 5, 5, 3]
        np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(23))
    assert not np.array_equal(np.concatenate(epoch1), np.concatenate(epoch2))  # reshuffled


def test_epochs_drop_last_and_no_shuffle():
    mb = MiniBatches(10, 4, np.random.default_rng(0), shuffle=False, drop_last=True)
    batches = list(mb.epochs(3))
    assert len(batches) == 6 and all(len(b) == 4 for b in batches)
    np.testing.assert_array_equal(batches[0], [0, 1, 2, 3])


def test_epoch_order_is_rng_permutation_held_narrow():
    """The epoch order is ``rng.permutation(n)``'s, the generator left in the same state and
    the batches int64, while the order itself is held as int32 below 2^31 rows (half the bytes
    of an [n] int64 permutation)."""
    n, b = 10_007, 1000
    rng, ref = np.random.default_rng(3), np.random.default_rng(3)
    got = list(MiniBatches(n, b, rng).epochs(2))
    want = np.concatenate([ref.permutation(n), ref.permutation(n)])
    np.testing.assert_array_equal(np.concatenate(got), want)
    assert all(batch.dtype == np.int64 for batch in got)
    assert rng.random() == ref.random()
    assert _order_dtype(n) is np.int32 and _order_dtype(2**31 - 1) is np.int32
    assert _order_dtype(2**31) is np.int64


def test_bad_batch_sizes():
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="batch_size 11 is larger than the number of rows 10"):
        MiniBatches(10, 11, rng)
    with pytest.raises(InputError, match="batch_size must be a positive integer"):
        MiniBatches(10, 0, rng)
    with pytest.raises(InputError, match="numpy.random.Generator"):
        MiniBatches(10, 2, 0)


def test_stream_from_memmap_yields_the_right_rows(tmp_path: Path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(101, 4))
    y = np.arange(101)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    Xm, ym = open_memmap_dataset(tmp_path / "X.npy", tmp_path / "y.npy")
    assert isinstance(Xm, np.memmap)
    seen = []
    for Xb, yb in stream_batches(Xm, ym, 16, np.random.default_rng(1)):
        assert type(Xb) is np.ndarray and Xb.shape[1] == 4  # a copy, not a memmap view
        np.testing.assert_array_equal(Xb, X[yb])  # y holds the row number
        seen.append(yb)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), y)


class RowSpy:
    """An array stand-in that records which rows were read and refuses whole-array reads."""

    def __init__(self, a: np.ndarray):
        self._a = a
        self.shape = a.shape
        self.read: list[int] = []

    def __getitem__(self, idx):
        idx = np.asarray(idx)
        assert idx.ndim == 1 and idx.dtype.kind == "i", "only row-index reads allowed"
        self.read += idx.tolist()
        return self._a[idx]

    def __array__(self, *args, **kwargs):
        raise AssertionError("the whole array was touched")


def test_stream_reads_only_batch_rows():
    X = RowSpy(np.arange(40.0).reshape(20, 2))
    y = RowSpy(np.arange(20))
    batches = stream_batches(X, y, 8, np.random.default_rng(0))
    Xb, yb = next(batches)
    assert len(X.read) == 8 and sorted(X.read) == X.read  # sorted within a batch
    np.testing.assert_array_equal(Xb[:, 0], 2.0 * yb)


def test_open_memmap_errors(tmp_path: Path):
    with pytest.raises(InputError, match="X file not found"):
        open_memmap_dataset(tmp_path / "X.npy", tmp_path / "y.npy")
    np.save(tmp_path / "X.npy", np.zeros((5, 2)))
    np.save(tmp_path / "y.npy", np.zeros(4))
    with pytest.raises(InputError, match="X has 5 rows but y has 4"):
        open_memmap_dataset(tmp_path / "X.npy", tmp_path / "y.npy")
