"""Hydra's basic sweeper, made for large sweeps: lazy composition, named job folders, a report
whatever happens.

* **Lazy composition.** Hydra's basic sweeper composes every job's config before the first job
  starts (for the 1200 jobs of a paper protocol, minutes of silence); the launcher composes each
  job again when it runs it. ``GPInferSweeper`` checks only a covering set instead: as many jobs
  as the longest list of swept config-group choices, which together use every swept choice of
  every group (5 compositions for the 1200 jobs of ``villacampa2017_uci``: 4 methods, 5
  datasets), so a misspelt group option fails at once and the first job starts within
  seconds. Plain values (``seed``, ``M``) compose alike; each job checks its own.
* **Job folders name every swept key.** Each job gets ``hydra.job.config.override_dirname``'s
  ``exclude_keys`` set to the keys that do not vary (and ``method`` / ``dataset``, already in the
  folder name), so ``hydra.sweep.subdir`` (``conf/config.yaml``) reads
  ``<num>_<method>_<dataset>_M=0.05,seed=3``. The resolver ``gpinfer.swept`` turns the
  ``override_dirname`` into that suffix (empty when nothing else varies).
* **A clean Ctrl-C in every phase.** Every composition (the checks here, and each job's by the
  launcher, through ``_InterruptSafeLoader``) runs with SIGINT deferred to its end
  (``gpinfer.experiment.interrupts``): a Ctrl-C inside OmegaConf would otherwise surface as an
  ``AttributeError`` traceback.
* **A report whatever happens.** ``sweep.json`` in the sweep folder records the planned jobs
  and the swept keys; when a job failed (Hydra raises before its ``on_multirun_end``
  callbacks) or the sweep is interrupted (Ctrl-C, SIGTERM), the sweep report (``SweepReport``,
  if configured) is written here from the jobs that finished, then the error goes on.

Selected in ``conf/config.yaml`` (``override hydra/sweeper: gpinfer``); it takes the basic
sweeper's options (``params``, ``max_batch_size``). No ``from __future__ import annotations``
here: Hydra executes plugin modules outside ``sys.modules``, where dataclasses cannot resolve
string annotations.
"""


import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Override
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from gpinfer.experiment import interrupts

#: batches at least this large are announced
ANNOUNCE_FROM = 50
#: keys always in the job folder's name, so never repeated in its swept-keys suffix
NAMED_KEYS = ("method", "dataset")
#: the resolver that turns ``hydra.job.override_dirname`` into the folder name's suffix
RESOLVER = "gpinfer.swept"


def swept_suffix(override_dirname: str) -> str:
    """``"_" + override_dirname`` with path separators replaced (``""`` when it is empty)."""
    text = str(override_dirname or "").replace("/", "-")
    return f"_{text}" if text else ""


OmegaConf.register_new_resolver(RESOLVER, swept_suffix, replace=True)


@dataclass
class GPInferSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.gpinfer_hydra.sweeper.GPInferSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="gpinfer", node=GPInferSweeperConf,
                             provider="gpinfer")


def covering_jobs(batch: Sequence[Sequence[str]],
                  groups: Collection[str] | None = None) -> list[list[str]]:
    """Jobs that together use every value of every config group swept in ``batch``.

    ``batch``: jobs x overrides (the same keys in the same order in every job, as the basic
    sweeper makes them); ``groups``: the config groups (``method``, ``dataset``, ...; ``None``:
    every key counts as one). Returns ``max |values of a group|`` jobs (at least one), job
    ``i`` taking value ``i mod |values|`` of each key: each is a job of the full sweep (a
    product of the values). A group's choice is what can fail to compose (a missing or broken
    YAML file); a plain value (``seed=3``) is checked by its job, which fails alone.
    """
    if not batch:
        return []
    width = min(len(job) for job in batch)
    values = [list(dict.fromkeys(job[k] for job in batch)) for k in range(width)]
    covered = [v for v in values if groups is None or _key(v[0]) in groups]
    n = max((len(v) for v in covered), default=1)
    return [[v[i % len(v)] for v in values] for i in range(n)]


def _key(override: str) -> str:
    """The key of an override string, without its ``+``, ``++`` or ``~`` prefix."""
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(overrides: Sequence[Override]) -> tuple[list[str], list[str]]:
    """``(keys with several values, keys with one)`` among the parsed sweep ``overrides``."""
    swept: list[str] = []
    fixed: list[str] = []
    for o in overrides:
        several = o.is_sweep_override() and len(list(o.sweep_string_iterator())) > 1
        (swept if several else fixed).append(o.key_or_group)
    return swept, fixed


class _InterruptSafeLoader:
    """Hydra's config loader, each sweep composition with SIGINT deferred to its end."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> Any:
        with interrupts.deferred():
            return self._loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":  # while unpickling (a launcher's worker): not set yet
            raise AttributeError(name)
        return getattr(self._loader, name)


class GPInferSweeper(BasicSweeper):
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        """The basic sweeper's set-up, its launcher given the interrupt-safe config loader."""
        loader: Any = _InterruptSafeLoader(hydra_context.config_loader)  # duck-typed
        safe = HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=safe, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's sweep, with the report written when it fails or is interrupted (see the
        module docstring); ``KeyboardInterrupt`` goes on to ``gpinfer-run``'s exit 130."""
        try:
            interrupts.release()  # composing the primary config is over
            return super().sweep(arguments)
        except BaseException as exc:
            self._report(interrupted=not isinstance(exc, Exception))
            raise

    def split_arguments(self, overrides: list[Override],  # type: ignore[override]
                        max_batch_size: int | None) -> list[list[list[str]]]:
        """The basic sweeper's job lists, each job also told which keys name its folder;
        records them in ``sweep.json``."""
        batches = BasicSweeper.split_arguments(overrides, max_batch_size)
        swept, fixed = swept_keys(overrides)
        exclude = ",".join(dict.fromkeys([*fixed, *NAMED_KEYS]))
        naming = f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]"
        self._write_plan(sum(len(b) for b in batches), swept)
        return [[[*job, naming] for job in batch] for batch in batches]

    def _write_plan(self, n_jobs: int, swept: list[str]) -> None:
        from gpinfer.experiment.report import write_plan

        assert self.config is not None
        write_plan(str(self.config.hydra.sweep.dir), n_jobs, swept)

    def _report(self, interrupted: bool) -> None:
        from gpinfer.experiment.hydra_callbacks import SweepReport

        if self.config is None:
            return
        callbacks = self.config.hydra.get("callbacks") or {}
        if any(str(node.get("_target_", "")).endswith(".SweepReport")
               for node in callbacks.values()):
            SweepReport().report(self.config, interrupted=interrupted)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Compose the covering jobs of ``batch`` (``covering_jobs`` over the config groups
        of the primary config), not all of them."""
        from gpinfer.progress import ProgressBar

        assert self.hydra_context is not None and self.config is not None
        groups = set(OmegaConf.select(self.config, "hydra.runtime.choices", default={}) or {})
        jobs = covering_jobs(batch, groups)
        if len(batch) >= ANNOUNCE_FROM:
            print(f"gpinfer-run: {len(batch)} jobs; checking the configs of the {len(jobs)} that "
                  "use every swept config-group choice", file=sys.stderr, flush=True)
        show = "auto" if len(batch) >= ANNOUNCE_FROM else False
        with ProgressBar(len(jobs), "composing", show=show) as bar:
            for i, overrides in enumerate(jobs, 1):
                self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                bar.update(i)
