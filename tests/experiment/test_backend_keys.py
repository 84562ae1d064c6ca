"""The top-level keys ``backend``, ``device``, ``dtype``: composed, checked with the method before
any MLflow run, passed to the estimator and logged as the run's params (as resolved)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment.runner import prepare, run_experiment

from .helpers import compose_cfg, store_cfg, store_runs

pytestmark = pytest.mark.usefixtures("toy_site")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def test_the_keys_compose_as_null() -> None:
    cfg = compose_cfg()
    assert (cfg.backend, cfg.device, cfg.dtype) == (None, None, None)
    cfg = compose_cfg("backend=torch", "device=cuda:1", "dtype=float32")
    assert (cfg.backend, cfg.device, cfg.dtype) == ("torch", "cuda:1", "float32")


def test_unset_keys_log_the_resolved_default(tmp_path: Path, store_uri: str) -> None:
    cfg = store_cfg(store_uri, "method.name=toygp", "iterations=3", "eval_every=3")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    params = run.data.params
    assert (params["backend"], params["device"], params["dtype"]) == ("numpy", "cpu", "float64")
    assert run.info.status == "FINISHED"


def test_the_settings_reach_the_estimator(tmp_path: Path, store_uri: str) -> None:
    p = prepare(store_cfg(store_uri, "method.name=toygp", "backend=numpy", "device=cpu",
                     "dtype=float64"), tmp_path / "run")
    assert p.backend.params() == {"backend": "numpy", "device": "cpu", "dtype": "float64"}
    assert (p.settings.backend, p.settings.device, p.settings.dtype) == (
        "numpy", "cpu", "float64")


_BAD = [
    ("backend=jax", r"unknown backend 'jax'"),
    ("dtype=float16", r"unknown dtype 'float16'"),
    ("device=tpu", r"unknown device 'tpu'"),
    ("device=0", r"device must be null or one of cpu, cuda or cuda:N; got 0"),
    ("backend=numpy device=cuda", r"backend='numpy' runs on the CPU only"),
    ("dtype=float32", r"dtype='float32' needs backend='torch'"),
    ("backend=torch", r"method 'toygp' runs on numpy only"),
    ("method=laplace backend=torch dtype=float32", r"method 'laplace' runs on numpy only"),
    # a likelihood expectation rule that runs on numpy only (docs/backends.md): named with the
    # backend and what runs there, before the MLflow run (the fit's first ELBO is too late)
    ("method=svi method.likelihood=softmax backend=torch",
     r"Softmax\(expectation='gauss_hermite'\) with 2 classes runs on numpy only, not on the "
     r"torch backend: on torch use expectation='monte_carlo'.*a likelihood of svi whose default "
     r"rule runs there: logit, probit, robustmax$"),
    ("method=vi-robustmax dataset=iris +method.options.robustmax_rule=likelihood backend=torch",
     r"RobustMax\(expectation='log_space'\) runs on numpy only, not on the torch backend: on "
     r"torch use expectation='trapezoid' or 'gauss_hermite'"),
]
if not _cuda():
    _BAD.append(("device=cuda", r"no CUDA GPU"))


@pytest.mark.parametrize(("override", "pattern"), _BAD)
def test_bad_settings_fail_before_any_mlflow_run(
    tmp_path: Path, store_uri: str, override: str, pattern: str
) -> None:
    pytest.importorskip("torch", reason="the torch settings are checked with PyTorch installed")
    before = len(store_runs(store_uri))
    base = [] if override.startswith("method=") else ["method.name=toygp"]
    cfg = store_cfg(store_uri, *base, *override.split())
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before
    assert not (tmp_path / "run" / "result.json").exists()


def test_a_numpy_only_method_is_refused_before_the_store_and_the_data(
    tmp_path: Path, store_uri: str
) -> None:
    """The method on the backend needs neither the data nor the store: refused before the
    experiment is made (only the likelihood's rule waits for the class count)."""
    pytest.importorskip("torch", reason="the torch settings are checked with PyTorch installed")
    cfg = store_cfg(store_uri, "method=laplace", "backend=torch", "mlflow.experiment=never_made")
    with pytest.raises(InputError, match=r"method 'laplace' runs on numpy only"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert MlflowClient(store_uri).get_experiment_by_name("never_made") is None


def test_a_regression_run_refuses_torch(tmp_path: Path, store_uri: str) -> None:
    pytest.importorskip("torch", reason="the torch settings are checked with PyTorch installed")
    before = len(store_runs(store_uri))
    cfg = store_cfg(store_uri, "method=pep", "dataset=diabetes", "M=8", "backend=torch")
    with pytest.raises(InputError, match="runs on numpy only"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


def test_sep_on_torch_is_logged(tmp_path: Path, store_uri: str) -> None:
    pytest.importorskip("torch", reason="the torch backend needs PyTorch")
    from gpinfer import registry

    try:
        sep = registry.load_method("sep")
    except Exception as exc:
        pytest.skip(f"method 'sep' does not load: {exc}")
    if "torch" not in tuple(sep.backends):
        pytest.skip("method 'sep' does not declare the torch backend yet")
    cfg = store_cfg(store_uri, "method=sep", "dataset=iris", "iterations=2", "eval_every=2",
               "backend=torch", "dtype=float32")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    assert result["status"] == "FINISHED"
    params = MlflowClient(store_uri).get_run(result["mlflow_run_id"]).data.params
    assert (params["backend"], params["device"], params["dtype"]) == ("torch", "cpu", "float32")
