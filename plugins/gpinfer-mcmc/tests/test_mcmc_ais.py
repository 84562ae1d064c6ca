"""AIS/HMC oracles of spec binary §7.10: Gaussian likelihood exact, n = 10 values, EP agreement."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_mcmc.ais import GaussianStart, run_ais
from gpinfer_mcmc.method import MCMCAIS

from gpinfer.errors import InputError
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF
from gpinfer.likelihoods.bernoulli import BernoulliLogit, BernoulliProbit
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.sites.ep import EPSites
from gpinfer.testing import MethodTestSuite


def _n10():
    X = np.linspace(-3, 3, 10)[:, None]
    y = (X[:, 0] > 0).astype(np.int64)
    y[3] = 1
    return X, y


def _problem(lik, ln_ell, ln_sf, seed=0):
    X, y = _n10()
    return Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=np.exp(ln_ell),
                   variance=np.exp(2 * ln_sf)), likelihood=lik, optimize=False,
                   rng=np.random.default_rng(seed))


def test_ais_gaussian_likelihood_is_exact_within_error_bar():
    """Regression likelihood N(y | f, s2): exact log Z known; AIS from a perturbed q."""
    rng = np.random.default_rng(3)
    X = np.linspace(-2, 2, 12)[:, None]
    K = RBF(lengthscale=0.8, variance=2.0).K(X)
    s2 = 0.3
    t = np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(12)
    C = K + s2 * np.eye(12)
    Lc = np.linalg.cholesky(C)
    exact = -0.5 * t @ np.linalg.solve(C, t) - np.sum(np.log(np.diag(Lc))) - 6 * np.log(2 * np.pi)

    def loglik(F):
        r = t[:, None] - F
        return -0.5 * np.sum(r * r, 0) / s2 - 6 * np.log(2 * np.pi * s2), r / s2

    W = np.full(12, 0.6 / s2)  # deliberately not the exact posterior precision
    nu = 0.8 * t / s2
    V = np.linalg.inv(np.linalg.inv(K) + np.diag(W))
    m = V @ nu
    B = np.eye(12) + np.sqrt(W)[:, None] * K * np.sqrt(W)[None, :]
    start = GaussianStart(m, jittered_cholesky(V).L, W, nu,
                          0.5 * nu @ m - 0.5 * np.linalg.slogdet(B)[1])
    res = run_ais(loglik, start, 400, 8, rng, n_blocks=10, step_sizes=np.full(10, 0.25))
    assert abs(res.log_z - exact) <= 3 * res.se + 1e-3, (res.log_z, exact, res.se)
    assert res.acceptance.min() > 0.5


@pytest.mark.parametrize("lik, le, ls, is_lnz", [
    (BernoulliProbit(), 0.0, 2.0, -7.5855), (BernoulliLogit(), 0.0, 2.0, -7.0192)])
def test_ais_matches_importance_sampling_n10(lik, le, ls, is_lnz):
    """Spec §7.7 IS values; and |log Z_EP - log Z_AIS| small (§7.10 item 35)."""
    res = MCMCAIS(budget="tiny", T=1500, R=4, n_samples=50).fit(_problem(lik, le, ls, seed=1))
    se = float(res.state["log_evidence_se"])
    assert se < 0.1
    assert abs(res.log_evidence - is_lnz) <= 3 * se + 0.01, (res.log_evidence, se)
    X, y = _n10()
    ep = EPSites(RBF(lengthscale=np.exp(le), variance=np.exp(2 * ls)).K(X), y, lik, tol=1e-9)
    ep.run()
    assert abs(ep.log_evidence() - res.log_evidence) <= 0.2


def test_low_acceptance_is_reported():
    with pytest.warns(RuntimeWarning, match="acceptance"):
        res = MCMCAIS(budget="tiny", T=50, step_size=8.0, n_samples=5).fit(
            _problem(BernoulliProbit(), 0.0, 2.0))
    assert float(res.state["min_acceptance"]) < 0.5


def test_bad_options_and_optimize():
    p = _problem(BernoulliProbit(), 0.0, 0.0)
    with pytest.raises(InputError, match="budget"):
        MCMCAIS(budget="huge").fit(p)
    with pytest.raises(InputError, match="start"):
        MCMCAIS(budget="tiny", start="laplace").fit(p)
    p.optimize = True
    with pytest.raises(InputError, match="optimize=false"):
        MCMCAIS(budget="tiny").fit(p)


class TestMCMCAISSuite(MethodTestSuite):
    method_name = "mcmc-ais"
    optimize = False
    method_options = {"budget": "tiny", "T": 100, "n_samples": 200, "pilot_T": 50}
    permutation_atol = 0.15  # Monte-Carlo noise: the mirrored problem uses other draws

    def test_objective_gradient(self) -> None:
        """AIS has no gradient (spec §1.6): fitting with optimize=True is refused instead."""
        X, y = self.data()
        with pytest.raises(InputError, match="no gradient"):
            self.make_estimator(optimize=True).fit(X, y)


def test_estimator_exposes_the_ais_standard_error():
    """``GPClassifier.log_evidence_se_`` carries the AIS standard error of ``log_evidence_``."""
    from gpinfer import GPClassifier

    X, y = _n10()
    clf = GPClassifier(method="mcmc-ais", kernel=RBF(lengthscale=1.0, variance=1.0),
                       optimize=False, random_state=0,
                       method_options={"budget": "tiny", "T": 300, "R": 3, "n_samples": 20})
    clf.fit(X, y)
    assert clf.log_evidence_se_ is not None and 0.0 < clf.log_evidence_se_ < 1.0
    assert np.isfinite(clf.log_evidence_)
