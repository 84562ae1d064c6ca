"""svi on the torch backend: the class-batched ELBO and its gradients equal numpy's (float64,
1e-12) and pass finite differences on torch; a fit on torch equals the numpy fit (predicted
probabilities and final ELBO to 1e-8), L-BFGS-B (the full-batch default on every backend)
included; float32 fits are finite; the posterior is on the host; the numpy-only rules are
refused with clear errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState
from gpinfer_svi.variational import (
    likelihood_expectation,
    natural_gradient_step,
    uncollapsed_elbo,
)

from gpinfer.backend import resolve_backend
from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit, RobustMax, Softmax
from gpinfer.testing.gradcheck import assert_gradient_close

torch = pytest.importorskip("torch", reason="the torch backend's tests need PyTorch (make test "
                            "installs its CPU build)")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])



def _t(x, device="cpu"):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64, device=device)


def _h(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# -- the ELBO -----------------------------------------------------------------------------------


def _elbo_inputs(n_latent: int, seed: int = 11, B: int = 9, M: int = 4):
    rng = np.random.default_rng(seed)
    X, Z = rng.normal(size=(B, 2)), rng.normal(size=(M, 2))
    kerns = [RBF(lengthscale=1.0 + 0.3 * l, variance=1.2) + White(0.05) for l in range(n_latent)]
    Kuu = np.stack([k.K(Z) for k in kerns])
    Kub = np.stack([k.K(Z, X) for k in kerns])
    Kd = np.stack([k.K_diag(X) for k in kerns])
    mu = rng.normal(size=(n_latent, M)) * 0.5
    Lq = np.tril(rng.normal(size=(n_latent, M, M)) * 0.2) + np.eye(M)
    if n_latent == 1:
        lik, y = BernoulliLogit(), rng.integers(0, 2, B)
    else:
        lik, y = RobustMax(1e-3), rng.integers(0, n_latent, B)
    return Kuu, Kub, Kd, mu, Lq, lik, y


def _estimates(n_latent, device="cpu", labels_on_device=False):
    Kuu, Kub, Kd, mu, Lq, lik, y = _elbo_inputs(n_latent)
    host = uncollapsed_elbo(list(Kuu), list(Kub), Kd, mu, Lq, likelihood_expectation(lik, y),
                            3.0)
    yd = torch.as_tensor(y, device=device) if labels_on_device else y
    dev = uncollapsed_elbo([_t(K, device) for K in Kuu], _t(Kub, device), _t(Kd, device),
                           _t(mu, device), _t(Lq, device), likelihood_expectation(lik, yd), 3.0)
    return host, dev


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("labels_on_device", [False, True])
@pytest.mark.parametrize("n_latent", [1, 3])
def test_elbo_and_gradients_equal_numpy(n_latent, labels_on_device, device):
    host, dev = _estimates(n_latent, device, labels_on_device)
    for got in (dev.value, dev.kl):  # left unread on the device (issue 25: no host sync)
        assert isinstance(got, torch.Tensor) and got.ndim == 0 and got.device.type == device
        assert got.dtype == torch.float64
    assert float(dev.value) == pytest.approx(host.value, rel=1e-12, abs=1e-12)
    assert float(dev.kl) == pytest.approx(host.kl, rel=1e-12, abs=1e-12)
    for name in ("dmu", "dLq", "dSigma", "expected"):
        got = getattr(dev, name)
        assert isinstance(got, torch.Tensor) and got.device.type == device, name
        np.testing.assert_allclose(_h(got), getattr(host, name), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
    for l, (a, b) in enumerate(zip(host.matrix, dev.matrix)):
        for name in ("Kuu", "Kuf", "Kff_diag"):
            np.testing.assert_allclose(_h(getattr(b, name)), getattr(a, name), rtol=1e-12,
                                       atol=1e-12, err_msg=f"latent {l} {name}")


@pytest.mark.parametrize("n_latent", [1, 2])
def test_elbo_gradients_by_finite_differences_on_torch(n_latent):
    """Every gradient of the ELBO evaluated on tensors: ``mu``, ``Lq`` and the matrix
    gradients (``Kuu``, ``Kuf``, ``Kff_diag``) against central differences of the torch value."""
    Kuu, Kub, Kd, mu, Lq, lik, y = _elbo_inputs(n_latent)
    fn = likelihood_expectation(lik, torch.as_tensor(y))
    args0 = {"Kuu": Kuu, "Kub": Kub, "Kdiag": Kd, "mu": mu, "Lq": Lq}

    def value(**over):
        args = {k: _t(v) for k, v in {**args0, **over}.items()}
        return uncollapsed_elbo(args["Kuu"], args["Kub"], args["Kdiag"], args["mu"],
                                args["Lq"], fn, 3.0).value

    est = uncollapsed_elbo(_t(Kuu), _t(Kub), _t(Kd), _t(mu), _t(Lq), fn, 3.0)
    assert_gradient_close(lambda m: value(mu=m), _h(est.dmu), mu, name="dELBO/dmu")
    assert_gradient_close(lambda L: value(Lq=np.tril(L)), _h(est.dLq), Lq, name="dELBO/dLq")
    for l in range(n_latent):
        G = est.matrix[l]

        def with_kuu(K, l=l):
            return value(Kuu=np.stack([0.5 * (K + K.T) if j == l else Kuu[j]
                                       for j in range(n_latent)]))

        def with_kub(K, l=l):
            return value(Kub=np.stack([K if j == l else Kub[j] for j in range(n_latent)]))

        def with_kd(d, l=l):
            return value(Kdiag=np.stack([d if j == l else Kd[j] for j in range(n_latent)]))

        assert_gradient_close(with_kuu, _h(G.Kuu), Kuu[l], name=f"dELBO/dKuu[{l}]")
        assert_gradient_close(with_kub, _h(G.Kuf), Kub[l], name=f"dELBO/dKuf[{l}]")
        assert_gradient_close(with_kd, _h(G.Kff_diag), Kd[l], name=f"dELBO/dKdiag[{l}]")


def test_natural_gradient_step_equals_numpy():
    host, dev = _estimates(3)
    _, _, _, mu, Lq, _, _ = _elbo_inputs(3)
    for l in range(3):
        a = natural_gradient_step(mu[l], Lq[l], host.dmu[l], host.dSigma[l], 0.7)
        b = natural_gradient_step(_t(mu[l]), _t(Lq[l]), dev.dmu[l], dev.dSigma[l], 0.7)
        for x, z in zip(a, b):
            assert isinstance(z, torch.Tensor)
            np.testing.assert_allclose(_h(z), x, rtol=1e-10, atol=1e-12)


def test_non_finite_kernel_matrix_is_an_error_on_torch():
    Kuu, Kub, Kd, mu, Lq, lik, y = _elbo_inputs(3)
    Kuu = Kuu.copy()
    Kuu[1, 0, 0] = np.nan
    with pytest.raises(NumericalError, match=r"Kuu \(latent 1\) has non-finite"):
        uncollapsed_elbo(_t(Kuu), _t(Kub), _t(Kd), _t(mu), _t(Lq),
                         likelihood_expectation(lik, y))


# -- VariationalState: packed parameters, kernel gradients ---------------------------------------


def _state(lik, backend, C=1, n=30, M=5, seed=0, learn_Z=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = rng.integers(0, max(C, 2), n)
    kernels = [RBF(lengthscale=1.0 + 0.2 * c, variance=1.3) + White(0.03) for c in range(C)]
    Z = X[:M] + 0.1
    hp = HyperParameters(kernels, Z=[backend.asarray(Z) for _ in range(C)],
                         optimize_inducing=learn_Z)
    st = VariationalState(X, y, lik, hp, C, M, backend=backend)
    mu = rng.normal(size=(C, M)) * 0.5
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.2) + np.eye(M)
    return st, st.pack(backend.asarray(mu), backend.asarray(Lq))


@pytest.mark.parametrize("learn_Z", [False, True])
@pytest.mark.parametrize(("lik", "C"), [(BernoulliProbit(), 1), (RobustMax(1e-3), 3)],
                         ids=["probit", "robustmax"])
def test_state_gradient_equals_numpy_and_finite_differences(lik, C, learn_Z):
    torch_backend = resolve_backend("torch")
    st_np, x_np = _state(lik, resolve_backend(), C=C, learn_Z=learn_Z)
    st_t, x_t = _state(lik, torch_backend, C=C, learn_Z=learn_Z)
    assert not st_t._fast and isinstance(x_t, torch.Tensor)
    np.testing.assert_array_equal(_h(x_t), x_np)
    batch = np.arange(0, 30, 3)
    v_np, g_np = st_np.elbo(x_np, batch)
    v_t, g_t = st_t.elbo(x_t, batch)
    assert isinstance(g_t, torch.Tensor)
    assert v_t == pytest.approx(v_np, rel=1e-12)
    np.testing.assert_allclose(_h(g_t), g_np, rtol=1e-10, atol=1e-10)
    assert_gradient_close(lambda z: st_t.elbo(_t(z), batch)[0], _h(g_t), x_np, rtol=1e-5,
                          atol=1e-6, name="svi ELBO gradient on torch")


# -- fits ---------------------------------------------------------------------------------------


def _problem(lik, C, backend, batch_size, n=90, M=8, max_iter=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    if C > 2:
        y = np.argmax(X @ rng.normal(size=(2, C)) + 0.3 * rng.normal(size=(n, C)), axis=1)
    else:
        y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return Problem(X=X, y=y.astype(np.int64), n_classes=C, kernel=RBF(), likelihood=lik,
                   inducing=M, max_iter=max_iter, batch_size=batch_size,
                   rng=np.random.default_rng(seed + 1), backend=backend)


X_TEST = np.random.default_rng(5).normal(size=(25, 2))


def _fit(lik, C, backend, batch_size, **options):
    return SVI(**options).fit(_problem(lik, C, backend, batch_size))


FIT_CASES = [(RobustMax(), 3), (BernoulliProbit(), 2)]
MORE_CASES = [(Softmax(gh_order=8), 3), (RobustMax(expectation="gauss_hermite"), 4),
              (BernoulliLogit(quadrature_points=30), 2)]


@pytest.mark.parametrize(("lik", "C"), MORE_CASES, ids=["softmax-gh", "robustmax-gh", "logit"])
def test_more_likelihoods_fit_on_torch_equal_numpy(lik, C):
    ref = _fit(lik, C, resolve_backend(), 30, optimizer="adam")
    got = _fit(lik, C, resolve_backend("torch"), 30, optimizer="adam")
    assert got.log_evidence == pytest.approx(ref.log_evidence, rel=1e-8, abs=1e-8)
    np.testing.assert_allclose(got.posterior.predict_proba(X_TEST),
                               ref.posterior.predict_proba(X_TEST), rtol=0, atol=1e-8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{"optimizer": "adam"}, {"optimizer": "adadelta"},
                                     {"optimizer": "adam", "natural_gradient": 0.5}],
                         ids=["adam", "adadelta", "adam+natural"])
@pytest.mark.parametrize("batch_size", [30, None])
@pytest.mark.parametrize(("lik", "C"), FIT_CASES, ids=["robustmax", "probit"])
def test_fit_on_torch_equals_numpy(lik, C, batch_size, options, device):
    ref = _fit(lik, C, resolve_backend(), batch_size, **options)
    got = _fit(lik, C, resolve_backend("torch", device=device), batch_size, **options)
    assert got.log_evidence == pytest.approx(ref.log_evidence, rel=1e-8, abs=1e-8)
    np.testing.assert_allclose(got.posterior.predict_proba(X_TEST),
                               ref.posterior.predict_proba(X_TEST), rtol=0, atol=1e-8)
    assert got.n_iter == ref.n_iter
    assert [h["objective"] for h in got.history] == pytest.approx(
        [h["objective"] for h in ref.history], rel=1e-8)
    for key in ("mu", "Lq", "Z"):
        assert type(got.state[key]) is np.ndarray, key
        np.testing.assert_allclose(got.state[key], ref.state[key], rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize(("lik", "C"), [*FIT_CASES, (Softmax(expectation="monte_carlo"), 3),
                                        (BernoulliLogit(), 2)],
                         ids=["robustmax", "probit", "softmax-mc", "logit"])
def test_float32_fit_is_finite_and_on_the_host(lik, C):
    backend = resolve_backend("torch", dtype="float32")
    res = _fit(lik, C, backend, 30, optimizer="adam")
    P = res.posterior.predict_proba(X_TEST)
    assert np.all(np.isfinite(P)) and np.allclose(P.sum(axis=1), 1.0)
    assert np.isfinite(res.log_evidence)
    post = res.posterior
    for arr in [*post.Z, *post.m, *post.S]:
        assert type(arr) is np.ndarray
    clone = pickle.loads(pickle.dumps(post))
    np.testing.assert_allclose(clone.predict_proba(X_TEST), P)
    ref = _fit(lik, C, resolve_backend(), 30, optimizer="adam")
    np.testing.assert_allclose(P, ref.posterior.predict_proba(X_TEST), atol=1e-3)


def test_posterior_of_a_torch_fit_is_plain_numpy():
    res = _fit(RobustMax(), 3, resolve_backend("torch"), 30, optimizer="adam")
    payload = pickle.dumps(res.posterior)
    assert b"torch" not in payload
    post = res.posterior
    assert all(type(a) is np.ndarray for a in [*post.Z, *post.m, *post.S])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{}, {"optimizer": "lbfgs", "hyper_bounds": (-5.0, 5.0),
                                          "learn_inducing": True}],
                         ids=["default", "lbfgs-bounded-Z"])
@pytest.mark.parametrize(("lik", "C"), FIT_CASES, ids=["robustmax", "probit"])
def test_lbfgs_on_torch_follows_the_numpy_path(lik, C, options, device):
    """L-BFGS-B keeps its state on the host and evaluates on the device: the same iterations,
    objectives and model as on numpy (full batch: L-BFGS-B is the default on both)."""
    ref = _fit(lik, C, resolve_backend(), None, **options)
    got = _fit(lik, C, resolve_backend("torch", device=device), None, **options)
    assert "lbfgs_success" in got.state and got.n_iter == ref.n_iter
    assert [h["objective"] for h in got.history] == pytest.approx(
        [h["objective"] for h in ref.history], rel=1e-9)
    np.testing.assert_allclose(got.posterior.predict_proba(X_TEST),
                               ref.posterior.predict_proba(X_TEST), rtol=0, atol=1e-8)
    for key in ("mu", "Lq", "Z"):
        assert type(got.state[key]) is np.ndarray, key


def test_lbfgs_in_float32_stays_close_to_float64():
    """float32 on torch with L-BFGS-B: allowed; round-off moves the path slowly away from the
    float64 one (docs/backends.md): probabilities within 1e-3 over these few iterations."""
    ref = _fit(RobustMax(), 3, resolve_backend(), None)
    got = _fit(RobustMax(), 3, resolve_backend("torch", dtype="float32"), None)
    P = got.posterior.predict_proba(X_TEST)
    assert np.all(np.isfinite(P))
    np.testing.assert_allclose(P, ref.posterior.predict_proba(X_TEST), rtol=0, atol=1e-3)


@pytest.mark.parametrize(("lik", "C"), [(RobustMax(expectation="log_space"), 3), (Softmax(), 2)],
                         ids=["robustmax-log-space", "softmax-2-classes"])
def test_numpy_only_expectation_rules_are_refused(lik, C):
    with pytest.raises(InputError, match="numpy only"):
        _fit(lik, C, resolve_backend("torch"), 30, optimizer="adam")


def test_non_finite_steps_raise_on_torch():
    """A diverging optimiser: the non-finite ELBO is an error, as on numpy, never NaN
    probabilities."""
    with pytest.raises(NumericalError):
        _fit(RobustMax(), 3, resolve_backend("torch"), 30, optimizer="adam",
             optimizer_options={"learning_rate": 1e8})


def test_method_declares_its_backends():
    assert set(SVI.backends) == {"numpy", "torch"}
    assert SVI.float32 is True


def test_estimator_runs_svi_on_torch():
    from gpinfer import GPClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    kw = {"method": "svi", "likelihood": "probit", "M": 8, "max_iter": 3, "batch_size": 20,
          "method_options": {"optimizer": "adam"}, "random_state": 0}
    ref = GPClassifier(**kw).fit(X, y)
    got = GPClassifier(backend="torch", **kw).fit(X, y)
    np.testing.assert_allclose(got.predict_proba(X), ref.predict_proba(X), atol=1e-8)


def test_vi_robustmax_preset_runs_on_torch():
    """The preset's batch L-BFGS-B runs on every backend (its state on the host): the check
    before training passes it and its default rule (robust-max trapezoid) on torch."""
    from gpinfer_svi.presets import ViRobustMax

    from gpinfer.validation import check_method_compatible

    assert set(ViRobustMax.backends) == {"numpy", "torch"}
    check_method_compatible(ViRobustMax, 3, "classification", None, None,
                            backend=resolve_backend("torch"))
