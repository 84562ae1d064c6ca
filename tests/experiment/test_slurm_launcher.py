"""The shipped SLURM launcher config (conf/hydra/launcher/gpinfer_slurm.yaml): what it
composes to, the sbatch script submitit would write from it, and that its local twin
(gpinfer_local, which tests/experiment/test_submitit_sweep.py runs) shares its settings.

No cluster is needed: the script is rendered by submitit's own SLURM executor, which only asks
for an ``srun`` on the PATH (a stub here); nothing is submitted."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gpinfer.experiment.app import CONF_DIR

from .helpers import REPO

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher")

import submitit  # noqa: E402
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf  # noqa: E402

SWEEP = "/shared/sweeps/s1"
#: a user's command line: a partition, four CPUs per job, a sweep of 8 jobs
OVERRIDES = ("hydra/launcher=gpinfer_slurm", "hydra.launcher.partition=cpu",
             "hydra.launcher.cpus_per_task=4", "method=laplace", "dataset=breast_cancer",
             "kernel=rbf,matern52", "seed=0,1,2,3")
THREADS_LINE = ("export GPINFER_BLAS_THREADS={n} OPENBLAS_NUM_THREADS={n} OMP_NUM_THREADS={n} "
                "MKL_NUM_THREADS={n} SRUN_CPUS_PER_TASK={n}")


def _launcher_params(*overrides: str) -> dict[str, Any]:
    """The launcher Hydra would build for ``gpinfer-run -m <overrides>``: its parameters, as
    resolved in its constructor (every interpolation, against the whole config)."""
    sweep = [o for o in overrides if "," not in o]  # one job's overrides: the sweep's values
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*sweep, f"hydra.sweep.dir={SWEEP}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    launcher = instantiate(cfg.hydra.launcher)
    return {"_target_": cfg.hydra.launcher._target_, **launcher.params}


def test_gpinfer_slurm_composes_to_the_slurm_launcher_with_gpinfer_settings() -> None:
    params = _launcher_params(*OVERRIDES)
    assert params["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert params["partition"] == "cpu" and params["cpus_per_task"] == 4
    assert params["setup"] == [THREADS_LINE.format(n=4)]
    assert params["submitit_folder"] == f"{SWEEP}/.submitit/%j"
    assert params["additional_parameters"] == {"export": "ALL"}
    assert params["timeout_min"] == 120 and params["mem_gb"] == 8
    assert params["array_parallelism"] == 64 and params["max_num_timeout"] == 0


def _readme_slurm_commands() -> list[list[str]]:
    """The README's ``gpinfer-run -m hydra/launcher=gpinfer_slurm ...`` commands, as
    arguments (continuation lines joined)."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    return [shlex.split(m.group(0)) for m in
            re.finditer(r"^gpinfer-run -m hydra/launcher=gpinfer_slurm .*$", text, re.MULTILINE)]


def test_the_readme_commands_compose_to_the_slurm_launcher() -> None:
    commands = _readme_slurm_commands()
    assert len(commands) == 2  # the CPU example and the GPU one
    for args in commands:
        params = _launcher_params(*args[2:])
        assert params["_target_"].endswith("submitit_launcher.SlurmLauncher"), args
        assert params["partition"] and params["setup"] == [
            THREADS_LINE.format(n=params["cpus_per_task"])], args


def test_the_default_is_one_thread_per_job() -> None:
    params = _launcher_params("hydra/launcher=gpinfer_slurm")
    assert params["cpus_per_task"] == 1 and params["setup"] == [THREADS_LINE.format(n=1)]


def test_the_local_twin_shares_every_setting_it_can_run() -> None:
    slurm = _launcher_params("hydra/launcher=gpinfer_slurm", "hydra.launcher.cpus_per_task=3")
    local = _launcher_params("hydra/launcher=gpinfer_local", "hydra.launcher.cpus_per_task=3")
    assert local["_target_"].endswith("submitit_launcher.LocalLauncher")
    base = set(OmegaConf.structured(BaseQueueConf).keys()) | {"setup"}
    assert set(local) - {"_target_"} == base
    assert {k: local[k] for k in base} == {k: slurm[k] for k in base}


def test_the_sbatch_script_has_the_threads_resources_and_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submission script of a 8-job sweep, rendered by submitit's SLURM executor from the
    parameters as hydra-submitit-launcher's ``launch`` passes them."""
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    params = _launcher_params(*OVERRIDES)
    del params["_target_"]
    folder = str(tmp_path / "submitit" / "%j")
    executor = submitit.AutoExecutor(cluster="slurm", folder=folder,
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    del params["submitit_folder"]
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    slurm = executor._executor
    script = submitit.slurm.slurm._make_sbatch_string(
        command="python -u -m submitit.core._submit", folder=slurm.folder, map_count=8,
        **slurm.parameters)
    lines = script.splitlines()
    for directive in ("--partition=cpu", "--cpus-per-task=4", "--mem=8GB", "--time=120",
                      "--export=ALL", "--array=0-7%8", "--job-name=gpinfer"):
        assert f"#SBATCH {directive}" in lines, (directive, script)
    threads = lines.index(THREADS_LINE.format(n=4))
    assert threads < next(i for i, line in enumerate(lines) if line.startswith("srun "))
