"""Issue 24 item 4: (1) peak RSS and epoch time of sep and svi from a float32 memmap against the
same data in memory; (2) K = 1 and K = 2 gloo processes on the CPU; (3) a model of the step on
K GPUs.

Part 1 (``--part memory``, the default).

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
minus the first's start, per epoch: wall, start-up included), the *epoch CPU* (process CPU per
epoch over epochs 2..E, from the callback: the issue's "epoch time", with ``--epochs`` >= 2) and
the peak RSS. The whole fit's CPU ratio is not the epoch ratio: the in-memory case checks and
copies all of X before training, which the memmap case streams.

Measured (s39, 2026-12-05; D 20, M 50, B 5000; 2 cores shared with other jobs; epoch CPU over
epochs 2..E, memmap / memory):

* 1e6, ``--epochs 3``, two interleaved rounds, load 4.2-6.4: svi 1.07x and 1.15x (11.10 /
  10.42 s, 10.25 / 8.94 s), sep 1.04x and 1.16x (7.98 / 7.69 s, 8.51 / 7.36 s). Before s39
  svi ran at 1.30-1.40x (1.30x here at load 0.9, 1.40x in a callback script timing epochs 2..4).
  Where it went, svi's epoch 2 from ``getrusage`` (two interleaved rounds, load 4.2-6.3):
  before, memmap 10.1-10.7 s user + 2.3-3.3 s system CPU with 1.2-1.5 million minor page
  faults, against 9.5 s + 0.0 s in memory; now 9.5-9.8 s + 0.35-0.40 s, 125 000 faults (the
  memmap's rows, read after ``madvise(MADV_DONTNEED)``): 1.02x and 1.08x. The system CPU was
  glibc's malloc giving a step's temporaries back to the system after every step and faulting
  them in at the next (``gpinfer.allocator.prime_allocator``); the user CPU, the fixed-``Z``
  kernel path the memmap fit did not take (``gpinfer.kernels.fixed``), and
  the batch reads (0.57 -> 0.39 s an epoch, ``RowSource.rows_as``).
* 1e7, ``--epochs 2`` (epoch 2 alone), one round, load 2.1-3.7: svi 0.90x (105.9 / 118.0 s),
  sep 1.25x (83.8 / 67.2 s); peak RSS memmap 545 MB (svi) and 497 MB (sep), in memory 5.6 GB.
  sep's 1.25x, checked from ``getrusage`` on sep's epoch 2 alone (load 1.4-3.4): in memory
  62.0 s (61.7 user + 0.3 system), memmap 67.5 s (64.8 + 2.7, 1.1 million minor faults) with
  the file in the page cache, 1.09x, and 74.5 s (66.6 + 8.0, 2.3 million minor and 59 major
  faults) right after the in-memory fit (5.6 GB) had pushed part of the file out of the page
  cache, 1.20x: the memmap's extra is the page faults of its reads, more of them when the
  file is not all cached (in this benchmark the memmap case runs right after the in-memory
  one of the other method). The reads alone cost 0.40 s CPU per 200 batches of 5000
  scattered rows with the file cached (~0.1 fault a row; ``madvise(MADV_RANDOM)`` or larger
  pieces between ``release_pages`` change nothing). The in-memory svi epoch is the slower
  one at this size: its faults (next item).
* Priming in memory (s39-prime, measured before every fit primed, then ``--modes
  memory,primed``: ``primed`` the in-memory fit after ``gpinfer.allocator.prime_allocator()``;
  now ``--modes unprimed,memory``: ``unprimed`` the in-memory fit with the estimator's priming
  turned off, ``memory`` primed as every fit; ``getrusage`` over epochs 2..E, user and
  system CPU and minor faults an epoch). 1e6, ``--epochs 3 --repeats 2``, load 2.6-5.1:
  nothing to gain, the in-memory fits fault nothing in their epochs either way: sep 7.09 /
  7.15 s unprimed (0.01-0.04 s system, 25-26 faults), 7.22 / 7.43 s primed (0.02-0.03 s,
  26); svi 9.65 / 10.11 s (0.00-0.03 s, 1-122 faults), 9.77 / 9.47 s (0.01 s, 0); peak RSS
  767.3-767.7 MB in all eight. At 1e7 (svi, in memory, ``report_every`` 100, reports 2..4 of
  one fit, load 3.0-3.6) the unprimed fit pays them: 5.44 s user + 0.92 s system and 386 000
  minor faults per 100 steps, primed 5.42 s + 0.02 s and 1 400 faults (6.36 -> 5.43 s,
  0.85x): its set-up's freed blocks (``N``-sized, over 32 MiB) never lift glibc's threshold,
  as at 1e6 some of them do. ``benchmarks/engine_step.py`` (MNIST-size sep step, ``--parts
  sep --epochs 3``; digits, ``--parts digits --digits-epochs 4``; two interleaved rounds,
  load 2.5-5.0): sep 132.4 / 135.5 ms a step unprimed, 132.9 / 135.7 primed, the whole
  process's minor faults 54 300 / 55 000 against 53 700 / 54 200 (the warm-up's); digits'
  sep step 23.5 / 22.2 ms against 21.0 / 21.8, svi 22.2 / 22.6 against 20.4 / 22.8, faults
  112 800 either way: unchanged. Since then every fit primes (``GPClassifier.fit``); peak RSS
  unchanged by it (memmap, ``--epochs 1``/``2``, before and after: svi 1e6 315.0 / 315.5 MB
  against 315.0 / 315.2 MB; sep 1e7 545.5 MB against 545.5 MB, svi 1e7 545.5 MB after).

The cases are interleaved (memmap, memory, memmap, memory, ...) with ``--repeats``; the file
is deleted at the end unless ``--keep``.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/scale_out.py --n 1000000 --d 20

Part 2 (``--part groups``): sep and svi (Adam) fitted by K = 1 process and by K = 2 gloo ranks
(``gpinfer.testing.ranks.run_ranks``, one fresh interpreter per rank, one BLAS thread each;
K = 1 is the one-process path, no group), on the same seeded float64 data (``--group-n`` x
``--d``, 3 classes; ``--group-batch`` is the global batch, each rank takes its half). Each
rank fits 1 epoch (its first calls' costs), then 1 and 1 + ``--epochs`` epochs: the epochs'
cost is the difference of the last two, set-up and the end cancelling. Per case: the ranks'
process CPU seconds summed and the slowest rank's wall seconds of those epochs, points per
CPU second and per wall second, the CPU per rank per step, the time inside the all-reduces
(``Group._sum``, wrapped), and the values and bytes all-reduced per step, counted and checked
against the formula (the run raises otherwise): sep ``C M^2 + C M + C + 1`` (the tied-site sums
and the failure flag) plus ``1 + P + 1`` (the objective, the gradient and the flag); svi
``1 + P + 1``; ``P`` from the fit (sep's ``theta``; svi's kernel parameters, ``mu`` and the
triangle of ``Lq``).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/scale_out.py --part groups \
        --group-n 40000 --group-batch 2000 --M 100 --epochs 4 --repeats 3

Measured (s38, this command, interleaved K = 1, 2 per method, 3 rounds; medians; N 40 000,
D 20, C 3, M 100, global batch 2000, 80 steps; 2 cores shared with other jobs, load 5.8-8.9):

| | sep K=1 | sep K=2 | svi K=1 | svi K=2 |
|---|---|---|---|---|
| CPU per rank per step (ms) | 44.0 | 24.7 (0.56x) | 43.5 | 26.9 (0.62x) |
| points per CPU second | 45 400 | 40 500 (0.89x) | 46 000 | 37 200 (0.81x) |
| points per wall second | 17 900 | 17 700 (0.99x) | 20 300 | 19 700 (0.97x) |
| values all-reduced per step | 0 | 30 304 + 6 011 = 36 315 | 0 | 15 461 |
| bytes all-reduced per step (float64) | 0 | 290 520 | 0 | 123 688 |
| CPU / wall inside the all-reduces per step (ms) | | 1.5-1.7 / 13-30 | | 0.9-1.0 / 8-20 |

(sep ``P`` = 6009 = C (M D + 3); svi ``P`` = 15 459 = C (3 + M (M + 3) / 2): both counts equal the
formula.) The step splits over the ranks: 0.56x / 0.62x CPU per rank, so the share of the step
that scales with the batch is f = 2 (1 - 0.56) = 0.88 (sep) and 0.76 (svi); the rest (Kuu and
its Cholesky, the KL, the M^3 site algebra, Adam, the all-reduce's own 1-1.7 ms) every rank
does whole. On this machine two ranks give no more points per wall second: the other jobs hold
the cores, and the all-reduce's wall time is mostly one rank waiting for the other to be
scheduled (13-30 ms against 1-1.7 ms of CPU).

Part 3, the model of the step on K GPUs (written, **not checked against a K = 2 GPU run**: no
multi-GPU machine was available). One data-parallel sep step on ``K`` GPUs with NCCL:

    T_K = T_1 ((1 - f) + f / K) + t_comm(K),
    t_comm(K) = 2 (alpha + s) + S 2 (K - 1) / K / busbw,

* ``T_1`` the measured one-GPU step; ``f`` its share that scales with the batch rows (each rank
  evaluates ``B / K`` of them; everything else is repeated whole on every rank);
* ``S`` the bytes all-reduced per step: the data ``C M^2 + P`` values (exactly
  ``C M^2 + C M + C + 1`` and ``1 + P + 1``, part 2);
* ``S 2 (K - 1) / K / busbw``: NCCL's bus bandwidth as nccl-tests define it
  (``busbw = algbw 2 (K - 1) / K`` for all-reduce, nccl-tests ``doc/PERFORMANCE.md``);
* ``alpha`` NCCL's latency per all-reduce (assumed 15 us within a node) and ``s`` the host read
  of the failure flag after each of the two all-reduces (a device sync; assumed 20 us).

Figures used (assumptions, stated): ``T_1`` = 48.9 ms, issue 25's MNIST-size sep step on an H100
(D 784, C 10, M 200, B 1024, float32; GPyTorch's step 16.5 ms); ``P`` = C (M D + 3) = 1 568 030,
so ``S`` = 402 011 + 1 568 032 = 1 970 043 values = 7.9 MB in float32 (15.8 MB in float64);
busbw 200 GB/s on H100 SXM with NVLink-4/NVSwitch (nccl-tests reach 460-480 GB/s on 8 x H100
SXM at large sizes; 8 MB messages are below that plateau, so half of it is assumed) and 30 GB/s
over PCIe Gen5 without NVLink (35-45 GB/s measured at large sizes; figures from the nccl-tests
reference table in Alaya NeW's "NCCL-tests in practice", 2026); ``f`` unknown on the GPU: 0.87
is the share of the step's FLOPs that scale with B (``flop_models.sep_step_terms``: 4 M B D +
7 M^2 B against 52/3 M^3 per class), an upper bound, since the H100 step is bound by ~2300
launches and by the M^3 Cholesky / ``cholesky_inverse`` (6.8 + 5.8 ms of its GPU time, issue
25), which do not shrink with B; 0.5 is a guess for that launch-bound step.

| | t_comm NVLink | t_comm PCIe | T_K, f = 0.87 | T_K, f = 0.5 |
|---|---|---|---|---|
| K = 2, global batch 1024 | 0.11 ms | 0.33 ms | 27.7 ms (1.76x) | 36.8 ms (1.33x) |
| K = 8, global batch 1024 | 0.14 ms | 0.53 ms | 11.8 ms (4.1x) | 27.6 ms (1.77x) |
| K = 2, 1024 per GPU | 0.11 ms | 0.33 ms | 49.0 ms: 2.0x the points per second | |
| K = 8, 1024 per GPU | 0.14 ms | 0.53 ms | 49.0 ms (49.4 on PCIe): 8.0x (7.9x) | |

So the all-reduce is under 1 % of the step on NVLink and about 1 % over PCIe: data-parallel sep
at this size is bound by the work each rank repeats, not by NCCL. At a fixed global batch the
gain is capped by ``1 / (1 - f)``; at a fixed batch per GPU the points per second grow almost K
times (2048 points per 49 ms on two H100s is 41 800 points/s, against 62 000 for GPyTorch's
one-GPU step). Check on a multi-GPU machine: ``T_2`` of the MNIST-size step at B 1024 (global)
and at 1024 per GPU, and ``f`` from one GPU at B 512 and 1024.
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
    if mode == "unprimed":  # in memory, glibc's thresholds left as they are (every fit primes)
        import gpinfer.estimator

        gpinfer.estimator.prime_allocator = lambda: None
    options: dict = {"inducing_init": "random"}
    if method == "svi":  # one reported iteration = one epoch (default: a tenth of one)
        options["report_every"] = len(y) // batch
    model = GPClassifier(method=method, M=M, batch_size=batch, max_iter=epochs,
                         random_state=0, method_options=options, baseline_failure="warn")
    marks: list[float] = []  # process CPU at the end of each epoch (one report per epoch)
    usage: list[resource.struct_rusage] = []  # getrusage at the same points

    def mark(info: object) -> None:
        marks.append(time.process_time())
        usage.append(resource.getrusage(resource.RUSAGE_SELF))

    c0, w0 = time.process_time(), time.perf_counter()
    model.fit(X, y, callback=mark)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    elapsed = [float(h["elapsed"]) for h in model.history_]
    epoch = elapsed[-1] / len(elapsed) if elapsed else float("nan")
    # the target's epoch time: CPU per epoch over epochs 2..E (the whole fit's CPU would count
    # the in-memory case's up-front check and copy of X, which the memmap case streams)
    epoch_cpu = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else float("nan")
    # user and system CPU and minor page faults per epoch over epochs 2..E
    user = system = faults = float("nan")
    if len(usage) > 1:
        first, last, per = usage[0], usage[-1], len(usage) - 1
        user = (last.ru_utime - first.ru_utime) / per
        system = (last.ru_stime - first.ru_stime) / per
        faults = (last.ru_minflt - first.ru_minflt) / per
    peak_mb = peak_rss_mb()
    return {"method": method, "mode": mode, "fit_cpu_s": cpu, "fit_wall_s": wall,
            "epoch_s": epoch, "epoch_cpu_s": epoch_cpu, "epoch_user_s": user,
            "epoch_sys_s": system, "epoch_minflt": faults, "epochs": len(elapsed),
            "peak_rss_mb": peak_mb}


# --------------------------------------------------------------------------------------------
# part 2: K = 1 and K = 2 gloo processes on the CPU (--part groups)
# --------------------------------------------------------------------------------------------

#: one rank's fit: the same seeded data on every rank, collectives counted in Group._sum
_RANK_FIT = """
import time
from gpinfer import GPClassifier
from gpinfer.training import distributed
count = {{"calls": 0, "values": 0, "bytes": 0, "cpu": 0.0, "wall": 0.0}}
sizes = {{}}
real = distributed.Group._sum
def counting(self, dist, tensor):
    n = int(tensor.numel())
    count["calls"] += 1
    count["values"] += n
    count["bytes"] += n * int(tensor.element_size())
    sizes[n] = sizes.get(n, 0) + 1
    c, w = time.process_time(), time.perf_counter()
    real(self, dist, tensor)
    count["cpu"] += time.process_time() - c
    count["wall"] += time.perf_counter() - w
distributed.Group._sum = counting
rng = np.random.default_rng(0)
X = rng.normal(size=({n}, {d}))
f = X @ rng.normal(size=({d}, 2)) + 0.5 * rng.normal(size=({n}, 2))
y = np.where(f[:, 0] > 0.5, 2, (f[:, 1] > 0).astype(int))
options = {{"inducing_init": "random"}}
if {method!r} == "svi":  # adam; one reported iteration = one epoch
    options.update(optimizer="adam", report_every=-(-{n} // {batch}))
def fit(epochs):
    model = GPClassifier(method={method!r}, M={M}, batch_size={batch}, max_iter=epochs,
                         random_state=0, method_options=options, baseline_failure="warn")
    before = dict(count)
    c0, w0 = time.process_time(), time.perf_counter()
    model.fit(X, y)
    spent = [time.process_time() - c0, time.perf_counter() - w0]
    return model, spent + [count[k] - before[k] for k in ("calls", "values", "bytes", "cpu",
                                                           "wall")]
# the epochs' cost: a fit of 1 + E epochs less one of 1 (set-up and the end cancel), after a
# fit of 1 epoch that takes the first calls' costs (imports, caches)
fit(1)
model, short = fit(1)
sizes.clear()
model, long = fit(1 + {epochs})
state = model.fit_result_.state
if {method!r} == "sep":
    P = state["theta"].size
else:  # svi: kernel parameters (+ Z when learned: not by default), mu [L, M], Lq's triangle
    L = state["mu"].shape[0]
    P = sum(state[f"kernel_params_{{l}}"].size for l in range(L)) + L * {M} * ({M} + 3) // 2
cpu, wall, calls, values, nbytes, comm_cpu, comm_wall = np.subtract(long, short)
save(cpu=cpu, wall=wall, fit_cpu=long[0], P=P, calls=calls, values=values, bytes=nbytes,
     comm_cpu=comm_cpu, comm_wall=comm_wall,
     sizes=np.array(sorted(sizes.items()), dtype=np.int64).reshape(-1, 2))
"""


def expected_values(method: str, C: int, M: int, P: int) -> dict[int, int]:
    """Values of each all-reduce of one step (``gpinfer.training.distributed``; the last value
    of each is the failure flag): sep the tied-site sums ``C M^2 + C M + C + 1`` and the
    objective ``1 + P + 1``; svi the ELBO ``1 + P + 1``."""
    objective = 1 + P + 1
    return {C * M * M + C * M + C + 1: 1, objective: 1} if method == "sep" else {objective: 1}


def run_group_case(method: str, K: int, a: argparse.Namespace, folder: Path) -> dict:
    """One fit as ``K`` gloo ranks (``K = 1``: one process, no group): the ranks' CPU and wall
    seconds, the counted all-reduces per step, checked against ``expected_values``."""
    from gpinfer.testing.ranks import run_ranks

    code = _RANK_FIT.format(n=a.group_n, d=a.d, method=method, M=a.M, batch=a.group_batch,
                            epochs=a.epochs)
    ranks = run_ranks(code, K, folder, timeout_s=1800)  # a failed rank raises, with its output
    steps = a.epochs * -(-a.group_n // a.group_batch)
    points = a.epochs * a.group_n
    cpu = sum(float(r["cpu"]) for r in ranks)
    wall = max(float(r["wall"]) for r in ranks)
    P = int(ranks[0]["P"])
    per_step = {int(n): int(c) / (steps + -(-a.group_n // a.group_batch))
                for n, c in ranks[0]["sizes"]}  # counted over the fit of 1 + E epochs
    if K > 1 and per_step != expected_values(method, 3, a.M, P):
        raise RuntimeError(f"{method}: all-reduce sizes per step {per_step} differ from "
                           f"{expected_values(method, 3, a.M, P)}")
    return {"method": method, "K": K, "cpu_s": cpu, "wall_s": wall, "steps": steps,
            "points_per_cpu_s": points / cpu, "points_per_wall_s": points / wall,
            "cpu_per_rank_step_ms": 1e3 * cpu / K / steps,
            "values_per_step": int(ranks[0]["values"]) / steps,
            "bytes_per_step": int(ranks[0]["bytes"]) / steps, "P": P,
            "comm_cpu_ms": 1e3 * max(float(r["comm_cpu"]) for r in ranks) / steps,
            "comm_wall_ms": 1e3 * max(float(r["comm_wall"]) for r in ranks) / steps,
            "fit_cpu_s": sum(float(r["fit_cpu"]) for r in ranks),
            "load": os.getloadavg()[0]}


def groups(a: argparse.Namespace) -> None:
    """Part 2: sep and svi as K = 1 and K = 2 gloo processes, interleaved ``--repeats``
    times; one line per case and the K = 2 / K = 1 ratios."""
    print(f"# groups: N={a.group_n} D={a.d} C=3 M={a.M} global batch={a.group_batch} "
          f"epochs={a.epochs} float64, load={os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for rep in range(a.repeats):
        for method in a.methods.split(","):
            for K in (1, 2):
                row = run_group_case(method, K, a, Path(a.dir) / f"{method}{K}r{rep}")
                rows.append(row)
                print(f"{method:4s} K={K} epochs CPU {row['cpu_s']:6.2f} s wall "
                      f"{row['wall_s']:6.2f} s points/CPU s {row['points_per_cpu_s']:7.0f} "
                      f"points/wall s {row['points_per_wall_s']:7.0f} CPU/rank/step "
                      f"{row['cpu_per_rank_step_ms']:6.2f} ms (in all-reduce: CPU "
                      f"{row['comm_cpu_ms']:5.2f} wall {row['comm_wall_ms']:5.2f} ms) "
                      f"all-reduced {row['values_per_step']:.0f} values = "
                      f"{row['bytes_per_step']:.0f} B per step (P={row['P']}; whole fit CPU "
                      f"{row['fit_cpu_s']:.2f} s) load {row['load']:.2f}", flush=True)
    for method in a.methods.split(","):
        one = [r for r in rows if r["method"] == method and r["K"] == 1]
        two = [r for r in rows if r["method"] == method and r["K"] == 2]
        med = {k: float(np.median([r[k] for r in two]) / np.median([r[k] for r in one]))
               for k in ("points_per_cpu_s", "points_per_wall_s", "cpu_per_rank_step_ms")}
        print(f"{method}: K=2 / K=1 points per CPU s {med['points_per_cpu_s']:.3f}, per wall s "
              f"{med['points_per_wall_s']:.3f}, CPU per rank-step "
              f"{med['cpu_per_rank_step_ms']:.3f} (share of the step that splits over the "
              f"ranks f = 2 (1 - that) = {2 * (1 - med['cpu_per_rank_step_ms']):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--M", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--methods", default="sep,svi")
    ap.add_argument("--modes", default="memmap,memory",
                    help="memmap, memory, unprimed (in memory, the allocator not primed)")
    ap.add_argument("--dir", default="/tmp/gpinfer_scale_out")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--case", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--part", choices=("memory", "groups"), default="memory",
                    help="memory: part 1 (memmap vs memory); groups: part 2 (K = 1, 2 ranks)")
    ap.add_argument("--group-n", type=int, default=40_000, help="part 2: training points")
    ap.add_argument("--group-batch", type=int, default=1000, help="part 2: global batch")
    a = ap.parse_args()
    if a.part == "groups":
        groups(a)
        return
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
                    print(f"{method:4s} {mode:8s} peak RSS {row['peak_rss_mb']:8.1f} MB  "
                          f"fit CPU {row['fit_cpu_s']:8.2f} s  wall {row['fit_wall_s']:8.2f} s  "
                          f"epoch {row['epoch_s']:8.2f} s  epoch CPU (2..) "
                          f"{row['epoch_cpu_s']:7.2f} s (user {row['epoch_user_s']:.2f} sys "
                          f"{row['epoch_sys_s']:.2f} minflt {row['epoch_minflt']:.0f})  "
                          f"load {os.getloadavg()[0]:.2f}",
                          flush=True)
        for method in a.methods.split(","):
            mm = [r for r in rows if r["method"] == method and r["mode"] == "memmap"]
            mem = [r for r in rows if r["method"] == method and r["mode"] == "memory"]
            unprimed = [r for r in rows if r["method"] == method and r["mode"] == "unprimed"]
            if unprimed and mem:
                ratio_p = (np.median([r["epoch_cpu_s"] for r in mem])
                           / np.median([r["epoch_cpu_s"] for r in unprimed]))
                print(f"{method}: memory (primed)/unprimed epoch CPU (epochs 2..) ratio "
                      f"{ratio_p:.3f}")
            if not (mm and mem):
                continue
            ratio = {key: np.median([r[key] for r in mm]) / np.median([r[key] for r in mem])
                     for key in ("epoch_cpu_s", "fit_cpu_s")}  # memmap / memory, medians
            print(f"{method}: memmap/memory epoch CPU (epochs 2..) ratio "
                  f"{ratio['epoch_cpu_s']:.3f} (the target's); fit CPU ratio "
                  f"{ratio['fit_cpu_s']:.3f}; peak RSS memmap "
                  f"{max(r['peak_rss_mb'] for r in mm):.0f} MB vs memory "
                  f"{max(r['peak_rss_mb'] for r in mem):.0f} MB")
    finally:
        if not a.keep:
            for f in ("X.npy", "y.npy"):
                (directory / f).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
