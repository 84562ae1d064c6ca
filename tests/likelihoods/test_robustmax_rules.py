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


def _node_counts(mean, var, y, negligible_z):
    from gpinfer.likelihoods import robustmax_rules

    _, _, _, d, rho = robustmax_rules.label_contrasts(mean, var, y)
    steps = robustmax_rules.step_levels(rho)[1]
    return robustmax_rules.window_nodes(d, rho, steps, robustmax_rules.ROBUSTMAX_WINDOW,
                                        negligible_z)


@pytest.mark.parametrize("one_group", [False, True])
@pytest.mark.parametrize("negligible_z", [np.inf, 9.0])
def test_robustmax_trapezoid_padded_groups_equal_each_row_on_its_own(monkeypatch, one_group,
                                                                     negligible_z):
    """Rows of different node counts share one padded node array (weights exactly 0 beyond a
    row's own nodes): ``P`` and its derivatives equal each row evaluated alone (a batch of one
    row: its own nodes, no padding) to round-off, in one padded group or the default grouping,
    on whole grids (``negligible_z = inf``) and on windows."""
    from gpinfer.likelihoods import robustmax_rules

    if one_group:
        monkeypatch.setattr(robustmax_rules, "GROUP_COST_NODES", 10**9)
    rng = np.random.default_rng(5)
    for C in range(2, 11):
        mean, var, y = _unequal_levels(rng, C)
        counts = _node_counts(mean, var, y, negligible_z).count.astype(int)
        assert np.unique(counts).size >= 5  # the batch mixes many node counts
        if one_group:
            assert len(robustmax_rules.padded_groups(counts)) == 1
        batch = argmax_probability_abs(mean, var, y, negligible_z=negligible_z)
        alone = [argmax_probability_abs(mean[i:i + 1], var[i:i + 1], y[i:i + 1],
                                        negligible_z=negligible_z)
                 for i in range(mean.shape[0])]
        for got, want in zip(batch, (np.concatenate(v) for v in zip(*alone))):
            assert np.max(np.abs(got - want)) <= 1e-13


def _confident_and_hopeless(rng, C, B=80):
    """Rows from hopeless to confident (label mean -12..12 sds away), narrow and wide
    variances (1e-4..1e2, ratios up to 1e3 within a row): many nodes out of the window."""
    var = 10 ** rng.uniform(-1.5, 1.5, size=(B, C)) * 10 ** rng.uniform(-2.5, 0.5, (B, 1))
    y = rng.integers(0, C, B)
    mean = rng.normal(size=(B, C)) * np.sqrt(var)
    mean[np.arange(B), y] += rng.uniform(-12.0, 12.0, B) * np.sqrt(var.max(axis=1))
    return mean, var, y


def _window_error(mean, var, y, negligible_z):
    """Largest absolute change of ``P``, ``dP/dmean``, ``dP/dvar`` from the whole grid, each
    over ``1 + `` its largest magnitude in the batch."""
    whole = argmax_probability_abs(mean, var, y, negligible_z=np.inf)
    window = argmax_probability_abs(mean, var, y, negligible_z=negligible_z)
    return max(float(np.max(np.abs(g - w)) / (1.0 + np.max(np.abs(w))))
               for g, w in zip(window, whole))


def test_robustmax_trapezoid_window_equals_the_whole_grid():
    """The nodes ``window_nodes`` leaves out (some ``z_k <= -9``) or counts by weight alone
    (every ``z_k >= 9``) move ``P`` and its derivatives by round-off only against every node of
    the grid (the bound of ``window_nodes``: ~1e-17 / s; measured <= 1.7e-16), for C 2..10,
    narrow and wide variances; the same test with the cut at ``z = 6`` fails for every C, at
    ``z = 8`` (errors up to 2.5e-14) for some (it can fail)."""
    rng = np.random.default_rng(8)
    at_8 = []
    for C in range(2, 11):
        mean, var, y = _confident_and_hopeless(rng, C)
        nodes = _node_counts(mean, var, y, 9.0)
        whole = 2 * nodes.half + 1
        assert np.sum(nodes.count) <= 0.7 * np.sum(whole)  # the window leaves out many nodes
        assert np.any(nodes.count == 0) and np.any(nodes.tail > 0)
        assert _window_error(mean, var, y, 9.0) <= 1e-15
        assert _window_error(mean, var, y, 6.0) > 1e-13  # a cut where the integrand counts
        at_8.append(_window_error(mean, var, y, 8.0))
    assert max(at_8) > 1e-15  # the tolerance tells a cut one sd closer from round-off


def test_robustmax_window_nodes_cover_the_grid():
    """``first .. first + count - 1`` then ``tail`` nodes up to ``half``: within the grid, the
    window and the tail adjacent, and every node left out of both below the window."""
    rng = np.random.default_rng(9)
    for C in (2, 5, 10):
        nodes = _node_counts(*_confident_and_hopeless(rng, C), 9.0)
        half, first, count, tail = (v.astype(int) for v in nodes)
        assert np.all(count >= 0) and np.all(tail >= 0)
        assert np.all(first >= -half) and np.all(first + count + tail <= half + 1)
        assert np.all((tail == 0) | (first + count + tail == half + 1))


def test_robustmax_padded_groups_cover_every_row_once():
    from gpinfer.likelihoods.robustmax_rules import padded_groups

    rng = np.random.default_rng(6)
    for cost in (0, 50, 400, 10**9):
        counts = rng.integers(0, 120, 300)
        groups = padded_groups(counts, cost)
        rows = np.concatenate([r for r, _ in groups])
        np.testing.assert_array_equal(np.sort(rows), np.flatnonzero(counts > 0))
        assert all(np.all(counts[r] <= n) and np.any(counts[r] == n) for r, n in groups)
        if cost == 0:
            assert len(groups) == np.unique(counts[counts > 0]).size
        if cost == 10**9:
            assert len(groups) == 1


def test_robustmax_trapezoid_on_torch_equals_numpy():
    """float64 on torch equals numpy to round-off; float32 to float32's, in padded groups."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    for C in (2, 5, 10):
        for mean, var, y in (_unequal_levels(rng, C), _confident_and_hopeless(rng, C)):
            want = argmax_probability_abs(mean, var, y)
            for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 2e-6)):
                got = argmax_probability_abs(torch.tensor(mean, dtype=dtype),
                                             torch.tensor(var, dtype=dtype), torch.tensor(y))
                for g, w in zip(got, want):
                    assert g.dtype == dtype
                    scale = 1.0 + np.max(np.abs(w))
                    assert np.max(np.abs(g.numpy().astype(np.float64) - w)) <= tol * scale


def test_robustmax_padded_groups_are_the_cheapest_grouping():
    """The dynamic programme (with its early stop) finds the cheapest split of the sorted
    distinct counts into runs, checked against every split of up to 9 levels."""
    import itertools

    from gpinfer.likelihoods.robustmax_rules import padded_groups

    def cost(groups, c):
        return sum(c + rows.size * n for rows, n in groups)

    rng = np.random.default_rng(10)
    for _ in range(30):
        counts = rng.integers(1, 10, 40) * rng.integers(1, 20)
        levels = np.unique(counts)
        for c in (0, 30, 400):
            best = min(
                cost([(np.flatnonzero((counts >= levels[i]) & (counts <= levels[j - 1])),
                       levels[j - 1]) for i, j in zip((0, *cuts), (*cuts, levels.size))], c)
                for r in range(levels.size)
                for cuts in itertools.combinations(range(1, levels.size), r))
            assert cost(padded_groups(counts, c), c) == best
