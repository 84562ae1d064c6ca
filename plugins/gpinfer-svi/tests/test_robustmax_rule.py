"""svi's robust-max set-up: its default (the likelihood's trapezoid rule) against the log-space
rule, the deprecated ``robustmax_rule`` option, and the Table-2 VI set-up options of svi (spec
ep-sep §2.11, §3.2, O13, O14)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_svi.method import SVI, VariationalState

from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.kernels.initialisation import prepare_kernel
from gpinfer.likelihoods import RobustMax


def _vi_state(rule, C=4, n=40, M=6):
    """``rule``: the likelihood's expectation rule."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(n, 2))
    y = rng.integers(0, C, n)
    kernels = [RBF(lengthscale=1.0 + 0.3 * c, variance=1.0 + 0.5 * c) + White(0.05)
               for c in range(C)]
    hp = HyperParameters(kernels, Z=[X[:M] + 0.1 * c for c in range(C)])
    st = VariationalState(X, y, RobustMax(1e-3, expectation=rule), hp, C, M)
    x = st.pack(rng.normal(size=(C, M)), np.tril(rng.normal(size=(C, M, M)) * 0.3) + np.eye(M))
    return st, x


def test_svi_default_robustmax_rule_matches_the_likelihood_rule():
    st_fast, x = _vi_state("trapezoid")
    st_ref, _ = _vi_state("log_space")
    v_fast, g_fast = st_fast.elbo(x, None)
    v_ref, g_ref = st_ref.elbo(x, None)
    assert v_fast == pytest.approx(v_ref, abs=1e-7)
    np.testing.assert_allclose(g_fast, g_ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match="expectation"):
        _vi_state("nope")


def test_deprecated_robustmax_rule_option_sets_the_likelihood_rule():
    p = _multiclass_problem()
    with pytest.warns(DeprecationWarning, match="robustmax_rule"):
        state, _ = SVI(robustmax_rule="likelihood")._setup(p)
    assert state.likelihood.expectation == "log_space"
    assert p.likelihood.expectation == "trapezoid"  # the problem's likelihood is not changed
    with pytest.warns(DeprecationWarning, match="robustmax_nodes"):
        state, _ = SVI(robustmax_nodes=12)._setup(p)
    assert (state.likelihood.expectation, state.likelihood.quadrature_points) == \
        ("gauss_hermite", 12)
    with pytest.raises(InputError, match="robustmax_rule"):  # refused by its declaration
        SVI(robustmax_rule="nope")


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
