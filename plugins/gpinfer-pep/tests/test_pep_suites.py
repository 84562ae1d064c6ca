"""The shared method battery for ``pep``, ``fitc`` and ``vfe`` (binary classification)."""

from __future__ import annotations

import numpy as np
from _pep_dense import single_thread  # noqa: F401  (autouse fixture)
from gpinfer_pep.rank_one import RankOnePEPSites, matrix_geometry

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.kernels import make_kernel
from gpinfer.likelihoods import BernoulliProbit
from gpinfer.registry import load_method
from gpinfer.testing import MethodTestSuite


class _PEPSuite(MethodTestSuite):
    inducing = 6
    max_iter = 5
    gradient_rtol = 1e-5

    def objective_and_gradient(self, X, y):
        """The energy over the kernel's log-parameters, sites re-converged at every point."""
        kern = make_kernel("rbf", input_dim=X.shape[1], ard=False)
        Z = X[:: max(1, len(X) // 6)][:6]
        hp = HyperParameters(kern, None, Z, optimize_inducing=False)
        alpha = load_method(self.method_name)(**(self.method_options or {})).alpha  # its power
        sites = RankOnePEPSites(BernoulliProbit(), y, alpha, site_step="full", damping=0.7)

        def value_grad(theta):
            hp.unpack(theta)
            sites.set_geometry(matrix_geometry(kern.K(Z), kern.K(Z, X), kern.K_diag(X),
                                                      1e-8))
            sites.run(5000, tol=1e-12)
            out = sites.energy()
            return out.value, parameter_gradient(hp, X, out.gradients)

        return (lambda t: value_grad(t)[0]), (lambda t: value_grad(t)[1]), hp.pack()


class TestPEP(_PEPSuite):
    method_name = "pep"
    method_options = {"alpha": 0.5}


class TestFITC(_PEPSuite):
    method_name = "fitc"


class TestVFE(_PEPSuite):
    method_name = "vfe"


def test_alias_powers():
    from gpinfer_pep.method import FITC, VFE, PowerEP

    assert FITC().alpha == 1.0 and VFE().alpha == 0.0 and PowerEP(alpha=0.3).alpha == 0.3
    assert np.isclose(PowerEP().alpha, 0.5)


def test_method_configs_are_accepted():
    from pathlib import Path

    from omegaconf import OmegaConf

    from gpinfer import registry

    conf = Path(__file__).resolve().parents[3] / "conf" / "method"
    for name in ("pep", "fitc", "vfe"):
        cfg = OmegaConf.to_container(OmegaConf.load(conf / f"{name}.yaml"))
        assert cfg["name"] == name
        registry.load_method(name)(**cfg["options"])


def test_median_lengthscale_init_and_epochs():
    from gpinfer import GPClassifier
    from gpinfer.testing.method_suite import make_suite_data

    X, y = make_suite_data(2, n=40)
    est = GPClassifier(method="pep", M=4, kernel=make_kernel("rbf", input_dim=2, ard=True),
                       batch_size=20, random_state=0,
                       method_options={"epochs": 3, "n_sweeps": 1, "init_lengthscale": "median"})
    est.fit(X, y)
    assert est.n_iter_ == 6 and len(est.history_) == 6
