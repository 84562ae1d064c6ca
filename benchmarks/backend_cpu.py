"""The array backend on the CPU (issue "The scalable methods on a GPU"), in one run.

One worker process per configuration, interleaved in rounds (A B C A B C ...) so that a busy
machine slows them alike, each with one BLAS thread and one torch thread:

* ``numpy (before)``: the checkout given by ``--before`` (a worktree of the commit before the
  backend; optional), to show that the numpy path did not slow down;
* ``numpy``, ``torch-cpu float64``, ``torch-cpu float32``: this checkout.

Each worker times one SEP mini-batch step at MNIST size (D = 784, C = 10, M = 200 per class,
batches of 200, Adam; synthetic MNIST-like pixels, N = 2000; process-CPU time per step over
epochs 2..E) and, where it applies, svi on digits (robust-max, M = 100, batches of 200), and
checks that the float64 backends give the same fitted probabilities (max abs difference).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/backend_cpu.py [--rounds 2]
        [--before /path/to/worktree-of-the-previous-commit]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
N, M, B = 2000, 200, 200
CONFIGS = {"numpy": {}, "torch-cpu float64": {"backend": "torch"},
           "torch-cpu float32": {"backend": "torch", "dtype": "float32"}}


def step_time(method: str, X: np.ndarray, y: np.ndarray, M_: int, epochs: int,
              options: dict, settings: dict, likelihood: str | None = None
              ) -> tuple[float, np.ndarray]:
    """Process-CPU seconds per mini-batch step over epochs 2..epochs (``engine_step``'s
    timing), and the fitted probabilities on the first 200 rows."""
    from engine_step import fit_steps

    from gpinfer.kernels import make_kernel

    out = fit_steps(X, y, method, M_, B, epochs, options, likelihood=likelihood,
                    kernel=make_kernel("rbf", X.shape[1], ard=True), settings=settings)
    return float(out["step_cpu_s"]), out["model"].predict_proba(X[:200])


def worker(config: str, epochs: int) -> dict[str, object]:
    settings = CONFIGS[config]
    if settings:
        import torch

        torch.set_num_threads(1)
    from engine_step import mnist_like

    X, y = mnist_like(n=N)
    out: dict[str, object] = {"config": config}
    t, p = step_time("sep", X, y, M, epochs, {"adam_learning_rate": 1e-3}, settings)
    out["sep_mnist_size_step_ms"] = 1e3 * t
    out["sep_proba"] = p.tolist()
    from sklearn.datasets import load_digits

    Xd, yd = load_digits(return_X_y=True)
    try:
        t, p = step_time("svi", Xd / 16.0, yd, 100, max(epochs, 3),
                         {"optimizer": "adam", "optimizer_options": {"learning_rate": 0.01}},
                         settings, likelihood="robustmax")
        out["svi_digits_step_ms"] = 1e3 * t
        out["svi_proba"] = p.tolist()
    except Exception as err:  # noqa: BLE001 - a configuration svi does not support is reported
        out["svi_digits_step_ms"] = f"failed: {type(err).__name__}: {err}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--before", default=None, help="worktree of the commit before the backend")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "backend_cpu.jsonl"))
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.epochs)))
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    jobs = [(name, None) for name in CONFIGS]
    if args.before:
        jobs.insert(0, ("numpy (before)", args.before))
    results: dict[str, list[dict]] = {name: [] for name, _ in jobs}
    for r in range(args.rounds):
        for name, tree in jobs:
            job_env = dict(env)
            if tree is not None:
                plugins = [str(p) for p in sorted(Path(tree, "plugins").glob("*")) if p.is_dir()]
                job_env["PYTHONPATH"] = os.pathsep.join([tree, *plugins])
            cmd = [sys.executable, __file__, "--worker", "numpy" if tree else name,
                   "--epochs", str(args.epochs)]
            line = subprocess.run(cmd, env=job_env, capture_output=True, text=True, check=True,
                                  cwd=tree or ROOT).stdout.strip().splitlines()[-1]
            res = json.loads(line)
            results[name].append(res)
            print(f"round {r + 1} {name:20s} sep {res['sep_mnist_size_step_ms']:.1f} ms/step, "
                  f"svi {res['svi_digits_step_ms']}", flush=True)
    ref = results["numpy"][0]
    summary = {}
    for name, runs in results.items():
        sep = [x["sep_mnist_size_step_ms"] for x in runs]
        svi = [x["svi_digits_step_ms"] for x in runs if isinstance(x["svi_digits_step_ms"], float)]
        row = {"sep_step_ms_median": float(np.median(sep)),
               "svi_step_ms_median": float(np.median(svi)) if svi else None,
               "sep_proba_max_diff_vs_numpy": float(np.max(np.abs(
                   np.array(runs[0]["sep_proba"]) - np.array(ref["sep_proba"]))))}
        if svi and "svi_proba" in ref:
            row["svi_proba_max_diff_vs_numpy"] = float(np.max(np.abs(
                np.array(runs[0]["svi_proba"]) - np.array(ref["svi_proba"]))))
        summary[name] = row
        print(f"{name:20s} {json.dumps(row)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps({"time": time.time(), "summary": summary}) + "\n")


if __name__ == "__main__":
    main()
