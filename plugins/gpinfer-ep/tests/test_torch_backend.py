"""ep / sep state algebra on the torch backend (CPU build in CI) against the frozen-cavity
oracle (spec O6): the gradient the torch state reports equals central differences of the
surrogate evaluated densely on the host."""

from __future__ import annotations

import numpy as np
import pytest
from ep_helpers import frozen_surrogate, hyper, problem, u_space_cavities
from gpinfer_ep.state import RankOneSites, TiedSites

from gpinfer.backend import ops, resolve_backend
from gpinfer.sites.stacked import stacked_terms
from gpinfer.testing import assert_gradient_close

torch = pytest.importorskip("torch")


def _host_mirror(state, cls, y, C, M):
    """The same sites as numpy arrays (the dense oracle reads them on the host)."""
    host = cls(y, C, M)
    for name, value in vars(state).items():
        if ops.is_array(value) and not ops.is_numpy(value):
            setattr(host, name, ops.to_host(value).copy())
    # read through the attributes: TiedSites keeps its sums whitened and forms Lam, h on read
    host.Lam, host.h = (ops.to_host(a).copy() for a in (state.Lam, state.h))
    return host


@pytest.mark.parametrize("cls", [TiedSites, RankOneSites], ids=["sep", "ep"])
def test_torch_gradient_is_exact_for_the_frozen_cavity_surrogate(cls):
    backend = resolve_backend("torch")
    X, y, kernels, Zs = problem(seed=1)
    state = cls(y, 3, 4, backend=backend)
    Xt, idx = backend.asarray(X), np.arange(12)
    Zt = [backend.asarray(z) for z in Zs]
    for _ in range(4):
        state.update(stacked_terms(kernels, Zt, Xt), idx, 0.5)
    hp_t = hyper(kernels, Zt)
    _, grads = state.evaluate(stacked_terms(kernels, hp_t.Z, Xt), idx)
    analytic = ops.to_host(hp_t.gradient(Xt, grads))
    hp = hyper(kernels, Zs)
    theta0 = hp.pack()
    np.testing.assert_allclose(ops.to_host(hp_t.pack()), theta0, rtol=0, atol=0)
    Lam, h, cav = u_space_cavities(_host_mirror(state, cls, y, 3, 4), kernels, hp.Z, X)

    def f(theta):
        hp.unpack(theta)
        return frozen_surrogate(kernels, hp.Z, X, y, Lam, h, cav)

    assert_gradient_close(f, analytic, theta0, eps=1e-6, rtol=1e-5, atol=1e-7,
                          name=f"{cls.__name__} frozen-cavity gradient on torch")


def test_slope_sums_on_a_device_equal_the_aggregate():
    """The evaluation's slope sums on a device (the negated row sums one product with kept
    -1s) equal numpy's ``scale * aggregate(g, -g, mask)`` to round-off, winners and losers."""
    from gpinfer_ep.state import _slope_sums

    from gpinfer.sites.inducing import aggregate, factor_mask

    rng = np.random.default_rng(0)
    n, C = 40, 5
    y = rng.integers(0, C, n)
    mask = factor_mask(y, C)
    g = np.where(mask, rng.normal(size=(n, C)), 0.0)  # zero off the factors, as pair_log_z's
    want = 2.5 * aggregate(g, -g, mask, win_masked=True)
    assert np.array_equal(_slope_sums(g, mask, 2.5), want)
    got = _slope_sums(torch.as_tensor(g), torch.as_tensor(mask), 2.5).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    assert np.array_equal(got[mask], want[mask])  # the losers' entries: exact


def test_first_row_sum_on_a_device_equals_the_sum():
    """q's log-norm ratios summed on a device (one einsum with kept (1, 0)) equal numpy's."""
    from gpinfer_ep.state import _first_row_sum

    lnr = np.random.default_rng(1).normal(size=(2, 7))
    assert _first_row_sum(lnr) == np.sum(lnr[0])
    got = float(_first_row_sum(torch.as_tensor(lnr)))
    assert abs(got - np.sum(lnr[0])) <= 1e-14 * np.abs(lnr[0]).sum()
    assert abs(got - np.sum(lnr)) > 1e-3  # the second row is left out
