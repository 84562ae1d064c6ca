"""scikit-learn's bundled sets load as Datasets (no download)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.data import load_dataset
from gpinfer.data.bundled import breast_cancer, digits, iris, wine


@pytest.mark.parametrize(
    "loader, shape, n_classes",
    [
        (wine, (178, 13), 3),
        (iris, (150, 4), 3),
        (digits, (1797, 64), 10),
        (breast_cancer, (569, 30), 2),
    ],
)
def test_bundled_sets_load(loader, shape, n_classes):
    ds = loader()
    assert ds.X.shape == shape and ds.X.dtype == np.float64
    assert ds.n_classes == n_classes and len(ds.class_names) == n_classes
    assert len(ds.feature_names) == shape[1]
    assert ds.X_test is None and ds.description


def test_bundled_sets_via_registry():
    ds = load_dataset("iris")
    assert ds.name == "iris" and ds.class_names == ["setosa", "versicolor", "virginica"]
    assert np.bincount(ds.y).tolist() == [50, 50, 50]
