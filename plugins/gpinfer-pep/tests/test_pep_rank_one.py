"""``gpinfer_pep.rank_one``: rank-one Power-EP sites in inducing space (spec power-ep §7).

Core-against-core oracles: with the full inducing set ``Z = X`` and power one, the sites reach
the fixed point of dense EP (``gpinfer.sites.ep.EPSites``: the same energy, marginals and site
precisions); the schedules and site steps share one fixed point at any power; the energy's
matrix gradients at convergence match finite differences through the kernel."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_pep.rank_one import RankOnePEPSites, kernel_geometry, matrix_geometry

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.kernels import RBF
from gpinfer.likelihoods import BernoulliProbit
from gpinfer.sites.ep import EPSites

PROBIT = BernoulliProbit()


def _problem(n=20, m=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return RBF(lengthscale=[0.9, 1.1], variance=1.3), X, y, X[:m] + 0.05


def _sites(kern, X, y, Z, alpha, jitter=0.0, **kw):
    sites = RankOnePEPSites(PROBIT, y, alpha, **kw)
    sites.set_geometry(matrix_geometry(kern.K(Z), kern.K(Z, X), kern.K_diag(X), jitter),
                       kern, Z)
    return sites


def test_full_inducing_set_at_power_one_is_dense_ep():
    kern, X, y, _ = _problem()
    jitter = 1e-8
    sites = _sites(kern, X, y, X.copy(), 1.0, jitter=jitter, schedule="sequential",
                   site_step="full", damping=1.0)
    sites.run(500, tol=1e-12)
    dense = EPSites(kern.K(X) + jitter * np.eye(len(y)), y, PROBIT, tol=1e-12)
    dense.run()
    mean_f, var_f = sites.marginals()
    np.testing.assert_allclose(sites.energy(with_gradients=False).value, dense.log_evidence(),
                               rtol=1e-6)
    np.testing.assert_allclose(mean_f, dense.mu, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var_f, dense.algebra.posterior_var_diag(), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("alpha", [0.4, 1.0])
def test_schedules_and_steps_share_the_fixed_point(alpha):
    kern, X, y, Z = _problem()
    energies = []
    for kw in (dict(schedule="sequential", site_step="power", damping=1.0),
               dict(schedule="parallel", site_step="full", damping=0.5)):
        sites = _sites(kern, X, y, Z, alpha, **kw)
        sites.run(3000, tol=1e-11)
        assert sites.converged and np.all(sites.tau >= 0)
        energies.append(sites.energy(with_gradients=False).value)
    assert energies[0] == pytest.approx(energies[1], abs=1e-8)


def test_energy_gradient_at_convergence_by_finite_differences():
    kern, X, y, Z = _problem(n=15, m=5)
    hp = HyperParameters(kern, Z=Z, optimize_inducing=False)
    theta0 = hp.pack()

    def energy(theta, gradients=False):
        hp.unpack(theta)
        sites = _sites(kern, X, y, Z, 0.5, schedule="sequential", site_step="power", damping=1.0)
        sites.run(3000, tol=1e-13)
        return sites.energy(with_gradients=gradients)

    out = energy(theta0, True)
    grad = parameter_gradient(hp, X, out.gradients)
    h = 1e-5
    for i in range(theta0.size):
        e = np.zeros_like(theta0)
        e[i] = h
        fd = (energy(theta0 + e).value - energy(theta0 - e).value) / (2 * h)
        assert grad[i] == pytest.approx(fd, rel=1e-4, abs=1e-6)


def _duplicated_rows(copies: int):
    """30 distinct standardised rows given ``copies`` times, ``Z`` the distinct rows, and the
    kernel L-BFGS-B reached when vfe fitted them (issue 27: length-scale 2.17, variance 443)."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=30) > 0).astype(int)
    X = (X - X.mean(0)) / X.std(0)
    kern = RBF(lengthscale=2.1737, variance=443.27)
    return kern, np.vstack([X] * copies), np.tile(y, copies), X


@pytest.mark.parametrize("copies", [1, 2])
def test_vfe_parallel_sweeps_converge_on_duplicated_rows(copies):
    """Issue 27: at alpha = 0 the undamped parallel sweep's most negative Jacobian eigenvalue
    here is -2.69 on the distinct rows and -2.985 with every row twice (the copies respond
    to one marginal together), against the limit 1 - 2 / rho = -3 of damping 0.5: the sweep
    oscillated for 1519 sweeps (500 allowed per evaluation). Cutting the damping once the
    steps keep reversing converges, to the fixed point (one undamped update moves no site)."""
    kern, X, y, Z = _duplicated_rows(copies)
    sites = RankOnePEPSites(PROBIT, y, 0.0, site_step="full", damping=0.5)
    sites.set_geometry(kernel_geometry(kern, Z, X, 1e-8))
    assert sites.run(500, tol=1e-9) < 500 and sites.converged
    assert sites.damping == 0.5  # a cut lasts one run
    assert (sites.damping_cuts > 0) == (copies == 2)
    tau, nu, ok = sites._targets(sites.cavity(np.arange(len(y))))
    assert ok.all()
    np.testing.assert_allclose(tau, sites.tau, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(nu, sites.nu, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_converging_sweeps_keep_their_damping(alpha):
    """pep and fitc converge on the duplicated rows at damping 0.5 without reversals: no cut,
    so their paths (and every protocol number) are those of the fixed damping."""
    kern, X, y, Z = _duplicated_rows(2)
    sites = RankOnePEPSites(PROBIT, y, alpha, site_step="full", damping=0.5)
    sites.set_geometry(kernel_geometry(kern, Z, X, 1e-8))
    assert sites.run(500) < 500 and sites.damping_cuts == 0


def test_geometry_is_the_inducing_geometry_and_the_old_name_is_deprecated():
    """pep's geometry is the one inducing geometry over one latent (``StackedTerms``: ``L``,
    ``A``, ``s`` and ``W = L^-T A``, its kernel matrices kept); ``InducingGeometry.build`` and
    ``.from_kernel`` work one more release with a ``DeprecationWarning``."""
    import gpinfer_pep.rank_one as rank_one

    from gpinfer.sites.stacked import StackedTerms

    rng = np.random.default_rng(3)
    X, Z = rng.normal(size=(9, 2)), rng.normal(size=(4, 2))
    kern = RBF(lengthscale=0.8, variance=1.2)
    geo = kernel_geometry(kern, Z, X, 1e-8)
    assert isinstance(geo, StackedTerms) and geo.Kuf is not None
    jitter = 1e-8 * float(np.mean(np.diag(kern.K(Z))))
    np.testing.assert_allclose(geo.L @ geo.L.T, kern.K(Z) + jitter * np.eye(4), atol=1e-12)
    np.testing.assert_allclose(geo.L @ geo.A, kern.K(Z, X), atol=1e-12)
    np.testing.assert_allclose(geo.W, np.linalg.solve(kern.K(Z) + jitter * np.eye(4),
                                                      kern.K(Z, X)), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(geo.s, kern.K_diag(X) - np.sum(geo.A**2, axis=0), atol=1e-12)
    with pytest.warns(DeprecationWarning, match="matrix_geometry"):
        old = rank_one.InducingGeometry
    np.testing.assert_array_equal(old.from_kernel(kern, Z, X, 1e-8).A, geo.A)
    np.testing.assert_array_equal(old.build(kern.K(Z), kern.K(Z, X), kern.K_diag(X), jitter).L,
                                  geo.L)
    with pytest.raises(AttributeError):
        _ = rank_one.NoSuchName
