"""Issue 24 part 1: peak RSS and epoch time of sep and svi from a float32 memmap against the
same data in memory.

Writes a synthetic float32 ``X [N, D]`` (3 classes) to ``--dir`` as ``.npy`` (in chunks, so the
writer never holds it), then runs each case in a fresh subprocess so that its peak RSS
(``VmHWM`` of ``/proc/self/status``: ``peak_rss_mb``) is its own. ``ru_maxrss`` is not: Linux
carries the parent's high-water mark through fork and exec, so every case reported the writer's
peak (909 MB at N=1e7, the 800 MB memmap it wrote plus its imports) whatever the fit used:

* ``memmap``: ``GPClassifier.fit(np.load(path, mmap_mode="r"), y)``, X never in memory;
* ``memory``: ``GPClassifier.fit(np.load(path), y)``: the float32 array in memory.

Each case fits ``--epochs`` epochs (``max_iter``; sep counts epochs, svi reports once per epoch
with ``report_every = N // batch``) and reports the fit's
process CPU time, its wall time, the epoch time (the history's ``elapsed`` of the last epoch
minus the first's start, per epoch) and the peak RSS. The cases are interleaved (memmap,
memory, memmap, memory, ...) with ``--repeats``; the file is deleted at the end unless
``--keep``.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/scale_out.py --n 1000000 --d 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 100_000


def write_data(directory: Path, n: int, d: int, seed: int = 0) -> tuple[Path, Path]:
    """``X.npy`` (float32 ``[n, d]``) and ``y.npy`` (int64 ``[n]``, 3 classes) in ``directory``."""
    rng = np.random.default_rng(seed)
    xp, yp = directory / "X.npy", directory / "y.npy"
    X = np.lib.format.open_memmap(xp, mode="w+", dtype=np.float32, shape=(n, d))
    y = np.empty(n, dtype=np.int64)
    w = rng.normal(size=(d, 2))
    for lo in range(0, n, CHUNK):
        block = rng.normal(size=(min(CHUNK, n - lo), d))
        X[lo:lo + block.shape[0]] = block
        f = block @ w + 0.5 * rng.normal(size=(block.shape[0], 2))
        y[lo:lo + block.shape[0]] = np.where(f[:, 0] > 0.5, 2, (f[:, 1] > 0).astype(np.int64))
    X.flush()
    del X
    np.save(yp, y)
    return xp, yp


def peak_rss_mb() -> float:
    """This process's peak resident set (MB): ``VmHWM`` (the high-water mark of its own
    address space, started afresh at exec); ``ru_maxrss`` where ``/proc`` is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_case(method: str, mode: str, xp: str, yp: str, epochs: int, batch: int, M: int) -> dict:
    """One fit in this process; returns its timings and peak RSS (MB)."""
    from gpinfer import GPClassifier

    y = np.load(yp)
    X = np.load(xp, mmap_mode="r") if mode == "memmap" else np.load(xp)
    options: dict = {"inducing_init": "random"}
    if method == "svi":  # one reported iteration = one epoch (default: a tenth of one)
        options["report_every"] = len(y) // batch
    model = GPClassifier(method=method, M=M, batch_size=batch, max_iter=epochs,
                         random_state=0, method_options=options, baseline_failure="warn")
    c0, w0 = time.process_time(), time.perf_counter()
    model.fit(X, y)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    elapsed = [float(h["elapsed"]) for h in model.history_]
    epoch = elapsed[-1] / len(elapsed) if elapsed else float("nan")
    peak_mb = peak_rss_mb()
    return {"method": method, "mode": mode, "fit_cpu_s": cpu, "fit_wall_s": wall,
            "epoch_s": epoch, "epochs": len(elapsed), "peak_rss_mb": peak_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--M", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--methods", default="sep,svi")
    ap.add_argument("--modes", default="memmap,memory")
    ap.add_argument("--dir", default="/tmp/gpinfer_scale_out")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--case", nargs=7, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        m, mode, xp, yp, epochs, batch, M = a.case
        print(json.dumps(run_case(m, mode, xp, yp, int(epochs), int(batch), int(M))))
        return
    directory = Path(a.dir)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        xp, yp = write_data(directory, a.n, a.d)
        print(f"# N={a.n} D={a.d} float32 ({xp.stat().st_size / 1e6:.0f} MB) batch={a.batch} "
              f"M={a.M} epochs={a.epochs} load={os.getloadavg()[0]:.2f}", flush=True)
        rows = []
        for _ in range(a.repeats):
            for method in a.methods.split(","):
                for mode in a.modes.split(","):
                    out = subprocess.run(
                        [sys.executable, __file__, "--case", method, mode, str(xp), str(yp),
                         str(a.epochs), str(a.batch), str(a.M)],
                        capture_output=True, text=True)
                    if out.returncode:
                        raise RuntimeError(f"{method} {mode} failed:\n{out.stderr[-3000:]}")
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    rows.append(row)
                    print(f"{method:4s} {mode:7s} peak RSS {row['peak_rss_mb']:8.1f} MB  "
                          f"fit CPU {row['fit_cpu_s']:8.2f} s  wall {row['fit_wall_s']:8.2f} s  "
                          f"epoch {row['epoch_s']:8.2f} s  load {os.getloadavg()[0]:.2f}",
                          flush=True)
        for method in a.methods.split(","):
            mm = [r for r in rows if r["method"] == method and r["mode"] == "memmap"]
            mem = [r for r in rows if r["method"] == method and r["mode"] == "memory"]
            if not (mm and mem):
                continue
            ratio = np.median([r["fit_cpu_s"] for r in mm]) / np.median(
                [r["fit_cpu_s"] for r in mem])
            print(f"{method}: memmap/memory fit CPU ratio {ratio:.3f}; peak RSS memmap "
                  f"{max(r['peak_rss_mb'] for r in mm):.0f} MB vs memory "
                  f"{max(r['peak_rss_mb'] for r in mem):.0f} MB")
    finally:
        if not a.keep:
            for f in ("X.npy", "y.npy"):
                (directory / f).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
