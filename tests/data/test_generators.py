"""Built-in generators: Breiman's waveform and the seed-000 synthetic 2-D three-class problem."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.data.generators import synthetic_2d_three_class, waveform, waveform_base_waves
from gpinfer.errors import InputError


def test_base_waves_match_breiman():
    h = waveform_base_waves()
    assert h.shape == (3, 21)
    t = np.arange(1, 22)
    # h1 peaks at t = 11 with height 6, h2 = h1 shifted right by 4, h3 = h1 shifted left by 4
    assert h[0, t == 11] == 6 and h[1, t == 15] == 6 and h[2, t == 7] == 6
    assert h[0, 0] == 0 and h[0, 5] == 1  # t = 6: max(6 - 5, 0)
    np.testing.assert_array_equal(h[1, 4:], h[0, :-4])
    np.testing.assert_array_equal(h[2, :-4], h[0, 4:])


def test_waveform_shape_balance_and_determinism():
    ds = waveform(n=3000, seed=3)
    assert ds.X.shape == (3000, 21) and ds.y.shape == (3000,)
    assert ds.X.dtype == np.float64 and ds.y.dtype == np.int64
    assert ds.n_classes == 3 and ds.name == "waveform"
    counts = np.bincount(ds.y, minlength=3)
    # equiprobable classes: each count within 4 binomial sds of 1000
    assert np.all(np.abs(counts - 1000) < 4 * np.sqrt(3000 * (1 / 3) * (2 / 3)))
    again = waveform(n=3000, seed=3)
    np.testing.assert_array_equal(ds.X, again.X)
    np.testing.assert_array_equal(ds.y, again.y)
    other = waveform(n=3000, seed=4)
    assert not np.array_equal(ds.X, other.X)


def test_waveform_class_means_are_average_of_two_base_waves():
    """Oracle: E[x | class] = (h_a + h_b) / 2, since E[u] = 1/2 and the noise has mean 0."""
    ds = waveform(n=9000, seed=0)
    h = waveform_base_waves()
    # Breiman: class 1 = (h1, h2), class 2 = (h1, h3), class 3 = (h2, h3)
    for c, (a, b) in enumerate([(0, 1), (0, 2), (1, 2)]):
        mean = ds.X[ds.y == c].mean(axis=0)
        # per-coordinate sd <= sqrt(1 + 36/12) = 2, about 3000 points per class: se < 0.04
        np.testing.assert_allclose(mean, (h[a] + h[b]) / 2, atol=0.2)
    # and the noise is unit Gaussian: residual variance at t=1 (all base waves are 0 there)
    assert abs(ds.X[:, 0].var() - 1.0) < 0.1


def test_waveform_rejects_bad_n():
    with pytest.raises(InputError, match="n must be an integer >= 1"):
        waveform(n=0)


def test_synthetic2d_shapes_range_and_determinism():
    ds = synthetic_2d_three_class(n=400, seed=0)
    assert ds.X.shape == (400, 2) and ds.y.shape == (400,)
    assert ds.X.min() >= -2.5 and ds.X.max() <= 2.5
    assert set(np.unique(ds.y)) == {0, 1, 2}
    assert ds.extras["F"].shape == (400, 3)
    again = synthetic_2d_three_class(n=400, seed=0)
    np.testing.assert_array_equal(ds.X, again.X)
    np.testing.assert_array_equal(ds.y, again.y)
    assert not np.array_equal(ds.y, synthetic_2d_three_class(n=400, seed=1).y)


def test_synthetic2d_latents_are_smooth_gp_draws_and_labels_their_argmax():
    ds = synthetic_2d_three_class(n=600, seed=2, n_test=200)
    F = ds.extras["F"]
    # noise variance 1e-2 against unit-variance latents: labels mostly equal argmax of F
    assert np.mean(np.argmax(F, axis=1) == ds.y) > 0.9
    # RBF prior with unit length-scale: latents at nearby inputs are strongly correlated
    d = np.linalg.norm(ds.X[:, None] - ds.X[None], axis=-1)
    i, j = np.nonzero(np.triu(d < 0.1, k=1))
    assert len(i) > 50
    for c in range(3):
        assert np.corrcoef(F[i, c], F[j, c])[0, 1] > 0.9
    # prior variance 1: the latents' overall spread is of order one
    assert 0.2 < F.var() < 3.0
    # the test part comes from the same latent draw
    assert ds.X_test.shape == (200, 2) and ds.extras["F_test"].shape == (200, 3)
    assert np.mean(np.argmax(ds.extras["F_test"], axis=1) == ds.y_test) > 0.9


def test_synthetic2d_rejects_bad_options():
    with pytest.raises(InputError, match="lengthscale"):
        synthetic_2d_three_class(n=10, lengthscale=-1.0)


@pytest.mark.parametrize("layout", ["tube", "clusters"])
@pytest.mark.parametrize("ratio", [1.0, 5.0, 20.0])
def test_stress_binary_imbalance_scales_and_determinism(layout, ratio):
    from gpinfer.data.generators import stress_binary

    ds = stress_binary(3000, ratio, layout, scales=(1.0, 1e3, 1e-2), seed=1)
    assert ds.X.shape == (3000, 3) and set(np.unique(ds.y)) == {0, 1}
    assert np.mean(ds.y) == pytest.approx(1.0 / (1.0 + ratio), abs=0.01)
    spread = ds.X.std(axis=0)
    assert spread[1] / spread[0] > 100 and spread[0] / spread[2] > 10  # very different scales
    again = stress_binary(3000, ratio, layout, scales=(1.0, 1e3, 1e-2), seed=1)
    assert np.array_equal(ds.X, again.X) and np.array_equal(ds.y, again.y)


def test_stress_binary_is_nearly_separable_and_rejects_bad_options():
    from sklearn.neighbors import KNeighborsClassifier

    from gpinfer.data.generators import stress_binary

    ds = stress_binary(4000, 4.0, "tube", flip=0.002, seed=0)
    knn = KNeighborsClassifier(5).fit(ds.X[:3000], ds.y[:3000])
    assert knn.score(ds.X[3000:], ds.y[3000:]) > 0.97  # near-separable, not linearly
    for bad in (dict(ratio=0.5), dict(layout="ring"), dict(flip=0.6), dict(scales=(1.0, 0.0, 1.0)),
                dict(n=0)):
        with pytest.raises(InputError, match="stress"):
            stress_binary(**{"n": 100, **bad})
