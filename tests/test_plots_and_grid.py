"""gpinfer.plots (PNG writers) and gpinfer.optim.grid.GridSearch."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.optim.grid import GridSearch
from gpinfer.plots import contour_grid_png, reliability_diagram_png


def test_reliability_diagram_and_contours_write_png(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.uniform(size=200)
    y = (rng.uniform(size=200) < p).astype(int)
    P = np.stack([1 - p, p], axis=1)
    out = reliability_diagram_png(tmp_path / "rel.png", y, {"a": P, "b": P[:, ::-1]})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    x = np.linspace(0, 1, 5)
    Z = np.add.outer(x, -x**2)
    out = contour_grid_png(tmp_path / "c.png", x, x, {"m1": Z, "m2": np.full((5, 5), np.nan)},
                           shared_levels=True)
    assert out.stat().st_size > 1000


def test_grid_search_finds_the_best_node():
    gs = GridSearch([[0.0, 1.0, 2.0], [-1.0, 0.5]])
    res = gs.maximize(lambda x: (-(x[0] - 1) ** 2 - x[1] ** 2, np.zeros(2)), np.zeros(2), 100)
    np.testing.assert_allclose(res.x, [1.0, 0.5])
    assert gs.values.shape == (3, 2) and res.n_iter == 6 and res.success
    with pytest.raises(InputError, match="axes"):
        gs.maximize(lambda x: (0.0, x), np.zeros(3), 10)
    with pytest.raises(InputError):
        GridSearch([])
