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

from .helpers import compose_cfg, load_logged_model, plugin_importable

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

    # the model through MLflow: sklearn flavour and pyfunc agree, with signature and example
    model, pyfunc = load_logged_model(run.info.run_id, store_uri)
    X = np.random.default_rng(0).standard_normal((7, 30))
    P = model.predict_proba(X)
    assert P.shape == (7, 2) and np.allclose(P.sum(axis=1), 1.0)
    assert np.array_equal(np.asarray(pyfunc.predict(X)), P)
    assert pyfunc.metadata.signature is not None
    assert pyfunc.metadata.get_input_schema().input_types()[0].name == "float64"


def test_log_estimator_round_trip_equals_the_fitted_object(tmp_path: Path) -> None:
    """Oracle: the fitted estimator itself; the reloaded model predicts the same numbers."""
    import mlflow
    import mlflow.pyfunc
    import mlflow.sklearn
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    import gpinfer

    reason = plugin_importable("laplace")
    if reason:
        pytest.skip(reason)
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
