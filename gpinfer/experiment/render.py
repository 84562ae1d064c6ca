"""A run's figures drawn in a separate process, off the run's critical path.

Matplotlib's import and the drawing take about as long as logging the model; ``FigureJob.start``
hands what the figures need to ``python -m gpinfer.experiment.render`` (a pickle on its stdin)
and returns at once, the run logs the model and the datasets meanwhile, and ``FigureJob.finish``
waits for the PNGs and uploads them (``figures.draw_figures`` / ``figures.upload_figures``). The
run's own process never imports matplotlib. Where no process can be started the figures are
drawn in-process, as before.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from gpinfer.experiment.figures import TrainingCurve, draw_figures, upload_figures
from gpinfer.experiment.tracking import RunLogger

#: seconds to wait for the figures before giving up on them (the run itself is done)
TIMEOUT_S = 300.0


@dataclass
class FigureJob:
    """The figures of one run: being drawn by ``process``, or (``process is None``) to be
    drawn in-process by ``finish``."""

    out_dir: Path
    payload: dict[str, Any]
    process: subprocess.Popen[bytes] | None = None
    #: the worker's stderr (a file: a pipe nobody reads could fill up and stall it)
    errors: IO[bytes] | None = None

    @classmethod
    def start(cls, out_dir: str | os.PathLike[str], curve: TrainingCurve, title: str,
              y_test: np.ndarray | None = None, P_test: np.ndarray | None = None) -> FigureJob:
        """Start drawing (``y_test [N*]`` class indices and ``P_test [N*, C]`` for a
        classifier's reliability diagram); returns without waiting."""
        payload = {"out_dir": str(out_dir), "curve": curve, "title": title,
                   "y_test": y_test, "P_test": P_test}
        job = cls(Path(out_dir), payload, errors=tempfile.TemporaryFile())
        try:
            job.process = subprocess.Popen(
                [sys.executable, "-m", "gpinfer.experiment.render"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=job.errors)
            assert job.process.stdin is not None
            with job.process.stdin:
                pickle.dump(payload, job.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError:  # no process to spare (or it died at once): draw in-process at finish
            if job.process is not None:
                job.process.kill()
                job.process.wait()
            job.process = None
            if job.errors is not None:
                job.errors.close()
        return job

    def finish(self, logger: RunLogger) -> None:
        """Wait for the PNGs (``RuntimeError`` with the worker's error if it failed) and upload
        them to the run."""
        if self.process is None:
            draw_figures(self.out_dir, **{k: v for k, v in self.payload.items()
                                          if k != "out_dir"})
        else:
            try:
                self.process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"the figures took more than {TIMEOUT_S:.0f} s") from None
            finally:
                err = b""
                if self.errors is not None:
                    self.errors.seek(0)
                    err = self.errors.read()
                    self.errors.close()
            if self.process.returncode != 0:
                lines = err.decode(errors="replace").strip().splitlines() or ["no message"]
                raise RuntimeError(f"drawing the figures failed: {lines[-1]}")
        upload_figures(logger, self.out_dir)


def main() -> None:
    """The worker: read the payload from stdin and draw the figures."""
    payload = pickle.load(sys.stdin.buffer)  # noqa: S301 - written by the parent run
    draw_figures(Path(payload.pop("out_dir")), **payload)


if __name__ == "__main__":
    main()
