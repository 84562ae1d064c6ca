"""The scale-out path for real: a two-job sweep through hydra-submitit-launcher's local
executor (the SLURM launcher's twin: pickled jobs, separate processes, submitit's folders)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from .helpers import require_plugin
from .test_app import GPINFER_RUN

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher")


def test_two_job_submitit_local_sweep_ends_finished_in_mlflow(tmp_path: Path) -> None:
    require_plugin("laplace")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [str(GPINFER_RUN), "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
         "hydra.launcher.cpus_per_task=1", "method=laplace", "dataset=breast_cancer",
         "iterations=2", "seed=0,1", "mlflow.log_model=false", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("gpinfer")
    runs = [r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("gpinfer.kind") != "report"]
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["hydra.mode"] for r in runs} == {"MULTIRUN"}
    assert (sweep / ".submitit").is_dir()  # the jobs went through submitit
    assert "| laplace | breast_cancer | 2 |" in (sweep / "report.md").read_text()
