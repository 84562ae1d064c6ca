"""After a run's fit: what MLflow users expect to find in the run besides its metrics.

``publish_run`` logs, each part on its own (one failing part is a warning and the tag
``publish_errors``, never a failed run: training is done and its metrics are logged):

* the learned hyper-parameters as metrics (``learned.*``, ``gpinfer.experiment.learned``);
* the model as the MLflow model ``model`` (``model_logging.log_estimator``, a cloudpickle): the
  run's ``model_logging.deployable_model``, which takes raw features; and, not pickled, the
  same model as the artifact ``model_skops/model.skops`` (``safe_model.log_skops``; the same
  probabilities on raw features);
* the training and test data as dataset inputs (``model_logging.log_datasets``);
* the figures under ``plots/`` (``figures``), drawn by a separate process while the model and
  the datasets are logged (``render.FigureJob``; the run starts it before training, so that
  its matplotlib import overlaps the fit), then uploaded.

Which parts run is set by ``mlflow.log_model``, ``mlflow.log_datasets`` and
``mlflow.log_plots`` in the config (all true by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from gpinfer.experiment import learned
from gpinfer.experiment.figures import TrainingCurve
from gpinfer.experiment.model_logging import log_datasets, log_estimator
from gpinfer.experiment.render import FigureJob
from gpinfer.experiment.safe_model import log_skops
from gpinfer.experiment.tracking import RunLogger, plugin_distribution

log = logging.getLogger("gpinfer.run")
_T = TypeVar("_T")


class _Parts:
    """Runs the publishing parts, each on its own: a part that raises is a warning, its name
    kept in ``errors`` (and not run again), its seconds added to ``timings``."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.errors: list[str] = []

    def run(self, name: str, enabled: bool, action: Callable[[], _T]) -> _T | None:
        """``action()`` unless disabled or failed before; its value, None if it raised."""
        if not enabled or name in self.errors:
            return None
        start = time.perf_counter()
        out = None
        try:
            out = action()
        except Exception as exc:  # noqa: BLE001 - a publishing failure must not fail the run
            self.errors.append(name)
            log.warning("could not log the %s to MLflow: %s: %s", name, type(exc).__name__, exc)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        return out


def _log_hyper(logger: RunLogger, estimator: Any, step: int) -> None:
    """The learned hyper-parameters as ``learned.*`` metrics at ``step`` and in the run log."""
    metrics = learned.learned_metrics(estimator.kernel_, estimator.likelihood_,
                                      estimator.posterior_)
    logger.log_metrics(metrics, step=step)
    logger.flush()
    log.info("learned hyper-parameters:\n%s", learned.as_text(metrics))


def _draw(job: FigureJob | None, out_dir: Any, curve: TrainingCurve, title: str,
          y_test: np.ndarray | None, P: np.ndarray | None) -> FigureJob:
    """The figures handed to ``job`` (one started here if None) to draw meanwhile;
    ``y_test [N*]`` and ``P [N*, C]``: a classifier's (None for a regressor)."""
    job = FigureJob.spawn(out_dir) if job is None else job
    job.submit(curve, title, y_test, P)
    return job


def _log_model(parts: _Parts, logger: RunLogger, model: Any, example: np.ndarray, method: str,
               settings: Mapping[str, Any], out_dir: Any) -> None:
    """``model`` as the MLflow model (``example [n, D]``: rows of its inputs) and, the same
    model without pickle, as the skops artifact (``mlflow.log_model``, default true)."""
    log_model = bool(settings.get("log_model", True))
    parts.run("model", log_model,
              lambda: log_estimator(logger, model, example, plugin_distribution(method)[0]))
    parts.run("skops model", log_model, lambda: log_skops(logger, model, out_dir))


def publish_run(
    logger: RunLogger, estimator: Any, *, settings: Mapping[str, Any], out_dir: Any,
    method: str, dataset: str, title: str, step: int, curve: TrainingCurve,
    data: tuple[Any, np.ndarray, Any, np.ndarray], classification: bool,
    model: Any = None, model_example: np.ndarray | None = None,
    P_test: np.ndarray | None = None, figures: FigureJob | None = None,
) -> dict[str, float]:
    """Log the parts above; returns ``{part: seconds}`` (``publish.<part>_s`` in the result).

    ``data``: ``(X_train [N, D], y_train [N], X_test [N*, D], y_test [N*])`` as the estimator
    saw them (standardised inputs, arrays or row sources read out of core; class indices for a
    classifier). ``model``: what is logged
    as the MLflow model and as the skops model (default: ``estimator``), ``model_example
    [n, D]``: rows of its inputs
    (default: ``X_train``). ``P_test [N*, C]``: a classifier's test probabilities when already
    computed (default: ``estimator.predict_proba(X_test)``). ``figures``: the figures' worker
    started by the run (``FigureJob.spawn``; default: one started here).
    """
    X_train, y_train, X_test, y_test = data
    parts = _Parts()
    parts.run("hyper-parameters", True, lambda: _log_hyper(logger, estimator, step))
    job = parts.run("plots", bool(settings.get("log_plots", True)),  # drawn meanwhile
                    lambda: _draw(figures, out_dir, curve, title,
                                  y_test if classification else None,
                                  None if not classification else
                                  estimator.predict_proba(X_test) if P_test is None else P_test))
    _log_model(parts, logger, estimator if model is None else model,
               X_train if model_example is None else model_example, method, settings, out_dir)
    parts.run("datasets", bool(settings.get("log_datasets", True)),
              lambda: log_datasets(logger, dataset, X_train, y_train, X_test, y_test))
    if job is not None:
        parts.run("plots", True, lambda: job.finish(logger))
    if figures is not None:  # given nothing to draw (plots off, or drawing failed): it exits
        figures.cancel()
    if parts.errors:
        logger.set_tags({"publish_errors": ",".join(parts.errors)})
    return parts.timings
