"""``gpinfer_pep.power_tilted``: the scaled tilted moments of Power EP (spec power-ep §7,
oracle 8): derivatives by finite differences for every power, and the quadrature rule against
the probit's closed form. Moved here from the pep plugin's tests."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_pep.power_tilted import scaled_tilted

from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit

PROBIT = BernoulliProbit()


@pytest.mark.parametrize("lik", [PROBIT, BernoulliLogit()])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0])
def test_tilted_derivatives(lik, alpha):  # oracle 8
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 12)
    m, v = rng.normal(size=12) * 2, rng.uniform(0.05, 20, 12)
    a = np.full(12, alpha)
    t = scaled_tilted(lik, y, m, v, a)
    e = 1e-5
    d1 = (scaled_tilted(lik, y, m + e, v, a).log_z - scaled_tilted(lik, y, m - e, v, a).log_z)
    dv = (scaled_tilted(lik, y, m, v + e, a).log_z - scaled_tilted(lik, y, m, v - e, a).log_z)
    np.testing.assert_allclose(t.d1, d1 / (2 * e), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(t.dv, dv / (2 * e), rtol=1e-6, atol=1e-9)


def test_quadrature_matches_probit_closed_form():  # oracle 8
    m, v = np.meshgrid(np.linspace(-6, 6, 13), np.logspace(-4, 3, 8))
    m, v = m.ravel(), v.ravel()
    for label in (0, 1):
        y = np.full(m.size, label)
        closed = scaled_tilted(PROBIT, y, m, v, np.ones(m.size))
        quad = scaled_tilted(PROBIT, y, m, v, np.full(m.size, 1 - 1e-12))
        for c, q in zip(closed[:3], quad[:3]):
            np.testing.assert_allclose(q, c, atol=1e-8)
