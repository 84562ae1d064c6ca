"""Helpers shared by the experiment tests (constants of the toy plugin, Hydra compose)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from gpinfer import registry
from gpinfer.experiment.app import CONF_DIR

TOY_PKG = "gpinfer_exptoy_zz"
TOY_DIST = "gpinfer-exptoy"
TOY_VERSION = "9.9.0"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


#: the toy methods run on a binary dataset with laplace's (empty) option set, whatever the
#: project's default experiment is; overrides naming another method or dataset win
TOY_GROUPS = (("method", "laplace"), ("dataset", "breast_cancer"))
#: what a run publishes after training (model, datasets, plots: about a second a run) is off
#: in composed test configs unless a test turns it on; tests/experiment/test_publish.py does
PUBLISH_OFF = ("mlflow.log_model=false", "mlflow.log_datasets=false", "mlflow.log_plots=false")


def compose_cfg(*overrides: str) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, as ``gpinfer-run`` would (no hydra node).

    The ``method`` and ``dataset`` groups default to ``TOY_GROUPS`` and publishing to
    ``PUBLISH_OFF`` unless overridden.
    """
    base = [
        f"{group}={default}"
        for group, default in TOY_GROUPS
        if not any(o.startswith(f"{group}=") for o in overrides)
    ]
    base += [o for o in PUBLISH_OFF if not any(x.startswith(o.split("=")[0]) for x in overrides)]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose(config_name="config", overrides=[*base, *overrides])


def store_cfg(store_uri: str, *overrides: str) -> DictConfig:
    """The config logging to ``store_uri``; the toy methods take the default likelihood."""
    return compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method.likelihood=null", *overrides)


def store_runs(store_uri: str) -> list:
    """Every run of the ``gpinfer`` experiment in the MLflow store ``store_uri``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri)
    exp = client.get_experiment_by_name("gpinfer")
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], max_results=1000)


def plugin_importable(name: str) -> str | None:
    """``None`` when method plugin ``name`` loads, else the reason (for ``pytest.skip``)."""
    try:
        registry.load_method(name)
    except Exception as exc:  # not installed yet, or broken
        return f"method plugin {name!r} is not importable yet: {exc}"
    try:
        from gpinfer.likelihoods import make_likelihood  # noqa: F401
    except ImportError as exc:
        return f"gpinfer.likelihoods.make_likelihood is missing: {exc}"
    return None


def require_plugin(name: str) -> None:
    """Skip the calling test unless method plugin ``name`` loads (``plugin_importable``)."""
    reason = plugin_importable(name)
    if reason:
        pytest.skip(reason)


def load_logged_model(run_id: str, tracking_uri: str):
    """The run's MLflow model ``runs:/<run_id>/model`` through the sklearn flavour and through
    pyfunc, as ``(sklearn_model, pyfunc_model)``, read from ``tracking_uri``."""
    import mlflow

    uri = f"runs:/{run_id}/model"
    mlflow.set_tracking_uri(tracking_uri)
    try:
        return mlflow.sklearn.load_model(uri), mlflow.pyfunc.load_model(uri)
    finally:
        mlflow.set_tracking_uri(None)
