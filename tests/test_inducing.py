"""``gpinfer.inducing``: the one rule for starting inducing inputs (``initial_inducing``, used by
ep, sep, gfitc, svi, the vi-jj family and pep), K-means inducing inputs and
``FixedInputCovariances`` (the cached-
distance fast path of svi and the vi-jj family) against the kernels' own matrices and the core's
vector-Jacobian products. Moved here from the vi-jj plugin's tests: they test the core."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.inducing import (
    DEFAULT_M,
    FixedInputCovariances,
    inducing_inputs,
    initial_inducing,
    kmeans_inducing,
)
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels import RBF, Linear, Matern52, White


class _WiderRBF(RBF):
    """An RBF subclass that changes ``_g`` (and so declares no squared-distance form)."""

    dg_dr2_per_g = -0.25
    sqdist_form = False

    def _g(self, r2):
        return np.exp(-0.25 * r2)

    def _dg_dr2(self, r2):
        return -0.25 * np.exp(-0.25 * r2)


class _DiagonalNoise(White):
    """A white part on ``Kff_diag`` only (as ep's ``LatentNoise``)."""

    on_square = False


@pytest.mark.parametrize(("kernel", "fast"), [
    (RBF(lengthscale=1.3) + White(0.05), True),
    (_WiderRBF(lengthscale=1.3) + White(0.05), False),
    (RBF(lengthscale=1.3) + _DiagonalNoise(0.05), False),
])
def test_fixed_input_fast_path_follows_the_kernels_declarations(kernel, fast):
    """The fast path is chosen by the kernels' own declarations (``Stationary.sqdist_form``,
    ``White.on_square``), not by their exact types; either path gives the kernel's matrices."""
    rng = np.random.default_rng(2)
    X, Z = rng.normal(size=(12, 2)), rng.normal(size=(4, 2))
    cov = FixedInputCovariances(kernel, Z, X)
    assert cov.fast is fast
    Kuu, Kuf, Kd = cov.matrices()
    np.testing.assert_allclose(Kuu, kernel.K(Z), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(Kuf, kernel.K(Z, X), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(Kd, kernel.K_diag(X), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kernel", [
    RBF(lengthscale=1.3, variance=0.7) + White(0.05),
    RBF(lengthscale=[0.8, 1.7], variance=1.4),
    White(0.1) + RBF(lengthscale=0.9, variance=2.0) + White(0.2),
    Matern52(lengthscale=1.1, variance=1.0) + White(0.1),  # generic fallback
])
def test_fixed_input_covariances_match_kernel_and_vjp(kernel):
    """The cached-distance path (RBF, alone or with white parts, isotropic or ARD) and the
    generic fallback give the kernel's matrices and the core's VJPs."""
    rng = np.random.default_rng(11)
    X, Z = rng.normal(size=(30, 2)) + 4.0, rng.normal(size=(6, 2)) + 4.0
    cov = FixedInputCovariances(kernel, Z, X)
    assert cov.fast is not any(isinstance(p, Matern52) for p in getattr(kernel, "parts", []))
    hp = HyperParameters(kernel, Z=Z, optimize_inducing=False)
    for cols in (None, np.array([2, 5, 11, 29])):
        Xb = X if cols is None else X[cols]
        Kuu, Kuf, Kd = cov.matrices(cols)
        np.testing.assert_allclose(Kuu, kernel.K(Z), atol=1e-14)
        np.testing.assert_allclose(Kuf, kernel.K(Z, Xb), atol=1e-14)
        np.testing.assert_allclose(Kd, kernel.K_diag(Xb), atol=1e-14)
        G = MatrixGradients(Kff_diag=rng.normal(size=len(Xb)), Kuf=rng.normal(size=Kuf.shape),
                            Kuu=(lambda A: A + A.T)(rng.normal(size=(6, 6))))
        np.testing.assert_allclose(cov.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag, cols),
                                   parameter_gradient(hp, Xb, G), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [
    RBF(lengthscale=1.3, variance=0.7) + White(0.05),
    RBF(lengthscale=[0.8, 1.7], variance=1.4),
    Matern52(lengthscale=1.1, variance=1.0) + White(0.1),  # generic fallback
    Linear(variance=[0.6, 1.2]) + White(0.1),  # non-stationary: generic, never centred
])
def test_fixed_input_covariances_out_of_core_equal_the_in_memory_ones(monkeypatch, kernel):
    """On a ``SourceRows`` (X out of core) the covariances and gradients are the in-memory
    path's bit for bit when that keeps no ``[M, N]`` distances (``M N`` above the limit; a
    ``SourceRows`` never does), whether the caller gives the batch's rows (``rows``) or not."""
    import gpinfer.inducing as inducing
    from gpinfer.data.source import ArraySource, SourceRows

    monkeypatch.setattr(inducing, "DISTANCE_CACHE_MAX_ENTRIES", 0)
    rng = np.random.default_rng(5)
    X, Z = rng.normal(size=(40, 2)) + 4.0, rng.normal(size=(6, 2)) + 4.0
    rows = SourceRows(ArraySource(X.astype(np.float32)))
    X32 = X.astype(np.float32).astype(np.float64)
    ref, cov = FixedInputCovariances(kernel, Z, X32), FixedInputCovariances(kernel, Z, rows)
    assert cov._D_fu is None and (rows._column_mean is not None) == cov.fast
    cols = np.array([31, 2, 17, 5])
    G = MatrixGradients(Kff_diag=rng.normal(size=4), Kuf=rng.normal(size=(6, 4)),
                        Kuu=(lambda A: A + A.T)(rng.normal(size=(6, 6))))
    for given in (None, rows[cols]):
        for a, b in zip(cov.matrices(cols, rows=given), ref.matrices(cols)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(
            cov.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag, cols, rows=given),
            ref.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag, cols))


def test_contracted_kuf_gradient_equals_the_full_one():
    """Isotropic RBF: ``Kuf_sums = (sum(G K), sum(G K D))`` gives the same gradient as ``Kuf``."""
    rng = np.random.default_rng(3)
    X, Z = rng.normal(size=(25, 2)), rng.normal(size=(5, 2))
    cov = FixedInputCovariances(RBF(lengthscale=0.9, variance=1.3) + White(0.1), Z, X)
    assert cov.contracts_kuf
    _, Kuf, _ = cov.matrices()
    Gu, Gf, Gd = rng.normal(size=(5, 5)), rng.normal(size=Kuf.shape), rng.normal(size=25)
    full = cov.kernel_gradient(Gu, Gf, Gd)
    K_rbf = Kuf  # the white part adds nothing between Z and X
    sums = (float(np.sum(Gf * K_rbf)), float(np.sum(Gf * K_rbf * cov.last_distances())))
    np.testing.assert_allclose(cov.kernel_gradient(Gu, None, Gd, Kuf_sums=sums), full,
                               rtol=1e-12, atol=1e-12)


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
