"""``gpinfer.inducing``: the one rule for starting inducing inputs (``initial_inducing``, used by
ep, sep, gfitc, svi, the vi-jj family and pep) and K-means inducing inputs. (The covariances at
fixed inputs are ``gpinfer.kernels.fixed``: ``tests/kernels/test_fixed.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.inducing import (
    DEFAULT_M,
    inducing_inputs,
    initial_inducing,
    kmeans_inducing,
)


def test_kmeans_inducing_inputs():
    """Well-separated clusters: the centres land on the cluster means; duplicates dropped."""
    rng = np.random.default_rng(0)
    means = np.array([[-5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
    X = np.concatenate([m + 0.1 * rng.normal(size=(50, 2)) for m in means])
    Z = kmeans_inducing(X, 3, np.random.default_rng(1))
    assert Z.shape == (3, 2)
    order = np.argsort(Z[:, 0] + 0.1 * Z[:, 1])
    np.testing.assert_allclose(Z[order], means[np.argsort(means[:, 0] + 0.1 * means[:, 1])],
                               atol=0.05)
    Zd = kmeans_inducing(np.repeat(X[:2], 10, axis=0), 5, np.random.default_rng(1))
    assert len(Zd) <= 2


@pytest.mark.parametrize("M", [30, 50, 60])
def test_kmeans_on_duplicated_rows_gives_the_distinct_rows(M):
    """Issue 27: 30 distinct rows twice and M >= 30: k-means++ ran out of points to draw and
    returned NaN centres (vfe then ran its sites for minutes); M == N returned the duplicates."""
    X = np.random.default_rng(0).normal(size=(30, 2))
    Z = kmeans_inducing(np.vstack([X, X]), M, np.random.default_rng(1))
    assert np.all(np.isfinite(Z))
    np.testing.assert_array_equal(Z, np.unique(X, axis=0))


def test_inducing_inputs_spec():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    Z = np.zeros((4, 2))
    np.testing.assert_array_equal(inducing_inputs(Z, X, rng), Z)
    assert inducing_inputs(5, X, np.random.default_rng(0)).shape[0] <= 5
    with pytest.raises(InputError):
        inducing_inputs(np.zeros((4, 3)), X, rng)


def _X(n: int = 80, d: int = 3) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, d))


def test_default_M_capped_at_N_and_random_rows_per_latent():
    X = _X(30)
    Zs = initial_inducing(None, X, np.random.default_rng(1), n_latent=3)
    assert len(Zs) == 3 and all(Z.shape == (min(DEFAULT_M, 30), 3) for Z in Zs)
    for Z in Zs:  # distinct training inputs
        assert len(np.unique(Z, axis=0)) == Z.shape[0]
        assert all((X == z).all(axis=1).any() for z in Z)
    Zs = initial_inducing(None, _X(200), np.random.default_rng(1), n_latent=2)
    assert Zs[0].shape[0] == DEFAULT_M and not np.array_equal(Zs[0], Zs[1])


def test_kmeans_centres_are_shared_and_arrays_are_copied():
    X = _X()
    Zs = initial_inducing(7, X, np.random.default_rng(2), n_latent=2, init="kmeans")
    np.testing.assert_array_equal(Zs[0], Zs[1])
    assert Zs[0] is not Zs[1] and Zs[0].shape[1] == 3
    given = X[:4].copy()
    Zs = initial_inducing(given, X, np.random.default_rng(2), n_latent=2)
    np.testing.assert_array_equal(Zs[1], given)
    Zs[1][0, 0] = 99.0
    assert given[0, 0] != 99.0
    # any array-like [M, D] is an array of inputs (a nested list too), not a count
    Zs = initial_inducing(given.tolist(), X, np.random.default_rng(2), n_latent=1)
    np.testing.assert_array_equal(Zs[0], given)


@pytest.mark.parametrize("spec,match", [(81, "1..N=80"), (0, "1..N=80"), (2.5, "1..N=80"),
                                        (np.zeros((3, 2)), r"\[M, 3\]"),
                                        (np.full((3, 3), np.nan), "non-finite")])
def test_bad_settings_are_input_errors_naming_the_method(spec, match):
    with pytest.raises(InputError, match=match) as err:
        initial_inducing(spec, _X(), np.random.default_rng(0), owner="sep")
    assert "sep" in str(err.value)


def test_an_unknown_initialisation_is_an_input_error():
    with pytest.raises(InputError, match="inducing_init"):
        initial_inducing(5, _X(), np.random.default_rng(0), init="grid", owner="svi")
