"""Whole-run CPU and bytes read of an out-of-core ``gpinfer-run`` (issue 24: the training rows
were scanned twice, once by the runner's chunked check and statistics and once by the
estimator's; now the runner hands its result to the estimator, ``RowSource.checked``).

Writes an ``N x D`` float32 ``X.npy`` with its ``y.npy`` (two classes) into ``--dir``, then
runs ``gpinfer-run dataset=file dataset.path=X.npy method=sep`` (``--M``, ``--batch``,
``--iterations``; plots and model not logged) in a fresh interpreter per run, for each code
under test, ``--rounds`` times interleaved: ``after`` is this checkout, ``before`` the
``gpinfer`` package at ``--before`` (a ``git archive`` of the older commit's ``gpinfer`` and
``conf``; the child puts it first on ``sys.path``: ``PYTHONPATH`` alone loses to the
``python -c`` child's first entry, its working folder, when that is this checkout, not to the
venv's editable finder, which comes after the path entries; the plugins are this venv's, so
the older commit must be one whose ``gpinfer`` they import: since the merge of s39-seppass,
063f125's lacks ``gpinfer.sites.stacked.FRAME_DRIFT`` and ``sep`` fails to load). Each run
reports its process CPU (``time.process_time`` at exit: all its threads), the bytes its
``.npy`` reads returned (``ShardSource.rows``, counted: up to the first iteration's callback,
which includes that iteration's reads, and in all), and the run's ``result.json`` numbers,
which must be equal between the two codes::

    git archive 063f125 gpinfer conf | tar -x -C /tmp/before
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/source_run_reads.py \\
        --before /tmp/before --n 1000000 --d 20 --iterations 2 --rounds 3

Measured (063f125 against the change, 1e6 x 20, sep M 20, batch 5000, 2 iterations, three
interleaved rounds, load 4.1-5.4 on 2 shared cores): process CPU 13.64 / 12.11 / 13.07 s
before, 10.91 / 11.07 / 12.32 s after (medians 13.07 and 11.07 s); bytes read 305.8 MB before,
233.8 MB after (72.0 MB less: the estimator's second scan of the 900 000 training rows; up to
the first callback 224.2 and 152.2 MB); ``result.json``'s numbers equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import atexit, json, os, sys, time
if os.environ.get("GPINFER_BEFORE"):  # the older package first: before the working folder
    sys.path.insert(0, os.environ["GPINFER_BEFORE"])
import gpinfer
print("gpinfer from", gpinfer.__file__, flush=True)
from gpinfer.data import source
from gpinfer.experiment import app, runner
read = {"bytes": 0, "to_first_callback": None}
real_rows = source.ShardSource.rows
def rows(self, index):
    out = real_rows(self, index)
    read["bytes"] += int(out.nbytes)
    return out
source.ShardSource.rows = rows
real_call = runner._Callback.__call__
def call(self, info):
    if read["to_first_callback"] is None:
        read["to_first_callback"] = read["bytes"]
    return real_call(self, info)
runner._Callback.__call__ = call
REPORT = sys.argv[1]
def report():
    with open(REPORT, "w") as f:
        json.dump({"cpu_s": time.process_time(), **read}, f)
atexit.register(report)
sys.argv = ["gpinfer-run", *sys.argv[2:]]
app.main()
"""

COMPARED = ("status", "test_error", "test_nll", "log_evidence", "n_iter", "n_train", "n_test",
            "train_nll", "baseline_nll")


def write_data(folder: Path, n: int, d: int) -> Path:
    """``X.npy`` (float32 ``[n, d]``) and ``y.npy`` (``[n]``, two classes) in ``folder``,
    written in blocks; returns the path of ``X.npy`` (kept when already there)."""
    path = folder / "X.npy"
    if path.exists() and np.load(path, mmap_mode="r").shape == (n, d):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    y = np.empty(n, dtype=np.int64)
    rng = np.random.default_rng(0)
    w = rng.normal(size=d)
    for start in range(0, n, 100_000):
        block = rng.normal(size=(min(100_000, n - start), d))
        X[start:start + block.shape[0]] = block
        y[start:start + block.shape[0]] = (block @ w + rng.normal(size=block.shape[0]) > 0)
    X.flush()
    del X
    np.save(folder / "y.npy", y)
    return path


def run_once(code: str, pythonpath: str | None, a: argparse.Namespace, X: Path,
             tag: str) -> dict:
    """One ``gpinfer-run`` in a fresh interpreter: its CPU, bytes read and result."""
    folder = Path(a.dir) / tag
    report = folder / "report.json"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("GPINFER_BEFORE", None)
    if pythonpath is not None:
        env["GPINFER_BEFORE"] = pythonpath
    overrides = [f"hydra.run.dir={folder / 'run'}", "method=sep", f"M={a.M}",
                 f"batch_size={a.batch}", f"iterations={a.iterations}", "dataset=file",
                 f"dataset.path={X}", f"mlflow.tracking_uri=sqlite:///{folder / 'mlflow.db'}",
                 "mlflow.log_plots=false", "mlflow.log_model=false", "progress.bar=false"]
    done = subprocess.run([sys.executable, "-c", code, str(report), *overrides], env=env,
                          capture_output=True, text=True)
    print(done.stdout.splitlines()[0], flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tag}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads((folder / "run" / "result.json").read_text())
    return {**json.loads(report.read_text()), **{k: result.get(k) for k in COMPARED}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="folder holding the older gpinfer package")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--M", type=int, default=20)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/gpinfer_source_reads")
    a = ap.parse_args()
    X = write_data(Path(a.dir) / "data", a.n, a.d)
    codes = {"before": str(Path(a.before).resolve()), "after": None}
    rows: dict[str, list[dict]] = {name: [] for name in codes}
    for r in range(a.rounds):
        for name, path in (codes.items() if r % 2 == 0 else reversed(codes.items())):
            row = run_once(CHILD, path, a, X, f"{name}{r}")
            rows[name].append(row)
            print(f"round {r} {name:6s} cpu {row['cpu_s']:7.2f} s  read "
                  f"{row['bytes'] / 1e6:8.1f} MB ({row['to_first_callback'] / 1e6:7.1f} MB "
                  f"up to the first iteration's callback)  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    same = all({k: x[k] for k in COMPARED} == {k: rows["before"][0][k] for k in COMPARED}
               for name in codes for x in rows[name])
    for name in codes:
        cpu = [x["cpu_s"] for x in rows[name]]
        print(f"{name:6s} cpu median {np.median(cpu):.2f} s, read "
              f"{rows[name][0]['bytes'] / 1e6:.1f} MB")
    print("results equal:", same, {k: rows["after"][0][k] for k in COMPARED})


if __name__ == "__main__":
    main()
