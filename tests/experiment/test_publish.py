"""What a run publishes to MLflow after training: experiment kind, run names, learned
hyper-parameters, the model (loaded back through MLflow), dataset inputs and plots."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from gpinfer.experiment import learned
from gpinfer.experiment.model_logging import log_estimator
from gpinfer.experiment.runner import run_experiment
from gpinfer.experiment.tracking import RunLogger

from .helpers import compose_cfg, load_logged_model, require_plugin

pytestmark = pytest.mark.usefixtures("toy_site")

PUBLISH_ON = ("mlflow.log_model=true", "mlflow.log_datasets=true", "mlflow.log_plots=true")


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for item in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return out


def test_a_run_publishes_model_data_plots_and_learned_parameters(
    tmp_path: Path, store_uri: str
) -> None:
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "mlflow.experiment=publish",
                      "method.name=toysparse", "method.likelihood=null", "M=5",
                      "iterations=4", "eval_every=2", *PUBLISH_ON)
    result = run_experiment(cfg, output_dir=tmp_path / "a", stream=io.StringIO())
    again = run_experiment(cfg, output_dir=tmp_path / "b", stream=io.StringIO())
    client = MlflowClient(store_uri)
    run = client.get_run(result["mlflow_run_id"])
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    # readable and unique names: the same settings twice give two names with one stem
    other = client.get_run(again["mlflow_run_id"]).info.run_name
    assert run.info.run_name != other
    assert run.info.run_name.startswith("toysparse-breast_cancer-rbf-M5-s0-")
    assert other.rsplit("-", 1)[0] == run.info.run_name.rsplit("-", 1)[0]

    metrics = run.data.metrics
    assert metrics["learned.kernel.lengthscale"] > 0 and metrics["learned.kernel.variance"] > 0

    contexts = {i.dataset.name: {t.key: t.value for t in i.tags}["mlflow.data.context"]
                for i in run.inputs.dataset_inputs}
    assert contexts == {"breast_cancer-train": "training", "breast_cancer-test": "evaluation"}

    arts = _artifacts(client, run.info.run_id)
    assert {"plots/reliability.png", "plots/training_curves.png", "config.yaml",
            "result.json", "state.npz"} <= arts
    for name in ("reliability.png", "training_curves.png"):
        assert (tmp_path / "a" / "plots" / name).read_bytes()[:4] == b"\x89PNG"

    # the model through MLflow: a pipeline on raw features (the run's standardisation, then
    # the classifier); sklearn flavour and pyfunc agree, with signature and example
    model, pyfunc = load_logged_model(run.info.run_id, store_uri)
    X_raw, y_raw, X_train_raw = _raw_test_part(seed=0)
    P = model.predict_proba(X_raw)
    assert P.shape == (X_raw.shape[0], 2) and np.allclose(P.sum(axis=1), 1.0)
    assert np.array_equal(np.asarray(pyfunc.predict(X_raw)), P)
    # the run's test accuracy, from raw inputs, through both flavours
    accuracy = np.mean(model.classes_[P.argmax(axis=1)] == y_raw)
    assert accuracy == pytest.approx(1.0 - result["test_error"], abs=1e-12)
    assert np.mean(model.predict(X_raw) == y_raw) == accuracy
    scaler = model.named_steps["standardize"]
    assert np.array_equal(scaler.mean_, X_train_raw.mean(axis=0))
    assert pyfunc.metadata.signature is not None
    assert pyfunc.metadata.get_input_schema().input_types()[0].name == "float64"
    example = np.asarray(pyfunc.input_example)
    assert np.array_equal(example, X_train_raw[: example.shape[0]])  # raw rows, not scaled


def _raw_test_part(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X_test [N*, D], y_test [N*], X_train [N, D])`` of breast_cancer as loaded (raw
    features), split as a run with ``seed`` splits it."""
    from gpinfer.data import load_dataset, train_test_split

    split = train_test_split(load_dataset("breast_cancer"), test_fraction=0.1, seed=seed)
    return split.X_test, split.y_test, split.X_train


def test_the_default_run_logs_a_model_that_takes_raw_features(
    tmp_path: Path, store_uri: str
) -> None:
    """sep on waveform, the default method and dataset (few iterations): the logged model's
    accuracy on the raw test inputs is the run's, through mlflow.sklearn and mlflow.pyfunc;
    on the standardised inputs the estimator inside gives the same probabilities."""
    from gpinfer.data import load_dataset, train_test_split

    require_plugin("sep")
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "mlflow.experiment=raw-model",
                      "method=sep", "dataset=waveform", "iterations=5", "mlflow.log_model=true")
    result = run_experiment(cfg, output_dir=tmp_path / "run", stream=io.StringIO())
    split = train_test_split(load_dataset("waveform", n=1000, seed=0, noise=1.0),
                             test_fraction=0.7, seed=0)
    model, pyfunc = load_logged_model(result["mlflow_run_id"], store_uri)
    P = np.asarray(pyfunc.predict(split.X_test))
    assert np.array_equal(P, model.predict_proba(split.X_test))
    classes = model.classes_
    accuracy = float(np.mean(classes[P.argmax(axis=1)] == split.y_test))
    assert accuracy == pytest.approx(1.0 - result["test_error"], abs=1e-12)
    inner = model.named_steps["model"]
    assert np.array_equal(inner.predict_proba(model.named_steps["standardize"].transform(
        split.X_test)), P)


def test_log_estimator_round_trip_equals_the_fitted_object(tmp_path: Path) -> None:
    """Oracle: the fitted estimator itself; the reloaded model predicts the same numbers."""
    import mlflow
    import mlflow.pyfunc
    import mlflow.sklearn
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    import gpinfer

    require_plugin("laplace")
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:120]
    clf = gpinfer.GPClassifier(method="laplace", max_iter=3, random_state=0).fit(X, y[:120])
    uri_store = f"sqlite:///{tmp_path / 'm.db'}"
    logger = RunLogger(uri_store, "roundtrip")
    with logger.run("roundtrip"):
        uri = log_estimator(logger, clf, X, "gpinfer-laplace")
    mlflow.set_tracking_uri(uri_store)
    try:
        loaded = mlflow.sklearn.load_model(uri)
        pyfunc = mlflow.pyfunc.load_model(uri)
        # a run without a model: MLflow's own error, nothing from gpinfer
        bare = RunLogger(uri_store, "roundtrip")
        with bare.run("bare"):
            pass
        with pytest.raises(mlflow.exceptions.MlflowException):
            mlflow.sklearn.load_model(f"runs:/{bare.run_id}/model")
        local = Path(mlflow.artifacts.download_artifacts(uri))
    finally:
        mlflow.set_tracking_uri(None)
    assert np.array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    assert np.array_equal(np.asarray(pyfunc.predict(X)), clf.predict_proba(X))
    requirements = (local / "requirements.txt").read_text()
    assert "gpinfer-laplace==" in requirements and "gpinfer==" in requirements
    assert {"MLmodel", "conda.yaml", "python_env.yaml", "input_example.json",
            "serving_input_example.json"} <= {f.name for f in local.iterdir()}
    # what mlflow.sklearn.log_model would record: a READY logged model of the run, in the
    # run's outputs; MLflow's requirements check is back in place afterwards
    import mlflow.utils.environment as environment
    from mlflow.entities import LoggedModelStatus
    from mlflow.utils.requirements_utils import warn_dependency_requirement_mismatches

    client = MlflowClient(uri_store)
    outputs = client.get_run(logger.run_id).outputs.model_outputs
    assert len(outputs) == 1
    logged = client.get_logged_model(outputs[0].model_id)
    assert logged.status == LoggedModelStatus.READY and logged.name == "model"
    assert logged.source_run_id == logger.run_id
    assert environment.warn_dependency_requirement_mismatches is \
        warn_dependency_requirement_mismatches


def test_learned_metrics_summarise_vectors_and_latents() -> None:
    from types import SimpleNamespace

    from gpinfer.kernels import make_kernel

    k = make_kernel("rbf", input_dim=12, ard=True, noise=0.5)
    k2 = make_kernel("rbf", input_dim=3, ard=True)
    Z = [np.ones((3, 2)), np.zeros((4, 2))]
    m = learned.learned_metrics([k, k], None, SimpleNamespace(Z=Z))
    assert m["learned.kernel.c1.1_white.variance"] == pytest.approx(0.5)
    assert {"learned.kernel.c0.0_rbf.lengthscale.min",
            "learned.kernel.c0.0_rbf.lengthscale.median"} <= set(m)  # 12 > MAX_VECTOR entries
    assert m["learned.inducing.c0.M"] == 3 and m["learned.inducing.c1.M"] == 4
    assert m["learned.inducing.c0.norm_mean"] == pytest.approx(np.sqrt(2.0))
    single = learned.learned_metrics(k2, None, SimpleNamespace())
    assert set(single) == {"learned.kernel.lengthscale.0", "learned.kernel.lengthscale.1",
                           "learned.kernel.lengthscale.2", "learned.kernel.variance"}


def test_figures_drawn_by_another_process_report_its_failure(tmp_path: Path) -> None:
    """The worker draws the same PNGs as the in-process path; a worker that fails is an error
    naming its cause (publish_run turns it into a warning and the publish_errors tag)."""
    from gpinfer.experiment.figures import TrainingCurve
    from gpinfer.experiment.render import FigureJob

    curve = TrainingCurve()
    for i in range(5):
        curve.add(0.1 * i, -float(i), {"test_error": 0.3 - 0.01 * i} if i % 2 else None)
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), size=40)
    good = FigureJob.start(tmp_path / "good", curve, "t", rng.integers(0, 3, 40), P)
    bad = FigureJob.start(tmp_path / "bad", curve, "t", np.zeros(3, dtype=int), P)  # 3 != 40
    assert good.process is not None
    good.process.wait(timeout=120)
    assert good.process.returncode == 0
    for name in ("training_curves.png", "reliability.png"):
        assert (tmp_path / "good" / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(RuntimeError, match="drawing the figures failed"):
        bad.finish(None)  # type: ignore[arg-type]  # fails before any upload


def test_a_figures_worker_started_before_training_draws_later_or_exits_when_cancelled(
    tmp_path: Path,
) -> None:
    """``spawn`` starts the worker before the payload exists, out of the run's process group
    (a terminal's Ctrl-C is the run's); ``submit`` hands it over and it draws; a worker
    cancelled before any payload exits with status 0 and draws nothing."""
    import os

    from gpinfer.experiment.figures import TrainingCurve
    from gpinfer.experiment.render import FigureJob

    curve = TrainingCurve()
    for i in range(4):
        curve.add(0.1 * i, -float(i), {"test_error": 0.3} if i % 2 else None)
    early = FigureJob.spawn(tmp_path / "early")
    idle = FigureJob.spawn(tmp_path / "idle")
    assert early.process is not None and idle.process is not None
    assert os.getpgid(idle.process.pid) != os.getpgid(0)
    early.submit(curve, "t")
    early.process.wait(timeout=120)
    assert early.process.returncode == 0
    assert (tmp_path / "early" / "plots" / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    process = idle.process
    idle.cancel()
    assert process.returncode == 0 and idle.process is None
    assert not (tmp_path / "idle").exists()
