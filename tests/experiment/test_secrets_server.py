"""No password in a tracking URI leaves gpinfer: a real basic-auth ``mlflow server`` on 127.0.0.1.

``secret_audit.run_audit`` drives ``gpinfer-run`` (a run, a run failing validation, a 2-job
multirun), ``gpinfer report`` (the URI in ``$MLFLOW_TRACKING_URI``) and
``gpinfer end-stale-runs`` (an unreachable server) with ``http://alice:<secret>@...`` and counts
the secret in stdout, stderr, every file of the run and sweep folders and the server's store.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .secret_audit import NO_RETRIES, run_audit

pytestmark = [pytest.mark.network, pytest.mark.slow]

BIN = Path(sys.executable).parent


def test_no_secret_anywhere(tmp_path: Path) -> None:
    audit = run_audit(BIN, tmp_path, extra_env=NO_RETRIES)
    steps = {s.name: s for s in audit.steps}
    details = "\n".join(f"--- {s.name} ({s.returncode})\n{s.stdout[-1500:]}\n{s.stderr[-1500:]}"
                        for s in audit.steps)
    assert audit.counts == {"stdout": 0, "stderr": 0, "run and sweep folders": 0,
                            "MLflow store": 0}, (audit.hits, details)
    # the commands did what they should, with the credentials taken from the environment
    assert steps["run"].returncode == 0, details
    assert "View run" in steps["run"].stdout, details  # MLflow's own link, now without them
    assert steps["failing run"].returncode == 1, details
    assert "iterations must be >= 1" in steps["failing run"].stderr, details
    assert "Error executing job with overrides" in steps["failing run"].stderr, details
    assert steps["multirun"].returncode == 0, details
    assert "Sweep report (2 finished of 2 job(s)): " in steps["multirun"].stdout, details
    assert steps["report"].returncode == 0, details
    assert "logged to MLflow as run" in steps["report"].stdout, details
    stale = steps["end-stale-runs"]
    assert stale.returncode == 2 and "Traceback" not in stale.stderr, details
    assert "gpinfer end-stale-runs: MLflow store 'http://127.0.0.1:" in stale.stderr, details
    # the saved configs were written, and hold the URI without its credentials
    work = tmp_path / "work"
    overrides = (work / "runs" / "ok" / ".hydra" / "overrides.yaml").read_text()
    assert "mlflow.tracking_uri=http://127.0.0.1:" in overrides
    assert (work / "sweep" / "multirun.yaml").is_file()
    assert len(list(work.glob("sweep/*/result.json"))) == 2
