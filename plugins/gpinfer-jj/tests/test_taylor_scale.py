"""vi-taylor at scale: Stage 1 must not diverge on 2e5 points (regression of a silent failure).

On a 196 045-point, 3-feature, 1:4 binary set, vi-taylor's objective climbed to +1.2e16 while
the kernel parameters ran to their bounds: after a Stage-2 step, the paper's undamped rule
``xi <- m`` (Newton's method for the projected-process MAP) diverged from the carried ``q(u)``,
the means of wrongly classified points ran to -40 ... -100 and the Taylor sites expanded there
made the surrogate positive. ``scale_synthetic`` reproduces that shape; the mode under one
length-scale, carried to a nearby length-scale, is exactly such a start.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_jj.bound import CollapsedObjective
from gpinfer_jj.method import ViTaylor
from gpinfer_jj.quadratic import CollapsedBound, taylor_coefficients
from gpinfer_jj.taylor import MapObjective, newton_rounds

from gpinfer.data.generators import scale_synthetic
from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF
from gpinfer.likelihoods import BernoulliLogit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.numerics.cholesky import tri_solve

N_POINTS, M = 200_000, 100


@pytest.fixture(scope="module")
def carried_mode():
    """The 2e5-point objective at length-scale 1.5 and the mode ``q(u)`` of length-scale 2."""
    ds = scale_synthetic(N_POINTS, d=3, n_classes=2, unbalanced=True, seed=0)
    s = 2.0 * ds.y - 1.0
    Z = ds.X[np.random.default_rng(0).choice(N_POINTS, M, replace=False)]
    kernel = RBF(lengthscale=2.0, variance=300.0)
    obj = CollapsedObjective("taylor", ds.X, s, kernel, Z, BernoulliLogit(),
                             HyperParameters(kernel, Z=Z, optimize_inducing=False))
    fac = obj.factors()
    taylor = MapObjective(s, LOGISTIC)
    start = taylor.point(np.zeros(M), np.zeros(N_POINTS))
    mode = newton_rounds(taylor, fac, lambda x: obj.bound(x, fac), start, 12)
    kernel.set_unconstrained(np.log([1.5, 300.0]))  # what a Stage-2 step does to theta
    return obj, taylor, mode


def _map_value(obj: CollapsedObjective, taylor: MapObjective, mu: np.ndarray) -> float:
    fac = obj.factors()
    nu = tri_solve(fac.L, mu)
    return taylor.point(nu, fac.A_T @ nu).value


def test_the_paper_rule_diverges_from_the_carried_mode(carried_mode):
    """The failure this guards against (so the next test can fail): undamped rounds go wrong."""
    obj, taylor, mode = carried_mode
    fac = obj.factors()
    xi = fac.A_T @ tri_solve(fac.L, mode.mu)
    values, bounds = [_map_value(obj, taylor, mode.mu)], []
    for _ in range(3):
        b = CollapsedBound(fac, taylor_coefficients(xi, obj.s, LOGISTIC))
        xi = b.m_hat
        values.append(_map_value(obj, taylor, b.mu_hat))
        bounds.append(b.value)
    assert values[-1] < values[0] - 1e4  # the MAP objective falls by orders of magnitude
    assert max(bounds) > 0.0  # and the surrogate of a log-likelihood turns positive


def test_stage1_is_a_monotone_ascent_and_keeps_the_surrogate_negative(carried_mode):
    obj, taylor, mode = carried_mode
    method = ViTaylor(n_upd=1)
    mu, Sigma, values, halvings = mode.mu, mode.Sigma, [_map_value(obj, taylor, mode.mu)], 0
    for _ in range(6):
        out = method._stage1(obj, mu, Sigma, None)
        mu, Sigma = out.mu, out.Sigma
        values.append(_map_value(obj, taylor, mu))
        halvings += out.halvings
        assert out.value < 0.0
    assert halvings > 0  # the safeguard acted
    assert np.all(np.diff(values) >= -1e-8 * abs(values[0]))
    margins = obj.s * out.xi
    assert margins.min() > -25.0  # no expansion point far on the wrong side
    assert values[-1] > values[0]
