"""Tests of gpinfer.metrics against hand-computed values (spec binary §4 and §7.9)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.metrics import (
    ReliabilityCurve,
    error_rate,
    expected_calibration_error,
    information_score_bits,
    nll,
    reliability_curve,
)


def test_error_rate_binary_vector_counts_ties_as_errors():
    y = np.array([0, 1, 1, 0])
    p1 = np.array([0.2, 0.5, 0.9, 0.6])  # right, tie (error), right, wrong
    assert error_rate(y, p1) == pytest.approx(0.5)
    assert error_rate(y, np.stack([1 - p1, p1], axis=1)) == pytest.approx(0.5)


def test_error_rate_multiclass():
    P = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2], [0.2, 0.7, 0.1]])
    y = np.array([0, 2, 1, 0])  # right, right, tie (error), wrong
    assert error_rate(y, P) == pytest.approx(0.5)


def test_nll_from_probabilities_and_from_log_predictive():
    y = np.array([0, 1])
    P = np.array([[0.8, 0.2], [0.25, 0.75]])
    expected = -(np.log(0.8) + np.log(0.75)) / 2  # 0.255412811...
    assert expected == pytest.approx(0.2554128119, abs=1e-9)
    assert nll(y, P) == pytest.approx(expected)
    assert nll(y, np.array([0.2, 0.75])) == pytest.approx(expected)
    assert nll(None, log_predictive=np.log([0.8, 0.75])) == pytest.approx(expected)
    assert nll(y, log_predictive=np.log([0.8, 0.75])) == pytest.approx(expected)


def test_nll_zero_probability_is_large_but_finite():
    assert nll(np.array([0]), np.array([[0.0, 1.0]])) == pytest.approx(-np.log(1e-300))


def test_information_score_spec_oracles():
    """Spec binary §7.9 #30: perfect confident predictions -> I = B = 1; p = 1/2 -> I = 0."""
    y = np.array([0, 1, 0, 1])
    perfect = np.eye(2)[y]
    assert information_score_bits(y, perfect, [0.5, 0.5]) == pytest.approx(1.0)
    assert information_score_bits(y, np.full((4, 2), 0.5), [0.5, 0.5]) == pytest.approx(0.0)


def test_information_score_hand_computed_unbalanced_prior():
    # B = -(1/2 log2 0.75 + 1/2 log2 0.25) = 1.2075187; mean log2 p = -1 -> I = 0.2075187
    y = np.array([0, 1])
    P = np.full((2, 2), 0.5)
    assert information_score_bits(y, P, [0.75, 0.25]) == pytest.approx(0.2075187496)
    assert information_score_bits(y, P, [3, 1]) == pytest.approx(0.2075187496)  # counts
    lp = np.log([0.5, 0.5])
    assert information_score_bits(y, None, [3, 1], log_predictive=lp) == pytest.approx(
        0.2075187496
    )


def test_information_score_matches_paper_formula():
    """I = B + 1/(2n) sum[(1+y) log2 p + (1-y) log2(1-p)] with y in {-1, +1}."""
    rng = np.random.default_rng(3)
    y01 = rng.integers(0, 2, size=50)
    p = rng.uniform(0.05, 0.95, size=50)  # p(y = +1)
    train_freq = np.array([0.4, 0.6])
    s = 2 * y01 - 1
    n1 = np.mean(y01 == 1)
    B = -((1 - n1) * np.log2(train_freq[0]) + n1 * np.log2(train_freq[1]))
    paper = B + np.sum((1 + s) * np.log2(p) + (1 - s) * np.log2(1 - p)) / (2 * len(p))
    assert information_score_bits(y01, p, train_freq) == pytest.approx(paper, rel=1e-12)


def test_ece_and_reliability_top_label():
    y = np.array([0, 0, 1, 0])
    p1 = np.array([0.1, 0.65, 0.95, 0.45])
    # top-label confidences 0.9, 0.65, 0.95, 0.55; hits 1, 0, 1, 1
    assert expected_calibration_error(y, p1, n_bins=10) == pytest.approx(
        (0.1 + 0.65 + 0.05 + 0.45) / 4
    )
    assert expected_calibration_error(y, p1, n_bins=2) == pytest.approx(abs(0.75 - 0.7625))
    curve = reliability_curve(y, p1, n_bins=2)
    assert isinstance(curve, ReliabilityCurve)
    np.testing.assert_array_equal(curve.count, [0, 4])
    assert np.isnan(curve.confidence[0]) and np.isnan(curve.accuracy[0])
    assert curve.confidence[1] == pytest.approx(0.7625)
    assert curve.accuracy[1] == pytest.approx(0.75)
    np.testing.assert_allclose(curve.edges, [0.0, 0.5, 1.0])


def test_reliability_for_one_class_and_bin_edges():
    y = np.array([0, 1, 1, 0])
    p1 = np.array([0.1, 0.65, 0.95, 0.5])  # 0.5 belongs to the bin (0, 0.5]
    curve = reliability_curve(y, p1, n_bins=2, class_index=1)
    np.testing.assert_array_equal(curve.count, [2, 2])
    np.testing.assert_allclose(curve.confidence, [0.3, 0.8])
    np.testing.assert_allclose(curve.accuracy, [0.0, 1.0])
    assert expected_calibration_error(y, p1, n_bins=2, class_index=1) == pytest.approx(0.25)
    zero = reliability_curve(np.array([0, 1]), np.array([0.0, 1.0]), n_bins=4, class_index=1)
    np.testing.assert_array_equal(zero.count, [1, 0, 0, 1])


def test_perfectly_calibrated_is_zero():
    y = np.array([1, 1, 1, 0])  # 3 of 4 are class 1 at confidence 0.75
    P = np.tile([0.25, 0.75], (4, 1))
    assert expected_calibration_error(y, P) == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: error_rate([0, 1], np.ones((3, 2)) / 2), "N=3"),
        (lambda: error_rate([0, 2], np.ones((2, 2)) / 2), "outside 0..1"),
        (lambda: error_rate([0, 0.5], np.ones((2, 2)) / 2), "integer class indices"),
        (lambda: error_rate([0], np.ones((1, 1))), "C >= 2"),
        (lambda: nll([0], np.ones((1, 2)) / 2, log_predictive=[0.0]), "exactly one"),
        (lambda: nll([0]), "exactly one"),
        (lambda: information_score_bits([0, 1], np.ones((2, 2)) / 2, [1.0]), "prior"),
        (lambda: reliability_curve([0], np.ones((1, 2)) / 2, n_bins=0), "n_bins"),
        (lambda: reliability_curve([0], np.ones((1, 2)) / 2, class_index=2), "class_index"),
    ],
)
def test_metric_input_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
