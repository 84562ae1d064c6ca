"""Shared kernel set-up of the inducing-point methods (spec ep-sep §2.11, P18)."""

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Sum
from gpinfer.kernels.initialisation import leaf_kernels, median_distance, prepare_kernel


def test_median_distance_matches_brute_force_and_subsets():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    d = [np.linalg.norm(X[i] - X[j]) for i in range(40) for j in range(i + 1, 40)]
    assert median_distance(X, rng) == pytest.approx(np.median(d), rel=1e-12)
    sub = median_distance(X, np.random.default_rng(1), subset=10)
    assert sub != pytest.approx(np.median(d), rel=1e-6)  # a subset of 10 rows was used
    assert median_distance(np.zeros((5, 2)), rng) == 1.0
    assert median_distance(X[:1], rng) == 1.0


def test_prepare_kernel_adds_noise_once_and_sets_squared_lengthscale():
    X = np.random.default_rng(2).standard_normal((30, 2))
    k = prepare_kernel(RBF(lengthscale=[1.0, 2.0]), X, 0.5, "median")
    parts = leaf_kernels(k)
    assert [type(p).__name__ for p in parts] == ["RBF", "White"]
    med = median_distance(X, np.random.default_rng(0))
    np.testing.assert_allclose(parts[0].describe()["lengthscale"], [np.sqrt(med)] * 2)
    assert parts[1].describe()["variance"] == pytest.approx(0.5)
    # a kernel that has a white term keeps it (no second one), "kernel" keeps length-scales
    k2 = prepare_kernel(Sum([RBF(lengthscale=3.0), White(0.1)]), X, 1.0, "kernel")
    assert [type(p).__name__ for p in leaf_kernels(k2)] == ["RBF", "White"]
    assert leaf_kernels(k2)[0].describe()["lengthscale"] == pytest.approx(3.0)
    assert prepare_kernel(RBF(), X, None, "kernel") is not None


def test_prepare_kernel_rejects_unknown_initialisation():
    with pytest.raises(InputError, match=r"svi: lengthscale_init must be one of"):
        prepare_kernel(RBF(), np.zeros((3, 1)), None, "nope", owner="svi")
