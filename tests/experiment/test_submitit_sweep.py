"""The scale-out path for real: a two-job sweep through the shipped ``gpinfer_local`` launcher,
hydra-submitit-launcher's local executor with the settings gpinfer_slurm sends to a cluster
(conf/hydra/launcher/gpinfer/submitit.yaml: pickled jobs, separate processes, submitit's
folders, the setup line that gives each job its threads)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.threads import BLAS_THREADS_TAG, RUNTIME_ENVS, THREAD_ENV_TAG, THREADS_ENV

from .helpers import require_plugin
from .test_app import GPINFER_RUN

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher")

#: CPUs per job in the sweep: not the policy's default (1), so a job that did not get its
#: threads from the launcher's setup line shows 1
CPUS = 2


def test_two_job_gpinfer_local_sweep_ends_finished_with_the_jobs_threads(
        tmp_path: Path) -> None:
    require_plugin("laplace")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    # the submitting shell's thread settings are 1: only the setup line can make them CPUS
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
           **{name: "1" for name in (THREADS_ENV, *RUNTIME_ENVS)}}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [str(GPINFER_RUN), "-m", "hydra/launcher=gpinfer_local", "hydra.launcher.timeout_min=10",
         f"hydra.launcher.cpus_per_task={CPUS}", "method=laplace", "dataset=breast_cancer",
         "iterations=2", "seed=0,1", "mlflow.log_model=false", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    client = MlflowClient(uri)  # the jobs found the store through MLFLOW_TRACKING_URI
    exp = client.get_experiment_by_name("gpinfer")
    runs = [r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("gpinfer.kind") != "report"]
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["hydra.mode"] for r in runs} == {"MULTIRUN"}
    # recorded inside each job: the fits' thread policy and the BLAS runtimes' variables
    assert {r.data.tags[BLAS_THREADS_TAG] for r in runs} == {str(CPUS)}
    job_env = {r.data.tags[THREAD_ENV_TAG] for r in runs}
    assert len(job_env) == 1
    seen = dict(item.split("=", 1) for item in job_env.pop().split())
    for name in (THREADS_ENV, "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert seen[name] == str(CPUS), (name, seen)
    # the jobs went through submitit, a folder per job (named by its id) in the sweep's
    job_dirs = [d for d in (sweep / ".submitit").iterdir() if d.name.isdigit()]
    assert len(job_dirs) == 2 and all((d / f"{d.name}_0_result.pkl").is_file() for d in job_dirs)
    assert "| laplace | breast_cancer | 2 |" in (sweep / "report.md").read_text()
