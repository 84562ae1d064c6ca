"""``gpinfer.kernels.fixed``: the kernels' covariances at fixed inputs (the cached-distance
path of svi and the vi-jj family with ``Z`` fixed) against the kernels' own matrices and the
core's vector-Jacobian products; one distance cache per distinct ``Z``, one shift per ``X``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import gpinfer.kernels.fixed as fixed
from gpinfer.data.source import ArraySource, SourceRows
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels import RBF, Linear, Matern52, White
from gpinfer.kernels.fixed import (
    FixedInputs,
    fast_family,
    fixed_gradient,
    fixed_groups,
    fixed_matrices,
)
from gpinfer.kernels.stacked import StackedKernels


def _one(kernel, Z, X):
    """One latent's groups and kernels (``fixed_groups``)."""
    return fixed_groups([kernel], [Z], X), [kernel]


def _matrices(one, cols=None, rows=None):
    """``(covs, (Kuu, Kuf, Kff_diag))`` of one latent (``fixed_matrices``)."""
    covs, Kuu, Kuf, Kd = fixed_matrices(*one, cols, rows)
    return covs, (Kuu[0], Kuf[0], Kd[0])


def _gradient(one, covs, G, cols=None, rows=None):
    """One latent's kernel gradient (``fixed_gradient``)."""
    return fixed_gradient(one[0], covs, one[1], [G], cols, rows)


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
    one = _one(kernel, Z, X)
    assert (one[0][0][2] is not None) is fast
    _, (Kuu, Kuf, Kd) = _matrices(one)
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
    one = _one(kernel, Z, X)
    fast = not any(isinstance(p, Matern52) for p in getattr(kernel, "parts", []))
    assert (one[0][0][2] is not None) is fast
    hp = HyperParameters(kernel, Z=Z, optimize_inducing=False)
    for cols in (None, np.array([2, 5, 11, 29])):
        Xb = X if cols is None else X[cols]
        covs, (Kuu, Kuf, Kd) = _matrices(one, cols)
        np.testing.assert_allclose(Kuu, kernel.K(Z), atol=1e-14)
        np.testing.assert_allclose(Kuf, kernel.K(Z, Xb), atol=1e-14)
        np.testing.assert_allclose(Kd, kernel.K_diag(Xb), atol=1e-14)
        G = MatrixGradients(Kff_diag=rng.normal(size=len(Xb)), Kuf=rng.normal(size=Kuf.shape),
                            Kuu=(lambda A: A + A.T)(rng.normal(size=(6, 6))))
        np.testing.assert_allclose(_gradient(one, covs, G, cols),
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
    monkeypatch.setattr(fixed, "DISTANCE_CACHE_MAX_ENTRIES", 0)
    rng = np.random.default_rng(5)
    X, Z = rng.normal(size=(40, 2)) + 4.0, rng.normal(size=(6, 2)) + 4.0
    rows = SourceRows(ArraySource(X.astype(np.float32)))
    X32 = X.astype(np.float32).astype(np.float64)
    ref, one = _one(kernel, Z, X32), _one(kernel, Z, rows)
    (_, inputs, family), = one[0]
    assert inputs.D_fu is None and (rows._column_mean is not None) == (family is not None)
    cols = np.array([31, 2, 17, 5])
    G = MatrixGradients(Kff_diag=rng.normal(size=4), Kuf=rng.normal(size=(6, 4)),
                        Kuu=(lambda A: A + A.T)(rng.normal(size=(6, 6))))
    for given in (None, rows[cols]):
        covs, mats = _matrices(one, cols, rows=given)
        ref_covs, ref_mats = _matrices(ref, cols)
        for a, b in zip(mats, ref_mats):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(_gradient(one, covs, G, cols, rows=given),
                                      _gradient(ref, ref_covs, G, cols))


def test_contracted_kuf_gradient_equals_the_full_one():
    """Isotropic RBF: ``Kuf_sums = (sum(G K), sum(G K D))`` gives the same gradient as ``Kuf``."""
    rng = np.random.default_rng(3)
    X, Z = rng.normal(size=(25, 2)), rng.normal(size=(5, 2))
    family = fast_family([RBF(lengthscale=0.9, variance=1.3) + White(0.1)])
    assert family is not None
    cov = family.fixed_covariances(FixedInputs(Z, X))
    assert cov.fixed is not None and cov.fixed.D_uf is not None
    Kuf = cov.Kuf[0]
    Gu, Gf, Gd = rng.normal(size=(5, 5)), rng.normal(size=Kuf.shape), rng.normal(size=25)
    full = cov.vjp_fixed(Gu[None], Gf[None], Gd[None])
    np.testing.assert_array_equal(cov.vjp_fixed([Gu], [Gf], [Gd]), full)  # per-latent views
    K_rbf = Kuf  # the white part adds nothing between Z and X
    sums = np.array([[np.sum(Gf * K_rbf), np.sum(Gf * K_rbf * cov.fixed.D_uf)]])
    np.testing.assert_allclose(cov.vjp_fixed([Gu], None, [Gd], Kuf_sums=sums), full,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [RBF(lengthscale=[0.9, 1.4]), Matern52(lengthscale=0.9)])
def test_old_name_refuses_kuf_sums_off_the_isotropic_fast_path(kernel):
    """The old ``FixedInputCovariances``: ARD and kernels off the fast path contract no
    ``Kuf``: ``Kuf_sums`` and ``last_distances`` are refused with a ``ValueError`` naming
    ``contracts_kuf``."""
    rng = np.random.default_rng(9)
    X, Z = rng.normal(size=(10, 2)), rng.normal(size=(3, 2))
    cov = _old_name()(kernel, Z, X)
    assert not cov.contracts_kuf
    cov.matrices()
    with pytest.raises(ValueError, match="isotropic RBF fast path.*contracts_kuf"):
        cov.kernel_gradient(np.eye(3), None, None, Kuf_sums=(1.0, 1.0))
    with pytest.raises(ValueError, match="isotropic RBF fast path.*contracts_kuf"):
        cov.last_distances()




def test_latents_with_equal_inducing_inputs_share_one_cache():
    """``fixed_groups``: equal ``Z`` (values, not objects) share one ``FixedInputs`` and its
    distances (kernels of one family: one ``StackedKernels``; of several: a group each);
    another ``Z`` gets its own distances but the same shift, read once from an out-of-core
    ``X``; every latent's matrices are its kernel's."""
    rng = np.random.default_rng(7)
    X, Z = rng.normal(size=(30, 2)), rng.normal(size=(5, 2))
    Z2 = rng.normal(size=(4, 2))
    kernels = [RBF(lengthscale=0.8) + White(0.1), RBF(lengthscale=1.4), RBF(lengthscale=1.1),
               RBF(lengthscale=[0.7, 1.2])]
    groups = fixed_groups(kernels, [Z, Z.copy(), Z2, Z], X)
    at = {l: inputs for ls, inputs, _ in groups for l in ls}
    assert at[0] is at[1] is at[3] and at[2] is not at[0] and at[2].shift is at[0].shift
    assert at[0].D_fu is not None and at[0].Xc is not None
    assert sorted(ls for ls, _, _ in groups) == [[0], [1], [2], [3]]  # three families at Z
    same = fixed_groups(kernels[1:3], [Z, Z], X)
    assert [ls for ls, _, family in same if family is not None] == [[0, 1]]
    _, Kuu, Kuf, Kd = fixed_matrices(groups, kernels)
    for l, (k, Zl) in enumerate(zip(kernels, [Z, Z, Z2, Z])):
        np.testing.assert_allclose(Kuu[l], k.K(Zl), atol=1e-14)
        np.testing.assert_allclose(Kuf[l], k.K(Zl, X), atol=1e-14)
        np.testing.assert_allclose(Kd[l], k.K_diag(X), atol=1e-14)
    rows = SourceRows(ArraySource(X))
    passes: list[int] = []
    mean = SourceRows.column_mean
    try:
        SourceRows.column_mean = lambda self: passes.append(1) or mean(self)
        out = fixed_groups(kernels, [Z, Z, Z2, Z], rows)
    finally:
        SourceRows.column_mean = mean
    assert len(passes) == 1 and out[0][1].D_fu is None and out[0][1].Xc is None


def test_generic_kernels_form_no_cache():
    """A kernel off the fast path reads ``X`` as it is: no shift, no distances formed."""
    X, Z = np.ones((6, 2)), np.zeros((2, 2))
    (_, inputs, family), = _one(Matern52() + White(0.1), Z, X)[0]
    assert family is None and inputs._kept == {} and isinstance(inputs, FixedInputs)


def _old_name():
    """``gpinfer.inducing.FixedInputCovariances`` (deprecated), its warning silenced."""
    import gpinfer.inducing as inducing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return inducing.FixedInputCovariances


def test_old_name_warns_and_builds_the_same_covariances():
    """``gpinfer.inducing.FixedInputCovariances`` works one more release, with a
    ``DeprecationWarning`` naming its successor; ``share`` is honoured for an equal ``Z``."""
    import gpinfer.inducing as inducing

    rng = np.random.default_rng(1)
    X, Z = rng.normal(size=(12, 2)), rng.normal(size=(3, 2))
    with pytest.warns(DeprecationWarning, match="fixed_groups"):
        old = inducing.FixedInputCovariances
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = old(RBF(), Z, X)
        second = old(RBF(lengthscale=2.0), Z.copy(), X, share=first)
    assert second.inputs is first.inputs
    assert second.fast and not second.ard and second.contracts_kuf  # the old attributes
    one = _one(RBF(lengthscale=2.0), Z, X)
    covs, mats = _matrices(one)
    for a, b in zip(second.matrices(), mats):
        np.testing.assert_array_equal(a, b)
    G = MatrixGradients(Kuu=np.eye(3), Kuf=rng.normal(size=(3, 12)), Kff_diag=np.ones(12))
    np.testing.assert_array_equal(second.kernel_gradient(G.Kuu, G.Kuf, G.Kff_diag),
                                  _gradient(one, covs, G))
    generic = old(Matern52(), Z, X)
    np.testing.assert_array_equal(generic.matrices()[1], Matern52().K(Z, X))


@pytest.mark.parametrize("lengthscales", [(0.8, 1.5), ([0.7, 1.3], [1.6, 0.9])])
def test_fixed_mode_of_several_latents_equals_each_latent(lengthscales):
    """``StackedKernels.fixed_covariances``: latents sharing one ``FixedInputs`` (isotropic or
    ARD, parameters of their own) give each kernel's matrices and the core's VJPs, and each
    latent's row is the one-latent mode's bit for bit (the same passes), also through
    ``fixed_matrices`` / ``fixed_gradient`` (one group, ``vjp_fixed`` over per-latent views)."""
    rng = np.random.default_rng(8)
    X, Z = rng.normal(size=(30, 2)) + 3.0, rng.normal(size=(5, 2)) + 3.0
    kernels = [RBF(lengthscale=lengthscales[0], variance=0.7) + White(0.05),
               RBF(lengthscale=lengthscales[1], variance=1.6) + White(0.2)]
    family = StackedKernels.of(kernels)
    assert family is not None and family.cached_distance_form
    inputs = FixedInputs(Z, X)
    cols = np.array([3, 17, 4, 29, 0, 11])
    cov = family.fixed_covariances(inputs, cols)
    G = MatrixGradients(Kuu=(lambda A: A + np.swapaxes(A, 1, 2))(rng.normal(size=(2, 5, 5))),
                        Kuf=rng.normal(size=(2, 5, 6)), Kff_diag=rng.normal(size=(2, 6)))
    grads = cov.vjp_fixed(G.Kuu, G.Kuf, G.Kff_diag)
    for c, k in enumerate(kernels):
        np.testing.assert_allclose(cov.Kuu[c], k.K(Z), atol=1e-14)
        np.testing.assert_allclose(cov.Kuf[c], k.K(Z, X[cols]), atol=1e-14)
        np.testing.assert_allclose(cov.Kff_diag[c], k.K_diag(X[cols]), atol=1e-14)
        Gc = MatrixGradients(Kuu=G.Kuu[c], Kuf=G.Kuf[c], Kff_diag=G.Kff_diag[c])
        hp = HyperParameters(k, Z=Z, optimize_inducing=False)
        np.testing.assert_allclose(grads[c], parameter_gradient(hp, X[cols], Gc),
                                   rtol=1e-12, atol=1e-12)
        one = fast_family([k])
        assert one is not None
        alone = one.fixed_covariances(inputs, cols)
        for a, b in zip((alone.Kuu, alone.Kuf, alone.Kff_diag),
                        (cov.Kuu[c], cov.Kuf[c], cov.Kff_diag[c])):
            np.testing.assert_array_equal(a[0], b)
        np.testing.assert_array_equal(alone.vjp_fixed(G.Kuu[c:c + 1], G.Kuf[c:c + 1],
                                                      G.Kff_diag[c:c + 1])[0], grads[c])
    groups = fixed_groups(kernels, [Z, Z.copy()], X)
    ard = np.ndim(lengthscales[0]) > 0  # ARD latents: each a group of its own
    assert [ls for ls, _, _ in groups] == ([[0], [1]] if ard else [[0, 1]])
    covs, Kuu, Kuf, Kd = fixed_matrices(groups, kernels, cols)
    for a, b in zip((Kuu, Kuf, Kd), (cov.Kuu, cov.Kuf, cov.Kff_diag)):
        np.testing.assert_array_equal(np.stack(a), b)
    per_latent = [MatrixGradients(Kuu=G.Kuu[c], Kuf=G.Kuf[c], Kff_diag=G.Kff_diag[c])
                  for c in range(2)]
    np.testing.assert_array_equal(fixed_gradient(groups, covs, kernels, per_latent, cols),
                                  grads.ravel())


def test_fixed_mode_refuses_what_it_cannot_serve():
    """The fixed-input mode refuses a kernel off the squared-distance form, ``Kuf_sums`` with
    ARD lengthscales, the VJP of moving inputs and a second hand-over of ``Kuf`` (its VJP reads
    it); ``vjp_fixed`` is refused on covariances of moving inputs."""
    rng = np.random.default_rng(4)
    X, Z = rng.normal(size=(9, 2)), rng.normal(size=(3, 2))
    inputs = FixedInputs(Z, X)
    matern = StackedKernels.of([Matern52()])
    assert matern is not None and not matern.cached_distance_form
    with pytest.raises(ValueError, match="squared-distance"):
        matern.fixed_covariances(inputs)
    diagonal = StackedKernels.of([RBF() + _DiagonalNoise(0.1)])
    assert diagonal is not None and not diagonal.cached_distance_form
    with pytest.raises(ValueError, match="on_square"):
        diagonal.fixed_covariances(inputs)
    ard = StackedKernels.of([RBF(lengthscale=[1.0, 2.0])])
    assert ard is not None
    with pytest.raises(ValueError, match="isotropic"):
        ard.fixed_covariances(inputs).vjp_fixed(None, None, None, Kuf_sums=np.ones((1, 2)))
    iso = StackedKernels.of([RBF()])
    assert iso is not None
    cov = iso.fixed_covariances(inputs)
    with pytest.raises(ValueError, match="vjp_fixed"):
        cov.vjp(None, None, None)
    cov.take_Kuf()
    with pytest.raises(RuntimeError, match="handed over"):
        cov.take_Kuf()
    with pytest.raises(ValueError, match="at_fixed_inputs"):
        iso.covariances(Z[None], X).vjp_fixed(None, None, None)


def test_kuf_is_written_into_out_only_in_the_distances_layout():
    """``StackedKernels.fixed_covariances(out=)`` (one isotropic latent): ``Kuf`` is a view of ``out`` where
    ``out`` has the layout of the cached distances (``[N, M]`` rows transposed), else a new
    array of the same values."""
    rng = np.random.default_rng(6)
    X, Z = rng.normal(size=(20, 2)), rng.normal(size=(4, 2))
    family, inputs = fast_family([RBF(lengthscale=0.8) + White(0.1)]), FixedInputs(Z, X)
    assert family is not None
    ref = family.fixed_covariances(inputs).Kuf[0].copy()
    rows_out, plain_out = np.zeros((20, 4)), np.zeros((4, 20))
    Kuf = family.fixed_covariances(inputs, out=rows_out.T).Kuf[0]
    assert np.shares_memory(Kuf, rows_out)
    np.testing.assert_array_equal(Kuf, ref)
    Kuf = family.fixed_covariances(inputs, out=plain_out).Kuf[0]
    assert not np.shares_memory(Kuf, plain_out) and not plain_out.any()
    np.testing.assert_array_equal(Kuf, ref)
