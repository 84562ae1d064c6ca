"""A run's dataset read out of core (``dataset.format=npy|parquet``,
``gpinfer.data.source_files``): its train/test split by row numbers, the chunked check and the
standardisation of the training part; ``X`` is never held in memory.

* The split: the file's own test part (``dataset.test_path`` with ``test_fraction: null``), or
  ``gpinfer.data.splits.split_rows`` on the labels (in memory, ``N`` values) with the run's
  seed: the rows a run of the same data loaded into memory puts in each part (stratified by
  class counts taken in chunks). Each part is an ``IndexedSource`` of the file's rows.
* The check and the statistics: one chunked pass over every row of the file
  (``gpinfer.data.source.scan``; a NaN or inf is an ``InputError`` naming the file's row and
  column), gathering the training rows' column statistics; the standardisation is
  ``gpinfer.out_of_core.fitted_scaler`` of those (what ``GPClassifier`` fits on a source; the
  bits of ``Standardizer().fit`` on the training rows when the file has at most ``CHUNK_ROWS``
  rows, round-off above), applied to each block read (``ScaledSource``). The training part
  carries that pass's result to the estimator (``RowSource.checked``, ``scaled_stats``), which
  therefore reads the training rows only to train.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpinfer.data.splits import Split
from gpinfer.errors import InputError

if TYPE_CHECKING:
    from gpinfer.data.source import ColumnStats, RowSource
    from gpinfer.data.source_files import SourceDataset
    from gpinfer.data.splits import Standardizer
    from gpinfer.experiment.settings import Settings

Array = np.ndarray

#: dataset keys of the in-memory path that a dataset read out of core does not take
_IN_MEMORY_ONLY = ("features", "keep_classes", "n_max")


class SourceSplit(Split["RowSource"]):
    """The parts of a dataset read out of core: ``X_train`` (``N`` rows of the file) with the
    class indices ``y_train [N]``, ``X_test`` (``N*`` rows) with ``y_test [N*]``, and the file's
    row numbers of each part (``None``: the file's own parts)."""


def load_split(s: Settings, fmt: str) -> tuple[SourceDataset, SourceSplit]:
    """The dataset of ``s`` in the out-of-core format ``fmt``, opened (nothing of ``X`` read
    but the files' headers) and split with the run's seed (see the module doc)."""
    from gpinfer.data.source_files import open_source_dataset
    from gpinfer.data.source_views import IndexedSource
    from gpinfer.data.splits import split_rows

    d = s.dataset_cfg
    given = [key for key in _IN_MEMORY_ONLY if d.get(key) is not None]
    if given or d.get("options"):
        raise InputError(
            f"dataset {s.dataset!r} is read out of core (format {fmt}): "
            f"{', '.join(f'dataset.{k}' for k in given) or 'dataset.options'} "
            "apply to files loaded into memory only; leave them null (write the columns, "
            "classes or rows you want into the files instead)")
    ds = open_source_dataset(s.dataset, d.get("path"), fmt, d.get("labels"),
                             d.get("test_path"), d.get("test_labels"))
    fraction = d.get("test_fraction")
    if fraction is None:
        if ds.X_test is None or ds.y_test is None:
            raise InputError(f"dataset {s.dataset!r} has no test part of its own: set "
                             "dataset.test_path=... or test_fraction (e.g. 0.1)")
        return ds, SourceSplit(ds.X, ds.y, ds.X_test, ds.y_test)
    if ds.X_test is not None:
        raise InputError(f"dataset {s.dataset!r}: dataset.test_path gives the test part, and "
                         f"test_fraction={fraction} would draw another: set "
                         "dataset.test_fraction=null to use the file's test part")
    train, test = split_rows(ds.y, float(fraction), s.seed, bool(d.get("stratify", True)))
    X_train, X_test = IndexedSource(ds.X, train), IndexedSource(ds.X, test)
    return ds, SourceSplit(X_train, ds.y[train], X_test, ds.y[test], X_train.index,
                           X_test.index)


def standardise(ds: SourceDataset, split: SourceSplit, standardize: bool
                ) -> tuple[RowSource, RowSource, Standardizer | None]:
    """``(X_train, X_test, standardizer)``: every row of the dataset checked in one chunked
    pass, and the parts standardised with the training rows' statistics (``standardize``;
    else as they are, ``None``)."""
    from gpinfer.data.source import scan
    from gpinfer.data.source_views import ScaledSource
    from gpinfer.out_of_core import fitted_scaler

    if split.train_index is None:  # the file's own parts
        stats = scan(ds.X, "X")
        scan(split.X_test, "X_test")
    else:
        train = np.zeros(ds.X.n_rows, dtype=bool)
        train[split.train_index] = True
        stats = scan(ds.X, "X", select=train)
    if not standardize:
        split.X_train.checked = stats
        return split.X_train, split.X_test, None
    scaler = fitted_scaler(stats)
    X_train = ScaledSource(split.X_train, scaler)
    X_train.checked = scaled_stats(stats, scaler)
    return X_train, ScaledSource(split.X_test, scaler), scaler


def scaled_stats(stats: ColumnStats, scaler: Standardizer) -> ColumnStats | None:
    """The statistics of rows that ``stats`` describes once standardised by ``scaler``
    (``ScaledSource``), handed to the estimator with them (``RowSource.checked``) so that it
    does not read every training row again: ``n``, and ``minimum`` / ``maximum`` exactly (the
    scaling is monotone), ``mean`` and ``m2`` to round-off (the run's estimator does not
    standardise again: its kernel is an object, so it reads neither). ``None`` (the estimator
    then checks the scaled rows itself) when a scaled extreme is not finite."""
    from gpinfer.data.source import ColumnStats

    mean, scale = scaler.mean_, scaler.scale_
    low, high = (stats.minimum - mean) / scale, (stats.maximum - mean) / scale
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        return None
    return ColumnStats(stats.n, (stats.mean - mean) / scale, stats.m2 / (scale * scale), low,
                       high)


def first_rows(X: Any, rows: int) -> Array:
    """The first ``rows`` rows of ``X`` (an array or a row source) as float64 ``[rows, D]``."""
    from gpinfer.data.source import RowSource

    if isinstance(X, RowSource):
        return np.array(X.rows(slice(0, min(rows, X.n_rows))), dtype=np.float64)
    return np.array(X[:rows], dtype=np.float64)
