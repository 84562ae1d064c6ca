"""Train/test splits (the papers' protocols) and standardisation fitted on the training part."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from gpinfer.data.base import Dataset
from gpinfer.errors import InputError

Array = np.ndarray


class _Rows(Protocol):
    """Inputs with a shape ``(N, D)``: an array, or a row source read out of core."""

    @property
    def shape(self) -> tuple[int, ...]: ...


#: the inputs of a split: arrays (``train_test_split``), or row sources
#: (``gpinfer.experiment.source_data.SourceSplit``)
XT = TypeVar("XT", bound=_Rows)


@dataclass
class Split(Generic[XT]):
    """A train/test split: ``X_train [N, D]``, ``y_train [N]``, ``X_test [N*, D]``, ``y_test [N*]``.

    ``train_index`` / ``test_index`` give the rows of the pooled data (``X`` then ``X_test`` of
    the dataset) that went to each part; ``None`` for the dataset's standard split.
    """

    X_train: XT
    y_train: Array
    X_test: XT
    y_test: Array
    train_index: Array | None = None
    test_index: Array | None = None

    @property
    def n_train(self) -> int:
        return int(self.X_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.X_test.shape[0])


def train_test_split(
    ds: Dataset, test_fraction: float | None = 0.1, seed: int = 0, stratify: bool = True
) -> Split[Array]:
    """Split ``ds`` into train and test parts.

    * ``test_fraction=None``: the dataset's own standard split (``InputError`` if it has none).
    * else a random split of the pooled rows (``X`` and, if present, ``X_test``) with
      ``round(test_fraction * N)`` test rows (at least 1, leaving at least 1 for training);
      ``stratify`` keeps class proportions (classification only) by largest remainders.

    The same ``seed`` gives the same split; rows keep their original order within each part.
    """
    if test_fraction is None:
        if ds.X_test is None or ds.y_test is None:
            raise InputError(
                f"dataset {ds.name!r} has no standard test split; give test_fraction "
                "(e.g. 0.1) for a random split"
            )
        return Split(ds.X, ds.y, ds.X_test, ds.y_test)
    X, y = _pooled(ds)
    train_index, test_index = split_rows(y, float(test_fraction), seed,
                                         stratify and ds.task == "classification")
    return Split(
        X[train_index], y[train_index], X[test_index], y[test_index], train_index, test_index
    )


def split_rows(y: Array, test_fraction: float, seed: int, stratify: bool) -> tuple[Array, Array]:
    """The row numbers ``(train [N - N*], test [N*])`` of a random split of the labels ``y [N]``
    (each part in increasing row order), as ``train_test_split`` draws them: ``N* =
    round(test_fraction * N)`` (at least 1, leaving at least 1), the draws seeded by ``seed``;
    ``stratify`` (class indices ``y``) keeps the class proportions by largest remainders, from
    class counts taken in chunks. Only ``y`` is read, so it also splits a source's rows."""
    test_index = _test_rows(y, test_fraction, seed, stratify)
    mask = np.zeros(len(y), dtype=bool)
    mask[test_index] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def repeated_splits(
    ds: Dataset,
    n_repeats: int,
    test_fraction: float | None = 0.1,
    seed: int = 1,
    stratify: bool = True,
) -> Iterator[Split]:
    """``n_repeats`` random splits; split ``r`` (0-based) uses seed ``seed + r``.

    The default ``seed=1`` gives the seeds 1..20 of the ep-sep-multiclass protocol (spec P19)
    for ``n_repeats=20``. Each split equals ``train_test_split(ds, test_fraction, seed + r)``.
    """
    if not isinstance(n_repeats, int | np.integer) or n_repeats < 1:
        raise InputError(f"n_repeats must be a positive integer, got {n_repeats!r}")
    for r in range(int(n_repeats)):
        yield train_test_split(ds, test_fraction, seed + r, stratify)


def _pooled(ds: Dataset) -> tuple[Array, Array]:
    if ds.X_test is None or ds.y_test is None:
        return ds.X, ds.y
    return np.concatenate([ds.X, ds.X_test]), np.concatenate([ds.y, ds.y_test])


def _test_rows(y: Array, fraction: float, seed: int, stratify: bool) -> Array:
    """Indices of the test rows, ``[round(fraction * N)]``."""
    n = len(y)
    if not 0.0 < fraction < 1.0:
        raise InputError(f"test_fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise InputError(f"cannot split {n} row(s) into train and test parts")
    n_test = int(min(max(round(fraction * n), 1), n - 1))
    rng = np.random.default_rng(seed)
    if not stratify:
        return rng.permutation(n)[:n_test]
    classes, counts = _class_counts(y)
    quota = counts * n_test / n
    take = np.floor(quota).astype(int)
    spare = n_test - take.sum()
    # largest remainders first; ties broken at random so no class is systematically favoured
    order = np.lexsort((rng.random(len(classes)), -(quota - take)))
    take[order[:spare]] += 1
    rows = []
    for c, k in zip(classes, take):
        idx = np.flatnonzero(y == c)
        rows.append(rng.permutation(idx)[:k])
    return np.concatenate(rows)


def _class_counts(y: Array) -> tuple[Array, Array]:
    """The classes present in ``y [N]`` (sorted) and their counts, as ``np.unique(y,
    return_counts=True)`` gives them; for class indices (integers in ``0..max(N, 65536)``)
    from counts taken in chunks (``gpinfer.validation.class_counts``), without sorting all of
    ``y``."""
    if (y.dtype.kind not in "iu" or y.size == 0 or int(y.min()) < 0
            or int(y.max()) > max(y.size, 1 << 16)):
        return np.unique(y, return_counts=True)
    from gpinfer.validation import class_counts

    counts = class_counts(y, int(y.max()) + 1)
    classes = np.flatnonzero(counts)
    return classes.astype(y.dtype), counts[classes]


class Standardizer:
    """Per-feature affine map ``(X - mean_) / scale_``, fitted on training inputs only.

    ``with_mean=False`` leaves ``mean_ = 0``; ``with_std=False`` leaves ``scale_ = 1``.
    Constant columns (max == min on the training data) get ``scale_ = 1``.
    """

    def __init__(self, with_mean: bool = True, with_std: bool = True):
        self.with_mean = with_mean
        self.with_std = with_std

    def fit(self, X: Array, sample_weight: Array | None = None) -> Standardizer:
        """Fit ``mean_ [D]`` and ``scale_ [D]`` (population std) on ``X [N, D]``.

        ``sample_weight [N]`` (non-negative, not all zero): the weighted mean and population
        std, so that a row of integer weight ``k`` counts as the row repeated ``k`` times (as
        an estimator's ``sample_weight`` does)."""
        X = _as_2d(X, "X")
        if X.shape[0] < 1:
            raise InputError("cannot fit a Standardizer on zero rows")
        w = None
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
            if w.shape[0] != X.shape[0]:
                raise InputError(f"sample_weight has {w.shape[0]} entries for {X.shape[0]} rows")
            if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
                raise InputError("sample_weight must be finite, non-negative and not all zero")
            if np.all(w == w[0]):
                w = None  # equal weights: the plain statistics, bit for bit
        d = X.shape[1]
        mean = X.mean(axis=0) if w is None else np.average(X, axis=0, weights=w)
        self.mean_ = mean if self.with_mean else np.zeros(d)
        scale = np.ones(d)
        if self.with_std:
            if w is None:
                std = X.std(axis=0)
            else:
                std = np.sqrt(np.average((X - mean) ** 2, axis=0, weights=w))
            constant = np.ptp(X if w is None else X[w > 0], axis=0) == 0
            scale = np.where(constant | (std == 0), 1.0, std)
        self.scale_ = scale
        return self

    def _check(self, X: Array) -> Array:
        if not hasattr(self, "mean_"):
            raise InputError("Standardizer is not fitted; call fit(X_train) first")
        X = _as_2d(X, "X")
        if X.shape[1] != self.mean_.shape[0]:
            raise InputError(
                f"Standardizer was fitted on {self.mean_.shape[0]} features, got {X.shape[1]}"
            )
        return X

    def transform(self, X: Array) -> Array:
        """``(X - mean_) / scale_`` for ``X [N, D]`` (a new array)."""
        return (self._check(X) - self.mean_) / self.scale_

    def inverse_transform(self, Xs: Array) -> Array:
        """``Xs * scale_ + mean_``: undo ``transform``."""
        return self._check(Xs) * self.scale_ + self.mean_

    def fit_transform(self, X: Array) -> Array:
        return self.fit(X).transform(X)


def standardize(
    split: Split, with_mean: bool = True, with_std: bool = True
) -> tuple[Split, Standardizer]:
    """Standardise a split with statistics of its training inputs only; returns the new split."""
    st = Standardizer(with_mean, with_std).fit(split.X_train)
    return replace(
        split, X_train=st.transform(split.X_train), X_test=st.transform(split.X_test)
    ), st


def _as_2d(X: Array, label: str) -> Array:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InputError(f"{label} must be 2-D [N, D], got shape {X.shape}")
    return X
