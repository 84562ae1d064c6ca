"""svi's ``shared_inducing``: one kernel and one ``Z [M, D]`` shared by every latent
(``Kuu``, ``Kuf`` formed once and broadcast over the latents). Its ELBO equals the per-latent
model's when every latent has that kernel and that ``Z``, its kernel and ``Z`` gradients are
the sums of the per-latent ones, both pass finite differences, on numpy and on torch; a fit
keeps one kernel and one ``Z`` and predicts with them for every latent."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState

from gpinfer.backend import resolve_backend
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import RobustMax
from gpinfer.testing.gradcheck import assert_gradient_close

C, M, N = 3, 4, 24


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 2))
    y = rng.integers(0, C, N)
    mu = rng.normal(size=(C, M)) * 0.5
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.2) + np.eye(M)
    return X, y, X[:M] + 0.1, mu, Lq


def _states(backend=None):
    """The shared state and the per-latent state with the same kernel and ``Z`` for every
    latent, with the points ``(x_shared, x_per_latent)`` of the same ``q(u)``."""
    backend = backend or resolve_backend()
    X, y, Z, mu, Lq = _data()
    kernel = RBF(lengthscale=[0.9, 1.4], variance=1.3) + White(0.03)
    lik = RobustMax(1e-3)
    shared = VariationalState(X, y, lik, HyperParameters(
        [kernel.copy()], Z=[backend.asarray(Z)], optimize_inducing=True), C, M, backend=backend)
    per = VariationalState(X, y, lik, HyperParameters(
        [kernel.copy() for _ in range(C)], Z=[backend.asarray(Z) for _ in range(C)],
        optimize_inducing=True), C, M, backend=backend)
    assert shared.shared and not per.shared
    q = (backend.asarray(mu), backend.asarray(Lq))
    return shared, shared.pack(*q), per, per.pack(*q)


def _host(a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def _summed_theta(per: VariationalState, g: np.ndarray) -> np.ndarray:
    """The per-latent gradient's kernel and ``Z`` entries summed over the latents, in the
    shared layout (one kernel's parameters, then one ``Z``)."""
    names = per.hp.names
    k = [np.array([i for i, n in enumerate(names) if n.startswith(f"kernel[{c}].")])
         for c in range(C)]
    z = [np.array([i for i, n in enumerate(names) if n.startswith(f"Z[{c}]")])
         for c in range(C)]
    return np.concatenate([sum(g[i] for i in k), sum(g[i] for i in z)])


@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
@pytest.mark.parametrize("batch", [None, np.arange(0, N, 3)], ids=["full", "batch"])
def test_shared_equals_per_latent_with_one_kernel_and_Z(backend_name, batch):
    if backend_name == "torch":
        pytest.importorskip("torch")
    shared, xs, per, xp = _states(resolve_backend(backend_name))
    v_s, g_s = shared.elbo(xs, batch)
    v_p, g_p = per.elbo(xp, batch)
    g_s, g_p = _host(g_s), _host(g_p)
    np.testing.assert_allclose(v_s, v_p, rtol=1e-12)
    P_s, P_p = shared.hp.size, per.hp.size
    assert P_p == C * P_s
    # q(u)'s entries: the same gradient; the shared kernel and Z: the latents' sum
    np.testing.assert_allclose(g_s[P_s:], g_p[P_p:], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_s[:P_s], _summed_theta(per, g_p), rtol=1e-10, atol=1e-12)
    assert np.abs(g_s[:P_s]).max() > 1e-3  # not a vacuous comparison


def test_shared_gradient_passes_finite_differences():
    shared, x, _, _ = _states()
    batch = np.arange(0, N, 2)
    assert_gradient_close(lambda z: shared.elbo(z, batch)[0], shared.elbo(x, batch)[1], x,
                          rtol=1e-5, atol=1e-6, name="shared-inducing svi ELBO gradient")


def test_fit_keeps_one_kernel_and_Z_for_every_latent():
    X, y, _, _, _ = _data(1)
    problem = Problem(X=X, y=y, likelihood=RobustMax(1e-3), n_classes=C, inducing=M,
                      kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.01), max_iter=3,
                      batch_size=8)
    options = {"shared_inducing": True, "optimizer": "adam", "report_every": 3}
    fit = SVI(**options).fit(problem)
    assert fit.state["mu"].shape == (C, M)
    assert [k for k in fit.state if k.startswith("kernel_params_")] == ["kernel_params_0"]
    post = fit.posterior
    assert all(np.array_equal(z, fit.state["Z"]) for z in post.Z)
    P = post.predict_proba(X)
    assert P.shape == (N, C) and np.all(np.isfinite(P))
