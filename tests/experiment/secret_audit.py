"""Audit: does a password in a tracking URI leave ``gpinfer-run`` / ``gpinfer``?

Starts a real ``mlflow server --app-name basic-auth`` on 127.0.0.1 (a free port, SQLite backend,
local artifacts; the admin user ``alice`` with a random password), runs, in a fresh folder,

* a run (``mlflow.tracking_uri=http://alice:<secret>@127.0.0.1:PORT`` on the command line),
* a run failing validation (``iterations=0``),
* a 2-job multirun,
* ``gpinfer report <experiment>`` with the URI in ``$MLFLOW_TRACKING_URI``,
* ``gpinfer end-stale-runs --tracking-uri http://alice:<secret>@127.0.0.1:<closed port>``,

and counts the secret in stdout, stderr, the files under the run and sweep folders, and the
server's store (backend database and artifacts). Used by ``test_secrets_server.py`` and, as a
script, against any installation (``--bin /path/to/venv/bin``) to compare::

    python tests/experiment/secret_audit.py --bin /other/.venv/bin
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
USER = "alice"
#: a cheap real run: Laplace on the embedded breast-cancer set, nothing published but the model
RUN_ARGS = ("method=laplace", "dataset=breast_cancer", "iterations=3", "eval_every=1",
            "mlflow.experiment=secret-audit", "mlflow.log_plots=false",
            "mlflow.log_datasets=false", "progress.bar=false")
#: MLflow retries a refused connection for minutes by default (end-stale-runs' closed port)
NO_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running basic-auth ``mlflow server``: its URL, store folder and admin secret."""

    url: str
    store: Path
    secret: str
    log: Path

    def uri(self, port: int | None = None) -> str:
        """The tracking URI with the credentials in it (``port``: another, closed port)."""
        where = self.url.split("://", 1)[1] if port is None else f"{HOST}:{port}"
        return f"http://{USER}:{self.secret}@{where}"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextmanager
def basic_auth_server(folder: Path, mlflow_exe: str) -> Iterator[Server]:
    """Start ``mlflow server --app-name basic-auth`` with its stores in ``folder/store`` and
    stop it (the whole process group) afterwards."""
    store = folder / "store"
    store.mkdir(parents=True)
    secret = "pw-" + secrets.token_hex(12)
    port = free_port()
    ini = folder / "basic_auth.ini"  # outside the audited store; holds no password
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{store / 'auth.db'}\n"
        f"admin_username = {USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = dict(os.environ, MLFLOW_AUTH_CONFIG_PATH=str(ini),
               MLFLOW_AUTH_ADMIN_PASSWORD=secret,
               MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16),
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",  # no job workers: a lighter server
               NO_PROXY=f"{HOST},localhost", no_proxy=f"{HOST},localhost")
    cmd = [mlflow_exe, "server", "--app-name", "basic-auth", "--host", HOST,
           "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{store / 'backend.db'}",
           "--artifacts-destination", str(store / "artifacts")]
    log = folder / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Server(url, store, secret, log)
    finally:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """End ``proc`` and its session's process group (a server and its workers): SIGTERM, and
    SIGKILL when it has not ended within ``timeout`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            if sig == signal.SIGKILL:
                raise


@dataclass
class Step:
    """One command of the audit and what it gave."""

    name: str
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Audit:
    """Every command run and the secret's count per place."""

    steps: list[Step] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    hits: dict[str, list[str]] = field(default_factory=dict)


def _count_in_files(root: Path, secret: str) -> tuple[int, list[str]]:
    needle = secret.encode()
    total, where = 0, []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        n = path.read_bytes().count(needle)
        if n:
            total += n
            where.append(f"{path.relative_to(root)}: {n}")
    return total, where


def run_audit(bin_dir: Path, folder: Path, mlflow_exe: str | None = None,
              extra_env: dict[str, str] | None = None, timeout_s: float = 600.0) -> Audit:
    """Run the audit with the ``gpinfer-run`` and ``gpinfer`` of ``bin_dir`` in ``folder``."""
    audit = Audit()
    work = folder / "work"
    work.mkdir(parents=True)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith("MLFLOW_TRACKING_")}
    base_env.update(NO_PROXY=f"{HOST},localhost", no_proxy=f"{HOST},localhost",
                    OPENBLAS_NUM_THREADS="1", GPINFER_BLAS_THREADS="1", **(extra_env or {}))
    with basic_auth_server(folder, mlflow_exe or str(bin_dir / "mlflow")) as server:
        uri = server.uri()

        def step(name: str, cmd: list[str], env: dict[str, str] | None = None) -> Step:
            done = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                                  env={**base_env, **(env or {})}, timeout=timeout_s)
            out = Step(name, done.returncode, done.stdout, done.stderr)
            audit.steps.append(out)
            return out

        run = [str(bin_dir / "gpinfer-run")]
        step("run", [*run, *RUN_ARGS, f"mlflow.tracking_uri={uri}", "hydra.run.dir=runs/ok"])
        step("failing run", [*run, *RUN_ARGS, "iterations=0", f"mlflow.tracking_uri={uri}",
                             "hydra.run.dir=runs/failed"])
        step("multirun", [*run, "-m", *RUN_ARGS, "seed=0,1", f"mlflow.tracking_uri={uri}",
                          "hydra.sweep.dir=sweep"])
        gp = str(bin_dir / "gpinfer")
        step("report", [gp, "report", "secret-audit", "--out", "report"],
             env={"MLFLOW_TRACKING_URI": uri})
        step("end-stale-runs", [gp, "end-stale-runs", "--tracking-uri",
                                server.uri(port=free_port())])
        secret = server.secret
        audit.counts["stdout"] = sum(s.stdout.count(secret) for s in audit.steps)
        audit.counts["stderr"] = sum(s.stderr.count(secret) for s in audit.steps)
        for place, root in (("run and sweep folders", work), ("MLflow store", server.store)):
            audit.counts[place], audit.hits[place] = _count_in_files(root, secret)
    return audit


def main(argv: list[str] | None = None) -> int:
    """Print the audit of ``--bin``'s installation as JSON (counts, return codes, hits)."""
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(Path(sys.executable).parent),
                        help="the bin folder holding gpinfer-run and gpinfer")
    parser.add_argument("--mlflow", default=None, help="the mlflow executable of the server")
    parser.add_argument("--keep", action="store_true", help="print and keep the folder")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="secret-audit-"))
    # an unreachable server: MLflow retries a refused connection for minutes by default
    audit = run_audit(Path(args.bin), folder, args.mlflow, NO_RETRIES)
    print(json.dumps({"counts": audit.counts, "hits": audit.hits,
                      "returncodes": {s.name: s.returncode for s in audit.steps},
                      "folder": str(folder) if args.keep else None}, indent=2))
    for s in audit.steps:
        lines = [ln for ln in (s.stdout + s.stderr).splitlines() if "pw-" in ln]
        for ln in lines[:6]:
            print(f"[{s.name}] {ln[:300]}")
    if not args.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
