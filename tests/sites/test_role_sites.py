"""Role-site bookkeeping of the pairwise-probit sites (gpinfer.sites.inducing, spec ep-sep §1.5)."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.sites.inducing import aggregate, factor_mask


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
