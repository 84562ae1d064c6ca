"""A run's figures drawn in a separate process, off the run's critical path.

Matplotlib's import and the drawing take about as long as logging the model. The run starts the
worker (``python -m gpinfer.experiment.render``) with ``FigureJob.spawn`` before it trains; the
worker imports matplotlib meanwhile, on another core where there is one, and waits for its
payload. After the fit, ``FigureJob.submit`` hands it what the figures need (a pickle on its
stdin) and returns at once; the run logs the model and the datasets meanwhile, and
``FigureJob.finish`` waits for the PNGs and uploads them (``figures.draw_figures`` /
``figures.upload_figures``). A run that ends before its figures closes the worker's stdin
(``FigureJob.cancel``): the worker exits without drawing; so does the worker of a run killed
outright. The worker runs in a session of its own and ignores SIGINT: Ctrl-C is the run's.
``FigureJob.start`` spawns and submits at once. The run's own process never imports
matplotlib. Where no process can be started the figures are drawn in-process, as before.
"""

from __future__ import annotations

import os
import pickle
import signal
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
#: seconds a cancelled worker gets to exit before it is killed
CANCEL_TIMEOUT_S = 5.0


@dataclass
class FigureJob:
    """The figures of one run: a worker ``process`` started, given its ``payload`` by
    ``submit``, or (``process is None``) figures to be drawn in-process by ``finish``."""

    out_dir: Path
    payload: dict[str, Any] | None = None
    process: subprocess.Popen[bytes] | None = None
    #: the worker's stderr (a file: a pipe nobody reads could fill up and stall it)
    errors: IO[bytes] | None = None

    @classmethod
    def spawn(cls, out_dir: str | os.PathLike[str]) -> FigureJob:
        """Start the worker now (it imports matplotlib, then waits for ``submit``)."""
        job = cls(Path(out_dir), errors=tempfile.TemporaryFile())
        try:
            job.process = subprocess.Popen(
                [sys.executable, "-m", "gpinfer.experiment.render"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=job.errors,
                start_new_session=True)  # a terminal's Ctrl-C reaches the run, not the worker
        except OSError:  # no process to spare: draw in-process at finish
            job._drop_worker()
        return job

    @classmethod
    def start(cls, out_dir: str | os.PathLike[str], curve: TrainingCurve, title: str,
              y_test: np.ndarray | None = None, P_test: np.ndarray | None = None) -> FigureJob:
        """``spawn`` and ``submit`` at once; returns without waiting."""
        job = cls.spawn(out_dir)
        job.submit(curve, title, y_test, P_test)
        return job

    def submit(self, curve: TrainingCurve, title: str, y_test: np.ndarray | None = None,
               P_test: np.ndarray | None = None) -> None:
        """Hand the worker what it draws (``y_test [N*]`` class indices and ``P_test [N*, C]``
        for a classifier's reliability diagram); returns without waiting."""
        self.payload = {"curve": curve, "title": title, "y_test": y_test, "P_test": P_test}
        if self.process is None:
            return
        assert self.process.stdin is not None
        try:
            with self.process.stdin:
                pickle.dump({"out_dir": str(self.out_dir), **self.payload}, self.process.stdin,
                            protocol=pickle.HIGHEST_PROTOCOL)
        except OSError:  # the worker died (it could not start): draw in-process at finish
            self._drop_worker()

    def cancel(self) -> None:
        """End a worker that was given nothing to draw (the run ended before its figures)."""
        if self.process is None or self.payload is not None:
            return
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()  # end of file: the worker exits without drawing
            self.process.wait(timeout=CANCEL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._drop_worker()

    def _drop_worker(self) -> None:
        """Kill the worker if it runs and forget it (figures, if any, are drawn in-process)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            if self.process.stdin is not None:
                try:
                    self.process.stdin.close()
                except OSError:  # a broken pipe: nothing more to send anyway
                    pass
        self.process = None
        if self.errors is not None:
            self.errors.close()
            self.errors = None

    def finish(self, logger: RunLogger) -> None:
        """Wait for the PNGs (``RuntimeError`` with the worker's error if it failed) and upload
        them to the run."""
        if self.payload is None:
            raise RuntimeError("FigureJob.finish before submit: nothing to draw")
        if self.process is None:
            draw_figures(self.out_dir, **self.payload)
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
    """The worker: import matplotlib, read the payload from stdin, draw the figures; exit
    without drawing at an empty stdin (the run ended before its figures)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's; it closes our stdin
    from gpinfer.plots import _pyplot

    _pyplot()  # matplotlib, imported while the run trains
    data = sys.stdin.buffer.read()
    if not data:
        return
    payload = pickle.loads(data)  # noqa: S301 - written by the parent run
    draw_figures(Path(payload.pop("out_dir")), **payload)


if __name__ == "__main__":
    main()
