"""How much memory a dataset file may make a loader allocate, checked before allocating it.

One setting bounds every loader of ``gpinfer.data.files``: ``max_dense_gb`` (a keyword of the
loaders; ``dataset.options.max_dense_gb=`` in ``gpinfer-run``), else ``$GPINFER_MAX_DENSE_GB``,
else ``MAX_DENSE_GB`` (4 GB, where a GB is 1e9 bytes). It bounds

* CSV and LIBSVM: the dense ``X [N, D]`` of float64 (``check_dense_size``; for LIBSVM ``D`` is
  the largest feature index) and the text read (``check_file_size``);
* ``.npz``: the arrays' total size once decompressed, computed from the ``.npy`` headers of the
  archive's members before any member is read (``check_npz``), so a small archive that expands
  to terabytes (a "zip bomb") is refused rather than exhausting memory. Object arrays are
  refused too: they would need pickle, which gpinfer never loads.

Every refusal is an ``InputError`` naming the file, the line or archive member, the sizes and
the limit; ``locate_libsvm_problem`` finds the line of a LIBSVM file that a parser rejected.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.errors import InputError

__all__ = [
    "MAX_DENSE_ENV", "MAX_DENSE_GB", "check_dense_size", "check_file_size", "check_npz",
    "dense_limit_gb", "largest_libsvm_index", "locate_libsvm_problem",
]

#: the default limit in GB (1e9 bytes)
MAX_DENSE_GB = 4.0
MAX_DENSE_ENV = "GPINFER_MAX_DENSE_GB"
#: how to raise the limit, appended to every refusal
_RAISE_IT = (f"Raise the limit with max_dense_gb=... (gpinfer-run: "
             f"+dataset.options.max_dense_gb=...) or ${MAX_DENSE_ENV} if the machine has the "
             "memory")
#: the first bytes of a zip archive (an .npz) and of an .npy array
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


def dense_limit_gb(max_dense_gb: float | None = None) -> float:
    """The limit in GB: ``max_dense_gb`` when given, else ``$GPINFER_MAX_DENSE_GB``, else
    ``MAX_DENSE_GB``; ``InputError`` for a value that is not a positive number."""
    source = "max_dense_gb"
    value: Any = max_dense_gb
    if value is None:
        value, source = os.environ.get(MAX_DENSE_ENV), MAX_DENSE_ENV
    if value is None:
        return MAX_DENSE_GB
    try:
        limit = float(value)
    except (TypeError, ValueError):
        limit = float("nan")
    if isinstance(value, bool) or not limit > 0 or limit == float("inf"):
        raise InputError(f"{source} must be a positive number of GB, got {value!r}")
    return limit


def check_dense_size(path: Path, n_rows: int, n_cols: int, max_dense_gb: float | None = None,
                     hint: str = "") -> None:
    """Refuse a file whose dense ``X [n_rows, n_cols]`` of float64 would exceed the limit
    (``dense_limit_gb``), with the sizes, the limit and how to raise it in the message."""
    limit = dense_limit_gb(max_dense_gb)
    need = 8.0 * n_rows * n_cols / 1e9
    if need > limit:
        raise InputError(
            f"{str(path)!r}: the dense X would be {n_rows} x {n_cols} float64 = {need:.4g} GB, "
            f"more than the limit of {limit:g} GB{hint}. {_RAISE_IT}"
        )


def check_file_size(path: Path, max_dense_gb: float | None = None) -> None:
    """Refuse a text file larger than the limit before reading it into memory."""
    limit = dense_limit_gb(max_dense_gb)
    try:
        size = path.stat().st_size / 1e9
    except OSError as exc:
        raise InputError(f"cannot read dataset file {str(path)!r}: {exc}") from exc
    if size > limit:
        raise InputError(f"{str(path)!r}: the file is {size:.4g} GB, more than the limit of "
                         f"{limit:g} GB. {_RAISE_IT}")


# --------------------------------------------------------------------------------------------
# .npz
# --------------------------------------------------------------------------------------------


def _read_header(fh: Any, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of an ``.npy`` header of any format version."""
    import importlib

    try:  # numpy >= 2: the implementation module; 1.x: numpy.lib.format itself
        module = importlib.import_module("numpy.lib._format_impl")
    except ImportError:  # pragma: no cover - numpy 1.x
        module = importlib.import_module("numpy.lib.format")
    # the reader np.load uses, for every format version (the public ones stop at 2.0)
    shape, fortran, dtype = module._read_array_header(fh, version)
    return tuple(int(n) for n in shape), bool(fortran), np.dtype(dtype)


def _member_bytes(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> tuple[int, int]:
    """``(bytes allocated, bytes held)`` of one archive member: for an ``.npy`` member the
    array its header announces (object arrays and a missing magic are refused) and the data
    that follows the header; for any other member its declared uncompressed size, twice."""
    with zf.open(info) as fh:
        magic = fh.read(len(_NPY_MAGIC))
        if magic != _NPY_MAGIC:
            if info.filename.endswith(".npy"):
                raise InputError(f"{where} is not an .npy array: it starts with {magic!r}, not "
                                 f"{_NPY_MAGIC!r}")
            return int(info.file_size), int(info.file_size)
        major, minor = (tuple(fh.read(2)) + (0, 0))[:2]
        if (major, minor) not in ((1, 0), (2, 0), (3, 0)):
            raise InputError(f"{where}: unknown .npy format version {(major, minor)}")
        try:
            shape, _, dtype = _read_header(fh, (major, minor))
        except (ValueError, SyntaxError, TypeError, EOFError) as exc:
            raise InputError(f"{where}: malformed .npy header: {exc}") from None
        header_end = fh.tell()
    if dtype.hasobject:
        raise InputError(f"{where} holds Python objects (dtype {dtype}); gpinfer loads only "
                         "numeric and text arrays, never pickled data")
    if any(n < 0 for n in shape):
        raise InputError(f"{where}: negative dimension in shape {shape}")
    return math.prod(shape) * dtype.itemsize, int(info.file_size) - header_end


def check_npz(path: Path, max_dense_gb: float | None = None) -> None:
    """Refuse an ``.npz`` that is not a zip archive, or whose arrays would take more than the
    limit once decompressed (read from the member headers; nothing is decompressed but them),
    or that holds object arrays."""
    limit = dense_limit_gb(max_dense_gb)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise InputError(f"cannot read dataset file {str(path)!r}: {exc}") from exc
    if head not in _ZIP_MAGIC:
        what = "an .npy array" if head == _NPY_MAGIC[:4] else f"bytes {head!r}"
        raise InputError(f"{str(path)!r} is not a readable .npz archive: it starts with {what}, "
                         "not the zip signature (np.savez writes .npz files)")
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                where = f"{str(path)!r}, member {info.filename!r}"
                need, held = _member_bytes(zf, info, where)
                total += need
                if total > limit * 1e9:
                    raise InputError(
                        f"{where}: the arrays would take {total / 1e9:.4g} GB once "
                        f"decompressed (this member {need / 1e9:.4g} GB), more than the limit "
                        f"of {limit:g} GB. {_RAISE_IT}")
                if held < need:
                    raise InputError(f"{where} is truncated: its header announces {need} bytes "
                                     f"of data, it holds {held}")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile and zlib raise many types on bad input
        # (BadZipFile, zlib.error, EOFError, RuntimeError for an "encrypted" flag, ...)
        raise InputError(f"{str(path)!r} is not a readable .npz archive: {exc}") from None


# --------------------------------------------------------------------------------------------
# LIBSVM
# --------------------------------------------------------------------------------------------


def _line_problem(tokens: list[str], limit_gb: float) -> str:
    """What is wrong with one LIBSVM data line, or ``""``."""
    try:
        float(tokens[0])
    except ValueError:
        return f"label {tokens[0]!r} is not a number"
    for token in tokens[1:]:
        index, sep, value = token.partition(":")
        if index == "qid":
            continue
        if not sep:
            return f"{token!r} is not index:value"
        try:
            number = int(index)
        except ValueError:
            return f"feature index {index!r} is not an integer"
        if number < 0:
            return f"feature index {number} is negative"
        if 8.0 * number / 1e9 > limit_gb:
            return (f"feature index {number} would make one row of the dense X "
                    f"{8.0 * number / 1e9:.4g} GB, more than the limit of {limit_gb:g} GB. "
                    f"{_RAISE_IT}")
        try:
            float(value)
        except ValueError:
            return f"feature value {value!r} (in {token!r}) is not a number"
    return ""


def locate_libsvm_problem(path: Path,
                          max_dense_gb: float | None = None) -> tuple[int, str] | None:
    """``(line number, what is wrong)`` of the first line of a LIBSVM file that a parser
    rejects: a label or value that is not a number, a token that is not ``index:value``, a
    negative feature index, or one so large that a single row of the dense ``X`` would pass the
    limit; ``None`` when every line looks right. Read line by line (only when a file failed)."""
    limit_gb = dense_limit_gb(max_dense_gb)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            tokens = line.split("#", 1)[0].split()
            if tokens:
                problem = _line_problem(tokens, limit_gb)
                if problem:
                    return number, problem
    return None


def largest_libsvm_index(path: Path) -> tuple[int, int]:
    """``(largest feature index, its line number)`` of a LIBSVM file (read line by line)."""
    best, where = -1, 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            for token in line.split("#", 1)[0].split()[1:]:
                index, _, _ = token.partition(":")
                if index.lstrip("-").isdigit() and int(index) > best:
                    best, where = int(index), number
    return best, where
