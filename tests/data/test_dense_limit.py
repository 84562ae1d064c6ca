"""CSV and LIBSVM files whose dense ``X`` would exceed the limit are refused before densifying."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpinfer.data import load_dataset
from gpinfer.data.files import MAX_DENSE_ENV, check_dense_size, dense_limit_gb, load_file
from gpinfer.errors import InputError


def _libsvm(path: Path, stray_index: int) -> Path:
    """An 80-line binary LIBSVM file, the last line with one stray feature index."""
    lines = [f"{1 if i % 2 else -1} 1:{0.1 * i:.2f} 2:0.5" for i in range(79)]
    lines.append(f"1 1:0.5 {stray_index}:1.0")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stray_libsvm_index_is_refused_with_the_sizes(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    path = _libsvm(tmp_path / "stray.libsvm", 2_000_000_000)
    with pytest.raises(InputError) as err:
        load_file(path)
    msg = str(err.value)
    assert "80 x 2000000000 float64 = 1280 GB, more than the limit of 4 GB" in msg
    assert "largest feature index is 2000000000" in msg and "160 values are stored" in msg
    assert "max_dense_gb=" in msg and MAX_DENSE_ENV in msg and str(path) in msg


def test_limit_can_be_raised_by_argument_and_environment(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    path = _libsvm(tmp_path / "wide.libsvm", 20_000)  # 80 x 20000 x 8 B = 12.8 MB
    with pytest.raises(InputError, match=r"= 0.0128 GB, more than the limit of 0.01 GB"):
        load_file(path, max_dense_gb=0.01)
    ds = load_file(path, max_dense_gb=0.02)
    assert ds.X.shape == (80, 20_000) and ds.X[79, 19_999] == 1.0
    monkeypatch.setenv(MAX_DENSE_ENV, "0.01")
    with pytest.raises(InputError, match="limit of 0.01 GB"):
        load_file(path)
    assert load_file(path, max_dense_gb=1).X.shape == (80, 20_000)  # the argument wins


def test_csv_is_refused_too(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    path = tmp_path / "d.csv"
    rows = np.arange(40 * 5).reshape(40, 5) % 2  # one digit a value: 400 bytes of text
    np.savetxt(path, rows, delimiter=",", fmt="%d")
    with pytest.raises(InputError, match=r"40 x 4 float64 = 1.28e-06 GB, more than the limit of "
                                         r"1e-06 GB"):
        load_file(path, max_dense_gb=1e-6)
    assert load_file(path).X.shape == (40, 4)
    # through load_dataset, the way gpinfer-run passes dataset.options
    with pytest.raises(InputError, match="limit of 1e-06 GB"):
        load_dataset("file", path=str(path), max_dense_gb=1e-6)


@pytest.mark.parametrize("bad", [0, -1, "abc", float("inf"), True])
def test_bad_limits_are_named(bad, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    with pytest.raises(InputError, match=r"max_dense_gb must be a positive number of GB"):
        dense_limit_gb(bad)
    monkeypatch.setenv(MAX_DENSE_ENV, str(bad))
    with pytest.raises(InputError, match=rf"{MAX_DENSE_ENV} must be a positive number"):
        check_dense_size(Path("x"), 1, 1)


def test_text_larger_than_the_limit_is_not_read(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    path = tmp_path / "d.csv"
    np.savetxt(path, np.tile([0.123456789, 1.0], (40, 1)), delimiter=",")
    size = path.stat().st_size / 1e9
    with pytest.raises(InputError, match=rf"the file is {size:.4g} GB, more than the limit of "
                                         r"1e-06 GB"):
        load_file(path, max_dense_gb=1e-6)


def test_npz_takes_the_limit_for_its_decompressed_arrays(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    path = tmp_path / "d.npz"
    np.savez_compressed(path, X=np.zeros((400, 2)), y=np.arange(400) % 2)  # 6.4 kB + 3.2 kB
    with pytest.raises(InputError, match=r"member 'y.npy': the arrays would take 9.6e-06 GB "
                                         r"once decompressed \(this member 3.2e-06 GB\), more "
                                         r"than the limit of 9e-06 GB"):
        load_file(path, max_dense_gb=9e-6)
    assert load_file(path, max_dense_gb=1e-5).X.shape == (400, 2)
