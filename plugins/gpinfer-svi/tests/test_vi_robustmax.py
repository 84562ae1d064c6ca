"""``vi-robustmax``: the registered preset of svi (the robust-max VI baseline, spec ep-sep §3.2)."""

from __future__ import annotations

import numpy as np
from gpinfer_svi.method import SVI, VariationalState
from gpinfer_svi.presets import VI_ROBUSTMAX_DEFAULTS, ViRobustMax

from gpinfer import registry
from gpinfer.estimator import GPClassifier
from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import RobustMax
from gpinfer.testing import MethodTestSuite
from gpinfer.testing.method_suite import make_suite_data


class TestViRobustMaxSuite(MethodTestSuite):
    method_name = "vi-robustmax"
    n_classes = 3
    inducing = 6
    max_iter = 10
    #: the preset draws M training inputs per class at random, so a permutation of the labels
    #: moves the draws between classes; the shared K-means inputs keep the check meaningful
    method_options = {"inducing_init": "kmeans"}
    permutation_atol = 1e-3

    def objective_and_gradient(self, X, y):
        """The preset's objective is svi's full ELBO (scale ``full``) with robust-max."""
        C = self.n_classes
        kernels = [RBF(lengthscale=1.1, variance=1.4) + White(1.0) for _ in range(C)]
        hp = HyperParameters(kernels, Z=[X[:4] + 0.05 * c for c in range(C)])
        st = VariationalState(X, y, RobustMax(1e-3), hp, C, 4)
        x0 = st.pack(np.full((C, 4), 0.1), np.repeat(np.eye(4)[None] * 0.8, C, axis=0))
        return (lambda z: st.elbo(z, None)[0], lambda z: st.elbo(z, None)[1], x0)


def test_preset_is_svi_with_the_baseline_defaults():
    cls = registry.load_method("vi-robustmax")
    assert cls is ViRobustMax and issubclass(cls, SVI)
    for key, value in VI_ROBUSTMAX_DEFAULTS.items():
        assert cls.default_options[key] == value
    unchanged = set(SVI.default_options) - set(VI_ROBUSTMAX_DEFAULTS)
    assert {k: cls.default_options[k] for k in unchanged} == \
        {k: SVI.default_options[k] for k in unchanged}


def test_preset_fits_few_points_per_class_without_M():
    """Its ``M`` distinct training inputs per class once needed 100 points (default_M); now M is
    capped at N, so 20 points per class fit with the defaults."""
    X, y = make_suite_data(3, n=60, seed=1)
    est = GPClassifier(method="vi-robustmax", random_state=0, max_iter=30).fit(X, y)
    from gpinfer.inducing import DEFAULT_M

    assert est.posterior_.Z[0].shape[0] == min(DEFAULT_M, 60)
    assert est.score(X, y) > 0.85 and est.n_iter_ <= 30
    P = est.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)


def test_batch_size_refusal_names_the_preset_and_the_way_out():
    """Stress hunt s40, case seed 4002 (``benchmarks/stress_hunt.py``): ``batch_size`` with the
    preset's L-BFGS-B was refused as "svi with L-BFGS-B ...", naming neither the method the user
    chose nor the option that allows mini-batches."""
    import pytest

    from gpinfer.errors import InputError

    X, y = make_suite_data(3, n=30)
    with pytest.raises(InputError, match=r"vi-robustmax with L-BFGS-B .*batch_size=8.*adadelta"):
        GPClassifier(method="vi-robustmax", M=4, max_iter=2, batch_size=8).fit(X, y)
    est = GPClassifier(method="vi-robustmax", M=4, max_iter=2, batch_size=8,
                       method_options={"optimizer": "adadelta"}).fit(X, y)
    assert np.all(np.isfinite(est.predict_proba(X)))
