"""load_dataset: registry first, then data-directory files; generic options; clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpinfer.data import load_dataset, select
from gpinfer.data.paths import DATA_DIR_ENV, data_dir
from gpinfer.errors import InputError, UnknownNameError


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "my_set.npz", X=rng.normal(size=(30, 4)), y=np.arange(30) % 3)
    np.savez(
        tmp_path / "two_part.npz",
        X_train=rng.normal(size=(20, 2)),
        y_train=np.arange(20) % 4,
        X_test=rng.normal(size=(8, 2)),
        y_test=np.arange(8) % 4,
        class_names=np.array(["w", "x", "y", "z"]),
    )
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    return tmp_path


def test_env_var_overrides_data_dir(data_home: Path):
    assert data_dir() == data_home.resolve()
    ds = load_dataset("my_set")
    assert ds.name == "my_set" and ds.X.shape == (30, 4)
    assert load_dataset("my-set").X.shape == (30, 4)  # dashes and underscores interchangeable


def test_env_var_pointing_nowhere_is_an_error(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(InputError, match=f"{DATA_DIR_ENV}=.*not an existing directory"):
        data_dir()


def test_unknown_dataset_suggests_nearest(data_home: Path):
    with pytest.raises(UnknownNameError) as info:
        load_dataset("my_sett")
    msg = str(info.value)
    assert "unknown dataset 'my_sett'" in msg and "did you mean 'my_set'" in msg
    assert "Registered datasets:" in msg and "waveform" in msg
    assert "two_part" in msg and str(data_home) in msg
    with pytest.raises(UnknownNameError, match="did you mean 'waveform'"):
        load_dataset("wavefrom")


def test_generator_options_pass_through_and_are_checked():
    ds = load_dataset("waveform", n=50, seed=7)
    assert ds.n == 50
    with pytest.raises(InputError, match=r"unknown option\(s\) \['colour'\].*accepts n, seed"):
        load_dataset("waveform", colour="red")


def test_keep_classes_reindexes_train_and_test(data_home: Path):
    ds = load_dataset("two_part", keep_classes=[3, 1])
    assert set(ds.y) == {0, 1} and set(ds.y_test) == {0, 1}
    assert ds.class_names == ["z", "x"]
    full = load_dataset("two_part")
    np.testing.assert_array_equal(ds.X[ds.y == 0], full.X[full.y == 3])
    np.testing.assert_array_equal(ds.X_test[ds.y_test == 1], full.X_test[full.y_test == 1])
    with pytest.raises(InputError, match="keep_classes"):
        load_dataset("two_part", keep_classes=[4])


def test_features_and_n_max(data_home: Path):
    full = load_dataset("my_set")
    ds = load_dataset("my_set", features=[2, 0], n_max=10, subsample_seed=3)
    assert ds.X.shape == (10, 2)
    rows = [np.flatnonzero((full.X[:, [2, 0]] == r).all(axis=1))[0] for r in ds.X]
    np.testing.assert_array_equal(ds.y, full.y[rows])  # rows stay paired with their labels
    again = load_dataset("my_set", features=[2, 0], n_max=10, subsample_seed=3)
    np.testing.assert_array_equal(ds.X, again.X)
    assert select(full, n_max=100).n == 30  # n_max above N keeps everything
    with pytest.raises(InputError, match="features"):
        load_dataset("my_set", features=[9])
    # a list, tuple or 1-D integer array is a list of indices; a ragged nesting, a set, a
    # string, a scalar or floats are InputErrors naming the key
    assert load_dataset("my_set", features=np.array([2, 0])).X.shape == (30, 2)
    assert load_dataset("my_set", features=(2, 0)).X.shape == (30, 2)
    for bad in ([[0], [1, 2]], {0, 1}, "01", 1, [0.0, 1.0], [True]):
        with pytest.raises(InputError, match="features must be a list"):
            load_dataset("my_set", features=bad)
