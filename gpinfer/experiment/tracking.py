"""MLflow logging for one run: params, tags, batched per-iteration metrics, artifacts, status.

Where runs go: ``mlflow.tracking_uri`` from the config when set, else ``$MLFLOW_TRACKING_URI``,
else the SQLite store ``<repo>/outputs/mlflow.db`` with artifacts in ``<repo>/outputs/mlartifacts``.
For any SQLite store the experiment is created with its artifact location set explicitly (next to
the database file), so artifacts never land in whatever folder the run was started from.

``RunLogger`` checks the store before training (an unwritable store is an ``InputError`` naming
it), buffers metrics and sends them with ``log_batch`` (every ``flush_every`` values or every
``flush_interval_s`` seconds, and at the end), and ends the run FINISHED, FAILED (an exception)
or KILLED (Ctrl-C / SIGTERM), flushing what it had buffered first so that nothing logged is lost.

A run's final numbers go through ``log_final``: sent at once, never skipped, each key at most
once and never also a per-iteration key, so that MLflow's value of the key (its latest, which the
UI's runs table and ``gpinfer report`` show) is exactly the number the run reports.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlparse

import numpy as np

from gpinfer.errors import InputError
from gpinfer.experiment import interrupts
from gpinfer.experiment.redact import redact_text, redact_uri

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from gpinfer.interfaces import FitResult

#: the repository root (this file is ``<repo>/gpinfer/experiment/tracking.py``)
REPO_ROOT = Path(__file__).resolve().parents[2]
#: the default SQLite store and artifact folder
DEFAULT_STORE = REPO_ROOT / "outputs" / "mlflow.db"
DEFAULT_ARTIFACTS = REPO_ROOT / "outputs" / "mlartifacts"

#: longest parameter / tag value sent (MLflow allows 6000 / 8000 characters)
MAX_PARAM_CHARS = 500
MAX_TAG_CHARS = 5000
#: MLflow's per-request limits for log_batch
_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_BATCH_TAGS = 100

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"

_P = ParamSpec("_P")
_R = TypeVar("_R")
#: tag refreshed with every metric batch: the run's process was alive then (ms since the
#: epoch; read by ``stale_runs``)
HEARTBEAT_TAG = "gpinfer.heartbeat"

#: tags of every experiment gpinfer creates: MLflow 3 opens a ``custom_model_development``
#: experiment in its model-training view (runs table with metric columns), not the GenAI one
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


# --------------------------------------------------------------------------------------------
# where the store is
# --------------------------------------------------------------------------------------------


def default_tracking_uri() -> str:
    """``sqlite:///<repo>/outputs/mlflow.db``."""
    return f"sqlite:///{DEFAULT_STORE}"


def resolve_tracking_uri(configured: str | None = None) -> str:
    """The store to use: ``configured``, else ``$MLFLOW_TRACKING_URI``, else the default; the
    credentials of an http(s) URI move to MLflow's environment variables
    (``credentials.take_credentials``), so the URI returned holds none."""
    from gpinfer.experiment.credentials import take_credentials

    if configured:
        return take_credentials(str(configured))
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return take_credentials(env) if env else default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///path`` URI (``None`` for other URIs or in-memory)."""
    if not uri.startswith("sqlite:"):
        return None
    rest = uri[len("sqlite:") :]
    if not rest.startswith("///") or len(rest) == 3:
        return None  # sqlite:// (in memory) or malformed
    return Path(rest[3:].split("?", 1)[0])


def _local_file_store(uri: str) -> Path | None:
    """The folder of a local file store (``file:`` URI or a plain path), else ``None``."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return Path(uri)
    return None


def default_artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go to ``<db folder>/mlartifacts`` (``None``: MLflow decides)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    if db.resolve() == DEFAULT_STORE.resolve():
        return DEFAULT_ARTIFACTS.resolve().as_uri()
    return (db.resolve().parent / "mlartifacts").as_uri()


def check_store_writable(uri: str) -> None:
    """For local stores, prove the folder (and the database file) writable; else ``InputError``."""
    db = sqlite_path(uri)
    target = db.parent if db is not None else _local_file_store(uri)
    if target is None:
        return  # a server: checked by contacting it
    what = f"MLflow store {redact_uri(uri)!r}"
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{what}: cannot create folder {str(target)!r} ({exc.strerror or exc}); set "
            "MLFLOW_TRACKING_URI or mlflow.tracking_uri=... to a writable store"
        ) from exc
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(
            f"{what}: folder {str(target)!r} is not writable; set MLFLOW_TRACKING_URI or "
            "mlflow.tracking_uri=... to a writable store"
        )
    if db is not None and db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise InputError(
            f"{what}: database file {str(db)!r} is not writable; set MLFLOW_TRACKING_URI or "
            "mlflow.tracking_uri=... to a writable store"
        )


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<db>.lock`` while a SQLite store is set up (POSIX only).

    The jobs of a parallel sweep start together; without the lock two of them may both try to
    create the tables of a new database, and one fails.
    """
    db = sqlite_path(uri)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None  # type: ignore[assignment]
    if db is None or fcntl is None:
        yield
        return
    with open(db.with_name(db.name + ".lock"), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# what is logged
# --------------------------------------------------------------------------------------------


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marking the cut with ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings to ``{"a.b.c": "value"}`` (lists and scalars as text, values truncated)."""
    out: dict[str, str] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if value:
                out.update(flatten_config(value, prefix=f"{name}."))
            else:
                out[name] = "{}"
        else:
            out[name] = truncate("null" if value is None else str(value), MAX_PARAM_CHARS)
    return out


def unique_run_name(parts: list[str]) -> str:
    """A readable run name, unique within its experiment: ``<parts joined by ->-<6 hex>``
    (e.g. ``sep-waveform-rbf-s0-3fa2c1``); runs with equal settings no longer share a name."""
    import secrets

    return "-".join([*parts, secrets.token_hex(3)])


def git_commit(repo: Path = REPO_ROOT) -> str:
    """``git rev-parse HEAD`` of ``repo`` (``"unknown"`` when git or the checkout is missing)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else "unknown"


def git_dirty(repo: Path = REPO_ROOT) -> str:
    """``"true"`` when tracked files differ from ``HEAD``, ``"false"``, or ``"unknown"``."""
    try:
        done = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if done.returncode != 0:
        return "unknown"
    return "true" if done.stdout.strip() else "false"


def plugin_distribution(method: str) -> tuple[str, str]:
    """``(distribution, version)`` registering ``method`` (``("unknown", "unknown")`` if none)."""
    from gpinfer import registry

    try:
        for entry in registry.entries(registry.METHODS):
            if entry.name == method:
                return entry.dist, entry.version
    except Exception:  # metadata trouble must not stop a run from being logged
        pass
    return "unknown", "unknown"


def collect_state(fit: FitResult, extra: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The fitted state to save: ``FitResult.state``, ``posterior.*`` and ``kernel.*`` arrays.

    Values that are not numeric arrays (objects, strings that numpy cannot store without pickle)
    are skipped.
    """
    arrays: dict[str, Any] = dict(fit.state or {})
    try:
        for key, value in (fit.posterior.state() or {}).items():
            arrays[f"posterior.{key}"] = value
    except Exception:  # a posterior without a usable state() still has its FitResult.state
        pass
    kernels = fit.kernel if isinstance(fit.kernel, list | tuple) else [fit.kernel]
    for i, kern in enumerate(kernels):
        getter = getattr(kern, "get_unconstrained", None)
        if callable(getter):
            try:
                arrays[f"kernel.{i}.theta"] = getter()
                names = getattr(kern, "param_names", None)
                if names is not None:
                    arrays[f"kernel.{i}.param_names"] = np.array([str(n) for n in names])
            except Exception:
                pass
    arrays.update(extra or {})
    out: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype != object:
            out[str(key)] = arr
    return out


def save_state(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> Path:
    """``np.savez_compressed`` the arrays to ``path`` (loadable without pickle)."""
    path = Path(path)
    # numpy's stub types the keyword arrays as possibly ``allow_pickle``: a plain dict of them
    named: dict[str, Any] = {str(key): value for key, value in arrays.items()}
    np.savez_compressed(path, **named)
    return path


# --------------------------------------------------------------------------------------------
# the logger
# --------------------------------------------------------------------------------------------


def store_call(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``method`` (a call into MLflow's store) with Ctrl-C deferred until it returns
    (``interrupts.deferred``; only under ``gpinfer-run``).

    A SIGINT that lands inside SQLite's or MLflow's own code surfaces there as a store error
    (``OperationalError: interrupted``, logged by MLflow with its traceback), or leaves a run
    created but not marked; deferred, it becomes a ``KeyboardInterrupt`` as soon as the call is
    complete, and the run ends KILLED with one line.
    """

    @functools.wraps(method)
    def deferring(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with interrupts.deferred():
            return method(*args, **kwargs)

    return deferring


class RunLogger:
    """One MLflow run through ``MlflowClient``: params, tags, batched metrics, artifacts, status.

    Construction opens the store and finds (or creates) the experiment, so a bad store fails
    here, before any training, with an ``InputError`` naming it.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str = "gpinfer",
        *,
        artifact_location: str | None = None,
        flush_every: int = 100,
        flush_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if int(flush_every) < 1 or float(flush_interval_s) < 0:
            raise InputError("mlflow.flush_every must be >= 1 and mlflow.flush_interval_s >= 0")
        self.tracking_uri = tracking_uri
        self.experiment_name = str(experiment)
        self.flush_every = min(int(flush_every), _BATCH_METRICS)
        self.flush_interval_s = float(flush_interval_s)
        self._clock = clock
        self._buffer: list[Any] = []
        self._seen: set[tuple[str, int]] = set()
        #: keys of the per-iteration history and of the final numbers (kept apart)
        self._history_keys: set[str] = set()
        self._final_keys: set[str] = set()
        self._last_flush = clock()
        self.run_id: str | None = None
        self.status: str | None = None
        check_store_writable(tracking_uri)
        self.client: MlflowClient = self._open_client()
        location = artifact_location or default_artifact_location(tracking_uri)
        self.experiment_id = self._experiment(location)

    # -- set-up ------------------------------------------------------------------------------
    @store_call
    def _open_client(self) -> MlflowClient:
        from mlflow.tracking import MlflowClient

        try:
            with _store_lock(self.tracking_uri):  # parallel jobs must not create tables twice
                client = MlflowClient(tracking_uri=self.tracking_uri)
                client.get_experiment_by_name(self.experiment_name)  # touches the store
        except Exception as exc:
            raise InputError(
                f"MLflow store {redact_uri(self.tracking_uri)!r} cannot be used: "
                f"{type(exc).__name__}: "
                f"{truncate(redact_text(str(exc), self.tracking_uri), 400)}. Set "
                "MLFLOW_TRACKING_URI or mlflow.tracking_uri=... to a reachable, writable store"
            ) from exc
        return client

    @store_call
    def _experiment(self, artifact_location: str | None) -> str:
        try:
            with _store_lock(self.tracking_uri):
                exp = self.client.get_experiment_by_name(self.experiment_name)
                if exp is None:
                    try:
                        return self.client.create_experiment(
                            self.experiment_name, artifact_location=artifact_location,
                            tags=dict(EXPERIMENT_TAGS),
                        )
                    except Exception:
                        # another process (a server's client, say) created it meanwhile
                        exp = self.client.get_experiment_by_name(self.experiment_name)
                        if exp is None:
                            raise
                for key, value in EXPERIMENT_TAGS.items():  # experiments made before the tag
                    if exp.lifecycle_stage == "active" and exp.tags.get(key) != value:
                        self.client.set_experiment_tag(exp.experiment_id, key, value)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(
                f"MLflow store {redact_uri(self.tracking_uri)!r}: cannot find or create experiment "
                f"{self.experiment_name!r}: {type(exc).__name__}: {truncate(str(exc), 400)}"
            ) from exc
        if exp.lifecycle_stage != "active":
            raise InputError(
                f"MLflow experiment {self.experiment_name!r} in "
                f"{redact_uri(self.tracking_uri)!r} is deleted; "
                "restore it (mlflow experiments restore) or choose mlflow.experiment=<other name>"
            )
        return exp.experiment_id

    # -- the run -----------------------------------------------------------------------------
    @store_call
    def start(
        self,
        run_name: str,
        tags: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> str:
        """Create the run with ``tags`` and log ``params``; returns the run id."""
        from mlflow.entities import Param

        tag_map = {str(k): truncate(str(v), MAX_TAG_CHARS) for k, v in (tags or {}).items()}
        run = self.client.create_run(self.experiment_id, tags=tag_map, run_name=run_name)
        self.run_id = run.info.run_id
        items = [
            Param(str(k), truncate(str(v), MAX_PARAM_CHARS)) for k, v in (params or {}).items()
        ]
        for i in range(0, len(items), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + _BATCH_PARAMS])
        return self.run_id

    @store_call
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Add or overwrite tags of the current run."""
        from mlflow.entities import RunTag

        items = [RunTag(str(k), truncate(str(v), MAX_TAG_CHARS)) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH_TAGS):
            self.client.log_batch(self._require_run(), tags=items[i : i + _BATCH_TAGS])

    @property
    def logged_keys(self) -> frozenset[str]:
        """The metric keys this run has logged (or buffered): per-iteration and final."""
        return frozenset(self._history_keys | self._final_keys)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer ``metrics`` at ``step``; sends a batch when the buffer or the clock says so.

        A (key, step) pair already logged is skipped, so the same value is never sent twice; a
        key of the final numbers (``log_final``) is refused (``ValueError``): a per-iteration
        value could hide the final one.
        """
        from mlflow.entities import Metric

        self._require_run()
        stamp = int(time.time() * 1000)
        for key, value in metrics.items():
            if value is None or (key, int(step)) in self._seen:
                continue
            if key in self._final_keys:
                raise ValueError(f"metric {key!r} is a final number of this run; per-iteration "
                                 "values need a key of their own")
            self._seen.add((key, int(step)))
            self._history_keys.add(str(key))
            self._buffer.append(Metric(str(key), float(value), stamp, int(step)))
        if (
            len(self._buffer) >= self.flush_every
            or self._clock() - self._last_flush >= self.flush_interval_s
        ):
            self.flush()

    @store_call
    def log_final(self, metrics: Mapping[str, float | None], step: int) -> None:
        """Send the run's final numbers now, each key once, after everything buffered.

        Nothing is skipped (``None`` values excepted, a number that does not exist), so MLflow's
        latest value of each key is the one given here. ``ValueError`` for a key that already
        has per-iteration values or a final value: it would not be the only value of its key.
        """
        from mlflow.entities import Metric

        run_id = self._require_run()
        clash = sorted(set(metrics) & (self._history_keys | self._final_keys))
        if clash:
            raise ValueError(f"final metric(s) {clash} already logged in this run; a final "
                             "number must be the only value of its key")
        self.flush()
        stamp = int(time.time() * 1000)
        final = [Metric(str(key), float(value), stamp, int(step))
                 for key, value in metrics.items() if value is not None]
        self._final_keys.update(str(key) for key in metrics)
        for i in range(0, len(final), _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=final[i : i + _BATCH_METRICS])

    @store_call
    def flush(self) -> None:
        """Send every buffered metric (in chunks MLflow accepts)."""
        self._last_flush = self._clock()
        if not self._buffer or self.run_id is None:
            return
        from mlflow.entities import RunTag

        pending, self._buffer = self._buffer, []
        beat = [RunTag(HEARTBEAT_TAG, str(int(time.time() * 1000)))]  # same request, no extra
        for i in range(0, len(pending), _BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=pending[i : i + _BATCH_METRICS],
                                  tags=beat if i == 0 else [])

    @store_call
    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Upload one local file to the run's artifacts."""
        self.client.log_artifact(self._require_run(), str(path), artifact_path=artifact_path)

    @store_call
    def end(self, status: str = FINISHED) -> None:
        """Flush and mark the run ``FINISHED``, ``FAILED`` or ``KILLED``."""
        if self.run_id is None or self.status is not None:
            return
        try:
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status=status)
            self.status = status

    @contextmanager
    def run(
        self,
        run_name: str,
        tags: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Iterator[RunLogger]:
        """Start a run and end it FINISHED, FAILED (exception) or KILLED (KeyboardInterrupt).

        On failure the error is recorded in the ``error`` tag; buffered metrics are flushed
        before the status changes; a stop (SIGINT, SIGTERM) meanwhile waits until the run has
        ended (``interrupts.hold``, inside ``interrupts.run_stops``). Errors while closing never
        hide the original exception. A run created by a ``start`` that then fails (a Ctrl-C
        while its params are sent) ends the same way.
        """
        try:
            self.start(run_name, tags=tags, params=params)
            yield self
        except BaseException as exc:
            interrupts.hold()  # a stop now waits until the run has ended (never left RUNNING)
            if self.run_id is None:  # no run was created
                raise
            status = KILLED if isinstance(exc, KeyboardInterrupt | SystemExit) else FAILED
            try:
                message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self.set_tags({"error": message})
                iteration = getattr(exc, "iteration", None)
                if iteration is not None:
                    self.set_tags({"error_iteration": iteration})
            except Exception:
                pass
            try:
                self.end(status)
            except Exception:
                pass
            raise
        self.end(FINISHED)

    def _require_run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("RunLogger: start() the run first")
        return self.run_id


def finite_or_none(value: Any) -> float | None:
    """``float(value)`` when finite, else ``None``."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None
