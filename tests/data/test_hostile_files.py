"""Hostile dataset files: every loader bounds what it allocates and answers with an InputError.

The named cases (a LIBSVM index of 1e11 or a huge negative one, a comments-only LIBSVM file, an
``.npz`` "zip bomb", object arrays, truncated files, wrong magic bytes) each get their message;
then seeded random mutations of valid files (truncation, flipped bytes, inserted junk) must
load or raise ``InputError``, never anything else. Valid files load bit-identically to the
plain readers (``np.load``, ``np.loadtxt``, scikit-learn's svmlight reader).
"""

from __future__ import annotations

import io
import random
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpinfer.data.files import MAX_DENSE_ENV, load_file
from gpinfer.errors import InputError

LIBSVM_OK = "".join(f"{1 if i % 2 else -1} 1:{0.25 * i:g} 3:{1.5 - 0.1 * i:.3f}\n"
                    for i in range(12))


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    """An .npy (version 1.0) header for ``shape`` without the data."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def _zip_bomb(path: Path) -> Path:
    """An .npz whose X.npy header says 3e9 float64 (24 GB); 30 MB of zeros follow, deflated."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("X.npy", "w", force_zip64=True) as fh:
            fh.write(_npy_header((3_000_000_000,)))
            chunk = bytes(10**6)
            for _ in range(30):
                fh.write(chunk)
        zf.writestr("y.npy", _npy_header((2,), "<i8") + bytes(16))
    return path


def _valid_npz(path: Path) -> Path:
    np.savez_compressed(path, X=np.linspace(-1, 1, 24).reshape(12, 2),
                        y=np.arange(12) % 2, feature_names=np.array(["a", "b"]))
    return path


def _bytes_of(maker: Callable[[Path], Path], tmp_path: Path, name: str) -> bytes:
    return maker(tmp_path / name).read_bytes()


def _write(path: Path, data: bytes | str) -> Path:
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def _zip_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _member_magic() -> bytes:
    """An .npz whose X.npy member lost its magic bytes (numpy then reads it as pickle)."""
    good = io.BytesIO()
    np.save(good, np.zeros((3, 2)))
    return _zip_of({"X.npy": b"\x00\x00" + good.getvalue()[2:],
                    "y.npy": _npy_header((3,)) + bytes(24)})


# name -> (file name, its contents or how to make it, a piece of the message)
CASES: dict[str, tuple[str, str | bytes | Callable[[Path], Path], str]] = {
    "libsvm index 1e11": (
        "big.libsvm", "1 1:0.5 100000000000:1\n-1 1:0.3\n",
        "line 1: feature index 100000000000 would make one row of the dense X 800 GB, more "
        "than the limit of 4 GB"),
    "libsvm huge negative index": (
        "neg.libsvm", "1 1:0.5\n-1 -9999999999999999999:1\n",
        "line 2: feature index -9999999999999999999 is negative"),
    "libsvm index 2e9": (
        "stray.libsvm", "1 1:0.5\n-1 2000000000:1\n",
        "the dense X would be 2 x 2000000000 float64 = 32 GB, more than the limit of 4 GB "
        "(the largest feature index is 2000000000, on line 2"),
    "libsvm comments only": (
        "comments.libsvm", "# a header\n# nothing else\n",
        "holds no data rows"),
    "libsvm empty": ("empty.libsvm", "", "holds no data rows"),
    "libsvm truncated": (
        "cut.libsvm", LIBSVM_OK + "1 1:0.5 3:",
        "line 13: feature value '' (in '3:') is not a number"),
    "libsvm binary junk": (
        "junk.libsvm", b"\x00\xff\xfe garbage \x93NUMPY",
        "is not a valid LIBSVM file"),
    "npz zip bomb": (
        "bomb.npz", _zip_bomb,
        "member 'X.npy': the arrays would take 24 GB once decompressed (this member 24 GB), "
        "more than the limit of 4 GB"),
    "npz object array": (
        "objects.npz",
        lambda p: (np.savez(p, X=np.array([{"x": 1}, None], dtype=object), y=np.arange(2)), p)[1],
        "member 'X.npy' holds Python objects (dtype object)"),
    "npz truncated": (
        "cut.npz", lambda p: _write(p, _valid_npz(p).read_bytes()[:300]),
        "is not a readable .npz archive"),
    "npz wrong magic": (
        "magic.npz", lambda p: _write(p, b"JUNK" + _valid_npz(p).read_bytes()[4:]),
        "is not a readable .npz archive: it starts with bytes b'JUNK', not the zip signature"),
    "npz that is an .npy": (
        "array.npz", lambda p: (np.save(p.with_suffix(".npy"), np.zeros(3)),
                                _write(p, p.with_suffix(".npy").read_bytes()))[1],
        "it starts with an .npy array, not the zip signature"),
    "npz member with wrong magic": (
        "member.npz", _member_magic(),
        "member 'X.npy' is not an .npy array: it starts with b'\\x00\\x00UMPY'"),
    "npz member truncated": (
        "short.npz", _zip_of({"X.npy": _npy_header((3, 2)) + bytes(8),
                              "y.npy": _npy_header((3,)) + bytes(24)}),
        "member 'X.npy' is truncated: its header announces 48 bytes of data, it holds 8"),
    "npz negative shape": (
        "negshape.npz", _zip_of({"X.npy": _npy_header((-5, 2)), "y.npy": _npy_header((2,))}),
        "member 'X.npy'"),
    "csv truncated": (
        "cut.csv", "1.0,2.0,0\n3.0,4.0,1\n5.0,",
        "line 3 has 2 fields, expected 3"),
    "csv binary junk": (
        "junk.csv", b"\xff\xfe\x00\x01junk",
        "cannot read dataset file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_file_is_one_clear_input_error(case: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    name, contents, expected = CASES[case]
    path = tmp_path / name
    path = contents(path) if callable(contents) else _write(path, contents)
    with pytest.raises(InputError) as err:
        load_file(path)
    message = str(err.value)
    assert expected in message
    assert str(path) in message  # names the file
    assert "\n" not in message


def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    """Truncations, flipped bytes and inserted junk of ``data``."""
    out = []
    for _ in range(40):
        cut = rng.randrange(len(data))
        out.append(data[:cut])
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(data))] = rng.randrange(256)
        out.append(bytes(flipped))
        at = rng.randrange(len(data))
        junk = bytes(rng.choice(b"0123456789:-e. \n#x\x00\xff") for _ in range(rng.randint(1, 20)))
        out.append(data[:at] + junk + data[at:])
    return out


@pytest.mark.parametrize("suffix", [".npz", ".csv", ".libsvm"])
def test_fuzzed_files_load_or_raise_input_error(suffix: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(MAX_DENSE_ENV, "0.05")  # a flipped digit may make a huge index
    valid = {".npz": lambda: _valid_npz(tmp_path / "v.npz").read_bytes(),
             ".csv": lambda: b"".join(b"%g,%g,%d\n" % (0.5 * i, 1.0 - i, i % 2)
                                      for i in range(12)),
             ".libsvm": LIBSVM_OK.encode}[suffix]()
    rng = random.Random(f"gpinfer fuzz {suffix}")
    outcomes = {"loaded": 0, "refused": 0}
    for i, data in enumerate(_mutations(valid, rng)):
        path = _write(tmp_path / f"m{i}{suffix}", data)
        try:
            load_file(path)
        except InputError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc), (data, exc)
            outcomes["refused"] += 1
        else:
            outcomes["loaded"] += 1
    assert outcomes["refused"] > 0


def test_valid_files_load_bit_identically(tmp_path: Path, monkeypatch) -> None:
    """The checks change nothing for valid files: the same bytes as the plain readers."""
    from sklearn.datasets import load_svmlight_file

    monkeypatch.delenv(MAX_DENSE_ENV, raising=False)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 4))
    y = rng.integers(0, 3, 50)
    npz = tmp_path / "d.npz"
    np.savez_compressed(npz, X_train=X[:40], y_train=y[:40], X_test=X[40:], y_test=y[40:],
                        speaker_train=np.arange(40))
    ds = load_file(npz)
    with np.load(npz) as z:
        for got, key in ((ds.X, "X_train"), (ds.y, "y_train"), (ds.X_test, "X_test"),
                         (ds.y_test, "y_test"), (ds.extras["speaker_train"], "speaker_train")):
            assert got.dtype == z[key].dtype and got.tobytes() == z[key].tobytes()

    csv = tmp_path / "d.csv"
    np.savetxt(csv, np.column_stack([X, y]), delimiter=",", fmt="%.17g")
    ds = load_file(csv)
    ref = np.loadtxt(csv, delimiter=",")
    assert ds.X.dtype == np.float64 and ds.X.tobytes() == ref[:, :-1].tobytes()
    assert ds.y.tolist() == ref[:, -1].astype(int).tolist()

    svm = _write(tmp_path / "d.libsvm", "".join(
        f"{int(c)} " + " ".join(f"{j + 1}:{v:.17g}" for j, v in enumerate(row) if j != 2) + "\n"
        for row, c in zip(X, y)))
    ds = load_file(svm)
    Xs, labels = load_svmlight_file(str(svm))
    assert ds.X.tobytes() == Xs.toarray().tobytes() and ds.X.shape == (50, 4)
    assert ds.y.tolist() == np.unique(labels, return_inverse=True)[1].tolist()
