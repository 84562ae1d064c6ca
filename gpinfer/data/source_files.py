"""Dataset files that ``gpinfer-run`` reads out of core (``dataset=file dataset.format=npy`` or
``parquet``): the inputs stay on disk as a row source (``gpinfer.data.source``), the labels
(``N`` values) are loaded.

* ``npy``: ``dataset.path`` is one ``.npy`` file, a glob of them (``/data/X_*.npy``) or a
  folder (its ``X*.npy`` files); shards are taken in name order, their rows one after the
  other. ``dataset.labels``: the labels' ``.npy`` file(s) (a path, glob or folder, read in name
  order); ``null`` takes, for each shard, the file beside it whose name has ``y`` for the
  shard name's leading ``X`` (``X_003.npy`` -> ``y_003.npy``, ``X.npy`` -> ``y.npy``).
* ``parquet``: ``dataset.path`` is a ``.parquet`` file or a folder of them; ``dataset.labels``
  names the label column (``null``: ``y``); every other column is an input and must be numeric.

``dataset.test_path`` (and ``dataset.test_labels``, by the same rules) gives the file's own test
part (with ``test_fraction: null``). Labels may be any integers, strings or integral floats;
they are encoded as class indices ``0..C-1`` in sorted order (``class_names`` keeps them).
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.data.paths import data_dir
from gpinfer.data.source import RowSource, ShardSource
from gpinfer.errors import InputError

Array = np.ndarray

__all__ = ["SOURCE_FORMATS", "SourceDataset", "open_source_dataset", "source_format"]

#: the formats read out of core (the others, npz, csv and libsvm, are loaded into memory)
SOURCE_FORMATS = ("npy", "parquet")
#: the label column of a Parquet dataset when ``dataset.labels`` is null
DEFAULT_LABEL_COLUMN = "y"


@dataclass
class SourceDataset:
    """A classification dataset whose inputs are read out of core: ``X`` (``N`` rows), the class
    indices ``y [N]`` (``0..C-1``, the narrowest signed integer type), the file's own test part
    ``X_test`` / ``y_test [N*]`` or ``None``, and the original labels ``class_names [C]``."""

    name: str
    X: RowSource
    y: Array
    X_test: RowSource | None
    y_test: Array | None
    class_names: list[str]
    description: str
    task: str = "classification"


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def source_format(path: Any, format: Any) -> str | None:
    """``"npy"`` or ``"parquet"`` when the dataset ``path`` is read out of core, ``None`` when it
    is one of the formats loaded into memory: ``format`` when given, else from the path (a
    ``.npy`` file or glob, a ``.parquet`` file, a folder holding ``X*.npy`` or ``.parquet``
    files)."""
    if format is not None:
        fmt = str(format).lower().lstrip(".")
        return fmt if fmt in SOURCE_FORMATS else None
    if path is None:
        return None
    text = str(path)
    if text.endswith(".npy"):
        return "npy"
    if text.endswith(".parquet"):
        return "parquet"
    found = _located(text)
    if found is not None and found.is_dir():
        if any(found.glob("X*.npy")):
            return "npy"
        if any(found.glob("*.parquet")):
            return "parquet"
    return None


def _located(text: str) -> Path | None:
    """``text`` as an existing path, or under the data directory for a relative one; None."""
    p = Path(text).expanduser()
    if p.exists():
        return p
    root = data_dir()
    if not p.is_absolute() and root is not None and (root / p).exists():
        return root / p
    return None


def npy_files(path: Any, what: str) -> list[Path]:
    """The ``.npy`` files that ``path`` names (one file, a glob or a folder's ``X*.npy``), in
    name order; ``InputError`` naming ``what`` when there are none."""
    text = str(path)
    if _is_glob(text):
        pattern, root = str(Path(text).expanduser()), data_dir()
        files = sorted(Path(f) for f in glob.glob(pattern))
        if not files and not Path(pattern).is_absolute() and root is not None:
            files = sorted(Path(f) for f in glob.glob(str(root / pattern)))
    else:
        found = _located(text)
        if found is None:
            raise InputError(f"{what}: {text!r} not found")
        files = sorted(found.glob("X*.npy")) if found.is_dir() else [found]
    if not files:
        raise InputError(f"{what}: no .npy file matches {text!r} (a folder needs X*.npy files)")
    return files


def _beside(shard: Path) -> Path:
    """The labels file of the shard ``shard``: its name with ``y`` for the leading ``X``."""
    if not shard.name.startswith("X"):
        raise InputError(
            f"no labels for shard {str(shard)!r}: its name does not start with X, so there is no "
            "y file beside it to take; set dataset.labels=/path/to/y.npy (or a glob of them)")
    label = shard.with_name("y" + shard.name[1:])
    if not label.is_file():
        raise InputError(f"no labels for shard {str(shard)!r}: expected {str(label)!r} beside "
                         "it, or set dataset.labels=/path/to/y.npy (or a glob of them)")
    return label


def _npy_labels(shards: list[Path], labels: Any, n: int) -> Array:
    """The labels ``[n]`` of ``shards`` from ``labels`` (None: the files beside them)."""
    files = [_beside(s) for s in shards] if labels is None else npy_files(labels, "labels")
    parts = []
    for f in files:
        try:
            part = np.load(f, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"labels {str(f)!r} is not a .npy array file: {exc}") from exc
        if part.ndim != 1:
            raise InputError(f"labels {str(f)!r} must be 1-D [N]; got shape {part.shape}")
        parts.append(part)
    y = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if y.shape[0] != n:
        raise InputError(f"the labels ({', '.join(str(f) for f in files)}) hold {y.shape[0]} "
                         f"values but X has {n} rows")
    return y


def _open_npy(path: Any, labels: Any, part: str) -> tuple[RowSource, Array]:
    """X (the shards ``path`` names) and their labels."""
    shards = npy_files(path, f"dataset {part} path")
    source = ShardSource(shards, name=f"X ({part})")
    return source, _npy_labels(shards, labels, source.n_rows)


def _open_parquet(path: Any, labels: Any, part: str) -> tuple[RowSource, Array]:
    """X (every column but the label column) and the labels of a Parquet dataset."""
    from gpinfer.data.parquet import ParquetSource

    found = _located(str(path))
    if found is None:
        raise InputError(f"dataset {part} path: Parquet dataset {str(path)!r} not found")
    column = DEFAULT_LABEL_COLUMN if labels is None else str(labels)
    import pyarrow.dataset as pds

    names = list(pds.dataset(str(found), format="parquet").schema.names)
    if column not in names:
        raise InputError(f"Parquet dataset {str(found)!r} has no label column {column!r} (its "
                         f"columns: {names}); set dataset.labels=<the label column>")
    source = ParquetSource(found, columns=[c for c in names if c != column],
                           name=f"X ({part})")
    y = source.dataset.to_table(columns=[column]).column(column)
    if y.null_count:
        raise InputError(f"label column {column!r} of {str(found)!r} has {y.null_count} "
                         "missing value(s)")
    return source, y.to_numpy(zero_copy_only=False)


def open_source_dataset(name: str, path: Any, format: str, labels: Any = None,
                        test_path: Any = None, test_labels: Any = None) -> SourceDataset:
    """The dataset ``path`` in ``format`` (``"npy"`` or ``"parquet"``, see the module doc) with
    its own test part ``test_path`` when given; nothing of ``X`` is read but the files' headers
    (the values are checked in chunks later: ``gpinfer.data.source.scan``)."""
    from gpinfer.validation import encode_labels

    if path is None or str(path).strip() == "":
        raise InputError("no dataset file given: set dataset.path=... (a .npy file, a glob of "
                         ".npy shards, a folder of X*.npy files, or a .parquet file or folder)")
    opener = {"npy": _open_npy, "parquet": _open_parquet}[format]
    X, y = opener(path, labels, "train")
    X_test = y_test = None
    if test_path is not None:
        X_test, y_test = opener(test_path, test_labels, "test")
        if X_test.n_cols != X.n_cols:
            raise InputError(f"dataset {name!r}: the test part has {X_test.n_cols} columns but "
                             f"X has {X.n_cols}")
    pooled = y if y_test is None else np.concatenate([y, y_test])
    try:
        classes, index = encode_labels(pooled)
    except InputError as exc:
        raise InputError(f"dataset {name!r}: {exc}") from exc
    if y_test is not None:
        index, test_index = index[:y.shape[0]], index[y.shape[0]:]
    return SourceDataset(name=name, X=X, y=index, X_test=X_test,
                         y_test=None if y_test is None else test_index,
                         class_names=[str(c) for c in classes],
                         description=f"{format} dataset {X.describe()}")
