"""The batched kernel path (gpinfer.kernels.stacked) against the per-latent kernels, and its
VJPs against finite differences of its own covariances."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels import RBF, Linear, Matern32, Matern52, White
from gpinfer.kernels.stacked import StackedKernels, StackedMatrixGradients

C, M, B, D = 3, 5, 7, 4


class DiagonalNoise(White):
    """A ``White`` that stays off square matrices (as ep's ``LatentNoise``)."""

    on_square = False

    def K(self, X, X2=None):
        return np.zeros((X.shape[0], X.shape[0] if X2 is None else X2.shape[0]))

    def grad_params(self, X, X2, dK):
        return np.zeros(1)


def family(kind: str, rng: np.random.Generator) -> list:
    """``C`` kernels of one family with different parameters per latent."""
    out = []
    for _ in range(C):
        ell = rng.uniform(0.5, 2.0, D)
        var = float(rng.uniform(0.5, 2.0))
        if kind == "rbf-ard+white":
            out.append(RBF(ell, var) + White(float(rng.uniform(0.1, 1.0))))
        elif kind == "matern32-iso":
            out.append(Matern32(float(ell[0]), var))
        elif kind == "matern52-ard+noise":
            out.append(Matern52(ell, var) + DiagonalNoise(float(rng.uniform(0.1, 1.0))))
        else:  # rbf-iso+white+white
            out.append(RBF(float(ell[0]), var) + White(0.3) + White(0.2))
    return out


KINDS = ["rbf-ard+white", "matern32-iso", "matern52-ard+noise", "rbf-iso+white+white"]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(C, M, D)) + 3.0
    X = rng.normal(size=(B, D)) + 3.0
    return rng, Z, X


@pytest.mark.parametrize("kind", KINDS)
def test_covariances_equal_the_per_latent_kernels(kind):
    rng, Z, X = _data()
    kernels = family(kind, rng)
    cov = StackedKernels.of(kernels).covariances(Z, X)
    for c, k in enumerate(kernels):
        np.testing.assert_allclose(cov.Kuu[c], k.K(Z[c]), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cov.Kuf[c], k.K(Z[c], X), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cov.Kff_diag[c], k.K_diag(X), rtol=1e-14)


@pytest.mark.parametrize("transposed", [False, True])
def test_both_layouts_of_the_cross_product_give_the_covariances(monkeypatch, transposed):
    """numpy's cross product as ``As Xs^T`` or as ``(Xs As^T)^T`` (``transposed_cross``, chosen
    by shape: forced here both ways) gives the per-latent ``Kuf`` and the distances' VJP."""
    from gpinfer.kernels import stacked

    monkeypatch.setattr(stacked, "transposed_cross", lambda B_, D_: transposed)
    rng, Z, X = _data(2)
    kernels = family("rbf-ard+white", rng)
    cov = StackedKernels.of(kernels).covariances(Z, X)
    dKuf = rng.normal(size=(C, M, B))
    g_params, g_Z = cov.vjp(None, dKuf, None)
    for c, k in enumerate(kernels):
        np.testing.assert_allclose(cov.Kuf[c], k.K(Z[c], X), rtol=1e-12, atol=1e-14)
        p_uf, z_uf = k.vjp(Z[c], X, dKuf[c])
        np.testing.assert_allclose(g_params[c], p_uf, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g_Z[c], z_uf, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("inputs", [True, False])
def test_vjp_equals_the_per_latent_vjps(kind, inputs):
    rng, Z, X = _data(1)
    kernels = family(kind, rng)
    dKuu, dKuf, dKd = rng.normal(size=(C, M, M)), rng.normal(size=(C, M, B)), rng.normal(
        size=(C, B))
    g_params, g_Z = StackedKernels.of(kernels).covariances(Z, X).vjp(dKuu, dKuf, dKd,
                                                                     inputs=inputs)
    assert (g_Z is None) == (not inputs)
    for c, k in enumerate(kernels):
        p_uu, z_uu = k.vjp(Z[c], None, dKuu[c])
        p_uf, z_uf = k.vjp(Z[c], X, dKuf[c])
        expected = k.grad_params_diag(X, dKd[c]) + p_uu + p_uf
        np.testing.assert_allclose(g_params[c], expected, rtol=1e-10, atol=1e-12)
        if inputs:
            np.testing.assert_allclose(g_Z[c], z_uu + z_uf, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_vjp_against_finite_differences(kind):
    rng, Z, X = _data(2)
    kernels = family(kind, rng)
    W = [rng.normal(size=(C, M, M)), rng.normal(size=(C, M, B)), rng.normal(size=(C, B))]

    def objective(Zv):
        cov = StackedKernels.of(kernels).covariances(Zv, X)
        return sum(float(np.sum(w * m)) for w, m in zip(W, (cov.Kuu, cov.Kuf, cov.Kff_diag)))

    g_params, g_Z = StackedKernels.of(kernels).covariances(Z, X).vjp(*W)
    h = 1e-6
    for c, k in enumerate(kernels):
        theta = k.get_unconstrained()
        for p in range(theta.size):
            step = np.zeros_like(theta)
            step[p] = h
            k.set_unconstrained(theta + step)
            up = objective(Z)
            k.set_unconstrained(theta - step)
            down = objective(Z)
            k.set_unconstrained(theta)
            assert g_params[c, p] == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-7)
    for idx in [(0, 0, 0), (1, 3, 2), (C - 1, M - 1, D - 1)]:
        Zp, Zm = Z.copy(), Z.copy()
        Zp[idx] += h
        Zm[idx] -= h
        assert g_Z[idx] == pytest.approx((objective(Zp) - objective(Zm)) / (2 * h),
                                         rel=1e-6, abs=1e-7)


def test_mixed_or_unbatched_families_keep_the_per_latent_path():
    assert StackedKernels.of([RBF(1.0), Matern32(1.0)]) is None
    assert StackedKernels.of([RBF(np.ones(2)), RBF(1.0)]) is None  # ARD and isotropic
    assert StackedKernels.of([Linear(1.0), Linear(1.0)]) is None
    assert StackedKernels.of([RBF(1.0) * RBF(1.0)] * 2) is None
    assert StackedKernels.of([RBF(1.0) + RBF(2.0)] * 2) is None  # two stationary parts
    assert StackedKernels.of([RBF(1.0) + White(), RBF(1.0)]) is None
    assert StackedKernels.of([RBF(1.0)] * 2) is not None  # one shared kernel: a broadcast


def test_the_cache_is_keyed_by_version_and_objects():
    rng, Z, X = _data(3)
    kernels = family("rbf-ard+white", rng)
    st = StackedKernels.of(kernels)
    first = st.covariances(Z, X, version=1)
    assert st.covariances(Z, X, version=1) is first
    assert st.covariances(Z, X, version=2) is not first
    assert st.covariances(Z.copy(), X, version=2) is not first
    again = st.covariances(Z, X, version=3)
    kernels[0].set_unconstrained(kernels[0].get_unconstrained() + 0.1)  # no new version
    changed = st.covariances(Z, X, version=3)
    assert changed is not again
    np.testing.assert_allclose(changed.Kuu[0], kernels[0].K(Z[0]), rtol=1e-12)
    assert st.covariances(Z, X) is not st.covariances(Z, X)  # no version: never reused


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_gradient_stacked_equals_per_latent(tied):
    rng, Z, X = _data(4)
    kernels = [RBF(np.ones(D), 1.5) + White(0.2)] * C if tied else family("rbf-ard+white", rng)
    grads = [MatrixGradients(Kuu=rng.normal(size=(M, M)), Kuf=rng.normal(size=(M, B)),
                             Kff_diag=rng.normal(size=B)) for _ in range(C)]
    hp = HyperParameters(kernels, Z=list(Z), fixed=["Z[1][2,3]"])
    assert hp.stacked is not None
    stacked = parameter_gradient(hp, X, grads)
    hp.stacked = None
    per_latent = parameter_gradient(hp, X, grads)
    np.testing.assert_allclose(stacked, per_latent, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["rbf-ard+white", "matern32-iso"])
def test_parameter_gradient_written_into_the_vector_equals_per_latent(kind):
    """All entries free, the matrix gradients as stacks: numpy's VJP writes ``g_Z`` into the
    gradient vector itself (``out_Z``); the same values as the per-latent path."""
    rng, Z, X = _data(9)
    kernels = family(kind, rng)
    stacks = StackedMatrixGradients(rng.normal(size=(C, M, M)), rng.normal(size=(C, M, B)),
                                    rng.normal(size=(C, B)))
    hp = HyperParameters(kernels, Z=list(Z))
    assert hp.stacked is not None
    stacked = parameter_gradient(hp, X, stacks)
    assert stacked.shape == (hp.size,)
    hp.stacked = None
    per_latent = parameter_gradient(hp, X, list(stacks))
    np.testing.assert_allclose(stacked, per_latent, rtol=1e-10, atol=1e-12)


def test_unpack_keeps_the_inducing_inputs_as_views_of_one_stack():
    rng, Z, X = _data(5)
    hp = HyperParameters(family("rbf-ard+white", rng), Z=list(Z))
    theta = hp.pack()
    version = hp.version
    hp.unpack(theta + 1.0)
    assert hp.version == version + 1
    stack = hp.inducing_stack()
    np.testing.assert_array_equal(stack, Z + 1.0)
    assert all(np.shares_memory(z, stack) for z in hp.Z)
    np.testing.assert_array_equal(hp.pack(), theta + 1.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("given", ["all", "Kuu", "Kuf+Kff"])
@pytest.mark.parametrize("inputs", [True, False])
def test_torch_equals_numpy(kind, given, inputs):
    """The device forms (one einsum for the weights and sums, ARD's gradients from
    ``V = A rA - 2 G_uu A - 2 G_uf Bx``) equal numpy's, for every family, with some matrix
    gradients ``None`` and without ``g_Z``."""
    torch = pytest.importorskip("torch")
    rng, Z, X = _data(6)
    kernels = family(kind, rng)
    st = StackedKernels.of(kernels)
    W = [rng.normal(size=(C, M, M)), rng.normal(size=(C, M, B)), rng.normal(size=(C, B))]
    W = [w if given == "all" or name in given.split("+") else None
         for w, name in zip(W, ("Kuu", "Kuf", "Kff"))]
    ref = st.covariances(Z, X)
    on = st.covariances(torch.as_tensor(Z), torch.as_tensor(X))
    for a, b in ((ref.Kuu, on.Kuu), (ref.Kuf, on.Kuf), (ref.Kff_diag, on.Kff_diag)):
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-12, atol=1e-14)
    g_ref = ref.vjp(*W, inputs=inputs)
    g_on = on.vjp(*(None if w is None else torch.as_tensor(w) for w in W), inputs=inputs)
    assert (g_on[1] is None) == (not inputs)
    for a, b in zip(g_ref, g_on):
        if a is not None:
            np.testing.assert_allclose(b.numpy(), a, rtol=1e-10, atol=1e-12)
