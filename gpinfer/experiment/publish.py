"""After a run's fit: what MLflow users expect to find in the run besides its metrics.

``publish_run`` logs, each part on its own (one failing part is a warning and the tag
``publish_errors``, never a failed run: training is done and its metrics are logged):

* the learned hyper-parameters as metrics (``learned.*``, ``gpinfer.experiment.learned``);
* the model as the MLflow model ``model`` (``model_logging.log_estimator``, a cloudpickle): the
  run's ``model_logging.deployable_model``, which takes raw features; and, not pickled, the
  same model as the artifact ``model_skops/model.skops`` (``safe_model.log_skops``; the same
  probabilities on raw features);
* the training and test data as dataset inputs (``model_logging.log_datasets``);
* the figures under ``plots/`` (``figures``).

The learned hyper-parameters are logged by the run's process; the other parts (``PARTS``, given
as picklable ``PublishTask`` s) by the run's side process (``publish_worker``), which imported
MLflow's model code, skops and matplotlib while the run trained, or, where there is none, by
the run's process itself (``run_parts``, the same code). Either way the run's process waits for
them before the run ends.

Which parts run is set by ``mlflow.log_model``, ``mlflow.log_datasets`` and
``mlflow.log_plots`` in the config (all true by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpinfer.experiment import learned
from gpinfer.experiment.figures import TrainingCurve, draw_figures, upload_figures
from gpinfer.experiment.model_logging import log_datasets, log_estimator
from gpinfer.experiment.safe_model import log_skops
from gpinfer.experiment.tracking import RunLogger, RunTarget, plugin_distribution

if TYPE_CHECKING:
    from gpinfer.experiment.publish_worker import PublishWorker

log = logging.getLogger("gpinfer.run")


@dataclass
class PublishTask:
    """One part to publish: its name in ``PARTS`` and its keyword arguments (picklable: the
    task may be sent to the side process)."""

    name: str
    kwargs: dict[str, Any]


def _plots(run: RunTarget, out_dir: Any, curve: TrainingCurve, title: str,
           y_test: np.ndarray | None, P_test: np.ndarray | None) -> None:
    draw_figures(out_dir, curve, title, y_test, P_test)
    upload_figures(run, out_dir)


def _model(run: RunTarget, model: Any, example: np.ndarray, plugin: str | None) -> None:
    log_estimator(run, model, example, plugin)


def _skops(run: RunTarget, model: Any, out_dir: Any) -> None:
    log_skops(run, model, out_dir)


#: the parts that ``run_parts`` publishes, by name (``publish.<name>_s`` in the result)
PARTS: dict[str, Callable[..., Any]] = {
    "plots": _plots,
    "model": _model,
    "skops model": _skops,  # the same model without pickle
    "datasets": log_datasets,
}


def run_parts(run: RunTarget, tasks: Sequence[PublishTask]) -> tuple[dict[str, float],
                                                                     dict[str, str]]:
    """Publish ``tasks`` to ``run`` one after another; returns ``({part: seconds},
    {part: error})`` (a failing part is recorded and the next one runs)."""
    timings: dict[str, float] = {}
    errors: dict[str, str] = {}
    for task in tasks:
        start = time.perf_counter()
        try:
            PARTS[task.name](run, **task.kwargs)
        except Exception as exc:  # noqa: BLE001 - a publishing failure must not fail the run
            errors[task.name] = f"{type(exc).__name__}: {exc}"
        timings[task.name] = time.perf_counter() - start
    return timings, errors


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
    worker: PublishWorker | None = None,
) -> dict[str, float]:
    """Log the parts above; returns ``{part: seconds}`` (``publish.<part>_s`` in the result).

    ``data``: ``(X_train [N, D], y_train [N], X_test [N*, D], y_test [N*])`` as the estimator
    saw them (standardised inputs; class indices for a classifier). ``model``: what is logged
    as the MLflow model and as the skops model (default: ``estimator``), ``model_example
    [n, D]``: rows of its inputs (default: ``X_train``). ``P_test [N*, C]``: a classifier's
    test probabilities when already computed (default: ``estimator.predict_proba(X_test)``).
    ``worker``: the run's side process (``publish_worker``), attached to the run; ``None``:
    everything is published here.
    """
    X_train, y_train, X_test, y_test = data
    timings: dict[str, float] = {}
    errors: dict[str, str] = {}

    start = time.perf_counter()
    try:
        metrics = learned.learned_metrics(estimator.kernel_, estimator.likelihood_,
                                          estimator.posterior_)
        logger.log_metrics(metrics, step=step)
        logger.flush()
        log.info("learned hyper-parameters:\n%s", learned.as_text(metrics))
    except Exception as exc:  # noqa: BLE001 - a publishing failure must not fail the run
        errors["hyper-parameters"] = f"{type(exc).__name__}: {exc}"
    timings["hyper-parameters"] = time.perf_counter() - start

    tasks: list[PublishTask] = []
    if settings.get("log_plots", True):
        P = None
        if classification:
            P = estimator.predict_proba(X_test) if P_test is None else P_test
        tasks.append(PublishTask("plots", {
            "out_dir": out_dir, "curve": curve, "title": title,
            "y_test": y_test if classification else None, "P_test": P}))
    if settings.get("log_model", True):
        deployable = estimator if model is None else model
        tasks.append(PublishTask("model", {
            "model": deployable, "example": X_train if model_example is None else model_example,
            "plugin": plugin_distribution(method)[0]}))
        tasks.append(PublishTask("skops model", {"model": deployable, "out_dir": out_dir}))
    if settings.get("log_datasets", True):
        tasks.append(PublishTask("datasets", {
            "name": dataset, "X_train": X_train, "y_train": y_train, "X_test": X_test,
            "y_test": y_test}))
    if tasks:
        if worker is not None and worker.submit(tasks):
            done, failed = worker.result([task.name for task in tasks])
        else:
            done, failed = run_parts(logger, tasks)
        timings.update(done)
        errors.update(failed)
    for name, message in errors.items():
        log.warning("could not log the %s to MLflow: %s", name, message)
    if errors:
        logger.set_tags({"publish_errors": ",".join(errors)})
    return timings
