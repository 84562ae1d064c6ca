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
from typing import Any

import numpy as np

from gpinfer.experiment import learned
from gpinfer.experiment.figures import TrainingCurve
from gpinfer.experiment.model_logging import log_datasets, log_estimator
from gpinfer.experiment.render import FigureJob
from gpinfer.experiment.safe_model import log_skops
from gpinfer.experiment.tracking import RunLogger, plugin_distribution

log = logging.getLogger("gpinfer.run")


def publish_run(
    logger: RunLogger,
    estimator: Any,
    *,
    settings: Mapping[str, Any],
    out_dir: Any,
    method: str,
    dataset: str,
    title: str,
    step: int,
    curve: TrainingCurve,
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    classification: bool,
    model: Any = None,
    model_example: np.ndarray | None = None,
    P_test: np.ndarray | None = None,
    figures: FigureJob | None = None,
) -> dict[str, float]:
    """Log the parts above; returns ``{part: seconds}`` (``publish.<part>_s`` in the result).

    ``data``: ``(X_train [N, D], y_train [N], X_test [N*, D], y_test [N*])`` as the estimator
    saw them (standardised inputs; class indices for a classifier). ``model``: what is logged
    as the MLflow model and as the skops model (default: ``estimator``), ``model_example
    [n, D]``: rows of its inputs
    (default: ``X_train``). ``P_test [N*, C]``: a classifier's test probabilities when already
    computed (default: ``estimator.predict_proba(X_test)``). ``figures``: the figures' worker
    started by the run (``FigureJob.spawn``; default: one started here).
    """
    X_train, y_train, X_test, y_test = data
    timings: dict[str, float] = {}
    errors: list[str] = []

    def part(name: str, enabled: bool, action: Callable[[], Any]) -> Any:
        if not enabled or name in errors:
            return None
        start = time.perf_counter()
        out = None
        try:
            out = action()
        except Exception as exc:  # noqa: BLE001 - a publishing failure must not fail the run
            errors.append(name)
            log.warning("could not log the %s to MLflow: %s: %s", name, type(exc).__name__, exc)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        return out

    def hyper() -> None:
        metrics = learned.learned_metrics(estimator.kernel_, estimator.likelihood_,
                                          estimator.posterior_)
        logger.log_metrics(metrics, step=step)
        logger.flush()
        log.info("learned hyper-parameters:\n%s", learned.as_text(metrics))

    def draw() -> FigureJob:
        P = None
        if classification:
            P = estimator.predict_proba(X_test) if P_test is None else P_test
        job = FigureJob.spawn(out_dir) if figures is None else figures
        job.submit(curve, title, y_test if classification else None, P)
        return job

    plots = bool(settings.get("log_plots", True))
    part("hyper-parameters", True, hyper)
    job = part("plots", plots, draw)  # drawn meanwhile by another process
    deployable = estimator if model is None else model
    part("model", bool(settings.get("log_model", True)),
         lambda: log_estimator(logger, deployable,
                               X_train if model_example is None else model_example,
                               plugin_distribution(method)[0]))
    part("skops model", bool(settings.get("log_model", True)),  # the same model without pickle
         lambda: log_skops(logger, deployable, out_dir))
    part("datasets", bool(settings.get("log_datasets", True)),
         lambda: log_datasets(logger, dataset, X_train, y_train, X_test, y_test))
    part("plots", job is not None, lambda: job.finish(logger))
    if figures is not None:  # given nothing to draw (plots off, or drawing failed): it exits
        figures.cancel()
    if errors:
        logger.set_tags({"publish_errors": ",".join(errors)})
    return timings
