"""A run's figures, logged under ``plots/``: calibration of the test predictions and the
training curves (objective, test error and test NLL against training time).

``TrainingCurve`` collects one point per iteration from the runner's callback;
``draw_figures`` draws the PNGs into the run folder and ``upload_figures`` uploads them to the
run (``gpinfer.experiment.render`` runs the two around its figure worker). Matplotlib is
imported lazily with the ``Agg`` backend (``gpinfer.plots``).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpinfer.experiment.tracking import RunLogger
from gpinfer.plots import _pyplot, reliability_diagram_png

Array = np.ndarray

#: the run's artifact folder holding the figures
PLOTS_DIR = "plots"
RELIABILITY_PNG = "reliability.png"
CURVES_PNG = "training_curves.png"


@dataclass
class TrainingCurve:
    """Per-iteration points: training time [s] (evaluation and logging excluded), the
    objective, and the test metrics at the iterations where they were computed."""

    time_s: list[float] = field(default_factory=list)
    objective: list[float] = field(default_factory=list)
    #: metric name -> (training times, values), e.g. ``test_error``, ``test_nll``
    tests: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    def add(self, time_s: float, objective: float, tests: dict[str, float] | None = None) -> None:
        """One iteration's point (``tests``: the test metrics, when computed there)."""
        self.time_s.append(float(time_s))
        self.objective.append(float(objective))
        self.add_tests(time_s, tests or {})

    def add_tests(self, time_s: float, tests: dict[str, float]) -> None:
        """Test metrics at ``time_s`` without an objective (the final evaluation)."""
        for key, value in tests.items():
            xs, ys = self.tests.setdefault(key, ([], []))
            xs.append(float(time_s))
            ys.append(float(value))


#: panel titles of the test metrics, in drawing order
_TEST_PANELS = (("test_error", "test error"), ("test_rmse", "test RMSE"), ("test_nll", "test NLL"))


#: the training-curve figure's margins in inches (left, right, top, bottom): fixed, so a label
#: fits whatever the number of panels (tight_layout would double the drawing time)
_CURVE_MARGINS_IN = (0.85, 0.2, 0.4, 0.55)


def training_curves_figure(curve: TrainingCurve, title: str = "") -> Any:
    """Objective and every test metric of ``curve`` against training time, one panel each;
    returns the figure."""
    plt = _pyplot()
    panels: list[tuple[str, list[float], list[float]]] = [
        ("objective", curve.time_s, curve.objective)]
    panels += [(label, *curve.tests[key]) for key, label in _TEST_PANELS if key in curve.tests]
    width, height = 6.0, 2.0 * len(panels) + 0.95
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, height), sharex=True,
                             squeeze=False)
    for ax, (label, xs, ys) in zip(axes[:, 0], panels):
        finite = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
        if finite:
            ax.plot(*zip(*finite), "o-" if len(finite) < 30 else "-", ms=3)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("training time [s] (evaluation and logging excluded)")
    axes[0, 0].set_title(textwrap.shorten(title or "training curves", width=70,
                                          placeholder="..."), fontsize=10)
    left, right, top, bottom = _CURVE_MARGINS_IN
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height,
                        bottom=bottom / height, hspace=0.12)
    return fig


def training_curves_png(path: str | Path, curve: TrainingCurve, title: str = "") -> Path:
    """``training_curves_figure`` of ``curve`` as a PNG at ``path``."""
    fig = training_curves_figure(curve, title)
    path = Path(path)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def draw_figures(
    out_dir: Path,
    curve: TrainingCurve,
    title: str,
    y_test: Array | None = None,
    P_test: Array | None = None,
) -> list[Path]:
    """Draw the training curves and, for a classifier (``y_test [N*]`` class indices,
    ``P_test [N*, C]``), the reliability diagram into ``out_dir/plots``."""
    folder = Path(out_dir) / PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    paths = [training_curves_png(folder / CURVES_PNG, curve, title)]
    if y_test is not None and P_test is not None:
        paths.append(reliability_diagram_png(folder / RELIABILITY_PNG, y_test, P_test,
                                             title=f"reliability (test): {title}"))
    return paths


def upload_figures(logger: RunLogger, out_dir: Path) -> None:
    """Upload the drawn ``out_dir/plots`` to the run, in one call."""
    logger.client.log_artifacts(logger._require_run(), str(Path(out_dir) / PLOTS_DIR),
                                artifact_path=PLOTS_DIR)
