"""Stale runs on hosts of one name: the host identity decides who may judge a pid, and the
heartbeat decides, for everyone else, when a run has gone quiet for too long."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.experiment import stale_runs
from gpinfer.experiment.tracking import HEARTBEAT_TAG, RunLogger


def _fake_host(monkeypatch: pytest.MonkeyPatch, folder: Path, machine: str, boot: str) -> None:
    """Make this process look like a machine with ``machine``/``boot`` ids and the host name
    ``twin`` (a container or cluster node sharing its name with another)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine-id").write_text(machine + "\n")
    (folder / "boot_id").write_text(boot + "\n")
    monkeypatch.setattr(stale_runs, "_hostname", lambda: "twin")
    monkeypatch.setattr(stale_runs, "_MACHINE_ID_FILES", (str(folder / "machine-id"),))
    monkeypatch.setattr(stale_runs, "_BOOT_ID_FILE", str(folder / "boot_id"))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_host_identity_tells_machines_and_boots_of_one_name_apart(tmp_path, monkeypatch):
    _fake_host(monkeypatch, tmp_path / "a", "a" * 32, "boot-1")
    first = stale_runs.host_identity()
    assert first == stale_runs.host_identity() and len(first) == 32
    assert "a" * 32 not in first  # hashed: the machine id itself is not published
    _fake_host(monkeypatch, tmp_path / "b", "b" * 32, "boot-1")
    assert stale_runs.host_identity() != first
    _fake_host(monkeypatch, tmp_path / "a2", "a" * 32, "boot-2")  # the same machine, rebooted
    assert stale_runs.host_identity() != first
    tags = stale_runs.run_tags()
    assert tags[stale_runs.HOST_TAG] == "twin"
    assert tags[stale_runs.HOST_ID_TAG] == stale_runs.host_identity()
    assert abs(int(tags[HEARTBEAT_TAG]) / 1000 - time.time()) < 60


def test_two_hosts_of_one_name_never_end_each_others_live_runs(tmp_path, monkeypatch):
    """Host A's run has a pid that does not exist on host B (same name). B's check leaves it
    alone while its heartbeat is fresh, ends it once the heartbeat is older than the idle
    limit; A's check ends it by pid at once."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("twins")
    pid = _dead_pid()
    _fake_host(monkeypatch, tmp_path / "A", "a" * 32, "boot")
    tags_a = stale_runs.run_tags()  # host A, the pid of this (live) test process
    run_a = client.create_run(exp, tags={**tags_a, stale_runs.PID_TAG: str(pid),
                                         stale_runs.PID_START_TAG: ""}).info.run_id

    _fake_host(monkeypatch, tmp_path / "B", "b" * 32, "boot")  # host B: same name "twin"
    assert stale_runs.host_identity() != tags_a[stale_runs.HOST_ID_TAG]
    assert stale_runs.find_stale_runs(client) == []  # not B's pid to judge
    assert stale_runs.find_stale_runs(client, idle_hours=1.0) == []  # heartbeat fresh
    later = time.time() + 2 * 3600
    (found,) = stale_runs.find_stale_runs(client, idle_hours=1.0, now=later)
    assert found.run_id == run_a and "nothing logged for 2.0 h" in found.reason
    # a heartbeat refreshed meanwhile keeps it alive for B, whatever the start time says
    client.set_tag(run_a, HEARTBEAT_TAG, str(int(later * 1000)))
    assert stale_runs.find_stale_runs(client, idle_hours=1.0, now=later) == []

    _fake_host(monkeypatch, tmp_path / "A", "a" * 32, "boot")  # back on host A
    (found,) = stale_runs.end_stale_runs(client)
    assert found.run_id == run_a and f"process {pid} on twin no longer exists" in found.reason
    assert client.get_run(run_a).info.status == "KILLED"


def test_runs_without_a_host_identity_need_the_idle_limit(tmp_path, monkeypatch):
    """A run recorded before the identity existed (host name and pid only) is not judged by pid
    even on a host of that name."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("legacy")
    monkeypatch.setattr(stale_runs, "_hostname", lambda: "twin")
    old = client.create_run(exp, tags={stale_runs.HOST_TAG: "twin",
                                       stale_runs.PID_TAG: str(_dead_pid())}).info.run_id
    assert stale_runs.find_stale_runs(client) == []
    found = stale_runs.find_stale_runs(client, idle_hours=1.0, now=time.time() + 7200)
    assert [r.run_id for r in found] == [old]


def test_metric_flushes_refresh_the_heartbeat(tmp_path):
    clock = [0.0]
    logger = RunLogger(f"sqlite:///{tmp_path / 'mlflow.db'}", "beat", flush_every=1000,
                       flush_interval_s=5.0, clock=lambda: clock[0])
    with logger.run("beat", tags=stale_runs.run_tags()):
        first = int(logger.client.get_run(logger.run_id).data.tags[HEARTBEAT_TAG])
        time.sleep(0.01)
        logger.log_metrics({"objective": 1.0}, step=1)  # buffered: no request, no heartbeat
        assert int(logger.client.get_run(logger.run_id).data.tags[HEARTBEAT_TAG]) == first
        clock[0] = 6.0
        logger.log_metrics({"objective": 0.5}, step=2)  # the periodic flush
        beat = int(logger.client.get_run(logger.run_id).data.tags[HEARTBEAT_TAG])
        assert beat > first and abs(beat / 1000 - time.time()) < 60
