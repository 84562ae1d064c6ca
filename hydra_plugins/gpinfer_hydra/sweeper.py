"""Hydra's basic sweeper with progress while it composes the jobs' configs.

Before launching a batch, Hydra composes every job's config to catch errors early: for the
1200 jobs of a paper protocol that is minutes of silence. ``GPInferSweeper`` says so in one
line and, on a terminal, draws a bar (``gpinfer.progress``). A sweep with failed jobs still
gets its report (Hydra skips ``on_multirun_end`` then). Selected in ``conf/config.yaml``
(``override hydra/sweeper: gpinfer``); it takes the basic sweeper's options (``params``,
``max_batch_size``). No ``from __future__ import annotations`` here: Hydra executes plugin
modules outside ``sys.modules``, where dataclasses cannot resolve string annotations.
"""


import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore

#: batches at least this large are announced
ANNOUNCE_FROM = 50


@dataclass
class GPInferSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.gpinfer_hydra.sweeper.GPInferSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="gpinfer", node=GPInferSweeperConf,
                             provider="gpinfer")


class GPInferSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's sweep; when a job failed, Hydra raises before its ``on_multirun_end``
        callbacks, so the sweep report (``SweepReport``, if configured) is written here first:
        the runs that finished are reported, the failed ones counted."""
        try:
            return super().sweep(arguments)
        except Exception:
            self._report()
            raise

    def _report(self) -> None:
        from gpinfer.experiment.hydra_callbacks import SweepReport

        callbacks = (self.config.hydra.get("callbacks") or {}) if self.config else {}
        if any(str(node.get("_target_", "")).endswith(".SweepReport")
               for node in callbacks.values()):
            SweepReport().on_multirun_end(self.config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if len(batch) < ANNOUNCE_FROM:
            super().validate_batch_is_legal(batch)
            return
        from gpinfer.progress import ProgressBar

        print(f"gpinfer-run: composing the configs of {len(batch)} jobs before the first starts",
              file=sys.stderr, flush=True)
        assert self.hydra_context is not None and self.config is not None
        with ProgressBar(len(batch), "composing", show="auto") as bar:
            for i, overrides in enumerate(batch, 1):
                self.hydra_context.config_loader.load_sweep_config(
                    master_config=self.config, sweep_overrides=list(overrides))
                bar.update(i)
