"""Fits and predictions from inputs out of core (issue 24 item 1): a memmap, .npy shards or any
row-indexable array give the fit of the same array in memory, without ever holding all of X."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpinfer.data.source as source_module
import gpinfer.out_of_core as ooc_module
from gpinfer import GPClassifier
from gpinfer.data.source import ArraySource
from gpinfer.errors import InputError
from gpinfer.fit_guard import NLL_CHECK_POINTS


def _data(n=400, d=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = rng.normal(2.0, 3.0, size=(n, d))
    y = (X[:, 0] + rng.normal(size=n) > 2.0).astype(int) + (X[:, 1] > 4.0)
    return X.astype(dtype), y


def _memmap(tmp_path, X):
    np.save(tmp_path / "X.npy", X)
    return np.load(tmp_path / "X.npy", mmap_mode="r")


def _shards(tmp_path, X, cuts=(150, 151, 300)):
    paths = []
    for k, part in enumerate(np.split(X, list(cuts))):
        paths.append(str(tmp_path / f"part{k}.npy"))
        np.save(paths[-1], part)
    return paths


def _settings(method, **kw):
    return {"method": method, "M": 8, "batch_size": 64, "max_iter": 4, "random_state": 3, **kw}


@pytest.mark.parametrize("method", ["sep", "ep"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_memmap_and_shards_fit_bit_identical_to_the_array_in_memory(tmp_path, method, dtype):
    X, y = _data(dtype=dtype)
    ref = GPClassifier(**_settings(method)).fit(X, y)
    P = ref.predict_proba(X)
    for given in (_memmap(tmp_path, X), _shards(tmp_path, X)):
        model = GPClassifier(**_settings(method)).fit(given, y)
        np.testing.assert_array_equal(model.predict_proba(given), P)
        np.testing.assert_array_equal(model.scaler_.mean_, ref.scaler_.mean_)
        assert model.n_iter_ == ref.n_iter_


def test_svi_memmap_fit_takes_the_in_memory_path(tmp_path, monkeypatch):
    """svi's fixed-Z path (``gpinfer.kernels.fixed``) runs out of core as in memory, each batch
    read once for every latent. In memory it keeps the ``[M, N]`` distances while ``M N <=
    DISTANCE_CACHE_MAX_ENTRIES``, out of core never: with that memo off (as at ``M N`` above
    the limit) the fit of a float32 memmap equals the in-memory fit bit for bit, with it on
    to rounding."""
    from gpinfer_svi.method import VariationalState

    import gpinfer.kernels.fixed as fixed
    from gpinfer.data.source import SourceRows

    X, y = _data(dtype=np.float32)
    mm = _memmap(tmp_path, X)
    P = GPClassifier(**_settings("svi")).fit(X, y).predict_proba(X)
    reads: list[int] = []
    get = SourceRows.__getitem__
    monkeypatch.setattr(SourceRows, "__getitem__",
                        lambda self, rows: reads.append(1) or get(self, rows))
    steps: list[tuple[int, bool]] = []
    estimate = VariationalState.estimate

    def counted(self, *args, **kwargs):
        before = len(reads)
        out = estimate(self, *args, **kwargs)
        steps.append((len(reads) - before, self._fast))
        return out

    monkeypatch.setattr(VariationalState, "estimate", counted)
    Q = GPClassifier(**_settings("svi")).fit(mm, y).predict_proba(mm)
    assert steps and set(steps) == {(1, True)}  # the fixed-Z path, one read per step
    np.testing.assert_allclose(Q, P, rtol=1e-10, atol=1e-13)
    monkeypatch.setattr(fixed, "DISTANCE_CACHE_MAX_ENTRIES", 0)
    np.testing.assert_array_equal(Q, GPClassifier(**_settings("svi")).fit(X, y).predict_proba(X))


def test_svi_ard_memmap_fit_equals_the_in_memory_fit(tmp_path, monkeypatch):
    """ARD (no ``[M, N]`` memo in memory either): svi's fixed-Z path out of core centres each
    batch as it is read by the column mean of one chunked pass; with the rows in one chunk the
    memmap fit is the in-memory fit bit for bit."""
    from gpinfer_svi.method import VariationalState

    from gpinfer.kernels import RBF, White

    X, y = _data(dtype=np.float32)
    kernel = RBF(lengthscale=[1.0, 2.0, 1.5], variance=1.0) + White(0.01)
    P = GPClassifier(**_settings("svi", kernel=kernel)).fit(X, y).predict_proba(X)
    ard: list[bool] = []  # the fixed-Z path, on its ARD branch
    estimate = VariationalState.estimate
    monkeypatch.setattr(VariationalState, "estimate", lambda self, *a, **k: ard.append(
        self._fast and all(f is not None and f.stationary[0].ard for _, _, f in self._groups))
        or estimate(self, *a, **k))
    mm = _memmap(tmp_path, X)
    Q = GPClassifier(**_settings("svi", kernel=kernel)).fit(mm, y).predict_proba(mm)
    assert ard and all(ard)
    np.testing.assert_array_equal(Q, P)


def test_float32_input_is_cast_per_batch_as_the_float32_array_is(tmp_path):
    X, y = _data(dtype=np.float32)
    mm = _memmap(tmp_path, X)
    assert ArraySource(mm).rows(np.array([0, 1])).dtype == np.float32
    P = GPClassifier(**_settings("sep", standardize=False)).fit(X, y).predict_proba(X)
    Q = GPClassifier(**_settings("sep", standardize=False)).fit(mm, y).predict_proba(mm)
    np.testing.assert_array_equal(Q, P)


class _CountingRows:
    """A row-indexable array that counts the rows of every read and refuses ``__array__``."""

    def __init__(self, X):
        self._X, self.shape, self.dtype, self.reads = X, X.shape, X.dtype, []

    def __getitem__(self, index):
        block = self._X[index]
        self.reads.append(block.shape[0])
        return block

    def __array__(self, *args, **kwargs):
        raise AssertionError("X was materialised")


@pytest.mark.parametrize("method", ["sep", "svi"])
def test_x_is_never_materialised(monkeypatch, method):
    monkeypatch.setattr(source_module, "CHUNK_ROWS", 5000)
    monkeypatch.setattr(ooc_module, "PREDICT_CHUNK", 7000)
    X, y = _data(n=12_000, seed=1)
    rows = _CountingRows(X)
    model = GPClassifier(**_settings(method, method_options={"inducing_init": "random"}))
    model.fit(ArraySource(rows), y)
    assert rows.reads[:3] == [5000, 5000, 2000]  # the chunked check: each chunk once
    # then batches, the median heuristic's 1000 rows and the fit guard's fixed subsample
    assert max(rows.reads[3:]) <= NLL_CHECK_POINTS < X.shape[0]
    rows.reads.clear()
    P = model.predict_proba(ArraySource(rows))
    assert rows.reads == [7000, 5000] and P.shape == (12_000, 3)
    np.testing.assert_array_equal(P[:7000], model.predict_proba(X[:7000]))


def test_nan_in_the_last_row_of_a_memmap_is_named_before_training(tmp_path):
    X, y = _data()
    X[-1, 1] = np.nan
    with pytest.raises(InputError, match=r"first at row 399, column 1 \(nan\)"):
        GPClassifier(**_settings("sep")).fit(_memmap(tmp_path, X), y)


def test_full_batch_methods_and_missing_batch_size_are_refused_naming_the_fix(
        tmp_path, monkeypatch):
    X, y = _data()
    mm = _memmap(tmp_path, X)
    shards = _shards(tmp_path, X)
    with pytest.raises(InputError, match=r"'laplace' needs all of X in memory .* sep"):
        GPClassifier(method="laplace").fit(shards, (y > 0).astype(int))
    with pytest.raises(InputError, match="must train on mini-batches: set batch_size"):
        GPClassifier(**_settings("sep", batch_size=None)).fit(shards, y)
    # a memmap whose float64 copy fits the dense limit is an array for a full-batch method
    # (scikit-learn passes read-only memmaps); above the limit it is refused
    ref = GPClassifier(method="gfitc", M=8, max_iter=2, random_state=3).fit(X, y).predict_proba(X)
    got = GPClassifier(method="gfitc", M=8, max_iter=2, random_state=3).fit(mm, y).predict_proba(X)
    np.testing.assert_array_equal(got, ref)
    monkeypatch.setenv("GPINFER_MAX_DENSE_GB", str(X.size * 8 / 2e9))
    with pytest.raises(InputError, match=r"'gfitc' needs all of X in memory .*svi"):
        GPClassifier(method="gfitc").fit(mm, y)
    with pytest.raises(InputError, match="must train on mini-batches: set batch_size"):
        GPClassifier(**_settings("sep", batch_size=None)).fit(mm, y)
    with pytest.raises(InputError, match="not supported with an out-of-core X"):
        GPClassifier(**_settings("svi")).fit(mm, y, sample_weight=np.linspace(1, 2, 400))
    with pytest.raises(InputError, match="inconsistent numbers of samples"):
        GPClassifier(**_settings("sep")).fit(mm, y[:-1])


def test_shards_with_another_column_count_or_dtype_are_refused_by_fit(tmp_path):
    X, y = _data()
    paths = _shards(tmp_path, X)
    np.save(paths[2], X[151:300, :2])
    with pytest.raises(InputError, match=r"shard 2 .* has 2 column\(s\)"):
        GPClassifier(**_settings("sep")).fit(paths, y)
    np.save(paths[2], X[151:300].astype(np.float32))
    with pytest.raises(InputError, match="mixed dtypes"):
        GPClassifier(**_settings("sep")).fit(paths, y)


def test_prediction_from_a_memmap_checks_its_features(tmp_path):
    X, y = _data()
    model = GPClassifier(**_settings("sep")).fit(X, y)
    with pytest.raises(InputError, match="expecting 3 features"):
        model.predict_proba(_memmap(tmp_path, X[:, :2]))


def test_parquet_fit_equals_the_array_in_memory(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    X, y = _data()
    pq.write_table(pa.table({f"x{j}": X[:, j] for j in range(3)}), tmp_path / "X.parquet",
                   row_group_size=100)
    P = GPClassifier(**_settings("sep")).fit(X, y).predict_proba(X)
    model = GPClassifier(**_settings("sep")).fit(str(tmp_path / "X.parquet"), y)
    np.testing.assert_array_equal(model.predict_proba(str(tmp_path / "X.parquet")), P)


def test_a_regressor_given_shards_names_the_regression_methods_that_stream(tmp_path):
    from gpinfer import GPRegressor

    X, _ = _data()
    with pytest.raises(InputError, match=r"needs all of X in memory .*\(none installed\)"):
        GPRegressor(method="pep", batch_size=64).fit(_shards(tmp_path, X), X[:, 0])


def test_the_named_kernels_start_length_scale_comes_from_the_chunked_extremes(tmp_path):
    """With lengthscale_init="kernel" the start length-scale sqrt(max(D', 2) / 2) counts the
    varying columns D' (here 3 of 4: one constant column)."""
    X, y = _data(n=300, d=4)
    X[:, 3] = 1.5
    kw = _settings("sep", method_options={"lengthscale_init": "kernel"}, max_iter=1)
    ref = GPClassifier(**kw).fit(X, y)
    model = GPClassifier(**kw).fit(_memmap(tmp_path, X), y)
    np.testing.assert_array_equal(model.predict_proba(X), ref.predict_proba(X))
    np.testing.assert_array_equal(model.scaler_.scale_, ref.scaler_.scale_)


def test_early_stopping_splits_from_y_and_fits_as_in_memory(tmp_path):
    X, y = _data()
    kw = _settings("sep", validation_fraction=0.25, max_iter=3)
    ref = GPClassifier(**kw).fit(X, y)
    model = GPClassifier(**kw).fit(_memmap(tmp_path, X), y)
    np.testing.assert_array_equal(model.predict_proba(X), ref.predict_proba(X))
    assert model.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("method", ["sep", "svi"])
def test_torch_backend_reads_batches_from_a_memmap_as_from_memory(tmp_path, method):
    pytest.importorskip("torch")
    X, y = _data(n=300)
    kw = _settings(method, backend="torch")
    P = GPClassifier(**kw).fit(X, y).predict_proba(X)
    mm = _memmap(tmp_path, X)
    Q = GPClassifier(**kw).fit(mm, y).predict_proba(mm)
    np.testing.assert_allclose(Q, P, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("labels", [np.array([7, -2, 7, 3, 3, 9, 7, -2, 11, 3, 9]),
                                    np.array([True, True, False, True, False, True, True]),
                                    np.array([5, 5, 5, 5, 5, 1], dtype=np.uint8)])
def test_long_integer_labels_are_encoded_in_chunks_as_np_unique_does(monkeypatch, labels):
    import gpinfer.validation as validation

    ref_classes, ref_index = validation.encode_labels(labels)
    monkeypatch.setattr(validation, "LABEL_CHUNK", 2)
    classes, index = validation.encode_labels(labels)
    assert classes.dtype == ref_classes.dtype and index.dtype == np.int8  # <= 128 classes
    np.testing.assert_array_equal(classes, ref_classes)
    np.testing.assert_array_equal(index, ref_index)
    with pytest.raises(InputError, match="y has 1 class"):
        validation.encode_labels(np.full(5, 4))
    many = np.arange(300) % 129  # 129 classes: index 128 needs int16
    classes, index = validation.encode_labels(many)
    assert index.dtype == np.int16
    np.testing.assert_array_equal(classes[index], many)


@pytest.mark.parametrize("method", ["sep", "svi"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_narrow_label_indices_fit_as_int64_ones(monkeypatch, tmp_path, method, backend):
    """Long integer labels are encoded as int8 indices: the fit (in memory and from a memmap)
    equals the one on int64 indices bit for bit."""
    import gpinfer.validation as validation

    if backend == "torch":
        pytest.importorskip("torch")
    X, y = _data()
    kw = _settings(method, backend=backend)
    P = GPClassifier(**kw).fit(X, y).predict_proba(X)
    monkeypatch.setattr(validation, "LABEL_CHUNK", 50)
    assert validation.encode_labels(y)[1].dtype == np.int8
    np.testing.assert_array_equal(GPClassifier(**kw).fit(X, y).predict_proba(X), P)
    mm = _memmap(tmp_path, X)
    np.testing.assert_allclose(GPClassifier(**kw).fit(mm, y).predict_proba(mm), P,
                               rtol=1e-12, atol=1e-15)


def test_class_counts_in_chunks_equal_bincount(monkeypatch):
    import gpinfer.validation as validation

    index = np.array([2, 0, 2, 2, 1, 0, 2], dtype=np.int8)
    monkeypatch.setattr(validation, "LABEL_CHUNK", 3)
    counts = validation.class_counts(index, 4)
    assert counts.dtype == np.int64
    np.testing.assert_array_equal(counts, [2, 1, 4, 0])


def test_a_method_that_cannot_stream_is_refused_before_any_row_is_read(tmp_path):
    """The method is checked before the chunked check: here the NaN is never reached."""
    X, y = _data()
    X[0, 0] = np.nan
    rows = _CountingRows(X)
    with pytest.raises(InputError, match=r"'laplace' needs all of X in memory"):
        GPClassifier(method="laplace").fit(ArraySource(rows), (y > 0).astype(int))
    with pytest.raises(InputError, match="must train on mini-batches: set batch_size"):
        GPClassifier(**_settings("sep", batch_size=400)).fit(ArraySource(rows), y)
    with pytest.raises(InputError, match="batch_size must be a positive int or None"):
        GPClassifier(**_settings("sep", batch_size="64")).fit(_memmap(tmp_path, X[1:]), y[1:])
    assert rows.reads == []


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc thresholds")
def test_the_primed_allocator_keeps_a_steps_temporaries_resident():
    """After ``prime_allocator``, or after a small in-memory fit (every fit primes), blocks of
    20 MB allocated and freed again and again are served from the heap without new page
    faults; unprimed, glibc maps them afresh each time (a fresh interpreter: this one's
    thresholds are already raised)."""
    code = textwrap.dedent("""
        import resource, sys
        import numpy as np
        from gpinfer import GPClassifier
        from gpinfer.allocator import prime_allocator
        if sys.argv[1] == "prime":
            prime_allocator()
        elif sys.argv[1] == "fit":  # its arrays are all far below the threshold
            rng = np.random.default_rng(0)
            X = rng.normal(size=(60, 2))
            GPClassifier(method="sep", M=4, max_iter=1).fit(X, (X[:, 0] > 0).astype(int))
        faults = []
        for _ in range(4):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            a, b = np.ones((1250, 2000)), np.ones((1250, 2000))  # 20 MB each, written
            del a, b
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(*faults)
        """)
    runs = {mode: [int(v) for v in subprocess.run(
        [sys.executable, "-c", code, mode], capture_output=True, text=True, check=True
    ).stdout.split()] for mode in ("prime", "fit", "plain")}
    # primed, the heap keeps the pages between rounds; plain, 40 MB are mapped afresh each
    # round (here about 1000 faults a round; fewer, larger ones with transparent huge pages)
    assert max(runs["prime"][1:]) * 10 < min(runs["plain"][1:])
    assert max(runs["fit"][1:]) * 10 < min(runs["plain"][1:])
