"""Datasets: registered generators and loaders, data-directory files, splits and mini-batches.

``load_dataset(name, **options)`` finds ``name`` among the registered ``gpinfer.datasets``
entry points (built-ins: waveform, synthetic2d, wine, iris, digits, breast_cancer, file), else
as ``<data_dir>/<name>.npz`` (dashes and underscores interchangeable, case-insensitive).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer import registry
from gpinfer.data.base import Dataset
from gpinfer.data.files import load_file
from gpinfer.data.minibatch import MiniBatches, open_memmap_dataset, stream_batches
from gpinfer.data.paths import DATA_DIR_ENV, data_dir, data_files
from gpinfer.data.splits import (
    Split,
    Standardizer,
    repeated_splits,
    standardize,
    train_test_split,
)
from gpinfer.errors import InputError, UnknownNameError

__all__ = [
    "Dataset",
    "MiniBatches",
    "Split",
    "Standardizer",
    "data_dir",
    "data_files",
    "load_dataset",
    "load_file",
    "open_memmap_dataset",
    "repeated_splits",
    "select",
    "standardize",
    "stream_batches",
    "train_test_split",
]

#: options ``load_dataset`` handles itself for every dataset
GENERIC_OPTIONS = ("keep_classes", "features", "n_max", "subsample_seed")


def load_dataset(
    name: str,
    *,
    keep_classes: Sequence[int] | None = None,
    features: Sequence[int] | None = None,
    n_max: int | None = None,
    subsample_seed: int = 0,
    **options: Any,
) -> Dataset:
    """Load the dataset ``name`` and apply the generic selections.

    Lookup: a registered ``gpinfer.datasets`` entry point (called with ``options``, e.g.
    ``n``/``seed`` for generators or ``path`` for ``file``); else ``<data_dir>/<name>.npz``
    (``new-thyroid`` finds ``new_thyroid.npz``); else ``UnknownNameError`` listing the
    registered datasets and the data files, nearest first.

    Generic options (any dataset): ``keep_classes`` keeps those classes and re-indexes them
    ``0..len-1`` in the given order; ``features`` keeps those columns; ``n_max`` keeps a random
    subset of at most ``n_max`` training rows (seeded by ``subsample_seed``; the test split is
    kept whole).
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"dataset name must be a non-empty string, got {name!r}")
    if name in registry.names(registry.DATASETS):
        factory = registry.load(registry.DATASETS, name)
        ds = _call_factory(name, factory, options)
    else:
        path = _find_data_file(name)
        ds = load_file(path, format="npz", name=name, **options)
    return select(
        ds, keep_classes=keep_classes, features=features, n_max=n_max, seed=subsample_seed
    )


def _call_factory(name: str, factory: Callable[..., Any], options: dict[str, Any]) -> Dataset:
    if not callable(factory):
        raise InputError(f"dataset entry point {name!r} is not callable: {factory!r}")
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        accepted = [p for p in sig.parameters if p not in ("self", "cls")]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise InputError(
                f"dataset {name!r} got unknown option(s) {unknown}; it accepts "
                f"{', '.join(accepted) or 'no options'} plus the generic "
                f"{', '.join(GENERIC_OPTIONS)}"
            )
    if sig is not None:
        missing = [
            p.name
            for p in sig.parameters.values()
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in options
        ]
        if missing:
            raise InputError(
                f"dataset {name!r} needs option(s) {missing} "
                f"(e.g. dataset.{missing[0]}=... on the command line)"
            )
    ds = factory(**options)
    if not isinstance(ds, Dataset):
        raise InputError(
            f"dataset entry point {name!r} returned {type(ds).__name__}, not a gpinfer Dataset"
        )
    return ds


def _find_data_file(name: str) -> Path:
    root = data_dir()
    files = data_files(root)
    wanted = {v.lower() for v in (name, name.replace("-", "_"), name.replace("_", "-"))}
    for stem in files:
        if stem.lower() in wanted:
            return root / f"{stem}.npz"  # type: ignore[operator]
    registered = registry.names(registry.DATASETS)
    known = registered + [f for f in files if f not in registered]
    close = registry.nearest(name.replace("-", "_"), known)
    msg = f"unknown dataset {name!r}"
    if close:
        msg += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    msg += f" Registered datasets: {', '.join(registered) or 'none'}."
    if root is None:
        msg += f" No data directory found (set {DATA_DIR_ENV} to the folder of .npz files)."
    else:
        msg += f" Files in {root}: {', '.join(files) or 'none'}."
    raise UnknownNameError(msg)


def select(
    ds: Dataset,
    keep_classes: Sequence[int] | None = None,
    features: Sequence[int] | None = None,
    n_max: int | None = None,
    seed: int = 0,
) -> Dataset:
    """A new ``Dataset`` restricted to some classes, columns and at most ``n_max`` training rows
    (``keep_classes`` and ``features``: lists of integer indices, ``InputError`` otherwise)."""
    if keep_classes is not None:
        ds = _keep_classes(ds, _indices(ds, keep_classes, "keep_classes", "class indices"))
    if features is not None:
        ds = _keep_features(ds, _indices(ds, features, "features", "column indices"))
    if n_max is not None:
        if not isinstance(n_max, int | np.integer) or n_max < 1:
            raise InputError(
                f"dataset {ds.name!r}: n_max must be a positive integer, got {n_max!r}"
            )
        if ds.n > n_max:
            rows = np.sort(np.random.default_rng(seed).choice(ds.n, size=int(n_max), replace=False))
            ds = replace(ds, X=ds.X[rows], y=ds.y[rows], extras={})
    return ds


def _indices(ds: Dataset, values: Any, key: str, what: str) -> list[int]:
    """``values`` as a list of ints (``InputError`` naming ``key`` for a string, a scalar, a
    bool or a float, which ``int()`` would misread or truncate)."""
    try:  # one dimension: a list, tuple or array (a string, a scalar or a set has none)
        flat = np.ndim(values) == 1
    except ValueError:  # ragged nesting
        flat = False
    if not flat or any(
        isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Integral)
        for v in values
    ):
        raise InputError(
            f"dataset {ds.name!r}: {key} must be a list of {what} (integers), e.g. "
            f"{key}=[0,1]; got {values!r}"
        )
    return [int(v) for v in values]


def _keep_classes(ds: Dataset, keep: list[int]) -> Dataset:
    if ds.task != "classification":
        raise InputError(f"dataset {ds.name!r}: keep_classes applies to classification only")
    C = ds.n_classes
    bad = [c for c in keep if not 0 <= c < C]
    if bad or not keep or len(set(keep)) != len(keep):
        raise InputError(
            f"dataset {ds.name!r}: keep_classes {keep} must be distinct class indices in 0..{C - 1}"
        )
    new_label = np.full(C, -1, dtype=np.int64)
    new_label[keep] = np.arange(len(keep))

    def part(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = new_label[y] >= 0
        return X[m], new_label[y[m]]

    X, y = part(ds.X, ds.y)
    X_test = y_test = None
    if ds.X_test is not None and ds.y_test is not None:
        X_test, y_test = part(ds.X_test, ds.y_test)
    names = [ds.class_names[c] for c in keep] if ds.class_names is not None else None
    return replace(
        ds,
        X=X,
        y=y,
        X_test=X_test,
        y_test=y_test,
        class_names=names,
        extras={},
        description=ds.description + f" [classes {keep} kept]",
    )


def _keep_features(ds: Dataset, cols: list[int]) -> Dataset:
    D = ds.n_features
    bad = [j for j in cols if not -D <= j < D]
    if bad or not cols:
        raise InputError(
            f"dataset {ds.name!r}: features {cols} must be column indices in 0..{D - 1}"
        )
    X_test = ds.X_test[:, cols] if ds.X_test is not None else None
    names = [ds.feature_names[j] for j in cols] if ds.feature_names is not None else None
    return replace(ds, X=ds.X[:, cols], X_test=X_test, feature_names=names)
