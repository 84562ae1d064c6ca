"""gpinfer-run on a regression dataset: GPRegressor, test RMSE / NLL in the units of y, MLflow.

The oracle is an independent fit: the same split and standardisation done by hand, a
``GPRegressor`` with the same settings, and the metrics computed from ``predict(return_std)``
mapped back to the original units (not through the runner's evaluation code).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment.runner import run_experiment

from .helpers import compose_cfg, plugin_importable

pytestmark = pytest.mark.skipif(plugin_importable("pep") is not None,
                                reason=str(plugin_importable("pep")))

SETTINGS = ("method=pep", "dataset=diabetes", "M=8", "iterations=15", "seed=2", "eval_every=5")


def _cfg(store_uri: str, *overrides: str):
    return compose_cfg(f"mlflow.tracking_uri='{store_uri}'", *SETTINGS, *overrides)


def _independent_fit() -> tuple[float, float, float]:
    """(RMSE, mean NLL, log evidence of the standardised targets) of the same run, by hand."""
    from gpinfer import GPRegressor
    from gpinfer.data import load_dataset, train_test_split
    from gpinfer.kernels import make_kernel

    split = train_test_split(load_dataset("diabetes"), test_fraction=0.1, seed=2, stratify=False)
    mx, sx = split.X_train.mean(0), split.X_train.std(0)
    my, sy = split.y_train.mean(), split.y_train.std()
    Xtr, Xte = (split.X_train - mx) / sx, (split.X_test - mx) / sx
    est = GPRegressor(method="pep", M=8, kernel=make_kernel("rbf", input_dim=10, ard=False),
                      max_iter=15, random_state=2, method_options={"alpha": 0.5})
    est.fit(Xtr, (split.y_train - my) / sy)
    mean, std = est.predict(Xte, return_std=True)
    mean, std = my + sy * mean, sy * std
    err = split.y_test - mean
    nll = np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * err**2 / std**2)
    return float(np.sqrt(np.mean(err**2))), float(nll), float(est.log_evidence_)


def test_regression_run_matches_an_independent_fit(tmp_path: Path, store_uri: str) -> None:
    result = run_experiment(_cfg(store_uri), output_dir=tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["test_error"] is None
    rmse, nll, log_ev = _independent_fit()
    assert saved["test_rmse"] == pytest.approx(rmse, rel=1e-6)
    assert saved["test_nll"] == pytest.approx(nll, rel=1e-6)
    assert saved["log_evidence"] == pytest.approx(log_ev, rel=1e-6)
    # a fitted model beats predicting the training mean (RMSE about the std of y, ~77)
    assert 40.0 < rmse < 70.0

    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert run.data.params["data.task"] == "regression"
    assert run.data.metrics["test_rmse"] == pytest.approx(rmse, rel=1e-6)
    client = MlflowClient(store_uri)
    history = client.get_metric_history(run.info.run_id, "eval/test_rmse")
    assert [m.step for m in history] == [5, 10]  # every eval_every iterations but the last
    final = client.get_metric_history(run.info.run_id, "test_rmse")
    assert [(m.step, m.value) for m in final] == [(15, saved["test_rmse"])]  # the final value


def test_regression_run_rejects_a_classification_likelihood(tmp_path: Path,
                                                            store_uri: str) -> None:
    with pytest.raises(InputError, match=r"probit is for classification.*regression dataset"):
        run_experiment(_cfg(store_uri, "method.likelihood=probit"), output_dir=tmp_path / "r")
    assert not (tmp_path / "r" / "result.json").exists()
