"""The MLflow logger on its own: store resolution, batching, end status, params, state files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment import tracking
from gpinfer.experiment.tracking import RunLogger


class _Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _spy_batches(logger: RunLogger, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of metrics of every log_batch call that carries metrics."""
    sizes: list[int] = []
    real = logger.client.log_batch

    def spy(run_id, metrics=(), params=(), tags=(), **kw):
        if metrics:
            sizes.append(len(metrics))
        return real(run_id, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(logger.client, "log_batch", spy)
    return sizes


def test_store_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = tracking.default_tracking_uri()
    repo = Path(tracking.__file__).resolve().parents[2]
    assert default == f"sqlite:///{repo / 'outputs' / 'mlflow.db'}"
    assert tracking.resolve_tracking_uri(None) == default
    assert tracking.default_artifact_location(default) == (repo / "outputs" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.resolve_tracking_uri(None) == "http://127.0.0.1:5999"
    assert tracking.resolve_tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"  # config wins
    assert tracking.sqlite_path("sqlite:////x/y.db") == Path("/x/y.db")
    assert tracking.sqlite_path("sqlite:///rel/y.db") == Path("rel/y.db")
    assert tracking.sqlite_path("sqlite://") is None
    assert tracking.sqlite_path("http://127.0.0.1:5000") is None
    assert tracking.default_artifact_location("http://127.0.0.1:5000") is None
    assert tracking.default_artifact_location("sqlite:////x/y.db") == "file:///x/mlartifacts"


def test_flatten_config_truncates_long_values() -> None:
    flat = tracking.flatten_config(
        {"a": {"b": 1, "c": [1, 2], "d": None, "e": {}}, "long": "x" * 2000, "f": True}
    )
    assert flat["a.b"] == "1" and flat["a.c"] == "[1, 2]" and flat["a.d"] == "null"
    assert flat["a.e"] == "{}" and flat["f"] == "True"
    assert len(flat["long"]) == tracking.MAX_PARAM_CHARS and flat["long"].endswith("...")


def test_metrics_are_sent_in_batches(store_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    logger = RunLogger(store_uri, "batching", flush_every=5, flush_interval_s=2.0, clock=clock)
    sizes = _spy_batches(logger, monkeypatch)
    with logger.run("batches", params={"p": 1}):
        for step in range(1, 13):
            logger.log_metrics({"objective": -float(step)}, step=step)
        assert sizes == [5, 5]  # two full buffers, two values still waiting
        clock.t = 2.5  # the interval elapses: the next value goes out with the waiting ones
        logger.log_metrics({"objective": -13.0}, step=13)
        assert sizes == [5, 5, 3]
        logger.log_metrics({"objective": -13.0}, step=13)  # same (key, step): skipped
        logger.log_metrics({"objective": -14.0}, step=14)
    assert sizes == [5, 5, 3, 1]  # the end flushes the rest
    client = MlflowClient(store_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"p": "1"}
    history = client.get_metric_history(logger.run_id, "objective")
    assert [m.step for m in history] == list(range(1, 15))
    assert [m.value for m in history] == [-float(s) for s in range(1, 15)]


def test_final_numbers_are_never_dropped_and_keep_their_keys(store_uri: str) -> None:
    """The bug of issue 26: a final number at the step of the last per-iteration value was
    skipped as an already-logged (key, step) pair. Final numbers now have keys of their own,
    logged once, at once; MLflow's value of the key is the final number."""
    logger = RunLogger(store_uri, "finals", flush_every=1000, flush_interval_s=1e9)
    with logger.run("finals"):
        for step in (10, 20):
            logger.log_metrics({"eval/test_error": 0.2 - step / 1000}, step=step)
        logger.log_final({"test_error": 0.1614, "test_nll": 0.3621, "absent": None}, step=20)
        with pytest.raises(ValueError, match="already logged"):
            logger.log_final({"test_error": 0.5}, step=21)
        with pytest.raises(ValueError, match="already logged"):
            logger.log_final({"eval/test_error": 0.5}, step=21)
        with pytest.raises(ValueError, match="final number"):
            logger.log_metrics({"test_nll": 0.5}, step=20)
    client = MlflowClient(store_uri)
    metrics = client.get_run(logger.run_id).data.metrics
    assert metrics["test_error"] == 0.1614 and metrics["test_nll"] == 0.3621
    assert metrics["eval/test_error"] == 0.2 - 20 / 1000 and "absent" not in metrics
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "test_error")] \
        == [(20, 0.1614)]


@pytest.mark.parametrize(
    ("exc", "status"), [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")]
)
def test_run_end_status_keeps_buffered_metrics(store_uri: str, exc: BaseException, status: str) -> None:
    logger = RunLogger(store_uri, "status", flush_every=1000, flush_interval_s=1e9)
    with pytest.raises(type(exc)), logger.run("ends"):
        for step in (1, 2, 3):
            logger.log_metrics({"objective": float(step), "other": 0.5}, step=step)
        raise exc
    client = MlflowClient(store_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == status
    assert run.data.tags["error"].startswith(type(exc).__name__)
    assert [m.step for m in client.get_metric_history(logger.run_id, "objective")] == [1, 2, 3]


def test_experiment_artifact_location_and_deleted_experiment(tmp_path: Path, store_uri: str) -> None:
    logger = RunLogger(store_uri, "located")
    exp = logger.client.get_experiment(logger.experiment_id)
    db = tracking.sqlite_path(store_uri)
    assert exp.artifact_location == (db.parent / "mlartifacts").as_uri()
    explicit = RunLogger(store_uri, "explicit", artifact_location=(tmp_path / "arts").as_uri())
    assert explicit.client.get_experiment(explicit.experiment_id).artifact_location.endswith("arts")
    logger.client.delete_experiment(logger.experiment_id)
    with pytest.raises(InputError, match=r"experiment 'located' .* is deleted"):
        RunLogger(store_uri, "located")


def test_bad_stores_are_input_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError, match="cannot create folder"):
        RunLogger(f"sqlite:///{blocker}/x/mlflow.db")
    with pytest.raises(InputError, match="bad-scheme"):
        RunLogger("bad-scheme://nowhere")


def test_state_arrays_and_git(tmp_path: Path) -> None:
    from types import SimpleNamespace

    class Post:
        def state(self):
            return {"alpha": np.arange(3.0), "weird": object()}

    class Kern:
        param_names = ["log_lengthscale", "log_variance"]

        def get_unconstrained(self):
            return np.array([0.1, 0.2])

    fit = SimpleNamespace(state={"W": np.eye(2)}, posterior=Post(), kernel=[Kern(), Kern()])
    arrays = tracking.collect_state(fit, extra={"classes": np.array([0, 1])})
    assert set(arrays) == {
        "W",
        "posterior.alpha",
        "kernel.0.theta",
        "kernel.0.param_names",
        "kernel.1.theta",
        "kernel.1.param_names",
        "classes",
    }
    path = tracking.save_state(tmp_path / "state.npz", arrays)
    with np.load(path, allow_pickle=False) as loaded:
        assert np.array_equal(loaded["kernel.1.theta"], [0.1, 0.2])
        assert loaded["kernel.0.param_names"].tolist() == Kern.param_names
    sha = tracking.git_commit()
    assert sha == "unknown" or (len(sha) == 40 and int(sha, 16) >= 0)
    assert tracking.git_commit(tmp_path) == "unknown"
    assert tracking.git_dirty(tmp_path) == "unknown"
