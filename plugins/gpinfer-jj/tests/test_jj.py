"""The methods vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full (spec jj-taylor-svi §7: T5 through the
kernel VJPs, T11-T13); the oracles of the quadratic sites (T1-T10, T14) are in
``test_jj_quadratic.py``."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_jj.bound import CollapsedObjective, XiSites
from gpinfer_jj.method import ViJJ, ViJJFull, ViJJHybrid, ViTaylor

from gpinfer.errors import InputError, NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit
from gpinfer.registry import load_method
from gpinfer.testing import MethodTestSuite
from gpinfer.testing.gradcheck import assert_gradient_close
from gpinfer.training.inner import InnerSchedule

RNG = np.random.default_rng(7)


def _problem(n=40, m=7, seed=0):
    """``X [n, 2]``, ``Z [m, 2]``, signs ``s [n]`` and an RBF + white kernel."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    s = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, X[:m] + 0.1, s, RBF(lengthscale=1.2, variance=1.5) + White(0.05)


# -- T5 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_t5_theta_gradient_through_kernel_vjp_with_noise(kind):
    X, Z, s, k = _problem(n=30, m=6)
    lik = BernoulliLogit()
    hp = HyperParameters(k, Z=Z, optimize_inducing=True)
    obj = CollapsedObjective(kind, X, s, k, Z, lik, hp)
    xi = RNG.uniform(0.2, 2, X.shape[0])
    theta0 = hp.pack()
    assert_gradient_close(lambda t: obj.value_and_grad(t, xi)[0],
                          obj.value_and_grad(theta0, xi)[1], theta0, rtol=1e-5, atol=1e-6,
                          name=f"{kind} dF/d(log theta, Z)")


def _method_problem(n=80, M=10, y=None, n_classes=2, max_iter=5, lik=None):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    y0 = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return Problem(X=X, y=y0 if y is None else y, n_classes=n_classes,
                   kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.01),
                   likelihood=lik or BernoulliLogit(), inducing=M, max_iter=max_iter)


def test_bad_input_errors():
    with pytest.raises(InputError, match="binary"):
        ViJJ().fit(_method_problem(y=np.arange(80) % 3, n_classes=3))
    with pytest.raises(InputError, match="both classes|binary"):
        ViJJ().fit(_method_problem(y=np.zeros(80, dtype=np.int64)))
    with pytest.raises(InputError, match="1..N"):
        ViJJ().fit(_method_problem(M=81))
    with pytest.raises(InputError, match="logistic"):
        ViJJ().fit(_method_problem(lik=BernoulliProbit()))
    with pytest.raises(ValueError, match="unknown option"):
        ViJJ(foo=1)


def test_non_finite_bound_is_a_clear_error(monkeypatch):
    def bad(self, theta, xi, with_xi=False):
        return float("nan"), np.zeros(theta.size + (xi.size if with_xi else 0))

    monkeypatch.setattr(CollapsedObjective, "value_and_grad", bad)
    with pytest.raises(NumericalError, match="not finite|nan"):
        ViJJ().fit(_method_problem())


def test_abnormal_lbfgs_end_is_reported(monkeypatch):
    original = CollapsedObjective.value_and_grad

    def wrong_gradient(self, theta, xi, with_xi=False):
        value, grad = original(self, theta, xi, with_xi)
        return value, -grad  # an ascent direction that is not: the line search fails

    monkeypatch.setattr(CollapsedObjective, "value_and_grad", wrong_gradient)
    seen = []
    with pytest.warns(RuntimeWarning, match="abnormally"):
        result = ViJJ(max_fun=60).fit(_method_problem(max_iter=2), callback=seen.append)
    assert int(result.state["lbfgs_abnormal"]) >= 1
    assert seen[-1].extra["lbfgs_abnormal"] >= 1
    assert any("ABNORMAL" in str(m) for m in result.state["lbfgs_messages"])


@pytest.mark.parametrize("cls", [ViJJ, ViTaylor, ViJJHybrid, ViJJFull])
def test_t13_methods_learn_and_report(cls):
    seen = []
    result = cls().fit(_method_problem(n=120, M=12, max_iter=5), callback=seen.append)
    assert seen and [i.iteration for i in seen] == list(range(1, len(seen) + 1))
    assert all(np.isfinite(i.objective) for i in seen)
    if cls is not ViJJFull:
        assert all(1 <= i.extra["nfev"] <= 25 for i in seen)
    X = _method_problem(n=120).X
    y = _method_problem(n=120).y
    acc = np.mean(np.argmax(result.posterior.predict_proba(X), axis=1) == y)
    assert acc > 0.85
    assert seen[-1].objective > seen[0].objective


def test_carry_xi_is_monotone_for_jj():
    seen = []
    ViJJ(carry="xi", tol=0.0).fit(_method_problem(n=80, M=8, max_iter=5), callback=seen.append)
    obj = [i.extra["stage1_bound"] for i in seen]
    assert np.all(np.diff(obj) >= -1e-8)


# -- the shared battery --------------------------------------------------------------------------
class _Suite(MethodTestSuite):
    #: the method's collapsed objective (``_CollapsedVI.kind``, checked by ``test_kind``)
    kind = "jj"
    likelihood = "logit"
    inducing = 6
    max_iter = 3
    kernel = "rbf"

    def objective_and_gradient(self, X, y):
        s = 2.0 * y - 1.0
        k = RBF(lengthscale=1.1, variance=1.4) + White(0.02)
        Z = X[:6] + 0.05
        hp = HyperParameters(k, Z=Z)
        obj = CollapsedObjective(self.kind, X, s, k, Z, BernoulliLogit(), hp)
        xi = np.linspace(0.2, 2.0, X.shape[0])
        return (lambda t: obj.value_and_grad(t, xi)[0],
                lambda t: obj.value_and_grad(t, xi)[1], hp.pack())

    def test_kind(self):
        assert load_method(self.method_name).kind == self.kind


class TestViJJSuite(_Suite):
    method_name = "vi-jj"


class TestViTaylorSuite(_Suite):
    method_name = "vi-taylor"
    kind = "taylor"
    permutation_atol = 1e-3


class TestViJJHybridSuite(_Suite):
    method_name = "vi-jj-hybrid"


class TestViJJFullSuite(_Suite):
    method_name = "vi-jj-full"


def test_stage1_rounds_on_the_inner_schedule_are_alg1():
    """Alg. 1's Stage 1 by hand (``xi`` rule, then the bound's marginals, ``n_upd`` times)
    equals ``XiSites`` on the inner schedule; the change is ``max|Delta xi|``; a damped round
    mixes ``xi``; the rounds converge to the JJ fixed point ``xi = sqrt(m^2 + S^2)``."""
    X, Z, s, k = _problem(n=30, m=6)
    obj = CollapsedObjective("jj", X, s, k, Z, BernoulliLogit(), HyperParameters(k, Z=Z))
    fac = obj.factors()
    mean0, var0 = np.zeros(30), np.ones(30)
    mean, var = mean0, var0
    for _ in range(3):
        xi = obj.xi_rule(mean, var)
        b = obj.bound(xi, fac)
        var, mean = b.S2_hat, b.m_hat
    sites = XiSites(obj, fac, mean0, var0)
    run = InnerSchedule(tol=-np.inf, max_updates=3).run(sites)
    assert run.updates == 3 and not run.converged
    np.testing.assert_array_equal(sites.xi, xi)
    assert sites.bound is not None and sites.bound.value == b.value
    half = XiSites(obj, fac, mean0, var0)
    half.update(1.0, 0)
    first = half.xi.copy()
    change = half.update(0.5, 0)
    np.testing.assert_allclose(half.xi, 0.5 * first + 0.5 * obj.xi_rule(*_marginals(obj, fac,
                                                                                    first)))
    assert change == pytest.approx(np.max(np.abs(half.xi - first)))
    done = InnerSchedule(tol=1e-10, max_updates=500).run(sites)
    assert done.converged
    np.testing.assert_allclose(sites.xi, np.sqrt(sites.mean**2 + sites.var), rtol=1e-8)


def _marginals(obj, fac, xi):
    b = obj.bound(xi, fac)
    return b.m_hat, b.S2_hat
