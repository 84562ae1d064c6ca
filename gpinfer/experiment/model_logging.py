"""The fitted estimator as an MLflow model, and the run's data as MLflow dataset inputs.

``deployable_model`` makes what a run logs: a scikit-learn ``Pipeline`` that takes raw features
``X [N, D]`` (the dataset's columns, as loaded), applies the run's standardisation (the training
part's mean and scale, exactly as the run applied them) and then the fitted estimator; for a
regression run the predictions are mapped back to the units of ``y`` as well.
``log_estimator`` logs it with MLflow's scikit-learn flavour under the name ``model``, with a
signature and an input example of raw rows, so that::

    mlflow.sklearn.load_model(f"runs:/{run_id}/model").predict_proba(X_raw)
    mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(X_raw)  # the same probabilities

(a classifier's pyfunc ``predict`` is ``predict_proba``; a regressor's is ``predict``). The
pip requirements are given explicitly (the core's and the method plugin's distributions and
their numerical dependencies), which spares MLflow the subprocess that infers them; the model
is saved with ``mlflow.sklearn.save_model`` and uploaded as a logged model of the run, without
the extras of ``mlflow.sklearn.log_model`` that cost about a second and add nothing here (see
``log_estimator``). ``cloudpickle`` serialises the estimator
(MLflow's ``skops`` format would need every gpinfer class declared as trusted). Loading a
cloudpickle runs code of whoever logged it: the same model is also logged without pickle
(``safe_model``, the artifact ``model_skops/model.skops``) for models from others.

``log_datasets`` records the training and test arrays as dataset inputs (``training`` and
``evaluation`` contexts) with their digest and schema; the arrays themselves are not uploaded.
Inputs read out of core (a row source) are recorded without reading all their rows: the
digest is MLflow's numpy digest (the first ``MAX_ROWS`` values and the shape: the same digest as
the same rows in memory), the profile gives the full shape and the file's dtype.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np

from gpinfer.experiment.tracking import RunLogger

Array = np.ndarray

#: the model's name in the run (``runs:/<run_id>/model``)
MODEL_NAME = "model"
#: rows of the training inputs stored as the model's input example
EXAMPLE_ROWS = 5
#: distributions whose versions the model pins besides gpinfer and the method's plugin
_RUNTIME = ("numpy", "scipy", "scikit-learn", "cloudpickle")


def pip_requirements(plugin_distribution: str | None = None) -> list[str]:
    """``name==version`` of gpinfer, the method's plugin and their numerical dependencies.

    A distribution that is not installed (a source tree) is listed without a version.
    """
    names = ["gpinfer", *([plugin_distribution] if plugin_distribution else []), *_RUNTIME]
    out = []
    for name in dict.fromkeys(names):
        if name in ("", "unknown"):
            continue
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


@contextmanager
def _requirements_as_given() -> Iterator[None]:
    """Spare MLflow its check of the model's pip requirements against this environment.

    ``pip_requirements`` are this environment's own versions, so the check (MLflow's
    ``warn_dependency_requirement_mismatches``) cannot find a mismatch, yet it maps every
    installed distribution to its modules first: ~0.3 s CPU per model. Replaced by a no-op
    meanwhile (restored after); where MLflow has no such function the check simply runs.
    """
    import mlflow.utils.environment as environment

    name = "warn_dependency_requirement_mismatches"
    original = getattr(environment, name, None)
    if original is None:
        yield
        return
    setattr(environment, name, lambda requirements: None)
    try:
        yield
    finally:
        setattr(environment, name, original)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Hold logger ``name`` to errors (MLflow warns about cloudpickle on every model it saves;
    the choice is deliberate, see the module docstring)."""
    import logging

    target = logging.getLogger(name)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)


def _fitted_scaler(mean: Array, scale: Array) -> Any:
    """A fitted ``StandardScaler`` computing ``(X - mean) / scale`` (``mean``, ``scale`` ``[D]``):
    the same floating-point operations as ``gpinfer.data.Standardizer.transform``."""
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler()
    scaler.mean_ = np.array(mean, dtype=np.float64).reshape(-1)
    scaler.scale_ = np.array(scale, dtype=np.float64).reshape(-1)
    scaler.var_ = scaler.scale_**2
    scaler.n_features_in_ = int(scaler.mean_.shape[0])
    scaler.n_samples_seen_ = 1  # unknown and unused: the statistics are the run's
    return scaler


def deployable_model(
    estimator: Any, standardizer: Any | None = None, target: tuple[float, float] | None = None
) -> Any:
    """The model to log: ``Pipeline([("standardize", ...), ("model", ...)])`` on raw features.

    ``standardizer``: the run's fitted ``gpinfer.data.Standardizer`` (``mean_``, ``scale_``
    ``[D]``), ``None`` when the run did not standardise (the step is ``"passthrough"``).
    ``target``: a regressor's ``(shift, scale)`` of ``y`` (fitted to ``(y - shift) / scale``);
    its predictions are mapped back with ``y = shift + scale * prediction``. ``estimator``: a
    fitted ``GPClassifier`` / ``GPRegressor`` or their core (logged as the scikit-learn one).
    """
    from sklearn.pipeline import Pipeline

    from gpinfer.sklearn_estimators import as_sklearn

    model = estimator = as_sklearn(estimator)  # the runner fits a core (no scikit-learn)
    if target is not None:
        from sklearn.compose import TransformedTargetRegressor

        model = TransformedTargetRegressor()
        model.regressor_ = estimator
        model.transformer_ = _fitted_scaler(np.array([target[0]]), np.array([target[1]]))
        model._training_dim = 1
    scaler = "passthrough" if standardizer is None else _fitted_scaler(standardizer.mean_,
                                                                       standardizer.scale_)
    return Pipeline([("standardize", scaler), ("model", model)])


def _model_type(model: Any) -> str:
    """``Pipeline(GPClassifier)`` for a pipeline, else the class name."""
    steps = getattr(model, "steps", None)
    if not steps:
        return type(model).__name__
    last = steps[-1][1]
    last = getattr(last, "regressor_", last)
    return f"{type(model).__name__}({type(last).__name__})"


def log_estimator(
    logger: RunLogger, estimator: Any, X_example: Array, plugin_distribution: str | None = None
) -> str:
    """Log the fitted ``estimator`` (a ``deployable_model`` pipeline, or a bare estimator) as
    the run's MLflow model; returns its ``runs:/`` URI.

    ``X_example [n, D]``: rows of the inputs the model takes (raw features for a pipeline); the
    first ``EXAMPLE_ROWS`` become the input example and, with the model's output on them, the
    signature.
    """
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    run_id = logger._require_run()
    # created here so that the model belongs to the run's experiment (MLflow's fluent API would
    # put it in the active experiment, and runs:/<run_id>/model would not find it)
    model = logger.client.create_logged_model(
        logger.experiment_id, name=MODEL_NAME, source_run_id=run_id,
        tags={"mlflow.source.name": "gpinfer-run"}, model_type=_model_type(estimator),
    )
    # the model ends READY, or FAILED if saving or uploading it fails
    try:
        _save_model(logger, estimator, model, run_id,
                    np.ascontiguousarray(X_example[:EXAMPLE_ROWS], dtype=np.float64),
                    plugin_distribution)
        logger.client.log_outputs(run_id, models=[LoggedModelOutput(model.model_id, step=0)])
    except BaseException:
        with suppress(Exception):  # the error that stopped the logging is the one to see
            logger.client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    logger.client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    return f"runs:/{run_id}/{MODEL_NAME}"


def _save_model(logger: RunLogger, estimator: Any, model: Any, run_id: str, example: Array,
                plugin_distribution: str | None) -> None:
    """Save ``estimator`` as the sklearn flavour of the logged model ``model`` (an MLflow
    ``LoggedModel``) with ``example [n, D]`` as its input example, and upload it.

    What ``mlflow.sklearn.log_model`` does, less what costs a second and adds nothing here: no
    reload of the saved model to score the example (the tests load it with both flavours), no
    re-read of every metric's history to link the run's step-0 metrics (a run has none)."""
    import tempfile

    import mlflow.sklearn
    from mlflow.models import Model, infer_signature

    classifier = hasattr(estimator, "predict_proba")
    output = estimator.predict_proba(example) if classifier else estimator.predict(example)
    with tempfile.TemporaryDirectory(prefix="gpinfer-model-") as tmp, \
            _quiet("mlflow.sklearn"), _requirements_as_given():
        mlflow.sklearn.save_model(
            estimator,
            path=f"{tmp}/{MODEL_NAME}",
            mlflow_model=Model(artifact_path=model.artifact_location, run_id=run_id,
                               model_uuid=model.model_id, model_id=model.model_id),
            signature=infer_signature(example, np.asarray(output)),
            input_example=example,
            pip_requirements=pip_requirements(plugin_distribution),
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
            pyfunc_predict_fn="predict_proba" if classifier else "predict",
        )
        logger.client.log_model_artifacts(model.model_id, f"{tmp}/{MODEL_NAME}")


def _code_source_tags() -> dict[str, str]:
    """The tags of a dataset's ``code`` source: the user, ``gpinfer-run``, ``LOCAL``."""
    import getpass

    from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return {MLFLOW_USER: user, MLFLOW_SOURCE_NAME: "gpinfer-run", MLFLOW_SOURCE_TYPE: "LOCAL"}


def log_datasets(
    logger: RunLogger,
    name: str,
    X_train: Array,
    y_train: Array,
    X_test: Array,
    y_test: Array,
    source: str | None = None,
) -> None:
    """Record the training and test parts of dataset ``name`` as the run's dataset inputs.

    ``source``: where the data came from (a path or URI); by default the run's code (MLflow's
    ``code`` source with the user and ``gpinfer-run`` as its tags, what MLflow would record,
    given here so that MLflow does not run its context providers, git's among them, to find
    them).
    """
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    origin: Any = source if source is not None else CodeDatasetSource(_code_source_tags())
    inputs = []
    for context, part, X, y in (("training", "train", X_train, y_train),
                                ("evaluation", "test", X_test, y_test)):
        entity = _dataset_entity(f"{name}-{part}", X, np.asarray(y), origin)
        tags = [InputTag(MLFLOW_DATASET_CONTEXT, context)]
        inputs.append(DatasetInput(entity, tags=tags))
    logger.client.log_inputs(logger._require_run(), datasets=inputs)


class _Head:
    """What MLflow's numpy digest reads of ``X [N, D]`` (a row source): its first rows as
    float64 (``flatten``) and its full ``shape``."""

    def __init__(self, X: Any, values: int):
        from gpinfer.experiment.source_data import first_rows

        self.shape = X.shape
        self.rows = first_rows(X, -(-values // X.n_cols))

    def flatten(self) -> Array:
        return self.rows.flatten()


def _dataset_entity(name: str, X: Any, y: Array, origin: Any) -> Any:
    """The MLflow dataset entity of the inputs ``X [N, D]`` (an array, or a row source read
    only at its head) and the targets ``y [N]``."""
    from mlflow.data.digest_utils import MAX_ROWS, compute_numpy_digest
    from mlflow.data.numpy_dataset import from_numpy
    from mlflow.entities import Dataset

    from gpinfer.data.source import RowSource

    if not isinstance(X, RowSource):
        return from_numpy(np.asarray(X), targets=y, name=name, source=origin)._to_mlflow_entity()
    head = _Head(X, MAX_ROWS)
    entity = from_numpy(head.rows, targets=y, name=name, source=origin,
                        digest=compute_numpy_digest(head, y))._to_mlflow_entity()
    n, d = X.shape
    profile = {"features_shape": [n, d], "features_size": n * d, "features_nbytes": 8 * n * d,
               "features_dtype": str(np.dtype(np.float64)), "features_stored_as": stored_dtype(X),
               "targets_shape": list(y.shape), "targets_size": int(y.size),
               "targets_nbytes": int(y.nbytes)}
    return Dataset(name=entity.name, digest=entity.digest, source_type=entity.source_type,
                   source=entity.source, schema=entity.schema, profile=json.dumps(profile))


def stored_dtype(X: Any) -> str:
    """The dtype of a row source's values as stored (under its views), e.g. ``float32``."""
    while getattr(X, "source", None) is not None and hasattr(X.source, "rows"):
        X = X.source
    return str(X.dtype)
