"""Hydra callbacks of ``gpinfer-run`` (registered under ``hydra.callbacks`` in
``conf/config.yaml``):

* ``SweepReport``: at the end of every multirun (and, through the sweeper, of a failed or
  interrupted one), the sweep report (``gpinfer.experiment.report``) into the sweep folder,
  logged to MLflow, and its table printed;
* ``ProtocolNotice``: before a paper protocol (``+experiment=...``) starts, what it needs: the
  number of jobs, the data files and whether they are there, and the time it takes.

Hydra turns exceptions raised by callbacks into warnings with a traceback, so both print one
line on any problem instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from gpinfer.errors import GPInferError


class SweepReport(Callback):
    """Write and print the sweep report when a multirun ends (``report``; the sweeper calls it
    too when the sweep failed or was interrupted)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.report(config)

    @staticmethod
    def report(config: DictConfig, interrupted: bool = False) -> None:
        """The report of the sweep folder ``config.hydra.sweep.dir`` from the jobs that ended
        there (``interrupted``: said so in the report); one line on stderr on any problem."""
        from gpinfer.experiment import report, tracking

        folder = Path(str(config.hydra.sweep.dir))
        try:
            records = report.collect_folder(folder)
            uri = tracking.resolve_tracking_uri(config.get("mlflow", {}).get("tracking_uri"))
            done = report.write_report(records, folder, str(folder), tracking_uri=uri,
                                       plan=report.read_plan(folder, interrupted))
        except GPInferError as exc:
            reason = str(exc).removeprefix("gpinfer report: ")
            print(f"gpinfer-run: no sweep report: {reason}", file=sys.stderr, flush=True)
            return
        except Exception as exc:  # noqa: BLE001 - a report must never turn a sweep into a failure
            print(f"gpinfer-run: sweep report failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            return
        print(f"\nSweep report ({done.summary}): {folder / report.REPORT_MD}\n"
              f"{done.markdown}", flush=True)
        if done.mlflow_error:
            print(f"gpinfer-run: the report was not logged to MLflow: {done.mlflow_error}",
                  file=sys.stderr, flush=True)


class ProtocolNotice(Callback):
    """Print a protocol's requirements (the config's ``protocol`` node) before it starts."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._notice(config)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._notice(config)

    @staticmethod
    def _notice(config: DictConfig) -> None:
        node = config.get("protocol")
        if not node:
            return
        from gpinfer.experiment.protocols import describe

        params = config.hydra.sweeper.get("params")
        try:
            text = describe(OmegaConf.to_container(node, resolve=True),  # type: ignore[arg-type]
                            OmegaConf.to_container(params) if params else {})  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - a notice must not stop the protocol
            text = f"protocol {node.get('name', '?')}: ({type(exc).__name__}: {exc})"
        print(text, file=sys.stderr, flush=True)
