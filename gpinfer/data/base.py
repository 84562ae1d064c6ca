"""The one dataset type every loader and generator returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gpinfer.errors import InputError

Array = np.ndarray


@dataclass
class Dataset:
    """A dataset: ``X [N, D]`` float64 inputs, ``y [N]`` targets, optionally a standard test split.

    * ``y``: int64 class indices ``0..C-1`` for classification, float64 for regression.
    * ``X_test [N*, D]``, ``y_test [N*]``: the source's standard test split, or ``None``.
    * ``class_names[c]``: the original label of class ``c`` (``None`` when unknown).
    * ``feature_names``: one name per column of ``X`` (``None`` when unknown).
    * ``extras``: further named arrays (e.g. the latent functions of a generator), not validated.

    Construction validates: 2-D finite ``X``, 1-D ``y`` of matching length, integer labels
    ``>= 0`` for classification, test arrays with the same number of columns. Problems raise
    ``InputError`` naming the dataset.
    """

    name: str
    X: Array
    y: Array
    X_test: Array | None = None
    y_test: Array | None = None
    task: Literal["classification", "regression"] = "classification"
    class_names: list[str] | None = None
    feature_names: list[str] | None = None
    description: str = ""
    extras: dict[str, Array] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise InputError(
                f"dataset {self.name!r}: task must be 'classification' or 'regression', "
                f"got {self.task!r}"
            )
        self.X, self.y = self._check_pair(self.X, self.y, "X", "y")
        if (self.X_test is None) != (self.y_test is None):
            raise InputError(
                f"dataset {self.name!r}: X_test and y_test must be given together "
                f"(got X_test={'set' if self.X_test is not None else None}, "
                f"y_test={'set' if self.y_test is not None else None})"
            )
        if self.X_test is not None:
            assert self.y_test is not None  # given together (checked above)
            self.X_test, self.y_test = self._check_pair(
                self.X_test, self.y_test, "X_test", "y_test"
            )
            if self.X_test.shape[1] != self.X.shape[1]:
                raise InputError(
                    f"dataset {self.name!r}: X has {self.X.shape[1]} columns but X_test has "
                    f"{self.X_test.shape[1]}"
                )
        if self.feature_names is not None:
            self.feature_names = [str(f) for f in self.feature_names]
            if len(self.feature_names) != self.X.shape[1]:
                raise InputError(
                    f"dataset {self.name!r}: {len(self.feature_names)} feature names for "
                    f"{self.X.shape[1]} columns of X"
                )
        if self.class_names is not None:
            self.class_names = [str(c) for c in self.class_names]
            if self.task == "classification" and len(self.class_names) < self.n_classes:
                raise InputError(
                    f"dataset {self.name!r}: {len(self.class_names)} class names but labels "
                    f"go up to {self.n_classes - 1}"
                )

    def _check_pair(self, X: Array, y: Array, xname: str, yname: str) -> tuple[Array, Array]:
        X = np.asarray(X)
        y = np.asarray(y)
        if X.ndim != 2:
            raise InputError(
                f"dataset {self.name!r}: {xname} must be 2-D [N, D], got shape {X.shape}"
            )
        if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
            raise InputError(f"dataset {self.name!r}: {xname} must be real numbers, got {X.dtype}")
        X = X.astype(np.float64, copy=False)
        if not np.all(np.isfinite(X)):
            bad = np.argwhere(~np.isfinite(X))
            raise InputError(
                f"dataset {self.name!r}: {xname} has {len(bad)} non-finite value(s) "
                f"(first at row {bad[0][0]}, column {bad[0][1]})"
            )
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise InputError(
                f"dataset {self.name!r}: {yname} must be 1-D with one entry per row of {xname} "
                f"({X.shape[0]}), got shape {y.shape}"
            )
        if self.task == "classification":
            if y.size and not np.issubdtype(y.dtype, np.integer):
                if (
                    not np.issubdtype(y.dtype, np.number)
                    or not np.all(np.isfinite(y))
                    or not (np.all(y == np.round(y)))
                ):
                    raise InputError(
                        f"dataset {self.name!r}: classification labels {yname} must be integers "
                        f"0..C-1, got dtype {y.dtype}"
                    )
            y = y.astype(np.int64, copy=False)
            if y.size and y.min() < 0:
                raise InputError(
                    f"dataset {self.name!r}: labels {yname} must be 0..C-1, found {int(y.min())}"
                )
        else:
            y = y.astype(np.float64, copy=False)
            if not np.all(np.isfinite(y)):
                raise InputError(f"dataset {self.name!r}: targets {yname} have non-finite values")
        return X, y

    # -- sizes -------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of (training) rows ``N``."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of input dimensions ``D``."""
        return int(self.X.shape[1])

    @property
    def n_classes(self) -> int:
        """Number of classes ``C`` (0 for regression): ``len(class_names)`` or ``max label + 1``."""
        if self.task != "classification":
            return 0
        top = int(self.y.max()) + 1 if self.y.size else 0
        if self.y_test is not None and self.y_test.size:
            top = max(top, int(self.y_test.max()) + 1)
        if self.class_names is not None:
            return max(top, len(self.class_names))
        return top

    @property
    def has_test_split(self) -> bool:
        """Whether the source provides a standard test split."""
        return self.X_test is not None

    def class_counts(self, test: bool = False) -> Array:
        """Number of points per class ``[C]`` in the training (or test) part."""
        y = self.y_test if test else self.y
        if y is None:
            raise InputError(f"dataset {self.name!r} has no test split")
        return np.bincount(y, minlength=self.n_classes)

    def __repr__(self) -> str:
        test = f", n_test={self.X_test.shape[0]}" if self.X_test is not None else ""
        return (
            f"Dataset({self.name!r}, n={self.n}, d={self.n_features}, "
            f"C={self.n_classes}{test}, task={self.task!r})"
        )
