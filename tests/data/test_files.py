"""File loaders: .npz (shared layout), CSV and LIBSVM round trips, and clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpinfer.data import load_dataset, load_file
from gpinfer.data.paths import data_dir
from gpinfer.errors import InputError

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 3))
Y = np.array([0, 1, 2] * 4)


def test_npz_round_trip_single_array_layout(tmp_path: Path):
    path = tmp_path / "toy.npz"
    np.savez_compressed(
        path,
        X=X,
        y=Y,
        class_names=np.array(["a", "b", "c"]),
        feature_names=np.array(["f0", "f1", "f2"]),
        description=np.array("a toy set"),
        source=np.array([["repo", "path", "commit"]]),
        y_species=Y[::-1],
    )
    ds = load_file(path)
    np.testing.assert_array_equal(ds.X, X)
    np.testing.assert_array_equal(ds.y, Y)
    assert ds.name == "toy" and ds.description == "a toy set"
    assert ds.class_names == ["a", "b", "c"] and ds.feature_names == ["f0", "f1", "f2"]
    assert ds.X_test is None
    np.testing.assert_array_equal(ds.extras["y_species"], Y[::-1])  # extra arrays kept aside
    assert "source" not in ds.extras


def test_npz_round_trip_train_test_layout(tmp_path: Path):
    path = tmp_path / "split.npz"
    np.savez(path, X_train=X[:8], y_train=Y[:8], X_test=X[8:], y_test=Y[8:])
    ds = load_file(path)
    np.testing.assert_array_equal(ds.X, X[:8])
    np.testing.assert_array_equal(ds.X_test, X[8:])
    np.testing.assert_array_equal(ds.y_test, Y[8:])
    assert ds.has_test_split and ds.n_classes == 3


def test_npz_malformed_lists_expected_and_found(tmp_path: Path):
    path = tmp_path / "bad.npz"
    np.savez(path, data=X, labels=Y)
    with pytest.raises(InputError) as info:
        load_file(path)
    msg = str(info.value)
    assert "bad.npz" in msg and "expected arrays X and y" in msg and "X_train" in msg
    assert "found: data, labels" in msg


def test_npz_not_an_archive(tmp_path: Path):
    path = tmp_path / "fake.npz"
    path.write_text("not a zip")
    with pytest.raises(InputError, match="not a readable .npz"):
        load_file(path)


def test_non_finite_values_are_rejected_naming_the_dataset(tmp_path: Path):
    Xn = X.copy()
    Xn[3, 1] = np.nan
    np.savez(tmp_path / "nan.npz", X=Xn, y=Y)
    with pytest.raises(InputError, match=r"dataset 'nan'.*non-finite.*row 3, column 1"):
        load_file(tmp_path / "nan.npz")


def test_missing_file_names_the_path(tmp_path: Path):
    missing = tmp_path / "nowhere" / "x.csv"
    with pytest.raises(InputError, match="not found") as info:
        load_file(missing)
    assert str(missing) in str(info.value)


def test_csv_with_header_and_string_labels(tmp_path: Path):
    path = tmp_path / "t.csv"
    names = ["b", "a", "c"]
    lines = ["f0,f1,f2,label"] + [
        ",".join(f"{v:.17g}" for v in row) + f",{names[c]}" for row, c in zip(X, Y)
    ]
    path.write_text("\n".join(lines) + "\n")
    ds = load_file(path)
    np.testing.assert_array_equal(ds.X, X)
    assert ds.feature_names == ["f0", "f1", "f2"]
    assert ds.class_names == ["a", "b", "c"]  # sorted; labels re-mapped to 0..C-1
    np.testing.assert_array_equal(np.array(ds.class_names)[ds.y], np.array(names)[Y])


def test_csv_without_header_label_first_semicolon(tmp_path: Path):
    path = tmp_path / "t.csv"
    rows = [f"{c + 1};" + ";".join(f"{v:.17g}" for v in row) for row, c in zip(X, Y)]
    path.write_text("\n".join(rows))
    ds = load_file(path, label_column=0)
    np.testing.assert_array_equal(ds.X, X)
    np.testing.assert_array_equal(ds.y, Y)
    assert ds.class_names == ["1", "2", "3"] and ds.feature_names is None


def test_csv_whitespace_txt_and_regression(tmp_path: Path):
    path = tmp_path / "t.txt"
    t = X @ np.array([1.0, -2.0, 0.5])
    path.write_text("\n".join(" ".join(f"{v:.17g}" for v in [*r, ti]) for r, ti in zip(X, t)))
    ds = load_file(path, task="regression")
    assert ds.task == "regression" and ds.n_classes == 0
    np.testing.assert_allclose(ds.y, t)


def test_csv_bad_value_names_line_and_column(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("1,2,0\n3,oops,1\n")
    with pytest.raises(InputError, match=r"line 2, column 1.*'oops' is not a number"):
        load_file(path, header=False)
    path.write_text("1,2,0\n3,1\n")
    with pytest.raises(InputError, match="line 2 has 2 fields, expected 3"):
        load_file(path)


def test_libsvm_round_trip(tmp_path: Path):
    from sklearn.datasets import dump_svmlight_file

    Xs = X.copy()
    Xs[Xs < 0] = 0.0  # sparse rows: absent entries are zero
    signs = np.where(Y == 0, -1, 1)
    path = tmp_path / "t.libsvm"
    dump_svmlight_file(Xs, signs, str(path), zero_based=False)
    ds = load_file(path, n_features=3)
    np.testing.assert_allclose(ds.X, Xs)
    np.testing.assert_array_equal(ds.y, (signs > 0).astype(int))
    assert ds.class_names == ["-1", "1"]


def test_libsvm_sniffed_from_txt_and_malformed(tmp_path: Path):
    path = tmp_path / "t.txt"
    path.write_text("3 1:0.5 3:2\n1 2:1.5\n2 1:1\n")
    ds = load_file(path)
    np.testing.assert_allclose(ds.X, [[0.5, 0, 2], [0, 1.5, 0], [1, 0, 0]])
    np.testing.assert_array_equal(ds.y, [2, 0, 1])
    bad = tmp_path / "bad.svm"
    bad.write_text("1 a:b\n")
    with pytest.raises(InputError, match="not a valid LIBSVM file"):
        load_file(bad)


def test_file_options_are_checked(tmp_path: Path):
    np.savez(tmp_path / "a.npz", X=X, y=Y)
    with pytest.raises(InputError, match="unknown option"):
        load_file(tmp_path / "a.npz", colour="red")
    with pytest.raises(InputError, match="does not apply to .npz"):
        load_file(tmp_path / "a.npz", delimiter=",")
    with pytest.raises(InputError, match="unknown file format 'xls'"):
        load_file(tmp_path / "a.npz", format="xls")


def test_dataset_file_entry_point(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("\n".join(",".join(f"{v:.17g}" for v in [*r, c]) for r, c in zip(X, Y)))
    ds = load_dataset("file", path=str(path))
    np.testing.assert_array_equal(ds.X, X)
    np.testing.assert_array_equal(ds.y, Y)
    with pytest.raises(InputError, match=r"needs option\(s\) \['path'\]"):
        load_dataset("file")


SHARED = data_dir()


@pytest.mark.skipif(
    SHARED is None or not (SHARED / "new_thyroid.npz").exists(), reason="no shared data"
)
def test_real_shared_files():
    ds = load_dataset("new-thyroid")
    assert (ds.n, ds.n_features, ds.n_classes) == (215, 5, 3)
    assert np.bincount(ds.y).tolist() == [150, 35, 30]
    assert ds.class_names == ["normal", "hyper", "hypo"]
    if (SHARED / "vowel.npz").exists():
        vowel = load_dataset("vowel", keep_classes=list(range(6)))
        assert (vowel.n, vowel.X_test.shape[0], vowel.n_classes) == (288, 252, 6)
