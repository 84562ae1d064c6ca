"""``gpinfer.sites.ep``: dense EP sites for a Bernoulli likelihood (spec binary §7.5): the
sequential and parallel schedules reach the same fixed point, where the posterior marginals equal
the tilted moments; n = 1 EP is exact. Moved here from the binary plugin's tests."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from gpinfer.errors import InputError
from gpinfer.kernels import RBF, Matern32
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit
from gpinfer.sites.ep import EPSites

PROBIT = BernoulliProbit()


def n10_data():
    """The deterministic n = 10 problem of spec binary §7.7: ``x`` on ``[-3, 3]``, labels
    ``x > 0`` but one outlier at ``x = -1`` (index 3)."""
    X = np.linspace(-3, 3, 10)[:, None]
    return X, np.where(np.arange(10) == 3, 1, (X[:, 0] > 0).astype(np.int64))


def test_ep_parallel_and_sequential_share_the_fixed_point():
    X, y = n10_data()
    K = RBF(lengthscale=1.0, variance=np.exp(4.0)).K(X)  # ln ell = 0, ln sf = 2
    seq = EPSites(K, y, PROBIT, tol=1e-12)
    seq.run()
    par = EPSites(K, y, PROBIT, tol=1e-12, schedule="parallel")
    par.run()
    assert seq.converged and par.converged
    np.testing.assert_allclose(par.tau, seq.tau, atol=1e-7)
    assert par.log_evidence() == pytest.approx(seq.log_evidence(), abs=1e-8)
    # fixed point: posterior marginals equal the tilted moments (spec §7.5 item 18)
    v = seq.algebra.posterior_var_diag()
    tc, nc = 1 / v - seq.tau, seq.mu / v - seq.nu
    mom, d2 = PROBIT.tilted_and_d2(y, nc / tc, 1 / tc)
    np.testing.assert_allclose(nc / tc + mom.dlogz_dmean / tc, seq.mu, atol=1e-8)
    np.testing.assert_allclose(1 / tc + d2 / tc**2, v, atol=1e-5)


@pytest.mark.parametrize("lik", [PROBIT, BernoulliLogit()])
@pytest.mark.parametrize("k", [0.5, 30.0])
def test_single_point_ep_is_exact(lik, k):
    """n = 1: one EP update matches the tilted moments exactly: ``log Z = log int sig(f)
    N(f | 0, k) df = -ln 2`` (a symmetric sigmoid) and the posterior moments of the 1-D
    integral."""
    sig = norm.cdf if lik is PROBIT else (lambda t: 1.0 / (1.0 + np.exp(-t)))
    s = np.sqrt(k)
    z = [quad(lambda f, j=j: f**j * sig(f) * norm.pdf(f, 0, s), -30 * s, 30 * s,
              points=[0.0], limit=400)[0] for j in range(3)]
    sites = EPSites(np.array([[k]]), np.array([1]), lik, tol=1e-12)
    sites.run()
    assert sites.log_evidence() == pytest.approx(-np.log(2.0), abs=1e-9)
    assert sites.mu[0] == pytest.approx(z[1] / z[0], rel=1e-7)
    assert sites.algebra.posterior_var_diag()[0] == pytest.approx(
        z[2] / z[0] - (z[1] / z[0]) ** 2, rel=1e-6)


def test_bad_input_is_an_input_error():
    X, y = n10_data()
    K = Matern32(lengthscale=1.0, variance=1.0).K(X)
    with pytest.raises(InputError, match="damping"):
        EPSites(K, y, PROBIT, damping=1.5)
    with pytest.raises(InputError, match="schedule"):
        EPSites(K, y, PROBIT, schedule="nope")
    from gpinfer.likelihoods import Gaussian

    with pytest.raises(InputError, match="tilted_and_d2"):
        EPSites(K, y, Gaussian())
