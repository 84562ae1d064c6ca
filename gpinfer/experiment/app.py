"""The Hydra application behind ``gpinfer-run`` and ``python -m gpinfer``.

The configuration lives in ``<repo>/conf`` (``config.yaml`` composing ``method/``, ``dataset/``,
``kernel/`` and ``optimizer/``); the package is installed in editable mode, so the folder is
found from this file's location. Examples::

    gpinfer-run                                            # the default run
    gpinfer-run method=laplace dataset=ionosphere seed=3
    gpinfer-run -m kernel=rbf,matern52 seed=0,1            # a sweep, one run after another
    gpinfer-run -m hydra/launcher=joblib hydra.launcher.n_jobs=2 seed=0,1,2,3   # in parallel

A gpinfer error (bad name, bad option, unreadable data, unwritable output or store, numerical
trouble) ends the run with a one-line message instead of a traceback; in a sweep every failed
job prints its line and the sweep goes on, Hydra exiting non-zero at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gpinfer.errors import GPInferError

#: ``<repo>/conf``: this file is ``<repo>/gpinfer/experiment/app.py``
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "config"


class RunFailed(CompactHydraException):
    """A run stopped by a gpinfer error; Hydra prints its message without a traceback."""


class OutputFolderCheck(Callback):
    """Hydra callback: an unwritable ``hydra.run.dir`` / ``hydra.sweep.dir`` is one clear line.

    Runs before Hydra creates the folder (which would otherwise fail with a traceback) and
    exits with status 1: Hydra turns exceptions raised by callbacks into warnings, so the
    callback stops the process itself. Registered under ``hydra.callbacks`` in
    ``conf/config.yaml``.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config.hydra.sweep.dir)

    @staticmethod
    def _check(path: str) -> None:
        from gpinfer.errors import InputError
        from gpinfer.experiment.results import check_output_dir

        try:
            check_output_dir(path)
        except InputError as exc:
            sys.stderr.write(f"gpinfer-run: InputError: {exc}\n")
            raise SystemExit(1) from None


def _multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:
        return False


def task(cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task: one ``run_experiment``; gpinfer errors become one-line failures."""
    from gpinfer.experiment.runner import run_experiment

    try:
        result = run_experiment(cfg)
    except GPInferError as exc:
        message = f"gpinfer-run: {type(exc).__name__}: {exc}"
        if _multirun():  # Hydra reports only the first failed job at the end of a sweep
            print(message, file=sys.stderr, flush=True)
        raise RunFailed(message) from None
    if not _multirun():
        from gpinfer.experiment.results import result_table

        print(result_table(result), flush=True)
    return result


def _check_conf_dir() -> None:
    if not (CONF_DIR / f"{CONFIG_NAME}.yaml").is_file():
        sys.stderr.write(
            f"gpinfer-run: configuration {CONF_DIR / (CONFIG_NAME + '.yaml')} not found. "
            "gpinfer-run reads the conf/ folder of the repository it was installed from "
            "(pip install -e .); reinstall from a checkout that has conf/config.yaml.\n"
        )
        raise SystemExit(2)


def main() -> None:
    """Console entry point: compose ``conf/config.yaml`` with the command-line overrides."""
    import hydra

    _check_conf_dir()
    hydra_main = hydra.main(
        config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3"
    )(task)
    try:
        hydra_main()
    except KeyboardInterrupt:
        sys.stderr.write("gpinfer-run: interrupted (a run in progress ends KILLED in MLflow)\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
