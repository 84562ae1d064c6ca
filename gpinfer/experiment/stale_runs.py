"""Runs left RUNNING by a process that died without ending them (SIGKILL, the OOM killer).

Every ``gpinfer-run`` run records where it runs as tags (``run_tags``): the host name, a host
identity, the process id, the process's start time (which tells a reused pid from the
original) and a heartbeat. The host identity (``gpinfer.host_id``) is a hash of the machine id
(``/etc/machine-id``), the boot id and the pid namespace, so two machines or containers that
share a host name never count as one, and a run of an earlier boot never matches a pid of this
one; the heartbeat (``gpinfer.heartbeat``, milliseconds since the epoch) is refreshed with
every batch of metrics the run sends (``RunLogger.flush``, every few seconds while training).
``end_stale_runs`` finds the RUNNING runs of a store and ends as KILLED those whose process is
gone:

* runs of this host identity: the process id no longer exists, or now belongs to a later
  process;
* any other run (another host, another container of the same name, a run recorded before
  gpinfer kept a host identity): only with ``idle_hours``, when its heartbeat (or, without one,
  anything logged to it) is older than that.

``gpinfer-run`` calls it for its own host at the start of every run in the same store;
``gpinfer end-stale-runs`` does it by hand (``--idle-hours`` for other hosts, ``--dry-run``).
An ended run gets the tag ``gpinfer.ended_by`` saying why.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import psutil
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment.tracking import HEARTBEAT_TAG

__all__ = [
    "HEARTBEAT_TAG", "HOST_ID_TAG", "HOST_TAG", "PID_TAG", "PID_START_TAG", "StaleRun",
    "end_stale_runs", "find_stale_runs", "host_identity", "process_alive", "run_tags",
]

HOST_TAG = "gpinfer.host"
HOST_ID_TAG = "gpinfer.host_id"
PID_TAG = "gpinfer.pid"
PID_START_TAG = "gpinfer.pid_start"
ENDED_BY_TAG = "gpinfer.ended_by"
#: process start times are compared to this many seconds (psutil rounds them)
_START_TOLERANCE_S = 1.0
#: metric histories read per run when judging the runs of other hosts
_ACTIVITY_KEYS = ("objective", "elapsed_s")


#: files holding the machine id (systemd, then D-Bus) and the boot id (Linux)
_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_PID_NAMESPACE = "/proc/self/ns/pid"


def _hostname() -> str:
    return socket.gethostname()


def _read_first(paths: Iterable[str]) -> str:
    for path in paths:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text:
            return text
    return ""


def host_identity() -> str:
    """This process's host identity: a hash of the host name, the machine id (else the MAC
    address), the boot id (else the boot time) and the pid namespace, so that equal host names
    on different machines or containers, and earlier boots, differ. Hashed: the machine id
    itself is not to be published (machine-id(5))."""
    parts = [
        _hostname(),
        _read_first(_MACHINE_ID_FILES) or f"mac:{uuid.getnode():012x}",
        _read_first([_BOOT_ID_FILE]) or f"boot:{psutil.boot_time():.0f}",
    ]
    try:
        parts.append(f"pidns:{os.stat(_PID_NAMESPACE).st_ino}")
    except OSError:  # no /proc (macOS, Windows): one pid namespace per boot
        pass
    digest = hashlib.sha256("\0".join(["gpinfer host identity", *parts]).encode())
    return digest.hexdigest()[:32]


def heartbeat_tag(now: float | None = None) -> dict[str, str]:
    """``{"gpinfer.heartbeat": <milliseconds since the epoch>}``."""
    return {HEARTBEAT_TAG: str(int((time.time() if now is None else now) * 1000))}


def run_tags(pid: int | None = None) -> dict[str, str]:
    """The tags that let a later process judge whether the run's process still exists:
    ``gpinfer.host``, ``gpinfer.host_id`` (``host_identity``), ``gpinfer.pid``,
    ``gpinfer.pid_start`` (seconds since the epoch) and the first ``gpinfer.heartbeat``."""
    pid = os.getpid() if pid is None else pid
    return {HOST_TAG: _hostname(), HOST_ID_TAG: host_identity(), PID_TAG: str(pid),
            PID_START_TAG: repr(psutil.Process(pid).create_time()), **heartbeat_tag()}


def process_alive(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` exists and (when ``started`` is known) is the one that started
    then, not a later process that reuses the id."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:  # exists, owned by someone else
        return True
    return started is None or abs(created - started) <= _START_TOLERANCE_S


@dataclass(frozen=True)
class StaleRun:
    """A RUNNING run judged dead: its id, experiment, name, tags and the reason."""

    run_id: str
    experiment_id: str
    run_name: str
    host: str
    pid: str
    reason: str


def _last_activity_ms(client: MlflowClient, run: Run) -> int:
    """The latest sign of life (ms) of ``run``: its heartbeat tag, else its start or a metric
    step (runs logged before the heartbeat existed)."""
    latest = int(run.info.start_time or 0)
    beat = run.data.tags.get(HEARTBEAT_TAG, "")
    if beat.isdigit():
        return max(latest, int(beat))
    for key in _ACTIVITY_KEYS:
        if key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            latest = max([latest, *(int(m.timestamp) for m in history)])
    return latest


def find_stale_runs(client: MlflowClient, experiment_ids: Iterable[str] | None = None,
                    idle_hours: float | None = None, now: float | None = None) -> list[StaleRun]:
    """RUNNING runs of ``experiment_ids`` (default: every active experiment) whose process is
    gone: those of this host identity by process id, any other (another host, or runs without
    the tags) only when ``idle_hours`` is given and its heartbeat is older than that."""
    if idle_hours is not None and not idle_hours > 0:
        raise InputError(f"idle_hours must be a positive number of hours, got {idle_hours!r}")
    if experiment_ids is None:
        experiment_ids = [e.experiment_id for e in client.search_experiments()]
    ids = list(experiment_ids)
    if not ids:
        return []
    host, identity = _hostname(), host_identity()
    now_ms = (time.time() if now is None else now) * 1000.0
    found = []
    for run in client.search_runs(ids, filter_string="attributes.status = 'RUNNING'",
                                  max_results=50000):
        tags = run.data.tags
        run_host, pid = tags.get(HOST_TAG, ""), tags.get(PID_TAG, "")
        reason = ""
        if tags.get(HOST_ID_TAG) == identity and pid.isdigit():
            started = tags.get(PID_START_TAG)
            start_time = float(started) if started else None
            if not process_alive(int(pid), start_time):
                reason = f"process {pid} on {host} no longer exists"
        elif idle_hours is not None:
            idle_h = (now_ms - _last_activity_ms(client, run)) / 3.6e6
            if idle_h >= idle_hours:
                where = f"process {pid} on {run_host}" if run_host else "an untagged process"
                reason = (f"nothing logged for {idle_h:.1f} h (>= {idle_hours:g} h) by {where}")
        if reason:
            found.append(StaleRun(run.info.run_id, run.info.experiment_id,
                                  run.info.run_name or "", run_host, pid, reason))
    return found


def end_stale_runs(client: MlflowClient, experiment_ids: Iterable[str] | None = None,
                   idle_hours: float | None = None, dry_run: bool = False) -> list[StaleRun]:
    """End every run of ``find_stale_runs`` as KILLED (tag ``gpinfer.ended_by`` = the reason);
    returns them. ``dry_run``: only find them."""
    stale = find_stale_runs(client, experiment_ids, idle_hours)
    if dry_run:
        return stale
    for run in stale:
        client.set_tag(run.run_id, ENDED_BY_TAG, f"gpinfer stale-run check: {run.reason}")
        client.set_terminated(run.run_id, status="KILLED")
    return stale
