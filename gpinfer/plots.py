"""PNG figures for experiments: reliability diagrams and hyper-parameter contour maps.

Matplotlib is imported lazily with the non-interactive ``Agg`` backend, so importing this module
costs nothing and works headless. Each function writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from gpinfer.interfaces import Array
from gpinfer.metrics import expected_calibration_error, reliability_curve


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reliability_diagram_png(path: str | Path, y: Array, P: Array | Mapping[str, Array],
                            n_bins: int = 10, title: str = "") -> Path:
    """Reliability diagram (top-label accuracy vs confidence, with bin counts) as a PNG.

    ``y [N]`` class indices; ``P [N, C]`` probabilities, or a mapping ``name -> [N, C]`` to
    overlay several methods. The legend gives each curve's expected calibration error.
    """
    plt = _pyplot()
    curves = P if isinstance(P, Mapping) else {"model": P}
    fig, (ax, axc) = plt.subplots(2, 1, figsize=(5, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect calibration")
    for name, probs in curves.items():
        c = reliability_curve(y, probs, n_bins)
        ece = expected_calibration_error(y, probs, n_bins)
        used = c.count > 0
        ax.plot(c.confidence[used], c.accuracy[used], "o-", label=f"{name} (ECE {ece:.3f})")
        centres = 0.5 * (c.edges[1:] + c.edges[:-1])
        axc.step(centres, c.count, where="mid", label=name)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(title or "reliability diagram")
    axc.set_xlabel("confidence (top-label probability)")
    axc.set_ylabel("count")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def contour_grid_png(path: str | Path, x: Sequence[float], y: Sequence[float],
                     panels: Mapping[str, Array], *, xlabel: str = "log lengthscale",
                     ylabel: str = "log amplitude", title: str = "",
                     levels: int | Sequence[float] = 12, shared_levels: bool = False) -> Path:
    """One contour panel per entry of ``panels`` (each ``[len(x), len(y)]``), as a PNG.

    The paper's Figs. 9-11 layout: one panel per method, the same axes; with
    ``shared_levels`` all panels use the same contour levels (evidence comparisons).
    """
    plt = _pyplot()
    names = list(panels)
    k = len(names)
    fig, axes = plt.subplots(1, k, figsize=(3.2 * k, 3.0), squeeze=False)
    finite = np.concatenate([np.ravel(v)[np.isfinite(np.ravel(v))] for v in panels.values()])
    lv: int | Sequence[float] | Array = levels
    if shared_levels and finite.size and isinstance(levels, int):
        lo, hi = np.percentile(finite, [5, 100])
        lv = np.linspace(lo, hi, levels)
    for ax, name in zip(axes[0], names):
        Z = np.asarray(panels[name], dtype=float).T  # rows: y, cols: x
        if np.isfinite(Z).sum() >= 4 and np.nanmax(Z) > np.nanmin(Z):
            cs = ax.contour(np.asarray(x), np.asarray(y), Z, levels=lv)
            ax.clabel(cs, fontsize=6)
            i, j = np.unravel_index(np.nanargmax(Z), Z.shape)
            ax.plot(x[int(j)], y[int(i)], "r+", ms=10)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
    axes[0][0].set_ylabel(ylabel, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
