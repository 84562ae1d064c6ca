"""The tracking worker (``gpinfer.experiment.tracking_worker``): the run's MLflow calls made in
another process, in order, their errors raised in the run, and no worker left behind."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment.tracking_worker import RemoteRunLogger, TrackingWorker


@pytest.fixture(scope="module")
def worker():
    """One worker for these tests (each opens its own store): its MLflow import once."""
    w = TrackingWorker()
    yield w
    w.close(timeout=60)
    assert w.process.returncode == 0


def test_calls_are_made_in_order_by_the_worker(worker, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = RemoteRunLogger(worker, uri, "exp", flush_every=3)
    logger.ready()
    with logger.run("r", tags={"a": "1"}, params={"p": 2}):
        for step in range(1, 8):
            logger.log_metrics({"objective": -1.0 / step}, step=step)
        logger.log_final({"test_error": 0.25}, step=7)
    assert logger.status == "FINISHED" and logger.run_id is not None
    run = MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"p": "2"}
    history = MlflowClient(uri).get_metric_history(logger.run_id, "objective")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 8))
    assert run.data.metrics["test_error"] == 0.25


def test_an_unusable_store_is_an_input_error_at_ready(worker, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    logger = RemoteRunLogger(worker, f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
    with pytest.raises(InputError, match="cannot create folder"):
        logger.ready()


def test_a_failed_call_is_raised_in_the_run_and_the_run_ends_failed(worker, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = RemoteRunLogger(worker, uri)
    with pytest.raises(ValueError, match="already logged"), logger.run("r"):
        logger.log_metrics({"test_error": 0.5}, step=1)
        logger.log_final({"test_error": 0.5}, step=1)  # a per-iteration key: refused
    assert MlflowClient(uri).get_run(logger.run_id).info.status == "FAILED"


def test_an_interrupted_run_ends_killed_with_its_metrics(worker, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = RemoteRunLogger(worker, uri, flush_every=100)
    with pytest.raises(KeyboardInterrupt), logger.run("r"):
        logger.log_metrics({"objective": -3.0}, step=1)  # buffered in the worker
        raise KeyboardInterrupt
    run = MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "KILLED" and run.data.metrics["objective"] == -3.0


def test_the_worker_exits_when_its_input_ends(tmp_path):
    """The run's process gone (its end of the pipe closed): the worker ends by itself."""
    w = TrackingWorker()
    w.requests.close()
    assert w.process.wait(timeout=120) == 0
