"""Dataset files: the shared ``.npz`` layout, numeric CSV and LIBSVM (svmlight) text.

``load_file(path)`` picks the reader from the suffix (``.npz``; ``.csv``/``.tsv``;
``.libsvm``/``.svm``/``.svmlight``; ``.txt``/``.dat``/other are sniffed: LIBSVM when the first
data line holds ``index:value`` pairs, else whitespace-separated CSV) or from ``format``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.data.base import Dataset
from gpinfer.data.limits import (  # noqa: F401 - re-exported: the limit's historical home
    MAX_DENSE_ENV,
    MAX_DENSE_GB,
    check_dense_size,
    check_file_size,
    check_npz,
    dense_limit_gb,
    largest_libsvm_index,
    locate_libsvm_problem,
)
from gpinfer.data.paths import data_dir
from gpinfer.errors import InputError

Array = np.ndarray

FORMATS = ("npz", "csv", "libsvm")
_SUFFIX = {
    ".npz": "npz",
    ".csv": "csv",
    ".tsv": "csv",
    ".libsvm": "libsvm",
    ".svm": "libsvm",
    ".svmlight": "libsvm",
}
#: arrays of the shared layout that describe the data rather than hold it
_META = ("source", "description", "class_names", "feature_names")
def load_file(
    path: str | Path,
    format: str | None = None,
    label_column: int = -1,
    **kw: Any,
) -> Dataset:
    """Load one dataset file into a ``Dataset``.

    * ``format``: ``"npz"``, ``"csv"`` or ``"libsvm"`` (default: from the suffix, see module doc).
    * ``label_column``: CSV column holding the label (negative counts from the end).
    * further keywords: ``name`` (default: the file stem), ``task`` (``"classification"`` or
      ``"regression"``; CSV/LIBSVM), ``delimiter`` and ``header`` (CSV: ``None`` = detect),
      ``n_features`` and ``zero_based`` (LIBSVM, as in ``sklearn.datasets.load_svmlight_file``),
      ``max_dense_gb`` (the most a file may make the loader allocate, in GB: the dense ``X`` of
      CSV and LIBSVM, the decompressed arrays of ``.npz``; see ``gpinfer.data.limits``).

    A relative ``path`` that does not exist is also looked up in the data directory. A missing
    file or a malformed one raises ``InputError`` naming the path and what was expected.
    """
    allowed = {"name", "task", "delimiter", "header", "n_features", "zero_based",
               "max_dense_gb"}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise InputError(
            f"load_file got unknown option(s) {unknown}; known: format, label_column, "
            + ", ".join(sorted(allowed))
        )
    p = resolve_path(path)
    fmt = _format_of(p, format)
    name = str(kw.pop("name", None) or p.stem)
    task = kw.pop("task", "classification")
    if task not in ("classification", "regression"):
        raise InputError(f"{p}: task must be 'classification' or 'regression', got {task!r}")
    if fmt == "npz":
        for key in ("delimiter", "header", "n_features", "zero_based"):
            if key in kw:
                raise InputError(f"{p}: option {key!r} does not apply to .npz files")
        return load_npz(p, name=name, max_dense_gb=kw.get("max_dense_gb"))
    if fmt == "csv":
        for key in ("n_features", "zero_based"):
            if key in kw:
                raise InputError(f"{p}: option {key!r} applies to LIBSVM files, not CSV")
        return load_csv(p, label_column=label_column, name=name, task=task, **kw)
    for key in ("delimiter", "header"):
        if key in kw:
            raise InputError(f"{p}: option {key!r} applies to CSV files, not LIBSVM")
    return load_libsvm(p, name=name, task=task, **kw)


def resolve_path(path: str | Path) -> Path:
    """``path`` if it is a file, else ``<data_dir>/path`` for a relative path; else InputError."""
    if path is None or str(path).strip() == "":
        raise InputError("no dataset file given: set the path (e.g. dataset.path=/data/x.csv)")
    p = Path(path).expanduser()
    if p.is_file():
        return p
    tried = [str(p)]
    if not p.is_absolute():
        root = data_dir()
        if root is not None:
            if (root / p).is_file():
                return root / p
            tried.append(str(root / p))
    if p.exists():
        raise InputError(f"dataset path {str(p)!r} is not a file")
    raise InputError(f"dataset file not found: {str(path)!r} (tried {', '.join(tried)})")


def _format_of(p: Path, format: str | None) -> str:
    if format is not None:
        fmt = str(format).lower().lstrip(".")
        fmt = {"svmlight": "libsvm", "svm": "libsvm", "tsv": "csv", "txt": "csv"}.get(fmt, fmt)
        if fmt not in FORMATS:
            raise InputError(f"unknown file format {format!r} for {p}; known: {', '.join(FORMATS)}"
                             " (and, read out of core by gpinfer-run: npy, parquet)")
        return fmt
    suffix = p.suffix.lower()
    if suffix in _SUFFIX:
        return _SUFFIX[suffix]
    first = _first_data_line(p)
    tokens = first.split()
    if len(tokens) > 1 and all(":" in t for t in tokens[1:]):
        return "libsvm"
    return "csv"


def _first_data_line(p: Path) -> str:
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip() and not line.lstrip().startswith("#"):
                    return line.strip()
    except OSError as exc:
        raise InputError(f"cannot read dataset file {str(p)!r}: {exc}") from exc
    raise InputError(f"dataset file {str(p)!r} is empty")


# --------------------------------------------------------------------------------------------
# .npz (../shared/data layout)
# --------------------------------------------------------------------------------------------


def load_npz(path: str | Path, name: str | None = None,
             max_dense_gb: float | None = None) -> Dataset:
    """Read the shared ``.npz`` layout (see ``../shared/data/README.md``).

    Either ``X [N, D]`` and ``y [N]``, or ``X_train``, ``y_train`` (and optionally ``X_test``,
    ``y_test``). ``class_names``, ``feature_names`` and ``description`` are used when present;
    other arrays (e.g. ``speaker_train``, ``X_onehot``) go to ``Dataset.extras``; ``source`` is
    dropped. The archive's decompressed size is checked against ``max_dense_gb`` from the
    member headers before any array is read, and object arrays are refused
    (``gpinfer.data.limits.check_npz``).
    """
    p = Path(path)
    name = name or p.stem
    if not p.is_file():
        raise InputError(f"dataset file not found: {str(p)!r}")
    check_npz(p, max_dense_gb)
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - as in check_npz: a damaged member past its header
        raise InputError(f"{str(p)!r} is not a readable .npz archive: "
                         f"{type(exc).__name__}: {exc}") from exc
    found = ", ".join(sorted(arrays)) or "no arrays"
    expected = "expected arrays X and y, or X_train and y_train (with X_test and y_test)"
    if "X" in arrays and "y" in arrays:
        X, y, X_test, y_test = arrays.pop("X"), arrays.pop("y"), None, None
    elif "X_train" in arrays and "y_train" in arrays:
        X, y = arrays.pop("X_train"), arrays.pop("y_train")
        has = ("X_test" in arrays, "y_test" in arrays)
        if has[0] != has[1]:
            raise InputError(f"malformed dataset file {str(p)!r}: {expected}; found: {found}")
        X_test, y_test = arrays.pop("X_test", None), arrays.pop("y_test", None)
    else:
        raise InputError(f"malformed dataset file {str(p)!r}: {expected}; found: {found}")
    class_names = _str_list(arrays.pop("class_names", None))
    feature_names = _str_list(arrays.pop("feature_names", None))
    description = arrays.pop("description", None)
    arrays.pop("source", None)
    if feature_names is not None and len(feature_names) != np.shape(X)[-1]:
        feature_names = None
    if description is None:
        description = f"loaded from {p}"
    return Dataset(name=name, X=X, y=y, X_test=X_test, y_test=y_test, class_names=class_names,
                   feature_names=feature_names, description=str(description), extras=arrays)


def _str_list(a: Array | None) -> list[str] | None:
    return None if a is None else [str(v) for v in np.atleast_1d(a)]


# --------------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------------


def load_csv(
    path: str | Path,
    label_column: int = -1,
    name: str | None = None,
    task: str = "classification",
    delimiter: str | None = None,
    header: bool | None = None,
    max_dense_gb: float | None = None,
) -> Dataset:
    """Read a numeric delimited text file; one column holds the label, the rest are features.

    ``delimiter=None`` picks comma, semicolon or tab when the first line holds one, else any
    whitespace. ``header=None`` treats the first line as a header when a feature field in it is
    not a number. Classification labels may be numbers or strings; they are mapped to
    ``0..C-1`` in sorted order and the originals kept in ``class_names``. Lines starting with
    ``#`` are skipped. A file whose ``X`` would exceed ``max_dense_gb`` is refused
    (``check_dense_size``).
    """
    p = Path(path)
    check_file_size(p, max_dense_gb)  # also: a bad limit fails before the file is read
    rows = _csv_rows(p, delimiter)
    width = len(rows[0])
    if width < 2:
        raise InputError(
            f"{str(p)!r}: expected at least 2 columns (features and a label), found {width}; "
            "set delimiter= if the file uses an unusual separator"
        )
    if isinstance(label_column, bool) or not isinstance(label_column, int | np.integer):
        raise InputError(
            f"{str(p)!r}: label_column must be a column index (an integer; -1: the last "
            f"column), not a column name; got {label_column!r}"
        )
    if not -width <= label_column < width:
        raise InputError(
            f"{str(p)!r}: label_column {label_column} out of range for {width} columns"
        )
    lab = label_column % width
    feats = [j for j in range(width) if j != lab]
    if header is None:
        header = any(not _is_number(rows[0][j]) for j in feats)
    names = [rows[0][j] for j in feats] if header else None
    rows = rows[1:] if header else rows
    if not rows:
        raise InputError(f"{str(p)!r}: only a header line, no data")
    check_dense_size(p, len(rows), len(feats), max_dense_gb)
    X, labels = _csv_values(p, rows, feats, lab, int(bool(header)))
    y, class_names = _csv_targets(p, labels, task)
    return Dataset(
        name=name or p.stem,
        X=X,
        y=y,
        task=task,  # type: ignore[arg-type]
        class_names=class_names,
        feature_names=names,
        description=f"CSV file {p} (label column {label_column})",
    )


def _csv_rows(p: Path, delimiter: str | None) -> list[list[str]]:
    """The fields of every data line of ``p`` (blank and ``#`` lines skipped), split at
    ``delimiter`` (None: comma, semicolon or tab when the first line holds one, else any
    whitespace); ``InputError`` for an unreadable or empty file."""
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read dataset file {str(p)!r}: {exc}") from exc
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"dataset file {str(p)!r} has no data lines")
    if delimiter is None:
        delimiter = next((d for d in (",", ";", "\t") if d in lines[0]), None)
    if delimiter is None:
        return [ln.split() for ln in lines]
    return [[c.strip() for c in r]
            for r in csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter)]


def _csv_values(p: Path, rows: list[list[str]], feats: list[int], lab: int, skipped: int
                ) -> tuple[np.ndarray, list[str]]:
    """``X [N, D]`` from the feature columns ``feats`` of ``rows`` and the label fields ``[N]``
    (column ``lab``); ``InputError`` naming the line (``skipped`` header lines before them)
    of a short row or a feature that is not a number."""
    width = len(feats) + 1
    X = np.empty((len(rows), len(feats)))
    labels = []
    for i, r in enumerate(rows):
        if len(r) != width:
            raise InputError(
                f"{str(p)!r}: line {i + 1 + skipped} has {len(r)} fields, expected {width}"
            )
        for k, j in enumerate(feats):
            try:
                X[i, k] = float(r[j])
            except ValueError:
                raise InputError(
                    f"{str(p)!r}: line {i + 1 + skipped}, column {j}: feature value "
                    f"{r[j]!r} is not a number"
                ) from None
        labels.append(r[lab])
    return X, labels


def _csv_targets(p: Path, labels: list[str], task: str
                 ) -> tuple[np.ndarray, list[str] | None]:
    """Regression targets ``[N]`` as numbers (no class names), or class indices ``[N]`` and
    the sorted original labels."""
    if task != "regression":
        return encode_labels(np.array(labels))
    try:
        return np.array([float(v) for v in labels]), None
    except ValueError as exc:
        raise InputError(f"{str(p)!r}: regression targets must be numbers: {exc}") from exc


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def encode_labels(labels: Array) -> tuple[Array, list[str]]:
    """Map labels ``[N]`` (numbers or strings) to ``0..C-1`` in sorted order.

    Returns ``(y [N] int64, class_names)`` with ``class_names[c]`` the original label of ``c``.
    Numeric string labels sort by value (``"10"`` after ``"9"``).
    """
    labels = np.asarray(labels)
    if labels.dtype.kind in "US" and all(_is_number(v) for v in labels):
        labels = labels.astype(float)
    uniq, y = np.unique(labels, return_inverse=True)
    return y.astype(np.int64), [_label_str(u) for u in uniq]


def _label_str(v: Any) -> str:
    if isinstance(v, float | np.floating) and float(v).is_integer():
        return str(int(v))
    return str(v)


# --------------------------------------------------------------------------------------------
# LIBSVM
# --------------------------------------------------------------------------------------------


def load_libsvm(
    path: str | Path,
    name: str | None = None,
    task: str = "classification",
    n_features: int | None = None,
    zero_based: bool | str = "auto",
    max_dense_gb: float | None = None,
) -> Dataset:
    """Read a LIBSVM/svmlight text file (``label index:value ...``), densified to ``X [N, D]``.

    Classification labels (e.g. ``-1/+1`` or ``1..C``) are mapped to ``0..C-1`` in sorted
    order, the originals kept in ``class_names``. ``D`` is the largest feature index (or
    ``n_features``): a file whose dense ``X`` would exceed ``max_dense_gb`` is refused before it
    is densified (``check_dense_size``), so one stray index such as ``2000000000:1`` is a clear
    error naming its line rather than an allocation of terabytes; an index too large for the
    parser (``1e11``, a huge negative one) is refused the same way, as is a file larger than
    the limit. A file of comments only holds no data rows and is refused.
    """
    from sklearn.datasets import load_svmlight_file

    p = Path(path)
    name = name or p.stem
    check_file_size(p, max_dense_gb)
    try:
        Xs, labels = load_svmlight_file(str(p), n_features=n_features, zero_based=zero_based)
    except (ValueError, OSError, OverflowError, MemoryError, UnicodeDecodeError) as exc:
        raise _libsvm_error(p, exc, max_dense_gb) from None
    if Xs.shape[0] == 0:
        raise InputError(f"LIBSVM file {str(p)!r} holds no data rows (only blank lines or "
                         "comments); expected lines 'label index:value ...'")
    if 8.0 * Xs.shape[0] * Xs.shape[1] / 1e9 > dense_limit_gb(max_dense_gb):
        index, line = largest_libsvm_index(p)
        check_dense_size(p, Xs.shape[0], Xs.shape[1], max_dense_gb,
                         hint=f" (the largest feature index is {index}, on line {line}; "
                         f"{Xs.nnz} values are stored)" if Xs.nnz else "")
    X = np.asarray(Xs.toarray(), dtype=np.float64)
    if task == "regression":
        y, class_names = np.asarray(labels, dtype=np.float64), None
    else:
        y, class_names = encode_labels(labels)
    return Dataset(
        name=name,
        X=X,
        y=y,
        task=task,  # type: ignore[arg-type]
        class_names=class_names,
        description=f"LIBSVM file {p}",
    )


def _libsvm_error(p: Path, exc: BaseException, max_dense_gb: float | None) -> InputError:
    """The ``InputError`` for a LIBSVM file the parser rejected, naming the line at fault."""
    found = locate_libsvm_problem(p, max_dense_gb=max_dense_gb)
    expected = "expected lines 'label index:value ...'"
    if found is None:
        return InputError(f"{str(p)!r} is not a valid LIBSVM file ({expected}): "
                          f"{type(exc).__name__}: {exc}")
    line, problem = found
    return InputError(f"{str(p)!r} is not a valid LIBSVM file ({expected}): line {line}: "
                      f"{problem}")
