"""Role-site bookkeeping of the pairwise-probit sites (gpinfer.sites.inducing, spec ep-sep §1.5)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.sites.inducing import aggregate, factor_mask, pair_slopes, pair_tilted


def _loop_aggregate(win: np.ndarray, lose: np.ndarray, y: np.ndarray) -> np.ndarray:
    n, C = win.shape
    out = np.zeros((n, C))
    for i in range(n):
        for k in range(C):
            if k != y[i]:
                out[i, k] = lose[i, k]
                out[i, y[i]] += win[i, k]
    return out


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("win_masked", [False, True])
def test_aggregate_sums_the_winner_roles_at_the_label_and_keeps_the_loser_elsewhere(
        backend, win_masked):
    rng = np.random.default_rng(2)
    n, C = 9, 4
    y = rng.integers(0, C, size=n)
    win, lose = rng.normal(size=(n, C)), rng.normal(size=(n, C))
    mask = factor_mask(y, C)
    if win_masked:
        win = np.where(mask, win, 0.0)
    else:  # non-factor entries are ignored, however large
        win[~mask], lose[~mask] = 1e300, -1e300
    ref = _loop_aggregate(win, lose, y)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        t_mask = factor_mask(torch.as_tensor(y), C)
        out = aggregate(torch.as_tensor(win), torch.as_tensor(lose), t_mask,
                        win_masked=win_masked).numpy()
    else:
        out = aggregate(win, lose, mask, win_masked=win_masked)
    assert out.shape == (n, C)
    np.testing.assert_allclose(out, ref, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_pair_slopes_are_pair_tilteds_masked_slope_and_curvature(backend):
    rng = np.random.default_rng(7)
    n, C = 8, 3
    y = rng.integers(0, C, size=n)
    a, v = rng.normal(size=(n, C)), rng.uniform(0.2, 2.0, size=(n, C))
    a_y, v_y = a[np.arange(n), y][:, None], v[np.arange(n), y][:, None]
    mask = factor_mask(y, C)
    args: tuple = (a_y, v_y, a, v, mask)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(torch.as_tensor(x) for x in args)
    full, slopes = pair_tilted(*args), pair_slopes(*args)
    for got, ref in ((slopes.g_win, full.g_win), (slopes.gamma, full.gamma)):
        got, ref = np.asarray(got), np.asarray(ref)
        np.testing.assert_array_equal(got, ref)
        assert np.all(got[~mask] == 0.0) and np.all(ref[mask] != 0.0)
