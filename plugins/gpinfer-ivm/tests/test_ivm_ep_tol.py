"""The EP phase's early stop (``ep_tol``) and the in-place site update of the liquid set."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpinfer_ivm import inference
from gpinfer_ivm.inference import IVMSettings, run_inference
from gpinfer_ivm.liquid import EPRepresentation, marginal_change
from gpinfer_ivm.solid import SolidRepresentation
from ivm_test_data import three_blobs

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.kernels.stationary import RBF


def _blobs_run(ep_tol: float, ep_sweeps: int = 3):
    X, y, k = three_blobs(120)
    s = IVMSettings(d_final=24, L=6, ep_sweeps=ep_sweeps, ep_tol=ep_tol, pool_size=40,
                    gh_order=3)
    return run_inference([k] * 3, X, y, np.zeros(3), s, np.random.default_rng(3))


def _every_sweep(self) -> None:
    """The EP phase before ``ep_tol``: always ``ep_sweeps`` sweeps (reference)."""
    for _ in range(self.s.ep_sweeps):
        self.ep_sweep(self.rng.permutation(self.ep.k))
    self.pi = list(self.ep.pi.copy())
    self.b = list(self.ep.b.copy())


def _count(monkeypatch) -> list[list[bool]]:
    """Record every EP phase as the list of its sweeps' "touched a site" flags."""
    phases: list[list[bool]] = []
    phase, sweep = inference._Runner.ep_phase, inference._Runner.ep_sweep

    def counted_phase(self):
        phases.append([])
        return phase(self)

    def counted_sweep(self, order):
        out = sweep(self, order)
        phases[-1].append(out[0])
        return out

    monkeypatch.setattr(inference._Runner, "ep_phase", counted_phase)
    monkeypatch.setattr(inference._Runner, "ep_sweep", counted_sweep)
    return phases


def test_ep_tol_zero_equals_every_sweep_exactly(monkeypatch):
    res = _blobs_run(0.0)
    monkeypatch.setattr(inference._Runner, "ep_phase", _every_sweep)
    ref = _blobs_run(0.0)
    np.testing.assert_array_equal(res.solid.active, ref.solid.active)
    np.testing.assert_array_equal(res.solid.pi, ref.solid.pi)
    np.testing.assert_array_equal(res.solid.b, ref.solid.b)
    assert (res.n_improper, res.n_rejected) == (ref.n_improper, ref.n_rejected)


def test_large_ep_tol_stops_after_one_sweep(monkeypatch):
    phases = _count(monkeypatch)
    _blobs_run(0.0)
    assert len(phases) > 10
    # ep_tol = 0: three sweeps, fewer only after a sweep that touched no site
    assert all(len(p) == 3 or not p[-1] for p in phases)
    every = sum(map(len, phases))
    assert every > 2 * len(phases)
    phases.clear()
    _blobs_run(1e9)
    assert len(phases) > 10 and all(len(p) == 1 for p in phases)
    phases.clear()
    res = _blobs_run(0.03)  # the default
    assert len(phases) <= sum(map(len, phases)) < every
    assert res.solid.d == 24


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_bad_ep_tol_raises_before_training(bad):
    X, y, k = three_blobs(30)
    with pytest.raises(InputError, match="ep_tol"):
        run_inference([k] * 3, X, y, np.zeros(3), IVMSettings(d_final=5, L=2, ep_tol=bad),
                      np.random.default_rng(0))
    with pytest.raises(InputError, match="ep_tol"):
        GPClassifier(method="ivm", M=5, optimize=False,
                     method_options={"ep_tol": bad}).fit(X, y)


def test_set_site_in_place_equals_rebuilt_representation():
    """The rank-C in-place update equals the representation built from the new sites (round-off),
    and returns the marginal change of the updated point."""
    C, n = 10, 40
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, 4))
    kernels = [RBF(lengthscale=rng.uniform(1.0, 2.0), variance=rng.uniform(0.5, 3.0))
               for _ in range(C)]  # fmt: skip
    idx = rng.permutation(n)[:14]
    pi = rng.uniform(0.1, 2.0, (14, C))
    b = rng.standard_normal((14, C))
    solid = SolidRepresentation.from_sites(kernels, X, idx[:6], pi[:6], b[:6])
    ep = EPRepresentation(solid, idx[6:], pi[6:], b[6:])
    for a in (3, 0, 7, 3):
        h0, A0 = ep.liquid_marginal(a)
        new_pi, new_b = rng.uniform(0.1, 2.0, C), rng.standard_normal(C)
        change = ep.set_site(a, new_pi, new_b)
        pi[6 + a], b[6 + a] = new_pi, new_b
        fresh = EPRepresentation(solid, idx[6:], pi[6:], b[6:])
        np.testing.assert_allclose(ep.Sigma, fresh.Sigma, rtol=0, atol=1e-10)
        np.testing.assert_allclose(ep.mu, fresh.mu, rtol=0, atol=1e-10)
        h1, A1 = fresh.liquid_marginal(a)
        assert change == pytest.approx(
            marginal_change(h0, A0.diagonal(), h1, A1.diagonal()), rel=1e-8)
        assert change > 0.0
        others = np.setdiff1d(np.arange(n), idx[6:])
        for got, want in zip(ep.marginals(others), fresh.marginals(others)):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_marginal_change_is_scale_free():
    h0, h1 = np.array([0.0, 1.0]), np.array([0.3, 1.0])
    v0, v1 = np.array([1.0, 4.0]), np.array([1.0, 2.0])
    assert marginal_change(h0, v0, h1, v1) == pytest.approx(math.log(2.0))
    assert marginal_change(10 * h0, 100 * v0, 10 * h1, 100 * v1) == pytest.approx(math.log(2.0))
    assert marginal_change(h0, v0, h0 + np.array([0.0, 6.0]), v0) == pytest.approx(3.0)
    assert marginal_change(h0, v0, h1, -v1) == math.inf
