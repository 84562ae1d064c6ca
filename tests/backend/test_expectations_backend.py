"""The likelihood expectations of svi's ELBO (``variational_expectations``) on the torch
backend: the same numbers as numpy (float64, 1e-12), labels on the host or on the device,
finite float32 results, and clear errors for the rules that run on numpy only."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit, RobustMax, Softmax

torch = pytest.importorskip("torch", reason="the torch backend's tests need PyTorch (make test "
                            "installs its CPU build)")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])



def _t(x: np.ndarray, device: str, dtype=None) -> torch.Tensor:
    return torch.as_tensor(x, dtype=dtype or (torch.float64 if x.dtype.kind == "f" else None),
                           device=device)


def _assert_same(host, dev, atol=1e-12, rtol=1e-12):
    for name, a, b in zip(("value", "dmean", "dvar"), host, dev):
        assert isinstance(b, torch.Tensor), name
        np.testing.assert_allclose(b.detach().cpu().numpy(), a, rtol=rtol, atol=atol,
                                   err_msg=name)


def _binary(n=60, seed=0):
    rng = np.random.default_rng(seed)
    # wide ranges: tails of both links, tiny and large variances
    mean = rng.normal(size=n) * 4.0
    var = np.exp(rng.uniform(np.log(1e-6), np.log(50.0), n))
    return mean, var, rng.integers(0, 2, n)


def _multiclass(n=80, C=4, seed=1):
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=(n, C)) * 2.0
    var = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), (n, C)))  # unequal variances
    return mean, var, rng.integers(0, C, n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("labels_on_device", [False, True])
@pytest.mark.parametrize(
    "lik", [BernoulliLogit(), BernoulliProbit(), BernoulliLogit(quadrature_points=20),
            BernoulliProbit(quadrature_points=31)], ids=repr)
def test_bernoulli_gauss_hermite_equals_numpy(lik, labels_on_device, device):
    mean, var, y = _binary()
    host = lik.variational_expectations(y, mean, var)
    yd = _t(y, device) if labels_on_device else y
    dev = lik.variational_expectations(yd, _t(mean, device), _t(var, device))
    _assert_same(host, dev)
    assert dev.value.device.type == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("labels_on_device", [False, True])
@pytest.mark.parametrize("C", [2, 3, 10])
@pytest.mark.parametrize(
    "lik", [RobustMax(), RobustMax(1e-2, expectation="gauss_hermite")], ids=repr)
def test_robustmax_rules_equal_numpy(lik, C, labels_on_device, device):
    mean, var, y = _multiclass(C=C)
    host = lik.variational_expectations(y, mean, var)
    yd = _t(y, device) if labels_on_device else y
    dev = lik.variational_expectations(yd, _t(mean, device), _t(var, device))
    _assert_same(host, dev)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("C", "order"), [(3, None), (4, 6), (6, 3)])
def test_softmax_gauss_hermite_equals_numpy(C, order, device):
    mean, var, y = _multiclass(n=30, C=C)
    lik = Softmax(gh_order=order)
    host = lik.variational_expectations(y, mean, var)
    dev = lik.variational_expectations(_t(y, device), _t(mean, device), _t(var, device))
    _assert_same(host, dev)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_monte_carlo_equals_numpy_with_the_same_generator(device):
    mean, var, y = _multiclass(C=5)
    lik = Softmax(expectation="monte_carlo", mc_samples=16)
    host = lik.variational_expectations(y, mean, var, rng=np.random.default_rng(3))
    dev = lik.variational_expectations(_t(y, device), _t(mean, device), _t(var, device),
                                       rng=np.random.default_rng(3))
    _assert_same(host, dev)


@pytest.mark.parametrize(
    "lik", [BernoulliLogit(), BernoulliProbit(), RobustMax(),
            RobustMax(expectation="gauss_hermite"), Softmax(expectation="monte_carlo"),
            Softmax(gh_order=8)],
    ids=repr)
def test_float32_is_finite_and_close(lik):
    if lik.multiclass:
        mean, var, y = _multiclass(C=4)
    else:
        mean, var, y = _binary()
        var = np.clip(var, 1e-3, None)  # float32 resolves no smaller variances of |mean| ~ 10
    kw = {"rng": np.random.default_rng(0)}
    host = lik.variational_expectations(y, mean, var, **kw)
    kw = {"rng": np.random.default_rng(0)}
    dev = lik.variational_expectations(y, _t(mean, "cpu", torch.float32),
                                       _t(var, "cpu", torch.float32), **kw)
    for a, b in zip(host, dev):
        assert b.dtype == torch.float32
        b = b.numpy()
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=2e-3 * max(1.0, np.abs(a).max()))


@pytest.mark.parametrize(
    ("lik", "pattern"),
    [(RobustMax(expectation="log_space"), "log_space.*numpy only"),
     (Softmax(), "2 classes runs on numpy only"),
     (BernoulliLogit(expectation="adaptive"), "adaptive.*numpy only")], ids=str)
def test_numpy_only_rules_refuse_tensors(lik, pattern):
    if lik.multiclass:
        mean, var, y = _multiclass(C=2 if isinstance(lik, Softmax) else 3)
    else:
        mean, var, y = _binary()
    with pytest.raises(InputError, match=pattern):
        lik.variational_expectations(y, _t(mean, "cpu"), _t(var, "cpu"))


def test_inputs_are_checked_on_the_device():
    mean, var, y = _multiclass(C=3)
    lik = RobustMax()
    bad = mean.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InputError, match="NaN or infinite"):
        lik.variational_expectations(y, _t(bad, "cpu"), _t(var, "cpu"))
    with pytest.raises(InputError, match="non-negative"):
        lik.variational_expectations(y, _t(mean, "cpu"), _t(-var, "cpu"))
    with pytest.raises(InputError, match=r"class indices in 0\.\.2"):
        lik.variational_expectations(_t(y + 1, "cpu"), _t(mean, "cpu"), _t(var, "cpu"))
    with pytest.raises(InputError, match="shape"):
        lik.variational_expectations(_t(y[:-1], "cpu"), _t(mean, "cpu"), _t(var, "cpu"))
    m, v, yb = _binary()
    with pytest.raises(InputError, match="sign labels"):
        BernoulliLogit().variational_expectations(_t(2 * yb - 1, "cpu"), _t(m, "cpu"),
                                                  _t(v, "cpu"))


def test_numpy_results_are_numpy():
    """The numpy path is untouched: numpy in, numpy out (no tensors, no warnings)."""
    mean, var, y = _multiclass(C=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = RobustMax().variational_expectations(y, mean, var)
    assert all(isinstance(a, np.ndarray) for a in out)
