"""Split protocols and the training-only standardiser."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.data import Dataset, Standardizer, repeated_splits, standardize, train_test_split
from gpinfer.errors import InputError


def make(n: int = 200, seed: int = 0, with_test: bool = False) -> Dataset:
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1, 2], [n // 2, 3 * n // 10, n - n // 2 - 3 * n // 10])
    X = rng.normal(size=(n, 3)) + y[:, None]
    extra = {}
    if with_test:
        extra = dict(X_test=rng.normal(size=(50, 3)), y_test=np.arange(50) % 3)
    return Dataset(name="toy", X=X, y=y, **extra)


def test_stratified_split_keeps_class_proportions():
    ds = make(200)
    s = train_test_split(ds, test_fraction=0.1, seed=0)
    assert s.n_test == 20 and s.n_train == 180
    assert np.bincount(s.y_test).tolist() == [10, 6, 4]
    assert np.bincount(s.y_train).tolist() == [90, 54, 36]
    # disjoint and covering
    assert set(s.train_index).isdisjoint(s.test_index)
    assert len(s.train_index) + len(s.test_index) == 200
    np.testing.assert_array_equal(s.X_test, ds.X[s.test_index])


def test_split_seeds_reproducible_and_different():
    ds = make(200)
    a = train_test_split(ds, 0.3, seed=5, stratify=False)
    b = train_test_split(ds, 0.3, seed=5, stratify=False)
    c = train_test_split(ds, 0.3, seed=6, stratify=False)
    np.testing.assert_array_equal(a.test_index, b.test_index)
    assert not np.array_equal(a.test_index, c.test_index)
    assert a.n_test == 60


def test_repeated_splits_differ_and_are_reproducible():
    ds = make(100)
    first = [s.test_index for s in repeated_splits(ds, 5, 0.2, seed=1)]
    second = [s.test_index for s in repeated_splits(ds, 5, 0.2, seed=1)]
    assert len(first) == 5
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)
    assert len({tuple(t) for t in first}) == 5
    np.testing.assert_array_equal(first[2], train_test_split(ds, 0.2, seed=3).test_index)


def test_standard_split_and_pooling():
    ds = make(100, with_test=True)
    s = train_test_split(ds, test_fraction=None)
    assert s is not None and s.n_test == 50 and s.train_index is None
    np.testing.assert_array_equal(s.X_test, ds.X_test)
    pooled = train_test_split(ds, test_fraction=0.1, seed=0)
    assert pooled.n_train + pooled.n_test == 150  # a random split pools train and test rows
    with pytest.raises(InputError, match="no standard test split"):
        train_test_split(make(10), test_fraction=None)
    with pytest.raises(InputError, match=r"test_fraction must be in \(0, 1\)"):
        train_test_split(ds, test_fraction=1.5)


def test_standardizer_fitted_on_train_only():
    ds = make(300, seed=1)
    s = train_test_split(ds, 0.5, seed=0, stratify=False)
    s = type(s)(s.X_train, s.y_train, s.X_test + 10.0, s.y_test)  # shift the test inputs
    std_split, st = standardize(s)
    np.testing.assert_allclose(std_split.X_train.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(std_split.X_train.std(axis=0), 1.0)
    np.testing.assert_allclose(st.mean_, s.X_train.mean(axis=0))
    # test statistics did not leak: the shift shows up in standardised test inputs
    expected = (s.X_test.mean(axis=0) - s.X_train.mean(axis=0)) / s.X_train.std(axis=0)
    np.testing.assert_allclose(std_split.X_test.mean(axis=0), expected)
    assert np.all(std_split.X_test.mean(axis=0) > 3.0)
    np.testing.assert_allclose(st.inverse_transform(std_split.X_test), s.X_test)


def test_standardizer_constant_columns_and_errors():
    X = np.column_stack([np.full(5, 0.1), np.arange(5.0)])
    st = Standardizer().fit(X)
    assert st.scale_[0] == 1.0
    np.testing.assert_allclose(st.transform(X)[:, 0], 0.0, atol=1e-15)
    with pytest.raises(InputError, match="not fitted"):
        Standardizer().transform(X)
    with pytest.raises(InputError, match="fitted on 2 features, got 3"):
        st.transform(np.zeros((2, 3)))
    raw = Standardizer(with_mean=False).fit(X)
    np.testing.assert_array_equal(raw.mean_, 0.0)


def test_standardizer_weights_are_repeated_rows():
    """``sample_weight``: integer weight k gives the statistics of the row repeated k times;
    rows of weight zero do not count (not even for the constant-column test)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(9, 3)) * [1.0, 5.0, 0.1]
    w = rng.integers(1, 4, size=9)
    st = Standardizer().fit(X, sample_weight=w)
    ref = Standardizer().fit(X.repeat(w, axis=0))
    np.testing.assert_allclose(st.mean_, ref.mean_, rtol=1e-12)
    np.testing.assert_allclose(st.scale_, ref.scale_, rtol=1e-12)
    Xc = np.column_stack([np.r_[np.full(4, 2.0), 7.0], np.arange(5.0)])
    zero = Standardizer().fit(Xc, sample_weight=[1.0, 2.0, 1.0, 1.0, 0.0])
    assert zero.mean_[0] == 2.0 and zero.scale_[0] == 1.0
    with pytest.raises(InputError, match="sample_weight has 2 entries for 5 rows"):
        Standardizer().fit(Xc, sample_weight=[1.0, 2.0])
    with pytest.raises(InputError, match="non-negative"):
        Standardizer().fit(Xc, sample_weight=[1.0, -2.0, 1.0, 1.0, 1.0])
