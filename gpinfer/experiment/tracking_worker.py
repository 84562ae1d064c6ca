"""MLflow off the run's critical path: a tracking worker process that owns the run's ``RunLogger``.

``gpinfer-run`` starts the worker (``start``) before Hydra composes the config: the worker
imports MLflow (and its SQLAlchemy store, about 2 CPU s) while the run's process composes,
loads the data and trains, on the machine's other core. The run's process never imports MLflow:
``open_logger`` gives it a ``RemoteRunLogger``, which has ``RunLogger``'s interface and sends
every call to the worker over a pipe, in order; the worker makes the call on its own
``RunLogger`` and answers with the result or the exception, which the run raises as it would
have raised the call itself. ``log_metrics``, ``log_artifact`` and ``log_artifacts`` do not
wait for their answer (the next call that does raises an error they had); every other call
waits. What needs MLflow's client beyond that (the model, the datasets) is sent as a function
to ``RunLogger.apply`` and runs in the worker. Once the run has started, the worker imports
what the run's publishing will need (``WARM_UPS``: scikit-learn, skops and ``mlflow.sklearn``
for the model, ``mlflow.data`` for the datasets) while it has nothing to do.

The worker ignores SIGINT and SIGTERM: a Ctrl-C (sent to the whole process group) or a SIGTERM
is the run's, which then ends its MLflow run KILLED through the worker. The worker exits at the
end of its input: when ``close`` closes the pipe (``close`` waits for it up to
``CLOSE_TIMEOUT_S``, then kills it and says so), or when the run's process dies. Secrets: the
worker gets MLflow's environment variables with each ``open`` (the credentials taken from a
tracking URI, ``credentials.take_credentials``), never through its command line; everything the
run sends goes through ``RunLogger`` as before, so ``redact`` applies as before.

``run_experiment`` called in a process without a worker (a library call, a test, a parallel
launcher's job) uses an in-process ``RunLogger``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpinfer.experiment.tracking import FINISHED, RunContext

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from gpinfer.experiment.tracking import RunLogger

#: seconds ``close`` waits for the worker's last calls before it kills it
CLOSE_TIMEOUT_S = 120.0
#: what each publishing setting (``mlflow.<key>``, on by default) imports: the worker imports
#: it once the run has started, while it has nothing to do (``warm_ups``)
WARM_UPS = {"log_model": ("sklearn.pipeline", "sklearn.preprocessing", "skops.io",
                          "mlflow.sklearn"),
            "log_datasets": ("mlflow.data",)}
#: calls that do not wait for their answer
_NO_WAIT = frozenset({"log_metrics", "log_artifact", "log_artifacts"})

_worker: TrackingWorker | None = None


class WorkerError(RuntimeError):
    """The tracking worker died or answered with something that is not an answer."""


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while a message crosses the pipe (a ``KeyboardInterrupt`` in
    the middle of one would leave half of it there); delivered right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class TrackingWorker:
    """The parent's end of the worker: the process and the two pipes."""

    def __init__(self) -> None:
        from multiprocessing.connection import Connection

        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        package_root = str(Path(__file__).resolve().parents[2])  # the same gpinfer as ours
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [env.get("PYTHONPATH")])])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpinfer.experiment.tracking_worker",
             str(requests_read), str(answers_write)],
            pass_fds=(requests_read, answers_write), stdin=subprocess.DEVNULL, env=env)
        os.close(requests_read)
        os.close(answers_write)
        self.owner = os.getpid()
        self.requests: Connection = Connection(requests_write, readable=False)
        self.answers: Connection = Connection(answers_read, writable=False)
        self.pending = 0  # requests sent whose answer is not read yet
        self.used = False  # a run sent something (else ``close`` need not wait)
        self.state: tuple[str | None, str | None] | None = None  # the run id and status

    def call(self, name: str, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None,
             wait: bool = True) -> Any:
        """Send ``name(*args, **kwargs)``; with ``wait``, read every answer due and return this
        call's result (raising the first error among them)."""
        self._send(("call", name, args, dict(kwargs or {})))
        return self.collect() if wait else None

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with _signals_held():
                self.requests.send(message)
        except OSError as exc:
            raise WorkerError(f"the MLflow tracking worker is gone ({self._exit_status()})"
                              ) from exc
        self.pending += 1
        self.used = True

    def collect(self) -> Any:
        """Read the answers due, in order; the last one's result, or the first error."""
        error: BaseException | None = None
        result: Any = None
        while self.pending:
            try:
                with _signals_held():  # a signal held meanwhile is raised on leaving, when
                    kind, value, self.state = self.answers.recv()  # the answer is counted
                    self.pending -= 1
            except (EOFError, OSError) as exc:
                raise WorkerError(f"the MLflow tracking worker ended before answering "
                                  f"({self._exit_status()})") from exc
            if kind == "error" and error is None:
                error = value
            result = value
        if error is not None:
            raise error
        return result

    def drain(self) -> None:
        """Read the answers due and drop them (errors included)."""
        try:
            self.collect()
        except WorkerError:
            raise
        except Exception:  # noqa: BLE001, S110 - an earlier run's error, reported there
            pass

    def _exit_status(self) -> str:
        code = self.process.poll()
        return "still running" if code is None else f"exit status {code}"

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """End of input for the worker; wait for it to finish its calls (``timeout`` seconds,
        then it is killed, with a line on stderr saying so). A worker no run used (``--help``,
        ``--cfg``, a rejected command line) is killed at once: nothing of it is lost."""
        for conn in (self.requests, self.answers):
            conn.close()
        if not self.used:
            self.process.kill()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            print(f"gpinfer-run: the MLflow tracking worker did not finish within {timeout:.0f} s "
                  "and was killed; the last calls may be missing from the run",
                  file=sys.stderr, flush=True)


class RemoteRunLogger(RunContext):
    """``RunLogger``'s interface, its calls made by the worker (``tracking_uri``,
    ``experiment_name``, ``run_id`` and ``status`` kept here)."""

    def __init__(self, worker: TrackingWorker, tracking_uri: str, experiment: str = "gpinfer",
                 warm: list[str] | None = None, **options: Any) -> None:
        self.worker = worker
        self.tracking_uri = tracking_uri
        self.experiment_name = str(experiment)
        self.run_id: str | None = None
        self.status: str | None = None
        worker.drain()  # what an earlier run (a sweep's job) left unread is not ours
        env = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
        # not waited for: the worker opens the store while the run loads its data (``ready``)
        self.worker.call("open", (tracking_uri, experiment, env, options, warm or []),
                         wait=False)

    def ready(self) -> None:
        """Wait for the store to be open (``InputError`` naming a bad one)."""
        self._call("ready")

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.worker.call(name, args, kwargs, wait=name not in _NO_WAIT)
        finally:
            state = getattr(self.worker, "state", None)
            if state is not None:
                self.run_id, self.status = state

    def start(self, run_name: str, tags: Mapping[str, Any] | None = None,
              params: Mapping[str, Any] | None = None) -> str:
        return str(self._call("start", run_name, tags=dict(tags or {}), params=dict(params or {})))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._call("set_tags", dict(tags))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", dict(metrics), step)

    def log_final(self, metrics: Mapping[str, float | None], step: int) -> None:
        self._call("log_final", dict(metrics), step)

    def flush(self) -> None:
        self._call("flush")

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        self._call("log_artifact", str(path), artifact_path=artifact_path)

    def log_artifacts(self, folder: str | os.PathLike[str], artifact_path: str | None = None
                      ) -> None:
        self._call("log_artifacts", str(folder), artifact_path=artifact_path)

    def host_tags(self, pid: int | None = None) -> dict[str, str]:
        return dict(self._call("host_tags", os.getpid() if pid is None else pid))

    def end_stale_runs(self) -> list[tuple[str, str, str]]:
        return list(self._call("end_stale_runs"))

    def apply(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._call("apply", function, *args, **kwargs)

    def end(self, status: str = FINISHED) -> None:
        self._call("end", status)


def warm_ups(settings: Mapping[str, Any]) -> list[str]:
    """The modules the run's publishing will import (``WARM_UPS``) under its ``mlflow``
    ``settings``."""
    return [name for key, names in WARM_UPS.items() if settings.get(key, True) for name in names]


def start() -> None:
    """Start this process's tracking worker (``gpinfer-run``, before composing); a worker that
    cannot start leaves the runs to an in-process ``RunLogger``."""
    global _worker
    if _worker is None:
        try:
            _worker = TrackingWorker()
        except OSError as exc:
            print(f"gpinfer-run: no MLflow tracking worker ({exc}); logging in-process",
                  file=sys.stderr)


def stop() -> None:
    """Close this process's worker, if any (waits for its last calls)."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None and worker.owner == os.getpid():
        worker.close()


def open_logger(tracking_uri: str, experiment: str = "gpinfer",
                publishing: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """The run's logger: a ``RemoteRunLogger`` through this process's worker when it has one
    (importing what ``publishing``, the run's ``mlflow`` settings, will need: ``warm_ups``),
    else ``RunLogger(tracking_uri, experiment, **options)`` in this process."""
    if _worker is not None and _worker.owner == os.getpid():
        return RemoteRunLogger(_worker, tracking_uri, experiment,
                               warm=warm_ups(publishing or {}), **options)
    from gpinfer.experiment.tracking import RunLogger

    return RunLogger(tracking_uri, experiment, **options)


# --------------------------------------------------------------------------------------------
# the worker's side
# --------------------------------------------------------------------------------------------


class _Served:
    """The worker's calls: ``open`` makes the ``RunLogger``, the rest are its methods."""

    def __init__(self) -> None:
        self.logger: RunLogger | None = None
        self.warm: list[str] = []  # imported now, while nothing is asked
        self.warm_later: list[str] = []  # once the run has started

    def open(self, tracking_uri: str, experiment: str, env: Mapping[str, str],
             options: Mapping[str, Any], warm: list[str]) -> None:
        from gpinfer.experiment.tracking import RunLogger

        os.environ.update(env)  # the credentials the run took from the URI
        self.logger = None
        self.logger = RunLogger(tracking_uri, experiment, **options)
        self.warm_later = [name for name in warm if name not in sys.modules]

    def start(self, *args: Any, **kwargs: Any) -> str:
        """Start the run; then warm up for publishing (``WARM_MODULES``) while the run trains."""
        assert self.logger is not None
        run_id = self.logger.start(*args, **kwargs)
        self.warm, self.warm_later = self.warm_later, []
        return run_id

    def state(self) -> tuple[str | None, str | None]:
        return (None, None) if self.logger is None else (self.logger.run_id, self.logger.status)

    def call(self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name == "open":
            return self.open(*args, **kwargs)
        if name == "ready":
            return None
        if self.logger is None:
            raise WorkerError(f"{name}: the MLflow store is not open")
        if name == "start":
            return self.start(*args, **kwargs)
        return getattr(self.logger, name)(*args, **kwargs)

    def warm_up(self) -> None:
        """Import the next module publishing will need (its import errors are left to the
        call that needs it)."""
        import importlib

        name = self.warm.pop(0)
        try:
            if name == "skops.io":  # as publishing imports it (not importing PyTorch)
                from gpinfer.experiment.safe_model import import_skops_io

                import_skops_io()
            else:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001, S110 - the publishing step reports it
            pass


def _answerable(exc: BaseException) -> BaseException:
    """``exc`` itself when it survives pickling, else a ``WorkerError`` with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes
        return exc
    except Exception:  # noqa: BLE001
        return WorkerError(f"{type(exc).__name__}: {exc}")


def serve(requests: Connection, answers: Connection) -> None:
    """Answer the run's calls until the end of its input."""
    served = _Served()
    while True:
        while served.warm and not requests.poll(0):
            served.warm_up()
        try:
            message = requests.recv()
        except (EOFError, OSError):
            return
        _, name, args, kwargs = message
        try:
            answer: tuple[Any, ...] = ("ok", served.call(name, args, kwargs), served.state())
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the run
            answer = ("error", _answerable(exc), served.state())
        try:
            answers.send(answer)
        except OSError:  # the run is gone
            return


def main(argv: list[str] | None = None) -> None:
    """``python -m gpinfer.experiment.tracking_worker REQUESTS_FD ANSWERS_FD``."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's: it ends it KILLED
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    argv = sys.argv[1:] if argv is None else argv
    requests = Connection(int(argv[0]), writable=False)
    answers = Connection(int(argv[1]), readable=False)
    import mlflow.tracking  # noqa: F401 - the import the worker is for, while the run composes

    serve(requests, answers)


if __name__ == "__main__":
    main()
