"""svi's default robust-max rule (``gpinfer_svi.robustmax``) against independent references,
and the Table-2 VI set-up options of svi (spec ep-sep §2.11, §3.2, O13, O14)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState
from gpinfer_svi.robustmax import argmax_probability_abs, robustmax_trapezoid_expectation
from scipy.special import ndtr

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.kernels.initialisation import prepare_kernel
from gpinfer.likelihoods import RobustMax
from gpinfer.likelihoods.multiclass import argmax_probability
from gpinfer.sites.variational import robustmax_expectation


def _reference(mean, var, y):
    """``P``, ``dP/dmean``, ``dP/dvar`` from the likelihood's log-space rule (~1e-13)."""
    out = argmax_probability(mean, var, y)
    P = np.exp(out.log_p)
    return P, P[:, None] * out.dmean, P[:, None] * out.dvar


def _cases(rng, B=40):
    """Random marginals: 3 to 10 classes, mean spreads 0.1..10, variance ratios up to 1e3."""
    for C in (3, 6, 10):
        for spread in (0.1, 1.0, 5.0):
            for decades in (0.0, 1.5, 3.0):
                mean = rng.normal(size=(B, C)) * spread
                var = (10 ** rng.uniform(-decades / 2, decades / 2, size=(B, C))
                       * 10 ** rng.uniform(-1.5, 1.5, size=(B, 1)))
                yield mean, var, rng.integers(0, C, B)


def test_robustmax_trapezoid_matches_the_reference_rule():
    rng = np.random.default_rng(0)
    for mean, var, y in _cases(rng):
        for got, want in zip(argmax_probability_abs(mean, var, y), _reference(mean, var, y)):
            assert np.all(np.abs(got - want) <= 1e-8 * (1.0 + np.abs(want)))


def test_robustmax_trapezoid_two_classes_closed_form():
    """O14(b): ``P = Phi((m_y - m_k) / sqrt(v_y + v_k))`` for C = 2, very unequal variances."""
    rng = np.random.default_rng(1)
    for ratio in (1e-4, 1e-2, 1.0, 1e2):
        mean = rng.normal(size=(50, 2)) * 2
        var = np.column_stack([np.full(50, 0.7), np.full(50, 0.7 * ratio)])
        y = rng.integers(0, 2, 50)
        P, _, _ = argmax_probability_abs(mean, var, y)
        rows = np.arange(50)
        exact = ndtr((mean[rows, y] - mean[rows, 1 - y]) / np.sqrt(var.sum(axis=1)))
        np.testing.assert_allclose(P, exact, rtol=0, atol=1e-10)


def test_robustmax_trapezoid_derivatives_are_exact_for_the_discretised_sum():
    rng = np.random.default_rng(2)
    B, C, h = 6, 5, 1e-6
    mean, var, y = rng.normal(size=(B, C)), rng.uniform(0.5, 1.5, (B, C)), rng.integers(0, C, B)
    _, dm, dv = argmax_probability_abs(mean, var, y)
    for c in range(C):
        e = np.zeros((B, C))
        e[:, c] = h
        num_m = (argmax_probability_abs(mean + e, var, y)[0]
                 - argmax_probability_abs(mean - e, var, y)[0]) / (2 * h)
        num_v = (argmax_probability_abs(mean, var + e, y)[0]
                 - argmax_probability_abs(mean, var - e, y)[0]) / (2 * h)
        np.testing.assert_allclose(dm[:, c], num_m, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(dv[:, c], num_v, rtol=1e-6, atol=1e-9)


def test_gauss_hermite_in_f_y_is_inaccurate_where_the_trapezoid_is_not():
    """Why the default changed: 20-node Gauss-Hermite at C = 10 with unequal variances."""
    rng = np.random.default_rng(3)
    B, C = 100, 10
    mean, y = rng.normal(size=(B, C)), rng.integers(0, C, B)
    var = 10 ** rng.uniform(-1, 1, size=(B, C))
    eps = 1e-3
    a, b = np.log(1 - eps + eps / C), np.log(eps / C)
    P_ref = _reference(mean, var, y)[0]
    E_gh = robustmax_expectation(eps, y, 20)(mean, var)[0]
    E_tr = robustmax_trapezoid_expectation(eps, y)(mean, var)[0]
    assert np.max(np.abs(E_gh - (b + (a - b) * P_ref))) > 1e-3
    np.testing.assert_allclose(E_tr, b + (a - b) * P_ref, rtol=0, atol=1e-8)


def _vi_state(rule, C=4, n=40, M=6):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(n, 2))
    y = rng.integers(0, C, n)
    kernels = [RBF(lengthscale=1.0 + 0.3 * c, variance=1.0 + 0.5 * c) + White(0.05)
               for c in range(C)]
    hp = HyperParameters(kernels, Z=[X[:M] + 0.1 * c for c in range(C)])
    st = VariationalState(X, y, RobustMax(1e-3), hp, C, M, 100, robustmax_rule=rule)
    x = st.pack(rng.normal(size=(C, M)), np.tril(rng.normal(size=(C, M, M)) * 0.3) + np.eye(M))
    return st, x


def test_svi_default_robustmax_rule_matches_the_likelihood_rule():
    st_fast, x = _vi_state("trapezoid")
    st_ref, _ = _vi_state("likelihood")
    v_fast, g_fast = st_fast.elbo(x, None)
    v_ref, g_ref = st_ref.elbo(x, None)
    assert v_fast == pytest.approx(v_ref, abs=1e-7)
    np.testing.assert_allclose(g_fast, g_ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match="robustmax_rule"):
        _vi_state("nope")


def _multiclass_problem(M=5, max_iter=3):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(45, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.5]).astype(np.int64)
    return Problem(X=X, y=y, n_classes=3, kernel=RBF(lengthscale=np.ones(2), variance=1.0),
                   likelihood=RobustMax(1e-3), inducing=M, max_iter=max_iter,
                   rng=np.random.default_rng(7))


def test_table2_setup_options():
    """Random per-class Z (the ep/sep/gfitc draws), q(u) at the prior (KL = 0), median
    length-scales, white noise added, log kernel parameters kept inside hyper_bounds."""
    p = _multiclass_problem()
    opts = {"inducing_init": "random", "init_q": "prior", "noise": 1.0,
            "lengthscale_init": "median", "hyper_bounds": [-0.5, 0.5]}
    state, x0 = SVI(optimizer="lbfgs", **opts)._setup(p)
    rng = np.random.default_rng(7)
    for Z in state.hp.Z:
        np.testing.assert_array_equal(Z, p.X[rng.choice(45, 5, replace=False)])
    assert not np.array_equal(state.hp.Z[0], state.hp.Z[1])
    assert state.estimate(x0, None)[2].kl == pytest.approx(0.0, abs=1e-9)
    k = prepare_kernel(p.kernel, p.X, 1.0, "median")
    assert any(isinstance(part, White) for part in k.parts)
    sq = np.sum((p.X[:, None] - p.X[None]) ** 2, axis=2)
    med = np.median(np.sqrt(sq[np.triu_indices(45, 1)]))
    np.testing.assert_allclose(k.parts[0].lengthscale ** 2, med)
    res = SVI(optimizer="lbfgs", **opts).fit(_multiclass_problem(max_iter=30))
    for i in range(3):
        theta = res.state[f"kernel_params_{i}"]
        assert np.all(theta >= -0.5 - 1e-12) and np.all(theta <= 0.5 + 1e-12)
    with pytest.raises(InputError, match="inducing_init"):
        SVI(inducing_init="nope").fit(_multiclass_problem())
    with pytest.raises(InputError, match="lengthscale_init"):
        SVI(lengthscale_init="nope").fit(_multiclass_problem())
    with pytest.raises(InputError, match="1..N"):
        SVI(inducing_init="random").fit(_multiclass_problem(M=46))
