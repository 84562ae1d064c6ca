"""Row sources (gpinfer.data.source): memmaps, shards, the chunked check and its statistics."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.data.source import (
    ArraySource,
    ColumnStats,
    ShardSource,
    SourceRows,
    as_source,
    scan,
)
from gpinfer.data.splits import Standardizer
from gpinfer.errors import InputError


def _memmap(tmp_path, X, name="X.npy"):
    path = tmp_path / name
    np.save(path, X)
    return np.load(path, mmap_mode="r")


def _shards(tmp_path, X, cuts):
    paths = []
    for k, part in enumerate(np.split(X, cuts)):
        paths.append(tmp_path / f"shard{k}.npy")
        np.save(paths[-1], part)
    return paths


def test_memmap_and_shards_give_the_rows_asked_in_their_order_and_dtype(tmp_path):
    X = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    index = np.array([49, 3, 17, 3, 0, 21, 20])
    for src in (as_source(_memmap(tmp_path, X)), as_source(_shards(tmp_path, X, [7, 20, 21]))):
        assert src.shape == (50, 3) and src.dtype == np.float32
        rows = src.rows(index)
        assert rows.dtype == np.float32
        np.testing.assert_array_equal(rows, X[index])
        np.testing.assert_array_equal(src.rows(slice(5, 30)), X[5:30])
        got = np.concatenate([block for _, block in src.chunks(8)])
        np.testing.assert_array_equal(got, X)


def test_rows_cast_as_gathered_equal_the_rows_cast_after(tmp_path, monkeypatch):
    """``rows_as``: a memmap's, shards' and an index view's rows gathered straight into float64
    (in pieces of ``MAPPED_PIECE`` rows, unsorted, repeated) are ``X[index]`` cast after, in a
    new array the caller owns; ``SourceRows`` scales them in place to the bits of ``(x - mean)
    / scale``."""
    import gpinfer.data.source as source_module
    from gpinfer.data.source_views import IndexedSource

    monkeypatch.setattr(source_module, "MAPPED_PIECE", 4)
    X = np.random.default_rng(4).normal(size=(60, 3)).astype(np.float32)
    index = np.random.default_rng(5).integers(0, 60, size=23)  # unsorted, with repeats
    part = np.array([59, 2, 40, 7, 7, 31])
    mean, scale = np.array([0.1, -0.3, 2.0]), np.array([1.5, 0.7, 3.0])
    mm = _memmap(tmp_path, X)
    for src in (as_source(mm), as_source(_shards(tmp_path, X, [9, 30, 31]))):
        for idx in (index, np.sort(index), slice(3, 50)):
            got = src.rows_as(idx, np.float64)
            assert got.dtype == np.float64 and got.flags.c_contiguous and got.flags.writeable
            np.testing.assert_array_equal(got, X[idx].astype(np.float64))
        view = IndexedSource(src, part)
        np.testing.assert_array_equal(view.rows_as(np.array([4, 0, 5]), np.float64),
                                      X[part[[4, 0, 5]]].astype(np.float64))
        rows = SourceRows(src, mean=mean, scale=scale)
        np.testing.assert_array_equal(rows[index], (X[index].astype(np.float64) - mean) / scale)
    np.testing.assert_array_equal(mm, X)  # the in-place scaling left the source alone


@pytest.mark.parametrize("dtype", ["<f2", ">f4", ">f8", "<i4", ">i8", "u1"])
def test_rows_as_casts_any_stored_dtype_as_numpy_does(tmp_path, monkeypatch, dtype):
    """``rows_as`` of float16, integer and big-endian ``.npy`` files (a memmap, shards, an
    array in memory): ``X[index].astype(float64)`` in a native, C-ordered array, for unsorted
    and repeated rows and a slice; ``rows`` keeps the stored dtype."""
    import gpinfer.data.source as source_module

    monkeypatch.setattr(source_module, "MAPPED_PIECE", 4)
    rng = np.random.default_rng(6)
    X = (rng.normal(size=(50, 3)) * 40).astype(dtype)
    index = rng.integers(0, 50, size=30)
    for src in (as_source(_memmap(tmp_path, X)), as_source(_shards(tmp_path, X, [17, 18])),
                ArraySource(X.copy())):
        for idx in (index, np.sort(index), slice(2, 40)):
            got = src.rows_as(idx, np.float64)
            assert got.dtype == np.float64 and got.dtype.isnative and got.flags.c_contiguous
            np.testing.assert_array_equal(got, X[idx].astype(np.float64))
            kept = src.rows(idx)
            assert kept.dtype == X.dtype
            np.testing.assert_array_equal(kept, X[idx])


def test_column_mean_in_chunks_is_the_mean_of_the_rows_as_read(tmp_path, monkeypatch):
    """``SourceRows.column_mean`` over several chunks (an index view, scaled): the mean of the
    rows as they are read, to rounding; computed once and kept; a subset's its own."""
    import gpinfer.data.source as source_module

    monkeypatch.setattr(source_module, "CHUNK_ROWS", 7)
    X = np.random.default_rng(7).normal(3.0, 2.0, size=(60, 3)).astype(np.float32)
    index = np.random.default_rng(8).permutation(60)[:45]
    mean, scale = np.array([2.0, 3.5, -1.0]), np.array([1.5, 0.5, 2.0])
    rows = SourceRows(as_source(_memmap(tmp_path, X)), index, mean, scale)
    expected = ((X[index].astype(np.float64) - mean) / scale).mean(axis=0)
    np.testing.assert_allclose(rows.column_mean(), expected, rtol=1e-13, atol=1e-14)
    assert rows.column_mean() is rows.column_mean()
    part = rows.subset(np.arange(10))
    np.testing.assert_allclose(part.column_mean(), rows[np.arange(10)].mean(axis=0),
                               rtol=1e-13, atol=1e-14)


def test_in_memory_input_is_no_source():
    assert as_source(np.zeros((3, 2))) is None
    assert as_source([[1.0, 2.0], [3.0, 4.0]]) is None


def test_one_chunk_statistics_equal_the_standardizer_bit_for_bit(tmp_path):
    X = np.random.default_rng(1).normal(3.0, 2.0, size=(40, 4))
    X[:, 2] = 5.0  # a constant column
    stats = scan(as_source(_memmap(tmp_path, X)))
    ref = Standardizer().fit(X)
    np.testing.assert_array_equal(stats.mean, ref.mean_)
    np.testing.assert_array_equal(stats.std[[0, 1, 3]], ref.scale_[[0, 1, 3]])
    np.testing.assert_array_equal(stats.maximum - stats.minimum, np.ptp(X, axis=0))


def test_chunked_statistics_merge_to_the_whole_arrays():
    X = np.random.default_rng(2).normal(1e3, 1.0, size=(1000, 3))
    stats = scan(ArraySource(X), chunk_rows=77)
    assert stats.n == 1000
    np.testing.assert_allclose(stats.mean, X.mean(0), rtol=1e-14)
    np.testing.assert_allclose(stats.std, X.std(0), rtol=1e-10)
    np.testing.assert_array_equal(stats.minimum, X.min(0))
    np.testing.assert_array_equal(stats.maximum, X.max(0))
    halves = ColumnStats.of(X[:300]).merge(ColumnStats.of(X[300:]))
    np.testing.assert_allclose(halves.m2, X.var(0) * 1000, rtol=1e-10)


def test_nan_in_the_last_row_of_a_memmap_is_named_by_global_row_and_column(tmp_path):
    X = np.ones((1000, 3), dtype=np.float32)
    X[999, 2] = np.nan
    with pytest.raises(InputError, match=r"first at row 999, column 2 \(nan\)"):
        scan(as_source(_memmap(tmp_path, X)), chunk_rows=64)
    X[999, 2], X[640, 1] = 1.0, np.inf
    with pytest.raises(InputError, match=r"first at row 640, column 1 \(inf\)"):
        scan(as_source(_shards(tmp_path, X, [100, 600])), chunk_rows=64)


def test_shards_with_another_column_count_or_dtype_are_refused(tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.zeros((4, 3)))
    np.save(b, np.zeros((4, 2)))
    with pytest.raises(InputError, match=r"shard 1 .* has 2 column\(s\) but shard 0 .* has 3"):
        ShardSource([a, b])
    np.save(b, np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(InputError, match="shard 1 .* dtype float32 but shard 0 has float64; "
                       "mixed dtypes"):
        ShardSource([a, b])
    with pytest.raises(InputError, match="shard 1 not found"):
        ShardSource([a, tmp_path / "missing.npy"])
    np.save(b, np.array([["x", "y", "z"]]))
    with pytest.raises(InputError, match="must hold numbers only"):
        ShardSource([a, b])


def test_bad_shapes_and_dtypes_are_refused():
    with pytest.raises(InputError, match="2-D array"):
        ArraySource(np.zeros(5))
    with pytest.raises(InputError, match="0 sample"):
        ArraySource(np.zeros((0, 3)))
    with pytest.raises(InputError, match="Complex"):
        ArraySource(np.zeros((2, 3), dtype=complex))


def test_source_rows_cast_and_standardise_per_batch_and_refuse_to_materialise():
    X = np.random.default_rng(3).normal(size=(30, 2)).astype(np.float32)
    mean, scale = np.array([0.5, -1.0]), np.array([2.0, 4.0])
    view = SourceRows(ArraySource(X), mean=mean, scale=scale)
    ref = (X.astype(np.float64) - mean) / scale
    idx = np.array([7, 2, 29])
    np.testing.assert_array_equal(view[idx], ref[idx])
    sub = view.subset(np.array([10, 3, 4, 25]))
    assert sub.shape == (4, 2)
    np.testing.assert_array_equal(sub[np.array([1, 3])], ref[[3, 25]])
    np.testing.assert_array_equal(sub[:2], ref[[10, 3]])
    with pytest.raises(InputError, match="never held in memory"):
        np.asarray(view)


def test_parquet_numeric_columns_are_a_source_and_other_columns_are_named(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    X = np.random.default_rng(4).normal(size=(70, 3)).astype(np.float32)
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2]})
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=20)
    src = as_source(str(tmp_path / "x.parquet"))
    assert src.shape == (70, 3) and src.dtype == np.float32
    np.testing.assert_array_equal(src.rows(np.array([69, 0, 33])), X[[69, 0, 33]])
    # row groups of 20 regrouped into chunks of exactly 16 rows
    assert [(start, len(b)) for start, b in src.chunks(16)] == [
        (0, 16), (16, 16), (32, 16), (48, 16), (64, 6)]
    np.testing.assert_array_equal(np.concatenate([b for _, b in src.chunks(16)]), X)
    pq.write_table(table.append_column("label", pa.array(["u"] * 70)), tmp_path / "s.parquet")
    with pytest.raises(InputError, match="column 'label' .* is not numeric"):
        as_source(tmp_path / "s.parquet")
    bad = X.copy()
    bad[64, 1] = np.nan
    pq.write_table(pa.table({"a": bad[:, 0], "b": bad[:, 1]}), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"first at row 64, column 1"):
        scan(as_source(tmp_path / "n.parquet"), chunk_rows=16)


@pytest.mark.parametrize("index", [slice(None), slice(2, 9), slice(-3, None), slice(None, None, -1),
                                   slice(1, 100, 3), slice(10, 2, -2), slice(-100, 3)])
def test_slice_rows_are_the_range_of_the_slice(index):
    from gpinfer.data.source import slice_rows

    for n in (0, 1, 17):
        np.testing.assert_array_equal(slice_rows(index, n), np.arange(n)[index])


@pytest.mark.parametrize("kind", ["int8", "int16", "int32", "uint32", "int64"])
def test_a_null_in_an_integer_parquet_column_is_named_by_the_chunked_check(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    values = pa.array([1, None, 3, 100], type=getattr(pa, kind)())
    pq.write_table(pa.table({"a": values}), tmp_path / "i.parquet")
    src = as_source(tmp_path / "i.parquet")
    assert src.dtype.kind == "f"
    np.testing.assert_array_equal(src.rows(np.array([3, 0])), [[100.0], [1.0]])
    with pytest.raises(InputError, match=r"first at row 1, column 0 \(nan\)"):
        scan(src)


def test_shards_read_repeated_rows_as_the_array_does(tmp_path):
    X = np.arange(40.0).reshape(20, 2)
    src = ShardSource(_shards(tmp_path, X, [7, 12]))
    for index in ([3, 3, 5], [8, 8, 10, 1], [13, 19, 19, 13, 15]):
        np.testing.assert_array_equal(src.rows(np.array(index)), X[index])
