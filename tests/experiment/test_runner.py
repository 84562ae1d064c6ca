"""One run in-process (Hydra compose API): result.json, the MLflow run, failures and bad input.

All runs of this module share one temporary SQLite store; output folders are temporary.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import FitFailedError, InputError, NumericalError, UnknownNameError
from gpinfer.experiment import results
from gpinfer.experiment.runner import run_experiment

from .helpers import TOY_DIST, TOY_VERSION, compose_cfg, store_cfg, store_runs

pytestmark = pytest.mark.usefixtures("toy_site")


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, key)]


def test_single_run_result_json_and_mlflow_run(tmp_path: Path, store_uri: str, capsys) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, "method.name=toygp", "iterations=12", "eval_every=5", "seed=3")
    result = run_experiment(cfg, output_dir=out)

    # result.json: every field, sane values, same as the return value
    saved = json.loads((out / "result.json").read_text())
    assert saved == json.loads(json.dumps(result))
    for key in results.RESULT_KEYS:
        assert key in saved, key
    assert (saved["method"], saved["dataset"], saved["M"], saved["seed"]) == (
        "toygp",
        "breast_cancer",
        None,
        3,
    )
    assert 0.0 <= saved["test_error"] < 0.2  # nearest class mean on standardised inputs
    assert 0.0 < saved["test_nll"] < 5.0
    assert saved["n_iter"] == 12 and saved["status"] == "FINISHED"
    assert saved["log_evidence"] == pytest.approx(-50.0 - 100.0 / 12)
    assert 0.0 <= saved["train_time_s"] < 60.0
    assert 10.0 < saved["peak_rss_mb"] < 100_000.0
    assert saved["n_train"] + saved["n_test"] == 569 and saved["n_test"] == 57
    assert saved["fit_warnings"] == [] and saved["train_nll"] < saved["baseline_nll"]

    # the one-line summary
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "toygp on breast_cancer" in line and "test error" in line

    # the MLflow run
    client = MlflowClient(store_uri)
    run = client.get_run(saved["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["method.name"] == "toygp"
    assert params["dataset.name"] == "breast_cancer"
    assert params["kernel.name"] == "rbf" and params["seed"] == "3"
    assert params["M"] == "null" and params["data.n_train"] == "512"
    assert tags["method"] == "toygp" and tags["dataset"] == "breast_cancer"
    assert tags["method.distribution"] == TOY_DIST and tags["method.version"] == TOY_VERSION
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", tags["git_commit"])
    assert tags["mlflow.runName"].startswith("toygp-breast_cancer")
    assert tags["fit_warnings"] == "none"

    # per-iteration history: objective every iteration, test metrics every eval_every under
    # eval/...; the final numbers once each, under result.json's names, at the last step
    assert _steps(client, run.info.run_id, "objective") == list(range(1, 13))
    assert _steps(client, run.info.run_id, "elapsed_s") == list(range(1, 13))
    assert _steps(client, run.info.run_id, "step_size") == list(range(1, 13))
    assert _steps(client, run.info.run_id, "eval/test_error") == [5, 10]
    assert _steps(client, run.info.run_id, "eval/test_nll") == [5, 10]
    for key in ("test_error", "test_nll", "log_evidence", "train_time_s", "n_iter"):
        assert _steps(client, run.info.run_id, key) == [12], key
    objective = [m.value for m in client.get_metric_history(run.info.run_id, "objective")]
    assert objective[0] == pytest.approx(-150.0) and objective[-1] == pytest.approx(-50 - 100 / 12)
    assert run.data.metrics["test_error"] == saved["test_error"]
    assert run.data.metrics["log_evidence"] == saved["log_evidence"]
    for key in ("train_time_s", "n_iter", "peak_rss_mb", "test_nll"):
        assert key in run.data.metrics

    # artifacts: resolved config, fitted state, result.json
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "state.npz", "result.json"} <= names
    local = Path(client.download_artifacts(run.info.run_id, "state.npz", str(tmp_path)))
    with np.load(local, allow_pickle=False) as state:
        assert state["means"].shape == (2, 30)
        assert np.array_equal(state["posterior.means"], state["means"])
        assert state["classes"].tolist() == [0, 1]
        assert "kernel.0.theta" in state.files
    config_text = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path)))
    assert "name: toygp" in config_text.read_text() and "hydra" not in config_text.read_text()
    # artifacts sit next to the SQLite file, not in the working directory
    assert run.info.artifact_uri.startswith(
        (Path(store_uri[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
    )


#: an untrained svi (one Adadelta step from the prior) predicts about 1/2 for 63:37 classes
UNTRAINED_SVI = ("method=svi", "method.options.optimizer=adadelta", "iterations=1", "M=5")


def test_a_fit_worse_than_the_class_frequencies_fails_the_run(tmp_path: Path, store_uri: str) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, *UNTRAINED_SVI)
    with pytest.raises(FitFailedError, match="no better than predicting the class frequencies"):
        run_experiment(cfg, output_dir=out)
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "FAILED" and "FitFailedError" in saved["error"]
    assert saved["fit_warnings"] == ["no_better_than_baseline"]
    assert saved["train_nll"] > saved["baseline_nll"] > 0.6
    run = MlflowClient(store_uri).get_run(saved["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["fit_warnings"] == "no_better_than_baseline"
    assert "Trace: 1 iteration(s)" in run.data.tags["error"]
    # what result.json records of the failed fit is in MLflow too (it was in result.json only)
    for key in ("n_iter", "train_nll", "baseline_nll", "train_time_s", "peak_rss_mb"):
        assert run.data.metrics[key] == pytest.approx(saved[key], rel=1e-12), key


def test_baseline_failure_warn_keeps_the_model_and_still_fails_the_run(
    tmp_path: Path, store_uri: str, capsys
) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, *UNTRAINED_SVI, "baseline_failure=warn")
    with pytest.warns(Warning, match="no better than predicting the class frequencies"):
        result = run_experiment(cfg, output_dir=out)
    saved = json.loads((out / "result.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["status"] == "FAILED" and saved["test_nll"] is not None  # evaluated, kept
    assert saved["fit_warnings"] == ["no_better_than_baseline"]
    assert saved["train_nll"] > saved["baseline_nll"] > 0.6
    assert "WARNING: no_better_than_baseline" in capsys.readouterr().out
    run = MlflowClient(store_uri).get_run(saved["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["fit_warnings"] == "no_better_than_baseline"
    assert "baseline_failure=warn" in run.data.tags["error"] and "training NLL" in saved["error"]
    assert run.data.metrics["train_nll"] == pytest.approx(saved["train_nll"])


def test_a_bad_baseline_failure_setting_is_an_input_error(tmp_path: Path, store_uri: str) -> None:
    cfg = store_cfg(store_uri, "method.name=toygp", "baseline_failure=ignore")
    with pytest.raises(InputError, match="baseline_failure must be 'raise'"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()


def test_numerical_error_fails_the_run_and_keeps_its_history(tmp_path: Path, store_uri: str) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, "method.name=toygp", "+method.options.fail_at=3", "iterations=10")
    with pytest.raises(NumericalError, match=r"iteration 3.*'B'"):
        run_experiment(cfg, output_dir=out)
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "FAILED" and saved["error_iteration"] == 3
    assert saved["n_iter"] == 2 and "Cholesky" in saved["error"]
    client = MlflowClient(store_uri)
    run = client.get_run(saved["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert "iteration 3" in run.data.tags["error"] and run.data.tags["error_iteration"] == "3"
    assert _steps(client, run.info.run_id, "objective") == [1, 2]
    # the iterations it ran, its time and memory, as result.json has them (were not in MLflow)
    assert run.data.metrics["n_iter"] == 2
    for key in ("train_time_s", "peak_rss_mb"):
        assert run.data.metrics[key] == pytest.approx(saved[key], rel=1e-12), key
    assert "test_nll" not in run.data.metrics  # never evaluated: no number made up
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_a_failure_after_the_final_numbers_keeps_them_in_result_json(
    tmp_path: Path, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails after its final numbers went to MLflow (here in publishing) keeps the
    fit's numbers in result.json too: not the time and memory up to the failure."""
    from gpinfer.experiment import runner

    def broken_publish(*args: object, **kwargs: object) -> float:
        raise RuntimeError("publishing failed")

    monkeypatch.setattr(runner, "_publish", broken_publish)
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, "method.name=toygp", "iterations=4")
    with pytest.raises(RuntimeError, match="publishing failed"):
        run_experiment(cfg, output_dir=out)
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "FAILED" and "publishing failed" in saved["error"]
    run = MlflowClient(store_uri).get_run(saved["mlflow_run_id"])
    assert run.info.status == "FAILED"
    for key in ("n_iter", "train_time_s", "peak_rss_mb", "test_error", "test_nll"):
        assert run.data.metrics[key] == pytest.approx(saved[key], rel=1e-12), key


def test_ctrl_c_ends_the_run_killed_with_its_metrics(tmp_path: Path, store_uri: str) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, "method.name=toygp", "+method.options.interrupt_at=3")
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, output_dir=out)
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "KILLED"
    client = MlflowClient(store_uri)
    run = client.get_run(saved["mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert _steps(client, run.info.run_id, "objective") == [1, 2]
    assert run.data.metrics["n_iter"] == saved["n_iter"] == 2


def test_non_finite_objective_names_iteration_and_quantity(tmp_path: Path, store_uri: str) -> None:
    out = tmp_path / "run"
    cfg = store_cfg(store_uri, "method.name=toygp", "+method.options.nan_at=2", "iterations=5")
    with pytest.raises(NumericalError, match=r"objective.*iteration 2.*'objective'"):
        run_experiment(cfg, output_dir=out)
    run = MlflowClient(store_uri).get_run(json.loads((out / "result.json").read_text())["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert math.isnan(run.data.metrics["objective"])  # the bad value itself is kept


@pytest.mark.parametrize(
    ("override", "error", "pattern"),
    [
        ("method.name=toygq", UnknownNameError, r"unknown method 'toygq'.*did you mean 'toygp'"),
        ("dataset.name=breast_cancr", UnknownNameError, r"unknown dataset 'breast_cancr'.*breast_cancer"),
        ("kernel.name=matern53", UnknownNameError, r"unknown kernel 'matern53'.*matern5"),
        ("+method.options.damping=0.5", InputError, r"unknown option.*damping"),
        ("M=10", InputError, r"'toygp' has no inducing points.*M"),
        ("batch_size=32", InputError, r"mini-batch"),
        ("iterations=0", InputError, r"iterations must be >= 1"),
        ("dataset.test_fraction=1.5", InputError, r"test_fraction must be in \(0, 1\)"),
        ("method.name=toysparse +optimizer.options.foo=1", InputError, r"optimizer 'lbfgs'.*foo"),
        ("method=laplace M=10", InputError, r"'laplace' has no inducing points; leave M unset"),
        ("method=laplace dataset=wine", InputError, r"'laplace' handles binary problems only"),
        ("method=laplace method.likelihood=softmax", InputError, r"does not accept likelihood"),
        ("validation_fraction=0.2 choice_rule=best", InputError, r"choice_rule must be one of"),
        ("validation_fraction=0.2 refine_iter=-1", InputError, r"refine_iter must be a non-neg"),
    ],
)
def test_bad_input_fails_before_any_mlflow_run(
    tmp_path: Path, store_uri: str, override: str, error: type, pattern: str
) -> None:
    before = len(store_runs(store_uri))
    base = [] if override.startswith("method=") else ["method.name=toygp"]
    cfg = store_cfg(store_uri, *base, *override.split())
    with pytest.raises(error, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    runs = store_runs(store_uri)
    assert len(runs) == before  # nothing started, so nothing is left RUNNING
    assert all(r.info.status != "RUNNING" for r in runs)
    assert not (tmp_path / "run" / "result.json").exists()


def test_missing_and_malformed_data_files(tmp_path: Path, store_uri: str) -> None:
    missing = tmp_path / "nope.npz"
    cfg = store_cfg(store_uri, "method.name=toygp", "dataset=file", f"dataset.path='{missing}'")
    with pytest.raises(InputError, match="nope.npz"):
        run_experiment(cfg, output_dir=tmp_path / "a")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"this is not a zip archive")
    cfg = store_cfg(store_uri, "method.name=toygp", "dataset=file", f"dataset.path='{bad}'")
    with pytest.raises(InputError, match="bad.npz"):
        run_experiment(cfg, output_dir=tmp_path / "b")
    cfg = store_cfg(store_uri, "method.name=toygp", "dataset=file")
    with pytest.raises(InputError, match=r"dataset.path="):
        run_experiment(cfg, output_dir=tmp_path / "c")


def test_unwritable_output_folder_and_store(tmp_path: Path, store_uri: str) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = store_cfg(store_uri, "method.name=toygp")
    with pytest.raises(InputError, match=r"output folder .*a_file.* not writable"):
        run_experiment(cfg, output_dir=blocker / "run")
    cfg = store_cfg(f"sqlite:///{blocker}/sub/mlflow.db", "method.name=toygp")
    with pytest.raises(InputError, match=r"MLflow store .*a_file"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()


def test_inducing_fraction_optimizer_and_env_store(
    tmp_path: Path, store_uri: str, toy_methods, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MLFLOW_TRACKING_URI is honoured when the config leaves mlflow.tracking_uri null
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    cfg = compose_cfg(
        "method.name=toysparse", "method.likelihood=null", "M=0.1", "optimizer=adam", "iterations=2", "kernel=matern32",
        "kernel.ard=true", "dataset=iris",
    )
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    problem = toy_methods.ToySparse.last_problem
    assert problem.inducing == round(0.1 * 135) == result["M_count"]
    assert result["M"] == 0.1 and result["dataset"] == "iris" and result["n_classes"] == 3
    assert problem.n_classes == 3 and problem.max_iter == 2 and problem.optimize is True
    assert problem.X.shape == (135, 4)
    assert np.allclose(problem.X.mean(axis=0), 0.0, atol=1e-12)  # standardised on train
    assert problem.kernel.n_params >= 4  # ARD: one lengthscale per input
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert run.data.tags["optimizer"] == "adam" and run.data.tags["optimizer.applied"] == "true"
    assert run.data.params["optimizer.options.learning_rate"] == "0.01"
    assert run.data.params["M_count"] == "14"


def test_optimize_false_and_seed_reach_the_method(tmp_path: Path, store_uri: str, toy_methods) -> None:
    cfg = store_cfg(store_uri, "method.name=toygp", "optimize=false", "iterations=1", "seed=7")
    run_experiment(cfg, output_dir=tmp_path / "a")
    first = toy_methods.ToyGP.last_problem
    assert first.optimize is False
    run_experiment(cfg, output_dir=tmp_path / "b")
    second = toy_methods.ToyGP.last_problem
    assert np.array_equal(first.X, second.X)  # same seed, same split
    assert first.rng.random() == second.rng.random()
    cfg = store_cfg(store_uri, "method.name=toygp", "optimize=false", "iterations=1", "seed=8")
    run_experiment(cfg, output_dir=tmp_path / "c")
    assert not np.array_equal(first.X, toy_methods.ToyGP.last_problem.X)


def test_progress_bar_shows_rate_objective_and_test_error(tmp_path: Path, store_uri: str) -> None:
    import io

    cfg = store_cfg(store_uri, "method.name=toygp", "iterations=12", "eval_every=4",
               "progress.bar=true")
    bar = io.StringIO()
    run_experiment(cfg, output_dir=tmp_path / "run", progress_stream=bar)
    text = bar.getvalue()
    assert "12/12" in text and "it/s" in text and "objective=" in text
    assert re.search(r"test error=\d\.\d{4}", text)
    quiet = io.StringIO()  # auto: no bar on a stream that is not a terminal
    run_experiment(store_cfg(store_uri, "method.name=toygp", "iterations=3"),
                   output_dir=tmp_path / "quiet", progress_stream=quiet)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(
    ("name", "n_train", "n_test", "n_features", "n_classes"),
    [
        ("breast_cancer", 512, 57, 30, 2),
        ("waveform", 300, 700, 21, 3),
        ("wine", 160, 18, 13, 3),
        ("iris", 135, 15, 4, 3),
        ("digits", 1617, 180, 64, 10),
        ("synthetic2d", 1000, 1000, 2, 3),
        ("new_thyroid", 193, 22, 5, 3),
        ("svmguide2", 352, 39, 20, 3),
        ("vowel", 486, 54, 10, 6),
        ("australian", 621, 69, 14, 2),
        ("crabs", 100, 100, 6, 2),
        ("ionosphere", 200, 151, 34, 2),
        ("sonar", 108, 100, 60, 2),
        ("german", 900, 100, 24, 2),
    ],
)
def test_dataset_configs_load_and_split(
    name: str, n_train: int, n_test: int, n_features: int, n_classes: int
) -> None:
    from gpinfer.data import data_dir, data_files
    from gpinfer.experiment.prepare import _load_split
    from gpinfer.experiment.runner import config_to_dict, parse_settings

    embedded = {"breast_cancer", "waveform", "wine", "iris", "digits", "synthetic2d"}
    if name not in embedded and (data_dir() is None or name not in data_files()):
        pytest.skip(f"{name}.npz is not in the shared data folder (../shared/data)")
    settings = parse_settings(config_to_dict(compose_cfg(f"dataset={name}")))
    _, split = _load_split(settings)
    assert (split.n_train, split.n_test) == (n_train, n_test)
    assert split.X_train.shape[1] == n_features
    assert np.unique(split.y_train).tolist() == list(range(n_classes))


@pytest.mark.parametrize("refit", [True, False, "average"])
def test_early_stopping_counts_and_metrics(tmp_path: Path, store_uri: str,
                                           refit: bool | str) -> None:
    """With a validation part, n_train is the count the fitted model was trained on: all the
    training rows after a refit (the default; n_validation 0), the rows less the held-out fifth
    of each class without one (or, averaging, less one of 5 folds). The run records (result.json
    and MLflow's final metrics) whether training stopped early, at which iteration the best
    validation NLL was and its score."""
    cfg = store_cfg(store_uri, "method.name=toygp", "iterations=30", "seed=3",
                    "validation_fraction=0.2", "n_iter_no_change=2", f"refit={str(refit).lower()}")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    held_out = 512 - result["n_train"]  # 512 training rows
    if refit is True:
        assert held_out == 0
    else:  # a fifth of each class held out
        assert 0.19 * 512 < held_out < 0.21 * 512
    # the toy posterior never changes: the first check is the best, two more stop training
    assert result["stopped_early"] == 1.0 and result["best_val_iteration"] == 1.0
    assert result["best_validation_score"] == pytest.approx(-result["best_val_nll"])
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    params, metrics = run.data.params, run.data.metrics
    assert params["data.n_train"] == str(result["n_train"])
    assert params["data.n_validation"] == str(held_out)
    assert metrics["stopped_early"] == 1.0 and metrics["best_val_iteration"] == 1.0
    assert metrics["best_validation_score"] == pytest.approx(result["best_validation_score"])
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["n_train"] == result["n_train"] and saved["stopped_early"] == 1.0


def test_refine_iter_reaches_the_estimator_and_the_run_records_it(tmp_path: Path,
                                                                  store_uri: str) -> None:
    """The config key ``refine_iter`` is passed to the estimator: the run's model is the refit
    plus up to ``refine_iter`` iterations on the posterior (``refined`` in result.json)."""
    cfg = store_cfg(store_uri, "method=sep", "dataset=wine", "M=5", "iterations=4", "seed=0",
                    "validation_fraction=0.2", "n_iter_no_change=2", "refine_iter=3")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    assert result["refined"] == 3.0
    assert result["n_iter"] == result["best_val_iteration"] + 3
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["refined"] == 3.0


@pytest.mark.parametrize("method,refit,refine_iter", [("sep", "true", "50"),
                                                      ("vi-robustmax", "average", "250")])
def test_the_run_records_the_early_stopping_rule_that_ran(tmp_path: Path, store_uri: str,
                                                          method: str, refit: str,
                                                          refine_iter: str) -> None:
    """``refit: auto`` (the config's default) runs the method's declared rule
    (``Method.early_stopping_rule``); MLflow's params name the rule that ran, and result.json
    its ``refine_iter``."""
    cfg = store_cfg(store_uri, f"method={method}", "dataset=wine", "M=5", "iterations=4",
                    "seed=0", "validation_fraction=0.2", "n_iter_no_change=2")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    params = MlflowClient(store_uri).get_run(result["mlflow_run_id"]).data.params
    assert params["refit"] == "auto"
    assert (params["early_stopping.refit"], params["early_stopping.refine_iter"]) == (
        refit, refine_iter)
    assert result["refine_iter"] == float(refine_iter)
    assert (result.get("averaged") is not None) == (refit == "average")
