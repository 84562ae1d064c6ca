"""``gpinfer.interfaces``: the method-option renames (old names work for one release with a
``DeprecationWarning``), likelihood capabilities and the expectation-rule option."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.interfaces import Method
from gpinfer.likelihoods import BernoulliLogit, BernoulliProbit, Gaussian, RobustMax, Softmax


class _Renamed(Method):
    name = "renamed-toy"
    default_options = {"power": 1.0, "tol": 1e-6}
    renamed_options = {"alpha": "power"}

    def fit(self, problem, callback=None):  # pragma: no cover - never trained
        raise NotImplementedError


def test_old_option_name_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="'alpha' is renamed 'power'"):
        m = _Renamed(alpha=0.5)
    assert m.options == {"power": 0.5, "tol": 1e-6}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _Renamed(power=0.3).options["power"] == 0.3  # the new name: no warning


def test_old_and_new_name_together_is_an_input_error():
    with pytest.raises(InputError, match="both 'alpha' and its new name 'power'"):
        _Renamed(alpha=0.5, power=0.5)


def test_capabilities_and_supports():
    assert BernoulliLogit().supports({"log_sigmoid", "jaakkola_jordan", "log_concave"})
    assert not BernoulliProbit().supports({"jaakkola_jordan"})
    assert Gaussian().supports({"log_prob_derivatives", "log_concave"})
    assert not RobustMax().supports({"log_prob_derivatives"})
    assert RobustMax().supports(())


def test_with_expectation_copies_and_checks():
    lik = Softmax()
    mc = lik.with_expectation("monte_carlo", mc_samples=8)
    assert (lik.expectation, mc.expectation, mc.mc_samples) == ("gauss_hermite", "monte_carlo", 8)
    with pytest.raises(InputError, match="unknown expectation setting"):
        lik.with_expectation(quadrature_points=3)
    with pytest.raises(InputError, match="positive integer"):
        BernoulliLogit(quadrature_points=2.5)
    # the default rule of a likelihood without its own rules is expected_log_prob itself
    y, m, v = np.array([0.3, -1.0]), np.array([0.1, 0.4]), np.array([0.5, 1.0])
    g = Gaussian(0.7)
    np.testing.assert_array_equal(g.variational_expectations(y, m, v).value,
                                  g.expected_log_prob(y, m, v).value)
