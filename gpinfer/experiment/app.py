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
job prints its line and the sweep goes on, Hydra exiting non-zero at the end. A run rejected
before it started (nothing in its folder but Hydra's ``.hydra/`` and the run log) leaves no
folder behind (``remove_unstarted_run_folder``). A finished run prints one line
(``results.summary_line``).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpinfer.errors import GPInferError
from gpinfer.experiment import interrupts
from gpinfer.experiment.config_paths import CONFIG_NAME, core_conf_dir, register_hydra_plugins
from gpinfer.experiment.credentials import protect_command_line
from gpinfer.threads import export_policy
from gpinfer.training import distributed

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
    """In a sweep, a job that ended without ``result.json`` (stopped before its run) is recorded
    in ``rejected/<job>.json`` of the sweep folder (``report.write_rejected``), so the sweep
    report counts and lists it."""
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


def remove_unstarted_run_folder(folder: str | os.PathLike[str], hydra_subdir: str | None) -> bool:
    """Remove the run ``folder`` Hydra made for a run that never started; returns whether it did.

    Removed only when it holds nothing but Hydra's ``hydra_subdir`` (``.hydra``) and the log
    files of the logging handlers writing into it (``gpinfer.log``, closed and detached first),
    and is neither the working directory nor one of its parents.
    """
    folder = Path(folder).resolve()
    cwd = Path.cwd().resolve()
    if not folder.is_dir() or folder == cwd or folder in cwd.parents:
        return False
    root = logging.getLogger()
    logs = [h for h in root.handlers if isinstance(h, logging.FileHandler)
            and Path(h.baseFilename).resolve().parent == folder]
    allowed = {Path(h.baseFilename).name for h in logs} | {hydra_subdir or ".hydra"}
    if any(entry.name not in allowed for entry in folder.iterdir()):
        return False
    for handler in logs:
        root.removeHandler(handler)
        handler.close()
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _forget_rejected_run() -> None:
    """After a gpinfer error: no folder for a run that never started (under Hydra only)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        folder, subdir = hc.runtime.output_dir, hc.output_subdir
    except Exception:  # not under Hydra
        return
    try:
        remove_unstarted_run_folder(folder, subdir)
    except OSError:  # litter is better than a second error
        pass


def task(cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task: one ``run_experiment`` (which prints the result line); gpinfer errors
    become one-line failures; a run rejected before it started leaves no folder (a sweep job's
    rejection is recorded in the sweep folder's ``rejected/`` for the sweep report)."""
    from gpinfer.experiment.runner import run_experiment

    interrupts.release()  # composing is over: Ctrl-C stops the run (KILLED in MLflow)
    try:
        return run_experiment(cfg)
    except GPInferError as exc:
        message = f"gpinfer-run: {type(exc).__name__}: {exc}"
        if _multirun():  # Hydra reports only the first failed job at the end of a sweep
            print(message, file=sys.stderr, flush=True)
            _record_rejection(cfg, exc)
        _forget_rejected_run()
        raise RunFailed(message) from None
    except Exception as exc:
        if _multirun():
            _record_rejection(cfg, exc)
        _forget_rejected_run()
        raise


def _check_conf_dir() -> None:
    if not (CONF_DIR / f"{CONFIG_NAME}.yaml").is_file():
        sys.stderr.write(
            f"gpinfer-run: configuration {CONF_DIR / (CONFIG_NAME + '.yaml')} not found: "
            "the gpinfer installation is incomplete (a wheel ships it as gpinfer/conf, a "
            "checkout has conf/config.yaml); reinstall gpinfer.\n"
        )
        raise SystemExit(2)


#: Hydra overrides a rank other than 0 replaces (its Hydra folder goes to a temporary one)
_FOLLOWER_KEYS = ("hydra.run.dir=", "hydra.output_subdir=")


def follower_overrides(args: list[str]) -> list[str]:
    """``args`` of a rank other than 0 under ``torchrun`` (unchanged otherwise): Hydra's run
    folder in a temporary folder, removed at exit, and no ``.hydra`` record: only rank 0
    writes to ``outputs/``."""
    if not distributed.launched_by_torchrun() or os.environ.get("RANK", "0") == "0":
        return args
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"gpinfer-rank{os.environ['RANK']}-")
    atexit.register(shutil.rmtree, folder, True)
    kept = [a for a in args if not a.lstrip("+").startswith(_FOLLOWER_KEYS)]
    return [*kept, f"hydra.run.dir={folder}", "hydra.output_subdir=null"]


def main() -> None:
    """Console entry point: compose ``conf/config.yaml`` with the command-line overrides."""
    import hydra

    _check_conf_dir()
    # credentials out of the tracking URI before Hydra sees, saves or prints the overrides
    sys.argv[1:] = follower_overrides(protect_command_line(sys.argv[1:]))
    export_policy()  # sweep workers start with the thread policy's BLAS threads
    hydra_main = hydra.main(
        config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3"
    )(task)
    interrupts.install()  # Ctrl-C deferred while Hydra composes (gpinfer.experiment.interrupts)
    status: object = 0
    try:
        hydra_main()
        interrupts.release()  # --cfg, --help: nothing ran
    except KeyboardInterrupt:
        sys.stderr.write("gpinfer-run: interrupted (a run in progress ends KILLED in MLflow; "
                         "a sweep reports its finished jobs)\n")
        raise SystemExit(130) from None
    except SystemExit as exc:  # Hydra's exit status (a failed run, --help, ...)
        status = exc.code
    finally:
        interrupts.uninstall()
    exit_without_teardown(status)


def exit_without_teardown(status: object = 0) -> NoReturn:
    """End the process with ``status`` (``SystemExit``'s meaning) without the interpreter's
    teardown of every module a run imported (MLflow, SQLAlchemy, pandas, scikit-learn: seconds
    on a busy machine, for nothing).

    The ``atexit`` handlers run first (logging's flush and close among them) and stdout and
    stderr are flushed, so nothing written is lost. With another thread still alive the normal
    exit is taken (``SystemExit``), which waits for it; daemon threads (MLflow's telemetry)
    are not waited for by either.
    """
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(status)
    if status is None or isinstance(status, int):
        code = int(status or 0)
    else:  # SystemExit("message"): printed, status 1
        print(status, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # what the interpreter would run at exit, in the same order
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be written anyway
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
