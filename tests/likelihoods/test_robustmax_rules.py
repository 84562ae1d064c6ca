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


def _unequal_levels(rng, C, B=60):
    """Rows with node levels from the coarsest to ~30x finer: variance ratios up to 1e4."""
    mean = rng.normal(size=(B, C)) * rng.uniform(0.1, 5.0, (B, 1))
    var = 10 ** rng.uniform(-2.0, 2.0, size=(B, C))
    return mean, var, rng.integers(0, C, B)


@pytest.mark.parametrize("one_group", [False, True])
def test_robustmax_trapezoid_padded_groups_equal_each_row_on_its_own_grid(monkeypatch,
                                                                          one_group):
    """Rows of different step levels share one padded node array (weights exactly 0 beyond a
    row's own grid): ``P`` and its derivatives equal each row evaluated alone (a batch of one
    row: its own grid, no padding) to round-off, in one padded group or the default grouping."""
    from gpinfer.likelihoods import robustmax_rules

    if one_group:
        monkeypatch.setattr(robustmax_rules, "GROUP_COST_NODES", 10**9)
    rng = np.random.default_rng(5)
    for C in range(2, 11):
        mean, var, y = _unequal_levels(rng, C)
        _, _, _, _, rho = robustmax_rules.label_contrasts(mean, var, y)
        halves = np.ceil(robustmax_rules.ROBUSTMAX_WINDOW
                         / robustmax_rules.step_levels(rho)[1]).astype(int)
        assert np.unique(halves).size >= 5  # the batch mixes many grids
        if one_group:
            assert len(robustmax_rules.padded_groups(halves)) == 1
        batch = argmax_probability_abs(mean, var, y)
        alone = [argmax_probability_abs(mean[i:i + 1], var[i:i + 1], y[i:i + 1])
                 for i in range(mean.shape[0])]
        for got, want in zip(batch, (np.concatenate(v) for v in zip(*alone))):
            assert np.max(np.abs(got - want)) <= 1e-13


def test_robustmax_padded_groups_cover_every_row_once():
    from gpinfer.likelihoods.robustmax_rules import padded_groups

    rng = np.random.default_rng(6)
    for cost in (0, 50, 400, 10**9):
        halves = rng.integers(20, 60, 300)
        groups = padded_groups(halves, cost)
        rows = np.concatenate([r for r, _ in groups])
        np.testing.assert_array_equal(np.sort(rows), np.arange(300))
        assert all(np.all(halves[r] <= h) and np.any(halves[r] == h) for r, h in groups)
        if cost == 0:
            assert len(groups) == np.unique(halves).size
        if cost == 10**9:
            assert len(groups) == 1


def test_robustmax_trapezoid_on_torch_equals_numpy():
    """float64 on torch equals numpy to round-off; float32 to float32's, in padded groups."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    for C in (2, 5, 10):
        mean, var, y = _unequal_levels(rng, C)
        want = argmax_probability_abs(mean, var, y)
        for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 2e-6)):
            got = argmax_probability_abs(torch.tensor(mean, dtype=dtype),
                                         torch.tensor(var, dtype=dtype), torch.tensor(y))
            for g, w in zip(got, want):
                assert g.dtype == dtype
                assert np.max(np.abs(g.numpy().astype(np.float64) - w)) <= tol
