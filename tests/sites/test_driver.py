"""``gpinfer.sites.driver.DenseBinaryMethod``: the shared driver of the dense binary methods.

Oracle: a solver whose evidence is the exact Gaussian evidence of the signed labels,
``log N(t | 0, K + s I)`` with ``G = 1/2 (a a^T - (K + s I)^-1)``, so that the driver's
hyper-parameter optimum must be scipy's optimum of the same closed form; plus the one-solve
path, the grid path and the label checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.optimize import minimize

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF
from gpinfer.likelihoods import BernoulliProbit
from gpinfer.sites import DiagonalSiteAlgebra
from gpinfer.sites.driver import DenseBinaryMethod, DenseSolution

NOISE = 0.5


def _evidence(K, t):
    C = K + NOISE * np.eye(len(t))
    a = np.linalg.solve(C, t)
    return -0.5 * t @ a - 0.5 * np.linalg.slogdet(C)[1] - 0.5 * len(t) * np.log(2 * np.pi), a, C


class _Exact(DenseBinaryMethod):
    name = "exact-label-regression"
    option_spec = dict(DenseBinaryMethod.driver_options)

    def solve(self, K, y, likelihood, warm: Any) -> DenseSolution:
        t = 2.0 * y - 1.0
        value, a, C = _evidence(K, t)
        alg = DiagonalSiteAlgebra.from_kernel_matrix(K, np.full(len(t), 1.0 / NOISE))
        return DenseSolution(
            log_evidence=float(value),
            gradient=lambda: 0.5 * (np.outer(a, a) - np.linalg.inv(C)),
            posterior=lambda lik, kern, X: alg.posterior(lik, kern, X, a),
            n_inner=1)


def _problem(optimize=True, n_classes=2, max_iter=50):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 1))
    y = (X[:, 0] + 0.4 * rng.normal(size=25) > 0).astype(np.int64)
    if n_classes > 2:
        y = rng.integers(0, n_classes, 25)
    return Problem(X=X, y=y, n_classes=n_classes, kernel=RBF(lengthscale=1.0, variance=1.0),
                   likelihood=BernoulliProbit(), optimize=optimize, max_iter=max_iter)


def test_one_solve_without_optimisation():
    p = _problem(optimize=False)
    res = _Exact().fit(p)
    assert res.n_iter == 1 and len(res.history) == 1
    ref = _evidence(p.kernel.K(p.X), 2.0 * p.y - 1.0)[0]
    assert res.log_evidence == pytest.approx(ref, rel=1e-12)


def test_hyper_parameter_optimum_is_the_closed_form_optimum():
    p = _problem()
    res = _Exact().fit(p)
    k = p.kernel.copy()

    def neg(theta):
        k.set_unconstrained(theta)
        return -_evidence(k.K(p.X), 2.0 * p.y - 1.0)[0]

    ref = minimize(neg, p.kernel.get_unconstrained(), method="Nelder-Mead",
                   options={"xatol": 1e-8, "fatol": 1e-12, "maxiter": 4000})
    assert res.log_evidence == pytest.approx(-ref.fun, abs=1e-6)
    np.testing.assert_allclose(res.kernel.get_unconstrained(), ref.x, atol=1e-3)
    values = [h["objective"] for h in res.history]
    assert values[-1] >= values[0]


def test_grid_search_evaluates_every_node():
    axes = [[-0.5, 0.0, 0.5], [-0.5, 0.5]]
    res = _Exact(optimizer="grid", optimizer_options={"axes": axes}).fit(_problem())
    p = _problem()
    k = p.kernel.copy()
    best = -np.inf
    for a in axes[0]:
        for b in axes[1]:
            k.set_unconstrained(np.array([a, b]))
            best = max(best, _evidence(k.K(p.X), 2.0 * p.y - 1.0)[0])
    assert res.log_evidence == pytest.approx(best, rel=1e-12)
    assert res.state["grid_values"].size == 6


def test_multiclass_labels_and_inducing_points_are_input_errors():
    with pytest.raises(InputError):
        _Exact().fit(_problem(n_classes=3))
    p = _problem()
    p.inducing = 5
    with pytest.raises(InputError, match="inducing"):
        _Exact().fit(p)


class _Rising(_Exact):
    """An evidence ``tr K`` that rises without end with the signal variance (``G = I``), as
    ep-dense's does on separable data."""

    name = "rising"

    def solve(self, K, y, likelihood, warm: Any) -> DenseSolution:
        sol = super().solve(K, y, likelihood, warm)
        n = K.shape[0]
        return DenseSolution(log_evidence=float(np.trace(K)), gradient=lambda: np.eye(n),
                             posterior=sol.posterior, n_inner=1)


def test_a_runaway_evidence_stops_on_the_default_box_with_a_warning_naming_it():
    from sklearn.exceptions import ConvergenceWarning

    from gpinfer.numerics.settings import LOG_PARAMETER_BOUNDS

    with pytest.warns(ConvergenceWarning, match=r"kernel\.variance ended on the upper bound.*separable"):
        res = _Rising().fit(_problem())
    log_variance = res.kernel.get_unconstrained()[1]
    assert log_variance == pytest.approx(LOG_PARAMETER_BOUNDS[1], abs=1e-4)


def test_a_box_the_user_gives_replaces_the_default_and_is_not_warned_about():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = _Rising(optimizer_options={"bounds": (-1.0, 2.0)}).fit(_problem())
    assert res.kernel.get_unconstrained()[1] == pytest.approx(2.0, abs=1e-6)


class _BreaksDown(_Exact):
    """The exact solver, failing numerically once the log length-scale exceeds ``LIMIT``
    (L-BFGS-B's second line search tries a point there, from ``_problem``'s start)."""

    LIMIT = 0.9

    def solve(self, K, y, likelihood, warm: Any) -> DenseSolution:
        if self.at[0] > self.LIMIT:
            raise NumericalError("inner solver broke down", quantity="cavity")
        return super().solve(K, y, likelihood, warm)


def test_a_trial_failure_ends_at_the_last_accepted_iterate_with_the_kernel_there():
    p = _problem()
    method = _BreaksDown()
    original = RBF.K

    def K(self, X, X2=None):  # the log parameters the solve sees
        method.at = self.get_unconstrained()
        return original(self, X, X2)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RBF, "K", K)
        with pytest.warns(RuntimeWarning, match="numerical failure at a trial point"):
            res = method.fit(p)
    theta = res.kernel.get_unconstrained()
    assert theta[0] <= _BreaksDown.LIMIT and res.history[-1]["stopped_on_failure"] == 1.0
    assert res.n_iter == len(res.history)
    # the kernel, the evidence and the state are the last accepted iterate's, not the failed
    # trial point's
    np.testing.assert_array_equal(res.state["kernel_params"], theta)
    assert res.log_evidence == res.history[-1]["objective"]
