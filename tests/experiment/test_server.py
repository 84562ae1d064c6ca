"""A real ``mlflow server`` on 127.0.0.1: a run logs to it and its metrics are read back over REST."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpinfer.experiment.runner import run_experiment

from .helpers import compose_cfg
from .secret_audit import stop_process_group

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("toy_site")]

HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - local URL
        return response.status, response.read().decode()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start ``mlflow server`` (SQLite backend, local artifacts), wait for /health, stop it after
    the module's tests (one start: it takes seconds)."""
    tmp_path = tmp_path_factory.mktemp("server")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("NO_PROXY", f"{HOST},localhost")
    monkeypatch.setenv("no_proxy", f"{HOST},localhost")
    port = _free_port()
    url = f"http://{HOST}:{port}"
    log_path = tmp_path / "server.log"
    cmd = [
        str(Path(sys.executable).with_name("mlflow")), "server",
        "--host", HOST, "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination", str(tmp_path / "server-artifacts"),
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                status, body = _get(f"{url}/health", timeout=2.0)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy after {START_TIMEOUT_S} s:\n"
                            f"{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        monkeypatch.undo()
        # the server and its workers share the new session's process group
        stop_process_group(proc, STOP_TIMEOUT_S)


def test_metrics_arrive_at_a_tracking_server(tmp_path: Path, mlflow_server: str) -> None:
    cfg = compose_cfg(
        f"mlflow.tracking_uri='{mlflow_server}'", "mlflow.experiment=server-test",
        "method.name=toygp", "method.likelihood=null", "iterations=6", "eval_every=3",
    )
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    run_id = result["mlflow_run_id"]
    api = f"{mlflow_server}/api/2.0/mlflow"

    _, body = _get(f"{api}/metrics/get-history?run_id={run_id}&metric_key=objective")
    history = json.loads(body)["metrics"]
    assert [m["step"] for m in sorted(history, key=lambda m: m["step"])] == [1, 2, 3, 4, 5, 6]
    assert min(m["value"] for m in history) == pytest.approx(-150.0)

    _, body = _get(f"{api}/metrics/get-history?run_id={run_id}&metric_key=eval%2Ftest_error")
    assert sorted(m["step"] for m in json.loads(body)["metrics"]) == [3]  # every eval_every
    _, body = _get(f"{api}/metrics/get-history?run_id={run_id}&metric_key=test_error")
    final = json.loads(body)["metrics"]  # the final number: once, as in result.json
    assert [(m["step"], m["value"]) for m in final] == [(6, result["test_error"])]

    _, body = _get(f"{api}/runs/get?run_id={run_id}")
    run = json.loads(body)["run"]
    assert run["info"]["status"] == "FINISHED"
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["method"] == "toygp" and tags["dataset"] == "breast_cancer"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["iterations"] == "6"

    _, body = _get(f"{api}/artifacts/list?run_id={run_id}")
    assert {"config.yaml", "state.npz", "result.json"} <= {
        f["path"] for f in json.loads(body).get("files", [])
    }


def test_gpinfer_run_logs_model_and_plots_to_a_tracking_server(
    tmp_path: Path, mlflow_server: str
) -> None:
    """``MLFLOW_TRACKING_URI`` points ``gpinfer-run`` at the server; everything reads back."""
    import numpy as np
    from mlflow.tracking import MlflowClient

    from .helpers import load_logged_model, require_plugin
    from .test_app import GPINFER_RUN

    require_plugin("laplace")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    proc = subprocess.run(
        [str(GPINFER_RUN), "method=laplace", "dataset=breast_cancer", "iterations=3",
         "eval_every=1", "mlflow.experiment=server-cli", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("server-cli")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("laplace-breast_cancer")
    assert 0.0 <= run.data.metrics["test_error"] <= 0.2
    assert run.data.metrics["learned.kernel.lengthscale"] > 0
    # every eval_every iterations but the last under eval/, the final number once
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/test_nll")] == [1, 2]
    final = client.get_metric_history(run.info.run_id, "test_nll")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert [(m.step, m.value) for m in final] == [(3, result["test_nll"])]
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/reliability.png", "plots/training_curves.png"}
    png = Path(client.download_artifacts(run.info.run_id, "plots/reliability.png", str(tmp_path)))
    assert png.read_bytes()[:4] == b"\x89PNG"
    model, pyfunc = load_logged_model(run.info.run_id, mlflow_server)
    classes = np.load(tmp_path / "run" / "state.npz")["classes"]  # the run folder has its files
    assert classes.tolist() == [0, 1]
    example = np.random.default_rng(1).standard_normal((4, 30))
    assert np.array_equal(np.asarray(pyfunc.predict(example)), model.predict_proba(example))
