"""A run's side process: publishes its model, datasets and figures, its imports done while the
run trains.

MLflow's model code, skops (whose import walks every scikit-learn estimator) and matplotlib take
seconds to import, more than the default run trains. ``PublishWorker.start`` launches
``python -m gpinfer.experiment.publish_worker`` when a run begins; the worker imports them
(``PRELOAD``) while the run checks, loads and trains, then:

1. ``attach``: the run's store and ids (a pickle on the worker's stdin), sent once the run
   exists: the worker opens the store meanwhile;
2. ``submit``: the ``publish.PublishTask`` s after the fit (the model, the datasets, the curves,
   pickled): the worker runs them (``publish.run_parts``) and writes their timings and errors
   as one line on its stdout;
3. ``result``: the run's process waits for that line (``TIMEOUT_S`` at most), so the run ends
   FINISHED only after everything is published; a part that failed, or a worker that died,
   is an error per part (``publish.publish_run`` turns it into a warning and the tag
   ``publish_errors``), never lost.

The worker is in a session of its own (a Ctrl-C at the terminal reaches the run's process
only) and ignores SIGINT; ``close`` (always called, ``started``) kills it when the run ends
without publishing (rejected, failed, interrupted). A worker whose stdin closes exits. Where no
process can be started, or the tasks cannot be pickled, the run publishes in-process.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpinfer.experiment.publish import PublishTask
    from gpinfer.experiment.tracking import RunLogger

#: seconds to wait for the published parts before giving up on them (the run itself is done)
TIMEOUT_S = 300.0
#: what the worker imports before it is needed
PRELOAD = ("mlflow.sklearn", "mlflow.models", "mlflow.data.numpy_dataset", "sklearn.pipeline",
           "sklearn.preprocessing", "gpinfer.estimator", "gpinfer.experiment.publish")
#: the worker's result line starts with this
RESULT_PREFIX = "gpinfer-publish-result "


class PublishWorker:
    """The side process of one run (``start``); see the module docstring."""

    def __init__(self, process: subprocess.Popen[bytes], errors: IO[bytes]) -> None:
        self.process = process
        #: the worker's stderr (a file: a pipe nobody reads could fill up and stall it)
        self.errors = errors

    @classmethod
    def start(cls) -> PublishWorker | None:
        """Launch the worker (it imports meanwhile); ``None`` if no process can be started."""
        errors = tempfile.TemporaryFile()
        # the same modules as here: a plugin on sys.path only (a test's toy plugin) included
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpinfer.experiment.publish_worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env,
                start_new_session=True)
        except OSError:
            errors.close()
            return None
        return cls(process, errors)

    def _send(self, message: Any) -> bool:
        """Pickle ``message`` to the worker; False if it cannot be pickled or the worker is
        gone (nothing half-written: pickled first)."""
        try:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an unpicklable model: publish in-process
            return False
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            return False
        try:
            stdin.write(data)
            stdin.flush()
        except (OSError, ValueError):  # a broken pipe: the worker died
            return False
        return True

    def attach(self, logger: RunLogger) -> bool:
        """Tell the worker the run it publishes to (``logger``'s store and ids, and MLflow's
        environment: the store's credentials, which the run moved there after the worker
        started)."""
        env = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}
        return self._send({"tracking_uri": logger.tracking_uri, "experiment_id":
                           logger.experiment_id, "run_id": logger._require_run(), "env": env})

    def submit(self, tasks: Sequence[PublishTask]) -> bool:
        """Hand the ``tasks`` to the worker; False (the worker is closed) if they cannot be
        sent: the caller publishes them itself."""
        if not self._send(list(tasks)):
            self.close()
            return False
        return True  # stdin is closed by result()'s communicate

    def result(self, names: Sequence[str], timeout: float = TIMEOUT_S
               ) -> tuple[dict[str, float], dict[str, str]]:
        """Wait for the submitted parts ``names``: ``({part: seconds}, {part: error})``; a part
        the worker did not report (it died, or took longer than ``timeout`` s) is an error."""
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            return {}, {name: f"not published within {timeout:.0f} s" for name in names}
        reply: dict[str, Any] = {}
        for line in out.decode(errors="replace").splitlines():
            if line.startswith(RESULT_PREFIX):
                reply = json.loads(line[len(RESULT_PREFIX):])
        timings = {str(k): float(v) for k, v in reply.get("timings", {}).items()}
        errors = {str(k): str(v) for k, v in reply.get("errors", {}).items()}
        missing = [name for name in names if name not in timings]
        if missing:
            why = self._last_error() or f"exit status {self.process.returncode}"
            errors.update({name: f"the publishing process failed: {why}" for name in missing})
        self.close()
        return timings, errors

    def _last_error(self) -> str:
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def close(self) -> None:
        """Stop the worker if it still runs (the run ends without it), and wait for it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.errors):
            if stream is not None and not stream.closed:
                stream.close()


@contextmanager
def started(enabled: bool) -> Iterator[PublishWorker | None]:
    """A worker for the block (``None`` when ``enabled`` is False or none can be started),
    closed at its end whatever happens."""
    worker = PublishWorker.start() if enabled else None
    try:
        yield worker
    finally:
        if worker is not None:
            worker.close()


def main() -> None:
    """The worker: import, then read the run and the tasks from stdin and publish them."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's process decides, and closes us
    results = sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever a part prints stays off the result line
    for name in PRELOAD:
        importlib.import_module(name)
    from gpinfer.experiment.publish import run_parts
    from gpinfer.experiment.safe_model import import_skops_io
    from gpinfer.experiment.tracking import AttachedRun
    from gpinfer.plots import _pyplot

    import_skops_io()
    _pyplot()  # matplotlib with the Agg backend
    stdin = sys.stdin.buffer
    try:
        target = pickle.load(stdin)  # noqa: S301 - written by the run's own process
    except EOFError:  # the run ended before it started (rejected, interrupted)
        return
    os.environ.update(target["env"])
    run = AttachedRun(target["tracking_uri"], target["experiment_id"], target["run_id"])
    try:
        run.client.get_run(run.run_id)  # opens the store while the run trains
    except Exception:  # noqa: BLE001 - the parts report the store's trouble themselves
        pass
    try:
        tasks = pickle.load(stdin)  # noqa: S301
    except EOFError:  # the run ended without publishing (failed, interrupted)
        return
    timings, errors = run_parts(run, tasks)
    results.write((RESULT_PREFIX + json.dumps({"timings": timings, "errors": errors})
                   + "\n").encode())
    results.flush()


if __name__ == "__main__":
    main()
