"""The pieces of a run on data read out of core: the split by row numbers (``split_rows``), the
views of a source (``IndexedSource``, ``ScaledSource``), ``scan`` of selected rows and the file
layouts of ``gpinfer.data.source_files``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpinfer.data.base import Dataset
from gpinfer.data.source import ArraySource, ColumnStats, ShardSource, scan
from gpinfer.data.source_files import npy_files, open_source_dataset, source_format
from gpinfer.data.source_views import IndexedSource, ScaledSource
from gpinfer.data.splits import Standardizer, split_rows, train_test_split
from gpinfer.errors import InputError


@pytest.mark.parametrize("stratify", [True, False])
def test_split_rows_is_the_in_memory_split(stratify: bool) -> None:
    rng = np.random.default_rng(3)
    y = rng.choice([0, 2, 5], size=701, p=[0.6, 0.3, 0.1])  # classes 1, 3 and 4 absent
    ds = Dataset("d", rng.normal(size=(701, 2)), y)
    split = train_test_split(ds, 0.2, seed=7, stratify=stratify)
    train, test = split_rows(y, 0.2, 7, stratify)
    assert split.train_index is not None and split.test_index is not None
    np.testing.assert_array_equal(train, split.train_index)
    np.testing.assert_array_equal(test, split.test_index)
    # the class counts in chunks draw what np.unique's counts draw (floats take np.unique)
    for other in (y.astype(np.float64), y.astype(np.int8)):
        for mine, theirs in zip(split_rows(other, 0.2, 7, stratify), (train, test)):
            np.testing.assert_array_equal(mine, theirs)
    if stratify:
        quota = np.bincount(y) * test.size / y.size  # largest remainders: within one
        assert np.all(np.abs(np.bincount(y[test], minlength=6) - quota) < 1)


def test_views_read_the_rows_of_the_array() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3)).astype(np.float32)
    index = np.array([7, 3, 3, 40, 0])
    part = IndexedSource(ArraySource(X), index)
    assert part.shape == (5, 3) and part.dtype == np.float32 and part.index.dtype == np.int32
    np.testing.assert_array_equal(part.rows(slice(1, 4)), X[index[1:4]])
    np.testing.assert_array_equal(part.rows(np.array([4, 0])), X[index[[4, 0]]])
    scaler = Standardizer().fit(X[index].astype(np.float64))
    scaled = ScaledSource(part, scaler)
    assert scaled.dtype == np.float64
    np.testing.assert_array_equal(scaled.rows(slice(None)), scaler.transform(X[index]))


def test_scan_of_selected_rows_checks_every_row() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(90, 2))
    keep = rng.random(90) < 0.5
    stats = scan(ArraySource(X), select=keep, chunk_rows=16)
    ref = ColumnStats.of(X[keep])
    np.testing.assert_allclose(stats.mean, ref.mean, rtol=1e-14)
    np.testing.assert_allclose(stats.m2, ref.m2, rtol=1e-12)
    np.testing.assert_array_equal(stats.maximum, ref.maximum)
    one = scan(ArraySource(X), select=keep)  # one chunk: Standardizer's bits
    np.testing.assert_array_equal(one.mean, X[keep].mean(axis=0))
    X[np.flatnonzero(~keep)[-1], 1] = np.inf  # a row outside the selection is checked too
    with pytest.raises(InputError, match=rf"first at row {np.flatnonzero(~keep)[-1]}, column 1"):
        scan(ArraySource(X), select=keep, chunk_rows=16)
    with pytest.raises(InputError, match="no row selected"):
        scan(ArraySource(X[:3]), select=np.zeros(3, dtype=bool))


def test_layouts_and_formats(tmp_path: Path) -> None:
    X = np.arange(24, dtype=np.float32).reshape(8, 3)
    y = np.array([-1, 1, 1, -1, 1, -1, -1, 1])
    for k in range(2):
        np.save(tmp_path / f"X_{k}.npy", X[4 * k:4 * k + 4])
        np.save(tmp_path / f"y_{k}.npy", y[4 * k:4 * k + 4])
    assert source_format(tmp_path, None) == "npy"
    assert source_format(f"{tmp_path}/X_*.npy", None) == "npy"
    assert source_format("a.parquet", None) == "parquet"
    assert source_format("a.npz", None) is None and source_format("a.npz", "npy") == "npy"
    assert source_format("a.csv", "csv") is None
    assert [p.name for p in npy_files(tmp_path, "path")] == ["X_0.npy", "X_1.npy"]
    ds = open_source_dataset("d", tmp_path, "npy")
    assert isinstance(ds.X, ShardSource) and ds.X.shard_count == 2
    np.testing.assert_array_equal(ds.X.rows(slice(None)), X)
    assert ds.class_names == ["-1", "1"] and ds.y.tolist() == [0, 1, 1, 0, 1, 0, 0, 1]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    np.save(mixed / "X.npy", X)
    np.save(mixed / "y.npy", y + 0.5)
    with pytest.raises(InputError, match="continuous"):
        open_source_dataset("d", mixed / "X.npy", "npy")
    with pytest.raises(InputError, match="no .npy file matches"):
        npy_files(f"{tmp_path}/Z_*.npy", "path")
