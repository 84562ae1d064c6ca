"""Collapsed Power-EP regression against dense references (spec power-ep §7, oracles 1-3, 5,
7, 10-14) and the ``GPRegressor`` estimator."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _pep_dense import (  # noqa: F401  (single_thread is an autouse fixture)
    exact_loglik,
    fitc_loglik,
    fitc_predict,
    gp_predict,
    pitc_loglik,
    problem,
    single_thread,
    titsias_bound,
)
from gpinfer_pep.collapsed import check_partition, collapsed_pep
from gpinfer_pep.rank_one import RankOnePEPSites, matrix_geometry

from gpinfer import GPRegressor
from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import MatrixGradients
from gpinfer.likelihoods import Gaussian

S2 = 0.05


def _collapsed(kern, X, y, Z, alpha, s2=S2, blocks=None, jitter=0.0, **kw):
    geo = matrix_geometry(kern.K(Z), kern.K(Z, X), kern.K_diag(X), jitter)
    a = np.full(len(y) if blocks is None else len(blocks), alpha) if np.isscalar(alpha) else alpha
    Kbb = None if blocks is None else [kern.K(X[b]) for b in blocks]
    return collapsed_pep(geo, y, s2, a, blocks, Kbb, **kw)


def _predict(res, kern, Z, Xs):
    from gpinfer_pep.rank_one import WhitenedInducingPosterior

    post = WhitenedInducingPosterior(Gaussian(S2), kern, Z, res.L, res.L_B, res.gamma)
    mean, var = post.predict_f(Xs)
    return mean[:, 0], var[:, 0]


def test_alpha_one_is_fitc_likelihood_and_predictive():  # oracle 1
    kern, X, y, Z = problem()
    res = _collapsed(kern, X, y, Z, 1.0)
    np.testing.assert_allclose(res.value, fitc_loglik(kern, X, y, Z, S2), rtol=1e-8)
    Xs = np.random.default_rng(5).normal(size=(9, 2))
    for got, want in zip(_predict(res, kern, Z, Xs), fitc_predict(kern, X, y, Z, S2, Xs)):
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


def test_alpha_zero_is_titsias_and_limit_is_order_alpha():  # oracle 2
    kern, X, y, Z = problem()
    F0 = _collapsed(kern, X, y, Z, 0.0).value
    np.testing.assert_allclose(F0, titsias_bound(kern, X, y, Z, S2), rtol=1e-8)
    gaps = [abs(_collapsed(kern, X, y, Z, a).value - F0) for a in (1e-2, 1e-4, 1e-6)]
    assert gaps[0] > gaps[1] > gaps[2]
    np.testing.assert_allclose(np.array(gaps[1:]) / gaps[:-1], 1e-2, rtol=0.2)  # O(alpha)
    np.testing.assert_allclose(_collapsed(kern, X, y, Z, 1e-12).value, F0, rtol=1e-8)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_full_inducing_set_is_exact_gp(alpha):  # oracle 3
    kern, X, y, _ = problem(n=20)
    jitter = 1e-8 * 1.3
    res = _collapsed(kern, X, y, X.copy(), alpha, jitter=jitter)
    np.testing.assert_allclose(res.value, exact_loglik(kern, X, y, S2), rtol=1e-6)
    Xs = np.random.default_rng(1).normal(size=(5, 2))
    C = kern.K(X) + S2 * np.eye(len(y))
    # the predictive goes through Kuu^-1 of a near-singular Kuu = Kff: jitter-limited accuracy
    for got, want in zip(_predict(res, kern, X, Xs), gp_predict(kern, X, y, Xs, C)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_blocks():  # oracle 10
    kern, X, y, Z = problem()
    blocks = check_partition([np.arange(i, min(i + 6, 30)) for i in range(0, 30, 6)], 30)
    singles = [np.array([i]) for i in range(30)]
    for a in (0.0, 0.4, 1.0):
        np.testing.assert_allclose(_collapsed(kern, X, y, Z, a, blocks=singles).value,
                                   _collapsed(kern, X, y, Z, a).value, rtol=1e-10)
    np.testing.assert_allclose(_collapsed(kern, X, y, Z, 1.0, blocks=blocks).value,
                               pitc_loglik(kern, X, y, Z, S2, blocks), rtol=1e-8)
    np.testing.assert_allclose(_collapsed(kern, X, y, Z, 0.0, blocks=blocks).value,
                               titsias_bound(kern, X, y, Z, S2), rtol=1e-8)
    with pytest.raises(InputError, match="partition"):
        check_partition([np.arange(10), np.arange(12, 30)], 30)
    with pytest.raises(InputError, match="partition"):
        check_partition([np.arange(15), np.arange(10, 30)], 30)


def _directional(F, grads, base, rng):
    """Central differences of ``F(Kuu, Kuf, kdiag, s2)`` along random directions."""
    Kuu, Kuf, kd, s2 = base
    e, out = 1e-6, []
    E = rng.normal(size=Kuu.shape)
    E = E + E.T
    dirs = [(E, 0, 0, 0), (0, rng.normal(size=Kuf.shape), 0, 0), (0, 0, rng.normal(size=kd.shape),
                                                                   0)]
    for dU, dF, dd, _ in dirs:
        fp = F(Kuu + e * dU, Kuf + e * dF, kd + e * dd, s2)
        fm = F(Kuu - e * dU, Kuf - e * dF, kd - e * dd, s2)
        ana = np.sum(grads.Kuu * dU) + np.sum(grads.Kuf * dF) + np.sum(grads.Kff_diag * dd)
        out.append(((fp - fm) / (2 * e), ana))
    fp, fm = F(Kuu, Kuf, kd, s2 * np.exp(e)), F(Kuu, Kuf, kd, s2 * np.exp(-e))
    out.append(((fp - fm) / (2 * e), grads.likelihood[0]))
    return np.array(out)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_matrix_gradients_finite_differences(alpha):  # oracle 7 (collapsed)
    kern, X, y, Z = problem()
    rng = np.random.default_rng(3)
    a = np.full(len(y), alpha)
    base = (kern.K(Z), kern.K(Z, X), kern.K_diag(X), S2)

    def F(Kuu, Kuf, kd, s2):
        return collapsed_pep(matrix_geometry(Kuu, Kuf, kd, 0.0), y, s2, a,
                             with_gradients=False).value

    res = collapsed_pep(matrix_geometry(*base[:3], 0.0), y, S2, a)
    pairs = _directional(F, res.grads, base, rng)
    np.testing.assert_allclose(pairs[:, 1], pairs[:, 0], rtol=1e-6)


def test_block_gradients_finite_differences():  # oracle 7 (blocks)
    kern, X, y, Z = problem(n=24)
    blocks = [np.arange(i, i + 6) for i in range(0, 24, 6)]
    a = np.array([0.0, 0.3, 0.7, 1.0])
    rng = np.random.default_rng(4)
    Kuu, Kuf = kern.K(Z), kern.K(Z, X)
    Kbb = [kern.K(X[b]) for b in blocks]
    Es = [rng.normal(size=K.shape) for K in Kbb]
    Es = [E + E.T for E in Es]
    EU = rng.normal(size=Kuu.shape)
    EU = EU + EU.T
    EF = rng.normal(size=Kuf.shape)

    def F(t, ds2=0.0):
        geo = matrix_geometry(Kuu + t * EU, Kuf + t * EF, kern.K_diag(X), 0.0)
        Kb = [K + t * E for K, E in zip(Kbb, Es)]
        return collapsed_pep(geo, y, S2 * np.exp(ds2), a, blocks, Kb, with_gradients=False).value

    res = collapsed_pep(matrix_geometry(Kuu, Kuf, kern.K_diag(X), 0.0), y, S2, a,
                        blocks, Kbb)
    ana = (np.sum(res.grads.Kuu * EU) + np.sum(res.grads.Kuf * EF)
           + sum(np.sum(R * E) for R, E in zip(res.block_grads, Es)))
    e = 1e-6
    np.testing.assert_allclose(ana, (F(e) - F(-e)) / (2 * e), rtol=1e-6)
    np.testing.assert_allclose(res.grads.likelihood[0], (F(0, e) - F(0, -e)) / (2 * e),
                               rtol=1e-6)


@pytest.mark.parametrize("blocks", [False, True])
def test_parameter_gradient_through_kernel_vjp(blocks):  # oracle 7: theta, Z and noise
    from gpinfer.testing.gradcheck import assert_gradient_close

    kern, X, y, Z = problem(n=20, m=5)
    lik = Gaussian(S2)
    hp = HyperParameters(kern, lik, Z)
    parts = [np.arange(i, i + 5) for i in range(0, 20, 5)] if blocks else None
    alpha = np.full(4 if blocks else 20, 0.4)

    def value_grad(theta):
        hp.unpack(theta)
        geo = matrix_geometry(kern.K(hp.Z[0]), kern.K(hp.Z[0], X), kern.K_diag(X), 0.0)
        Kbb = None if parts is None else [kern.K(X[b]) for b in parts]
        res = collapsed_pep(geo, y, lik.variance, alpha, parts, Kbb)
        g = parameter_gradient(hp, X, res.grads)
        for b, R in zip(parts or [], res.block_grads or []):
            g += parameter_gradient(hp, X[b], MatrixGradients(Kff=R))
        return res.value, g

    theta0 = hp.pack()
    grad = value_grad(theta0.copy())[1]
    assert_gradient_close(lambda t: value_grad(t)[0], grad, theta0, rtol=1e-5, atol=1e-7)


def test_iterative_gaussian_pep_equals_closed_form():  # oracle 5
    kern, X, y, Z = problem()
    geo = matrix_geometry(kern.K(Z), kern.K(Z, X), kern.K_diag(X), 0.0)
    lik = Gaussian(S2)
    for alpha in (0.3, 1.0):
        sites = RankOnePEPSites(lik, y, alpha, schedule="sequential", damping=1.0)
        sites.set_geometry(geo)
        tau_star = 1.0 / (S2 + alpha * geo.s)
        sites.update()
        if alpha == 1.0:  # one sequential sweep from tau = 0 is exact
            np.testing.assert_allclose(sites.tau, tau_star, rtol=1e-10)
        else:  # the power step shrinks the error by (1 - alpha) per sweep
            sites.update()
            np.testing.assert_allclose(tau_star - sites.tau, (1 - alpha) ** 2 * tau_star,
                                       rtol=1e-8)
            sites.run(2000, tol=1e-13)
        np.testing.assert_allclose(sites.tau, tau_star, rtol=1e-10)
        np.testing.assert_allclose(sites.nu, y * tau_star, rtol=1e-9, atol=1e-12)
        closed = collapsed_pep(geo, y, S2, np.full(len(y), alpha))
        energy = sites.energy()
        # the closed form carries the -N/2 log(2 pi s2)-type constants of the data term
        np.testing.assert_allclose(energy.value, closed.value, rtol=1e-10)
        np.testing.assert_allclose(sites.gamma, closed.gamma, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(energy.gradients.Kuu, closed.grads.Kuu, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(energy.gradients.Kuf, closed.grads.Kuf, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(energy.gradients.likelihood / S2,
                                   closed.grads.likelihood / S2, rtol=1e-6)


def test_bounds_monotonicity_and_invariants():  # oracles 11, 12, 14
    kern, X, y, Z = problem()
    exact = exact_loglik(kern, X, y, S2)
    nested = [_collapsed(kern, X, y, X[:m] + 0.01, 0.0).value for m in (3, 6, 9, 12)]
    assert all(v <= exact for v in nested)
    assert np.all(np.diff(nested) >= -1e-9)
    values = [_collapsed(kern, X, y, Z, a).value for a in np.linspace(0, 1, 6)]
    if not np.all(np.diff(values) >= -1e-9):
        warnings.warn("collapsed F_alpha was not non-decreasing in alpha (soft oracle 12)",
                      stacklevel=1)
    perm = np.random.default_rng(2).permutation(len(y))
    np.testing.assert_allclose(_collapsed(kern, X[perm], y[perm], Z, 0.5).value,
                               _collapsed(kern, X, y, Z, 0.5).value, rtol=1e-12)
    mixed = np.where(np.arange(len(y)) % 2 == 0, 0.0, 1.0)  # multi-power: VFE and EP points
    Q_K = _collapsed(kern, X, y, Z, mixed).value
    from _pep_dense import dense_q
    from scipy.stats import multivariate_normal

    Q, K = dense_q(kern, X, Z)
    h = np.diag(K - Q)
    want = (multivariate_normal.logpdf(y, np.zeros(len(y)), Q + np.diag(S2 + mixed * h))
            - np.sum((1 - mixed) * h) / (2 * S2))
    np.testing.assert_allclose(Q_K, want, rtol=1e-8)


# -- the estimator -------------------------------------------------------------------------------


@pytest.mark.parametrize("method,options", [("pep", {"alpha": 0.5}), ("fitc", {}), ("vfe", {})])
def test_gp_regressor(method, options):
    kern, X, y, _ = problem(n=60)
    est = GPRegressor(method=method, M=8, max_iter=30, random_state=0,
                      method_options=options).fit(X, y)
    mean, std = est.predict(X, return_std=True)
    assert mean.shape == std.shape == (60,)
    assert np.all(std > np.sqrt(est.likelihood_.variance) - 1e-12)
    assert est.score(X, y) > 0.7
    assert np.isfinite(est.log_predictive(X, y)).all()
    assert est.history_ and np.isfinite(est.log_evidence_)


def test_gp_regressor_blocks_and_bad_input():
    kern, X, y, _ = problem(n=40)
    blocks = [np.arange(i, i + 10) for i in range(0, 40, 10)]
    est = GPRegressor(method="pep", M=6, max_iter=10, random_state=0,
                      method_options={"alpha": 0.5, "blocks": blocks}).fit(X, y)
    assert np.isfinite(est.predict(X)).all()
    bad = y.copy()
    bad[4] = np.nan
    with pytest.raises(InputError, match="NaN"):
        GPRegressor(method="pep", M=5).fit(X, bad)
    with pytest.raises(InputError, match="alpha"):
        GPRegressor(method="pep", M=5, method_options={"alpha": 1.5}).fit(X, y)
    with pytest.raises(InputError, match="partition"):
        GPRegressor(method="pep", M=5, method_options={"blocks": blocks[:2]}).fit(X, y)


def test_energy_plateau_stops_lbfgs_early():
    from gpinfer_pep.method import plateaued

    assert not plateaued([0.0, 1.0, 2.0], 2, 0.5)  # gained 2 over the last 2 iterations
    assert plateaued([0.0, 1.0, 1.2, 1.3], 2, 0.5)  # gained 0.3 < 0.5
    assert not plateaued([1.0, 1.0], 2, 0.5)  # too short to judge
    kern, X, y, _ = problem(n=60)

    def fit(**opts):
        return GPRegressor(method="pep", M=8, kernel=kern, max_iter=60, random_state=0,
                           method_options={"alpha": 0.5, **opts}).fit(X, y)

    full, stopped = fit(), fit(stop_window=3, stop_tol=1.0)
    assert len(full.history_) > 10
    h = [r["objective"] for r in stopped.history_]
    # stopped at the first iteration whose 3-iteration gain is below 1 nat, not later
    first = next(i for i in range(3, len(full.history_))
                 if full.history_[i]["objective"] - full.history_[i - 3]["objective"] < 1.0)
    assert len(h) == first + 1 < len(full.history_)
    assert h == pytest.approx([r["objective"] for r in full.history_[:first + 1]], rel=1e-9)
    with pytest.raises(InputError, match="stop_window"):
        GPRegressor(method="pep", M=5, method_options={"stop_window": 0}).fit(X, y)
