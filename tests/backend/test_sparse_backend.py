"""The scalable site methods and the kernels on the torch backend (CPU build in CI): the same
numbers as numpy (float64), gradients against finite differences on torch, the posterior on the
host, the back-off on non-finite values, float32; GPU-only checks run where CUDA is present.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from gpinfer_ep.state import TiedSites

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.kernels import RBF, Matern52, White
from gpinfer.testing import assert_gradient_close

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _data(n=120, D=3, C=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.argmax(X @ rng.normal(size=(D, C)) + 0.3 * rng.normal(size=(n, C)), axis=1)
    return X, y.astype(np.int64)


@pytest.mark.parametrize("kernel", [RBF(lengthscale=[0.7, 1.3, 2.0], variance=1.7),
                                    Matern52(lengthscale=1.1) * RBF(lengthscale=[1.0, 2.0, 3.0])
                                    + White(0.1)], ids=["rbf-ard", "matern52*rbf+white"])
def test_kernel_values_and_vjps_on_torch_equal_numpy(kernel):
    rng = np.random.default_rng(3)
    Z, X = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
    Zt, Xt = torch.as_tensor(Z), torch.as_tensor(X)
    for X2, X2t in ((None, None), (X, Xt)):
        np.testing.assert_allclose(kernel.K(Zt, X2t).numpy(), kernel.K(Z, X2), rtol=1e-13,
                                   atol=1e-15)
        dK = rng.normal(size=(5, 5 if X2 is None else 7))
        gp, gi = kernel.vjp(Z, X2, dK)
        gpt, git = kernel.vjp(Zt, X2t, torch.as_tensor(dK))
        np.testing.assert_allclose(gpt.numpy(), gp, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(git.numpy(), gi, rtol=1e-12, atol=1e-13)
    dd = rng.normal(size=7)
    np.testing.assert_allclose(kernel.grad_params_diag(Xt, torch.as_tensor(dd)).numpy(),
                               kernel.grad_params_diag(X, dd), rtol=1e-13)


def test_kernel_vjp_on_torch_against_finite_differences():
    """The inducing-input and parameter products of ``sum(dK * K(Z, X))`` on torch tensors."""
    rng = np.random.default_rng(4)
    kernel = RBF(lengthscale=[0.9, 1.6], variance=1.3)
    Z, X, dK = rng.normal(size=(4, 2)), rng.normal(size=(6, 2)), rng.normal(size=(4, 6))
    Xt, dKt = torch.as_tensor(X), torch.as_tensor(dK)
    g_params, g_inputs = kernel.vjp(torch.as_tensor(Z), Xt, dKt)

    def value_at_inputs(z):
        return float(torch.sum(dKt * kernel.K(torch.as_tensor(z), Xt)))

    assert_gradient_close(value_at_inputs, g_inputs.numpy(), Z, name="dK/dZ on torch")
    theta0 = kernel.get_unconstrained()

    def value_at_params(theta):
        k = kernel.copy()
        k.set_unconstrained(theta)
        return float(torch.sum(dKt * k.K(torch.as_tensor(Z), Xt)))

    assert_gradient_close(value_at_params, g_params.numpy(), theta0, name="dK/dtheta on torch")


@pytest.mark.parametrize("method,batch_size", [("sep", None), ("sep", 40), ("ep", None),
                                               ("ep", 40)])
def test_fit_on_torch_cpu_equals_numpy(method, batch_size):
    """The issue's oracle: the same fit on torch's CPU build and on numpy, fixed seed, float64:
    probabilities and log Z_q to 1e-8."""
    X, y = _data()
    fits = {}
    for backend in ("numpy", "torch"):
        clf = GPClassifier(method=method, M=8, max_iter=6, batch_size=batch_size,
                           random_state=0, backend=backend)
        fits[backend] = clf.fit(X, y)
    p_np, p_t = (fits[b].predict_proba(X) for b in ("numpy", "torch"))
    np.testing.assert_allclose(p_t, p_np, rtol=0, atol=1e-8)
    assert fits["torch"].log_evidence_ == pytest.approx(fits["numpy"].log_evidence_, rel=1e-8)
    assert fits["torch"].backend_.name == "torch"


def test_torch_posterior_lives_on_the_host_and_predicts_on_either_side():
    X, y = _data()
    clf = GPClassifier(method="sep", M=8, max_iter=4, random_state=0, backend="torch").fit(X, y)
    post = clf.posterior_
    assert all(isinstance(a, np.ndarray) for a in (*post.Z, *post.m, *post.S))
    restored = pickle.loads(pickle.dumps(clf))
    np.testing.assert_allclose(restored.predict_proba(X), clf.predict_proba(X), rtol=1e-14)
    mean_t, var_t = post.predict_f(torch.as_tensor(X))
    assert isinstance(mean_t, torch.Tensor)
    mean, var = post.predict_f(X)
    np.testing.assert_allclose(mean_t.numpy(), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(var_t.numpy(), var, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(post.predict_proba(torch.as_tensor(X)), post.predict_proba(X),
                               rtol=1e-12)


def test_float32_sep_gives_finite_calibrated_probabilities():
    X, y = _data(n=150)
    p64 = GPClassifier(method="sep", M=10, max_iter=15, random_state=0,
                       backend="torch").fit(X, y).predict_proba(X)
    clf = GPClassifier(method="sep", M=10, max_iter=15, random_state=0, backend="torch",
                       dtype="float32").fit(X, y)
    p32 = clf.predict_proba(X)
    assert np.all(np.isfinite(p32))
    np.testing.assert_allclose(p32.sum(axis=1), 1.0, atol=1e-6)
    assert np.max(np.abs(p32 - p64)) < 2e-2  # single precision, same model


def test_ep_refuses_float32_naming_the_reason():
    X, y = _data(n=30)
    with pytest.raises(InputError, match="ep.*float64.*rank-one"):
        GPClassifier(method="ep", M=5, max_iter=2, backend="torch", dtype="float32").fit(X, y)


def test_non_finite_values_on_torch_trigger_the_back_off_not_nan_probabilities():
    """A step that makes the sites non-finite on the backend is caught as on the host: the
    loop restores the last good state and halves the damping (reported), and the fitted
    probabilities are finite."""
    X, y = _data(n=60)
    original = TiedSites.update
    calls = {"n": 0}

    def poisoned(self, terms, idx, rho, iteration=None):
        calls["n"] += 1
        change = original(self, terms, idx, rho, iteration)
        if calls["n"] == 3:
            self.h = self.h * float("nan")  # as an overflow on the device would leave them
            self._whitened = None
        return change

    TiedSites.update = poisoned
    try:
        clf = GPClassifier(method="sep", M=6, max_iter=6, random_state=0,
                           backend="torch").fit(X, y)
    finally:
        TiedSites.update = original
    assert clf.fit_result_.state["failures"] >= 1
    assert np.all(np.isfinite(clf.predict_proba(X)))


@cuda
def test_sep_on_cuda_equals_cpu():  # pragma: no cover - needs a GPU
    X, y = _data()
    p_gpu = GPClassifier(method="sep", M=8, max_iter=6, random_state=0,
                         device="cuda").fit(X, y).predict_proba(X)
    p_cpu = GPClassifier(method="sep", M=8, max_iter=6, random_state=0).fit(X, y).predict_proba(X)
    np.testing.assert_allclose(p_gpu, p_cpu, atol=1e-8)


def test_argmax_quadrature_on_torch_equals_numpy_and_the_two_class_answer():
    """The predictive quadrature of the argmax likelihood (1-D trapezoid around the mode) on
    torch: equal to numpy with its derivatives, and to ``Phi((m_1 - m_0) / sqrt(v_0 + v_1))``
    for two classes."""
    from scipy.special import ndtr

    from gpinfer.likelihoods.multiclass import argmax_probability

    rng = np.random.default_rng(7)
    mean, var = rng.normal(size=(40, 4)) * 3, rng.uniform(0.01, 30, size=(40, 4))
    y = rng.integers(0, 4, 40)
    ref = argmax_probability(mean, var, y)
    got = argmax_probability(torch.as_tensor(mean), torch.as_tensor(var), y)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-13)
    m2, v2 = mean[:, :2], var[:, :2]
    exact = np.log(ndtr((m2[:, 1] - m2[:, 0]) / np.sqrt(v2.sum(axis=1))))
    got2 = argmax_probability(torch.as_tensor(m2), torch.as_tensor(v2), np.ones(40, int))
    np.testing.assert_allclose(got2.log_p.numpy(), exact, rtol=1e-11, atol=1e-13)
