"""scikit-learn's bundled data sets (shipped with scikit-learn; no download): four
classification sets and one regression set (diabetes)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn import datasets as skd

from gpinfer.data.base import Dataset


def _from_sklearn(name: str, loader: Callable[..., object]) -> Dataset:
    bunch = loader()
    X = np.asarray(bunch.data, dtype=np.float64)  # type: ignore[attr-defined]
    y = np.asarray(bunch.target, dtype=np.int64)  # type: ignore[attr-defined]
    feature_names = getattr(bunch, "feature_names", None)
    if feature_names is None or len(feature_names) != X.shape[1]:
        feature_names = [f"x{j}" for j in range(X.shape[1])]
    class_names = [str(c) for c in getattr(bunch, "target_names", range(int(y.max()) + 1))]
    descr = str(getattr(bunch, "DESCR", "")).strip().splitlines()
    titles = (ln.strip(" *.") for ln in descr if ln.strip(" *.") and not ln.startswith(".."))
    title = next(titles, name)
    return Dataset(
        name=name,
        X=X,
        y=y,
        class_names=class_names,
        feature_names=list(feature_names),
        description=f"{title} (scikit-learn bundled copy, sklearn.datasets.load_{name})",
    )


def wine() -> Dataset:
    """UCI wine recognition: ``X [178, 13]``, 3 classes."""
    return _from_sklearn("wine", skd.load_wine)


def iris() -> Dataset:
    """Fisher's iris: ``X [150, 4]``, 3 classes."""
    return _from_sklearn("iris", skd.load_iris)


def digits() -> Dataset:
    """UCI optical digits (8x8): ``X [1797, 64]`` grey levels 0..16, 10 classes."""
    return _from_sklearn("digits", skd.load_digits)


def breast_cancer() -> Dataset:
    """Wisconsin diagnostic breast cancer: ``X [569, 30]``, 2 classes (malignant = 0)."""
    return _from_sklearn("breast_cancer", skd.load_breast_cancer)


def diabetes() -> Dataset:
    """Efron et al.'s diabetes regression set: ``X [442, 10]`` (age, sex, BMI, blood pressure,
    six serum measurements; scikit-learn's centred and scaled copy), ``y [442]`` real (disease
    progression one year after baseline)."""
    bunch = skd.load_diabetes()
    return Dataset(
        name="diabetes",
        X=np.asarray(bunch.data, dtype=np.float64),
        y=np.asarray(bunch.target, dtype=np.float64),
        task="regression",
        feature_names=list(bunch.feature_names),
        description="Diabetes progression, 442 patients x 10 baseline variables (scikit-learn "
                    "bundled copy, sklearn.datasets.load_diabetes); a regression set",
    )
