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
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpinfer.errors import GPInferError
from gpinfer.experiment import interrupts
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


def _record_rejection(cfg: DictConfig, exc: Exception) -> None:
    """In a sweep, a job that ended without ``result.json`` (stopped before its run) leaves
    ``rejected.json`` in its folder, so the sweep report counts and lists it."""
    from hydra.core.hydra_config import HydraConfig

    from gpinfer.experiment.report import write_rejected
    from gpinfer.experiment.results import RESULT_FILE

    try:
        folder = Path(HydraConfig.get().runtime.output_dir)
        if (folder / RESULT_FILE).exists():
            return  # the run started and recorded its own failure
        keys = {"method": OmegaConf.select(cfg, "method.name"),
                "dataset": OmegaConf.select(cfg, "dataset.name"),
                "kernel": OmegaConf.select(cfg, "kernel.name"),
                "M": OmegaConf.select(cfg, "M"), "seed": OmegaConf.select(cfg, "seed")}
        write_rejected(folder, keys, f"{type(exc).__name__}: {exc}")
    except Exception as err:  # noqa: BLE001 - bookkeeping must not hide the job's own error
        print(f"gpinfer-run: could not record the rejected job: {err}", file=sys.stderr)


def task(cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task: one ``run_experiment``; gpinfer errors become one-line failures (in a
    sweep, also ``rejected.json`` when the run never started)."""
    from gpinfer.experiment.runner import run_experiment

    interrupts.release()  # composing is over: Ctrl-C stops the run (KILLED in MLflow)
    try:
        result = run_experiment(cfg)
    except GPInferError as exc:
        message = f"gpinfer-run: {type(exc).__name__}: {exc}"
        if _multirun():  # Hydra reports only the first failed job at the end of a sweep
            print(message, file=sys.stderr, flush=True)
            _record_rejection(cfg, exc)
        raise RunFailed(message) from None
    except Exception as exc:
        if _multirun():
            _record_rejection(cfg, exc)
        raise
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
    interrupts.install()  # Ctrl-C deferred while Hydra composes (gpinfer.experiment.interrupts)
    try:
        hydra_main()
        interrupts.release()  # --cfg, --help: nothing ran
    except KeyboardInterrupt:
        sys.stderr.write("gpinfer-run: interrupted (a run in progress ends KILLED in MLflow; "
                         "a sweep reports its finished jobs)\n")
        raise SystemExit(130) from None
    finally:
        interrupts.uninstall()


if __name__ == "__main__":
    main()
