"""The robust-max expectation rules (``gpinfer.likelihoods.robustmax_rules``, the default rule of
``RobustMax.variational_expectations``) against independent references (spec ep-sep §3.2, O14)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from gpinfer.errors import InputError
from gpinfer.likelihoods import RobustMax
from gpinfer.likelihoods.multiclass import argmax_probability
from gpinfer.likelihoods.robustmax_rules import argmax_probability_abs


def _reference(mean, var, y):
    """``P``, ``dP/dmean``, ``dP/dvar`` from the likelihood's log-space rule (~1e-13)."""
    out = argmax_probability(mean, var, y)
    P = np.exp(out.log_p)
    return P, P[:, None] * out.dmean, P[:, None] * out.dvar


def _cases(rng, B=40):
    """Random marginals: 3 to 10 classes, mean spreads 0.1..10, variance ratios up to 1e3."""
    for C in (3, 6, 10):
        for spread in (0.1, 1.0, 5.0):
            for decades in (0.0, 1.5, 3.0):
                mean = rng.normal(size=(B, C)) * spread
                var = (10 ** rng.uniform(-decades / 2, decades / 2, size=(B, C))
                       * 10 ** rng.uniform(-1.5, 1.5, size=(B, 1)))
                yield mean, var, rng.integers(0, C, B)


def test_robustmax_trapezoid_matches_the_reference_rule():
    rng = np.random.default_rng(0)
    for mean, var, y in _cases(rng):
        for got, want in zip(argmax_probability_abs(mean, var, y), _reference(mean, var, y)):
            assert np.all(np.abs(got - want) <= 1e-8 * (1.0 + np.abs(want)))


def test_robustmax_trapezoid_two_classes_closed_form():
    """O14(b): ``P = Phi((m_y - m_k) / sqrt(v_y + v_k))`` for C = 2, very unequal variances."""
    rng = np.random.default_rng(1)
    for ratio in (1e-4, 1e-2, 1.0, 1e2):
        mean = rng.normal(size=(50, 2)) * 2
        var = np.column_stack([np.full(50, 0.7), np.full(50, 0.7 * ratio)])
        y = rng.integers(0, 2, 50)
        P, _, _ = argmax_probability_abs(mean, var, y)
        rows = np.arange(50)
        exact = ndtr((mean[rows, y] - mean[rows, 1 - y]) / np.sqrt(var.sum(axis=1)))
        np.testing.assert_allclose(P, exact, rtol=0, atol=1e-10)


def test_robustmax_trapezoid_derivatives_are_exact_for_the_discretised_sum():
    rng = np.random.default_rng(2)
    B, C, h = 6, 5, 1e-6
    mean, var, y = rng.normal(size=(B, C)), rng.uniform(0.5, 1.5, (B, C)), rng.integers(0, C, B)
    _, dm, dv = argmax_probability_abs(mean, var, y)
    for c in range(C):
        e = np.zeros((B, C))
        e[:, c] = h
        num_m = (argmax_probability_abs(mean + e, var, y)[0]
                 - argmax_probability_abs(mean - e, var, y)[0]) / (2 * h)
        num_v = (argmax_probability_abs(mean, var + e, y)[0]
                 - argmax_probability_abs(mean, var - e, y)[0]) / (2 * h)
        np.testing.assert_allclose(dm[:, c], num_m, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(dv[:, c], num_v, rtol=1e-6, atol=1e-9)


def test_gauss_hermite_in_f_y_is_inaccurate_where_the_trapezoid_is_not():
    """Why the default changed: 20-node Gauss-Hermite at C = 10 with unequal variances."""
    rng = np.random.default_rng(3)
    B, C = 100, 10
    mean, y = rng.normal(size=(B, C)), rng.integers(0, C, B)
    var = 10 ** rng.uniform(-1, 1, size=(B, C))
    eps = 1e-3
    a, b = np.log(1 - eps + eps / C), np.log(eps / C)
    P_ref = _reference(mean, var, y)[0]
    gh = RobustMax(eps, expectation="gauss_hermite", quadrature_points=20)
    E_gh = gh.variational_expectations(y, mean, var).value
    E_tr = RobustMax(eps).variational_expectations(y, mean, var).value
    assert np.max(np.abs(E_gh - (b + (a - b) * P_ref))) > 1e-3
    np.testing.assert_allclose(E_tr, b + (a - b) * P_ref, rtol=0, atol=1e-8)


def test_robustmax_expectation_option_is_checked():
    with pytest.raises(InputError, match="expectation must be one of"):
        RobustMax(1e-3, expectation="nope")
    with pytest.raises(InputError, match="quadrature_points"):
        RobustMax(1e-3, quadrature_points=0)
    lik = RobustMax(1e-3)
    assert lik.with_expectation("log_space").expectation == "log_space"
    assert lik.expectation == "trapezoid"  # with_expectation copies
