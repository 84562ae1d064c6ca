"""The Hydra application behind ``gpinfer-run`` and ``python -m gpinfer``.

The configuration is ``config.yaml`` composing ``method/``, ``dataset/``, ``kernel/`` and
``optimizer/``: the repository's top-level ``conf/``, shipped inside a wheel as ``gpinfer/conf``
(``config_paths.core_conf_dir``); plugins' own ``conf/`` folders are added to the search path by
the Hydra plugin ``hydra_plugins.gpinfer_hydra.searchpath``. Examples::

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
from typing import Any

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gpinfer.errors import GPInferError
from gpinfer.experiment.config_paths import CONFIG_NAME, core_conf_dir, register_hydra_plugins
from gpinfer.experiment.credentials import protect_command_line
from gpinfer.threads import export_policy

#: the core's configuration: ``<gpinfer>/conf`` in a wheel, ``<repo>/conf`` in a checkout
CONF_DIR = core_conf_dir()
register_hydra_plugins()  # the plugin configs' search path and the sweeper, also when editable


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
            f"gpinfer-run: configuration {CONF_DIR / (CONFIG_NAME + '.yaml')} not found: "
            "the gpinfer installation is incomplete (a wheel ships it as gpinfer/conf, a "
            "checkout has conf/config.yaml); reinstall gpinfer.\n"
        )
        raise SystemExit(2)


def main() -> None:
    """Console entry point: compose ``conf/config.yaml`` with the command-line overrides."""
    import hydra

    _check_conf_dir()
    # credentials out of the tracking URI before Hydra sees, saves or prints the overrides
    sys.argv[1:] = protect_command_line(sys.argv[1:])
    export_policy()  # sweep workers start with the thread policy's BLAS threads
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
