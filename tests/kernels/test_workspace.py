"""The stacked forward's reused ``[C, M, D]`` buffers (gpinfer.kernels.workspace): reused once
their covariances object is gone, never while it is still referenced."""

from __future__ import annotations

import copy
import gc
import pickle

import numpy as np

from gpinfer.kernels import RBF, White
from gpinfer.kernels.stacked import StackedCovariances, StackedKernels
from gpinfer.kernels.workspace import Workspace

C, M, B, D = 3, 6, 5, 4


def _setup(seed: int = 0):
    rng = np.random.default_rng(seed)
    kernels = [RBF(rng.uniform(0.5, 2.0, D), float(rng.uniform(0.5, 2.0)))
               + White(float(rng.uniform(0.1, 1.0))) for _ in range(C)]
    return rng, kernels, StackedKernels.of(kernels)


def _inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(size=(C, M, D)) + 2.0, rng.normal(size=(B, D)) + 2.0


def _weights(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return rng.normal(size=(C, M, M)), rng.normal(size=(C, M, B)), rng.normal(size=(C, B))


def _expected_vjp(kernels, Z, X, dKuu, dKuf, dKd) -> tuple[np.ndarray, np.ndarray]:
    """Every latent's own ``vjp`` summed over the three matrices: ``([C, P], [C, M, D])``."""
    params, inputs = [], []
    for c, k in enumerate(kernels):
        p_uu, z_uu = k.vjp(Z[c], None, dKuu[c])
        p_uf, z_uf = k.vjp(Z[c], X, dKuf[c])
        params.append(k.grad_params_diag(X, dKd[c]) + p_uu + p_uf)
        inputs.append(z_uu + z_uf)
    return np.stack(params), np.stack(inputs)


def _kept(cov: StackedCovariances) -> np.ndarray:
    assert cov.d.Zs is not None  # numpy's forward keeps Z - shift
    return cov.d.Zs


def test_buffers_are_reused_once_their_covariances_are_gone():
    rng, kernels, st = _setup()
    Z1, X1 = _inputs(rng)
    first = st.covariances(Z1, X1)
    kept, scratch = _kept(first), st.workspace.scratch(Z1)
    del first
    gc.collect()
    Z2, X2 = _inputs(rng)
    second = st.covariances(Z2, X2)
    assert _kept(second) is kept  # the same memory, no new pages
    assert st.workspace.scratch(Z2) is scratch
    # the values are those of a family with fresh arrays, to the bit
    fresh = StackedKernels.of(kernels).covariances(Z2, X2)
    for name in ("Kuu", "Kuf", "Kff_diag"):
        np.testing.assert_array_equal(getattr(second, name), getattr(fresh, name))
    w = _weights(rng)
    for got, want in zip(second.vjp(*w), fresh.vjp(*w), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_covariances_still_referenced_keeps_its_arrays():
    """A newer evaluation (other inputs, other parameters) allocates afresh while the older
    covariances object lives: the older one's VJP still equals the per-latent VJPs at its own
    inputs and parameters."""
    rng, kernels, st = _setup(1)
    Z1, X1 = _inputs(rng)
    w = _weights(rng)
    expected = _expected_vjp(kernels, Z1, X1, *w)
    first = st.covariances(Z1, X1)
    before = _kept(first).copy()
    for k in kernels:
        k.set_unconstrained(k.get_unconstrained() + 0.3)
    Z2, X2 = _inputs(rng)
    second = st.covariances(Z2, X2)
    assert not np.shares_memory(_kept(second), _kept(first))
    np.testing.assert_array_equal(_kept(first), before)
    g_params, g_Z = first.vjp(*w)
    np.testing.assert_allclose(g_params, expected[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_Z, expected[1], rtol=1e-10, atol=1e-12)
    # and the newer one is right at its own inputs
    g_params, g_Z = second.vjp(*w)
    expected = _expected_vjp(kernels, Z2, X2, *w)
    np.testing.assert_allclose(g_params, expected[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_Z, expected[1], rtol=1e-10, atol=1e-12)


def test_the_version_cache_releases_its_covariances_for_reuse():
    """A new version drops the cached covariances before the new forward: with no other
    holder, the new one gets the old buffer."""
    rng, _, st = _setup(2)
    Z, X = _inputs(rng)
    kept = _kept(st.covariances(Z, X, version=1))
    assert _kept(st.covariances(Z, X, version=2)) is kept


def test_buffers_follow_the_inducing_shape_not_the_batch():
    """Two ``[C, M, D]`` buffers whatever the batch size (memory independent of N); another
    ``M`` gets buffers of its shape."""
    rng, _, st = _setup(3)
    Z, _ = _inputs(rng)
    for n in (1, B, 50):
        cov = st.covariances(Z, rng.normal(size=(n, D)))
        assert _kept(cov).shape == Z.shape
        del cov
    Z_more = rng.normal(size=(C, M + 2, D))
    assert _kept(st.covariances(Z_more, rng.normal(size=(B, D)))).shape == Z_more.shape
    assert st.workspace.scratch(Z_more).shape == Z_more.shape


def test_copies_and_pickles_start_without_buffers():
    rng, _, st = _setup(4)
    Z, X = _inputs(rng)
    st.covariances(Z, X)
    for other in (copy.deepcopy(st.workspace), pickle.loads(pickle.dumps(st.workspace))):
        assert isinstance(other, Workspace)
        assert other.scratch(Z) is not st.workspace.scratch(Z)
        assert other.__dict__ == {"_scratch": other.scratch(Z), "_lent": None, "_holder": None}
