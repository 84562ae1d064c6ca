"""Installable: a wheel ships the configs (found by Hydra outside the checkout) and py.typed;
a plugin's own conf/method/<name>.yaml is found without any override."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gpinfer import registry
from gpinfer.experiment.config_paths import (
    core_conf_dir,
    plugin_conf_dirs,
    register_hydra_plugins,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The core's wheel, built as pip builds it (isolated build) from a copy of the sources,
    so that the checkout gets no build/ folder."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gpinfer", "conf", "hydra_plugins"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("gpinfer-*.whl"))


def test_wheel_ships_configs_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gpinfer/py.typed", "gpinfer/conf/config.yaml", "gpinfer/conf/method/laplace.yaml",
            "gpinfer/conf/experiment/villacampa2017_uci.yaml",
            "hydra_plugins/gpinfer_hydra/searchpath.py",
            "hydra_plugins/gpinfer_hydra/sweeper.py",
            "gpinfer/conf/hydra/launcher/gpinfer_slurm.yaml",
            "gpinfer/conf/hydra/launcher/gpinfer_local.yaml",
            "gpinfer/conf/hydra/launcher/gpinfer/submitit.yaml"} <= names
    shipped = {n.removeprefix("gpinfer/conf/") for n in names if n.startswith("gpinfer/conf/")}
    on_disk = {str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml")}
    assert shipped == on_disk


def _run_installed(wheel: Path, tmp_path: Path, code: str) -> str:
    """``code`` run by a fresh interpreter with ``wheel`` installed into ``tmp_path/site``
    ahead of the editable install; returns its stdout (the run must succeed)."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_installed_wheel_composes_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    stdout = _run_installed(wheel, tmp_path, (
        "import gpinfer.experiment.app as a, sys; print(a.CONF_DIR); "
        "sys.argv = ['gpinfer-run', '--cfg', 'job', 'method=laplace', 'dataset=iris']; "
        "a.main()"))
    first, rest = stdout.split("\n", 1)
    assert Path(first) == target / "gpinfer" / "conf"
    assert "name: laplace" in rest and "name: iris" in rest


def test_installed_wheel_composes_the_slurm_launcher(wheel: Path, tmp_path: Path) -> None:
    """``hydra/launcher=gpinfer_slurm`` from the wheel: the shipped launcher and its shared
    settings (a nested folder of the configs) are found outside the checkout."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher")
    stdout = _run_installed(wheel, tmp_path, (
        "import gpinfer.experiment.app as a, sys; sys.argv = ['gpinfer-run', "
        "'hydra/launcher=gpinfer_slurm', 'hydra.launcher.cpus_per_task=3', '--cfg', 'hydra', "
        "'-p', 'hydra.launcher', '--resolve']; a.main()"))
    assert "submitit_launcher.SlurmLauncher" in stdout
    assert "export GPINFER_BLAS_THREADS=3 OPENBLAS_NUM_THREADS=3" in stdout


def test_core_conf_dir_of_the_checkout() -> None:
    assert core_conf_dir() == REPO / "conf"


def test_a_plugin_ships_its_own_method_config(tmp_path: Path) -> None:
    """The example plugin, installed as a distribution: ``method=labelreg`` composes."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "docs" / "example_plugin" / "gpinfer_labelreg",
                    site / "gpinfer_labelreg")
    info = site / "gpinfer_labelreg-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpinfer-labelreg\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpinfer.methods]\nlabelreg = gpinfer_labelreg.method:LabelRegression\n")
    # the guide's test imports the example from docs/: forget that copy while this one is used
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.startswith("gpinfer_labelreg")}
    sys.path.insert(0, str(site))
    registry.refresh()
    register_hydra_plugins()
    try:
        assert site / "gpinfer_labelreg" / "conf" in plugin_conf_dirs()
        with initialize_config_dir(config_dir=str(core_conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["method=labelreg"])
        assert cfg.method.name == "labelreg" and cfg.method.options.noise == 1.0
    finally:
        sys.path.remove(str(site))
        for mod in [m for m in sys.modules if m.startswith("gpinfer_labelreg")]:
            del sys.modules[mod]
        sys.modules.update(saved)
        registry.refresh()
