"""The estimators' path for inputs out of core (``gpinfer.data.source``): a ``numpy.memmap``,
a list of ``.npy`` shards, a Parquet dataset or any ``RowSource`` given as ``X``.

``X`` is never held in memory as one array. ``fit`` checks it in chunks (each read once) while
gathering float64 column statistics, standardises from those statistics, and hands the method a
``SourceRows`` that reads, casts and scales each mini-batch; class counts and validation splits
come from ``y`` (in memory: ``N`` values). The median heuristic reads at most ``MEDIAN_SUBSET``
rows and k-means inducing inputs at most ``KMEANS_SUBSET`` (fixed subsamples drawn by
``np.random.default_rng(0)``, ``gpinfer.data.source.sample_rows``). ``predict_proba`` and
``predict_f`` work in chunks of ``PREDICT_CHUNK`` rows. Only methods that declare
``supports_out_of_core`` (sep, ep and svi in mini-batch mode) accept such inputs.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from gpinfer.data.source import (
    CHUNK_ROWS,
    ColumnStats,
    RowSource,
    SourceRows,
    checked_block,
    scan,
)
from gpinfer.errors import InputError

if TYPE_CHECKING:
    from gpinfer.data.splits import Standardizer
    from gpinfer.interfaces import Method
    from gpinfer.training.distributed import Group

Array = np.ndarray

#: rows per chunk at prediction (bounded memory: ``PREDICT_CHUNK x M`` kernel matrices)
PREDICT_CHUNK = CHUNK_ROWS


def checked_inputs(source: RowSource, y: Any) -> tuple[SourceRows, Array, ColumnStats]:
    """``X`` from ``source`` (unscaled, float64 per batch), the labels ``y [N]`` (1-D, in
    memory) and the column statistics of ``X``, after the chunked check (``scan``; the
    source's own ``checked`` statistics where a caller already checked it); ``InputError``
    when ``y`` has another length."""
    from gpinfer.validation import _labels_1d

    y = _labels_1d(y)
    if y.shape[0] != source.n_rows:
        raise InputError(
            f"X and y have inconsistent numbers of samples: X has {source.n_rows} rows, "
            f"y has {y.shape[0]} labels")
    stats = scan(source, "X") if source.checked is None else source.checked
    return SourceRows(source), y, stats


def check_out_of_core(method_cls: type[Method], name: str, batch_size: Any, n: int,
                      task: str = "classification") -> None:
    """``InputError`` unless ``method_cls`` trains from an out-of-core ``X`` (``supports_out_of
    _core``) with mini-batches (``batch_size`` set and, when an int, below ``N = n``; its type
    and sign are ``check_method_compatible``'s), naming the methods for ``task`` that do. The
    estimators call it before the chunked check, which reads every row."""
    from gpinfer import registry

    def streams(m: type[Method]) -> bool:
        tasks = (m.tasks,) if isinstance(m.tasks, str) else tuple(m.tasks)
        return bool(getattr(m, "supports_out_of_core", False)) and task in tasks

    if not getattr(method_cls, "supports_out_of_core", False):
        alts = ", ".join(registry.methods_supporting(streams)) or "(none installed)"
        raise InputError(
            f"method {name!r} needs all of X in memory at once, but X is given out of core "
            f"(a memmap, .npy shards or Parquet); use a mini-batch method with batch_size: "
            f"{alts}; or load X into memory (np.asarray) for {name!r}")
    whole = (isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool)
             and int(batch_size) >= n)
    if batch_size is None or whole:
        raise InputError(
            f"X is given out of core, so {name!r} must train on mini-batches: set batch_size "
            f"to a positive int below N={n} (got batch_size={batch_size!r})")


def check_group_shards(source: RowSource, group: Group | None) -> None:
    """``InputError`` when a process group (``torchrun``) has more ranks than ``source`` has
    shards (``RowSource.shard_count``: ``.npy`` shards, Parquet files; a single array has no
    shard count and is not checked). Which rows a rank reads does not depend on the shards
    (``gpinfer.training.distributed.Group.rows``: its part of every global batch, from any
    shard); a data-parallel dataset is laid out with at least one shard per rank, and a launch
    with more ranks than shards is refused before training as a job on the wrong data or with
    the wrong rank count."""
    shards = source.shard_count
    if group is None or shards is None or group.size <= shards:
        return
    raise InputError(
        f"torchrun started {group.size} ranks but X ({source.describe()}) has {shards} "
        f"shard(s): a data-parallel fit needs at least one shard per rank; write the rows into "
        f"at least {group.size} shards (e.g. numpy.array_split, one .npy file each) or launch "
        f"at most {shards} rank(s) (torchrun --nproc-per-node {shards})")


def check_unit_weights(weights: Array | None) -> None:
    """``InputError`` for per-row weights (other than all one) with an out-of-core ``X``."""
    if weights is not None and not np.all(weights == 1.0):
        raise InputError(
            "sample_weight other than all ones is not supported with an out-of-core X (a "
            "memmap, .npy shards or Parquet); drop the weighted rows or load X into memory")


def scaled_rows(X: SourceRows, stats: ColumnStats, scaler: Standardizer | None) -> SourceRows:
    """``X`` standardised by ``scaler`` (None: as it is), its ``stats`` kept."""
    out = X if scaler is None else SourceRows(X.source, X.index, scaler.mean_, scaler.scale_)
    out.stats = stats
    return out


def fitted_scaler(stats: ColumnStats) -> Standardizer:
    """The ``Standardizer`` of the rows ``stats`` describe: equal to ``Standardizer().fit(X)``
    (bit for bit when ``scan`` read one chunk)."""
    from gpinfer.data.splits import Standardizer

    scaler = Standardizer()
    scaler.mean_ = stats.mean
    std = stats.std
    scaler.scale_ = np.where((stats.maximum - stats.minimum == 0) | (std == 0), 1.0, std)
    return scaler


def start_lengthscale(X: SourceRows) -> float:
    """``standardised_lengthscale`` of the scaled rows ``X`` from their statistics: a column
    varies when its scaled maximum exceeds its scaled minimum (the scaling is monotone, so
    these are the scaled column's extremes exactly)."""
    stats = X.stats
    if stats is None:
        raise ValueError("start_lengthscale needs the rows' ColumnStats")
    hi, lo = stats.maximum, stats.minimum
    if X.mean is not None:
        hi, lo = (hi - X.mean) / X.scale, (lo - X.mean) / X.scale
    varying = int(np.count_nonzero(hi - lo > 0)) if X.shape[0] > 1 else 0
    return float(np.sqrt(max(varying, 2) / 2.0))


def take_rows(X: Any, rows: Any) -> Any:
    """``X[rows]``, lazily (``SourceRows.subset``) for inputs out of core."""
    return X.subset(rows) if isinstance(X, SourceRows) else X[rows]


def predicted_chunks(source: RowSource, n_features: int, scaler: Standardizer | None,
                     predict: Callable[[Array], Any]) -> Iterator[Any]:
    """``predict(rows)`` on consecutive checked, scaled float64 chunks ``[b, D]`` of
    ``source`` (at most ``PREDICT_CHUNK`` rows each, each read once); ``InputError`` for
    another number of features or a NaN/inf (named by its global row)."""
    if source.n_cols != n_features:
        raise InputError(f"X has {source.n_cols} features, but the model is expecting "
                         f"{n_features} features as input")
    for start, raw in source.chunks(PREDICT_CHUNK):
        block = checked_block(raw, start, source)
        yield predict(block if scaler is None else scaler.transform(block))
