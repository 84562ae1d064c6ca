"""The thread policy on a busy machine: training time of one ``gpinfer-run`` with the process's
default thread settings, against the same run with ``OPENBLAS_NUM_THREADS=1``, while another
process keeps one core busy (issue "One training engine", target: within 1.3x).

Three runs, interleaved ``rounds`` times, each a fresh ``gpinfer-run method=sep dataset=digits
iterations=ITERS`` (its ``result.json`` gives the training time):

* ``default``: no ``*_NUM_THREADS`` variables, ``GPINFER_BLAS_THREADS`` unset (the policy: one
  BLAS thread inside the fit);
* ``one-thread``: ``OPENBLAS_NUM_THREADS=1`` (what a careful user did before the policy);
* ``inherit``: ``GPINFER_BLAS_THREADS=inherit`` with default threads (the behaviour before the
  policy: OpenBLAS's own thread count, one per core).

    .venv/bin/python benchmarks/thread_policy.py [--iterations 200] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpinfer.threads import RUNTIME_ENVS, THREADS_ENV

ROOT = Path(__file__).resolve().parent.parent
BUSY = "import numpy as np\na = np.random.rand(1500, 1500)\nwhile True:\n    a @ a\n"


def one_run(label: str, iterations: int, store: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ENVS and k != THREADS_ENV}
    if label == "one-thread":
        env["OPENBLAS_NUM_THREADS"] = "1"
    elif label == "inherit":
        env[THREADS_ENV] = "inherit"
    out = Path(tempfile.mkdtemp(prefix=f"threads_{label}_", dir=store))
    cmd = [str(ROOT / ".venv" / "bin" / "gpinfer-run"), "method=sep", "dataset=digits",
           f"iterations={iterations}", f"hydra.run.dir={out}",
           f"mlflow.tracking_uri=sqlite:///{store / 'mlflow.db'}", "progress.bar=false",
           "mlflow.log_model=false", "mlflow.log_plots=false"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result = json.loads((out / "result.json").read_text())
    return float(result["train_time_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    store = ROOT / "outputs" / "thread_policy"
    store.mkdir(parents=True, exist_ok=True)
    busy_env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    busy = subprocess.Popen([sys.executable, "-c", BUSY], env=busy_env)
    times: dict[str, list[float]] = {"default": [], "one-thread": [], "inherit": []}
    try:
        for _ in range(a.rounds):
            for label in times:
                times[label].append(one_run(label, a.iterations, store))
                print(label, f"{times[label][-1]:.1f} s", flush=True)
    finally:
        busy.kill()
    base = sum(times["one-thread"]) / len(times["one-thread"])
    for label, ts in times.items():
        mean = sum(ts) / len(ts)
        print(f"{label:10s} training {mean:7.1f} s  = {mean / base:5.2f}x the one-thread run")


if __name__ == "__main__":
    main()
