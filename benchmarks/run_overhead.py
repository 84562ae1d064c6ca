"""Per-run overhead of ``gpinfer-run`` (issue 26, item 7): a default run as a command, against
its training time.

For each command under test (``--after``: this checkout's ``gpinfer-run``; ``--before``:
another checkout's, e.g. ``/work/main/.venv/bin/gpinfer-run``, run read-only from a temporary
folder) the script times, alternating between the commands so that both see the same machine
load:

* ``startup``: ``gpinfer-run --help``: the imports and the composition before any CLI action;
* ``run``: the default run (``sep`` on ``waveform``, 50 iterations) with publishing on; from
  its ``result.json``: ``train_time_s`` (training, evaluation and logging excluded),
  ``wall_time_s`` (the fit, evaluations included) and ``publish_s`` (model, datasets, plots;
  per part as ``publish.<part>_s`` where the run reports them);
* ``run_bare``: the same with ``mlflow.log_model/log_datasets/log_plots=false``;
* with ``--sweep SMALL,LARGE``: multiruns of SMALL and LARGE default jobs (seeds 1..n) under
  Hydra's basic launcher, one process each, and ``sweep.per_job_overhead_s``: the marginal
  wall time of one more job less its training time (a protocol of many jobs pays the imports
  once, and this per job);

and for each, ``command_cpu_s``: the CPU seconds of the command and of the processes it
waited for (the figures' process), which other load affects much less than wall time.

``overhead = command wall time - train_time_s``; the target is at most 2 s. Every command runs
in its own temporary folder with its own SQLite store, created by one untimed warm-up run (a
new store's tables cost seconds once). Medians over ``--repeat`` runs are printed as a table
and as JSON (``--json PATH``)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/run_overhead.py \\
        --before /work/main/.venv/bin/gpinfer-run --repeat 3

``--before`` may be a script that runs this venv's ``gpinfer-run`` on an older copy of the
code (``PYTHONPATH=<copy> exec .venv/bin/gpinfer-run "$@"``, with ``GPINFER_DATA_DIR`` set):
then both columns share every installed package, and only gpinfer's code differs.

Measured 2026-12-04 on the 2-core CI-like machine shared with other work (load average 1.6 at
the start, 2.6 at the end; ``--repeat 3``), ``before``: a6b4068 (the code before session s33),
``after``: 1d5b405 (main after s33's issue-26 work: the run fits ``GPClassifierCore`` without
scikit-learn; no later change to the run's code)::

                             before   after
    run.command_s              5.62    5.29   publishing on (model, skops, datasets, plots)
    run.overhead_s             5.08    4.84
    run.command_cpu_s          6.08    5.85
    run.train_s                0.46    0.51
    run_bare.command_s         4.53    4.05   publishing off
    run_bare.overhead_s        4.18    3.68
    run_bare.command_cpu_s     4.47    3.96
    startup.command_s          0.71    0.66   gpinfer-run --help

Measured 2026-12-05 on the same machine, quiet (load 1.5; ``--repeat 2 --sweep 2,6``), main
after s34's merges: ``run.overhead_s`` 3.80 (command 4.10, training 0.30), ``run_bare``
3.16, ``startup`` 0.54, ``sweep.per_job_overhead_s`` 0.95 (sweeps of 2 and 6 jobs: 6.03 and
11.03 s). ``run_floor.py --repeat 5`` at the same load: the MLflow floor (a process that only
imports MLflow and records one run in the SQLite store) 1.80 s wall, 1.79 s CPU.

The target (overhead at most 2 s with publishing on) is below what a single command can reach:
the MLflow floor (1.80 s), Hydra's composition (~0.4 s) and the scikit-learn flavour of the
logged model (0.59 s: ``sklearn.pipeline`` and ``mlflow.sklearn``), each required by the issue,
sum to ~2.8 s. In a sweep, where the imports are paid once, a job costs 0.95 s beyond training.
Floor of the run's process, CPU seconds (``run_floor.py --repeat 3``, load 1.5; and
``run_phases.py`` on an existing store, medians of 3, load 1.5-1.7)::

    interpreter start                           0.04
    Hydra + OmegaConf + gpinfer.experiment.app  0.18
    Hydra: composition (twice: its get_mode, then the run) and job set-up   0.25
    gpinfer.experiment.runner + estimator       0.32   numpy, scipy, the backend
    import mlflow                               1.03   its __init__ imports genai, data
                                                       (pandas), gateway (fastapi) eagerly;
                                                       any mlflow.<sub> import pays it
    SqlAlchemyStore module                      0.78   SQLAlchemy, alembic, table models
    store open + experiment lookup              0.05
    data (load, split, standardise, checks)     0.21   the method's plugin import included
    fit's test evaluations (4, eval_every 10)   0.40   the method's predict_proba; counted as
                                                       overhead (train_time_s excludes them)
    scikit-learn + mlflow.sklearn               0.70   the sklearn-flavour model (scipy.stats)
    skops.io                                    0.32   imports every scikit-learn module
    the rest (run, metrics, model, artifacts)   ~0.5   wall overhead less the above

Already small, checked with cProfile of a default run: ``stale_runs`` scan 0.02 s, the
experiment looked up twice (5 ms each), the data read once (0.04 s), metric flushes 1-2 per
run (batched), the figures' wait 0.00 s (its worker is ready first). The one avoidable part
left in the run's own process is the skops artifact (``publish.skops model_s`` 0.44 s wall:
0.32 s of it skops' import): it is the run's only non-pickle copy of the model (``safe_model``),
so its default stays on; ``mlflow.log_model=false`` drops it along with the MLflow model.
Moving work into another process was measured slower on this machine (2 cores, busy), not
faster, both times: a tracking worker holding MLflow (overhead 5.85 -> 7.41 s, backed out in
16ead11), and the skops dump in the figures' worker (it imports scikit-learn and skops too; the
run then waited 0.67-1.17 s for it, command 6.6-6.7 s against 5.3 s; not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PUBLISH_OFF = ("mlflow.log_model=false", "mlflow.log_datasets=false", "mlflow.log_plots=false")


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's ended and waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``command`` as a process (it must succeed); ``cpu``: its CPU
    time and that of the processes it waited for (the figures' process), little affected by
    other load."""
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds, _children_cpu() - cpu


def _publish_seconds(result: dict[str, Any]) -> float:
    """``publish_s`` of a result.json: a number, or ``{part: seconds}``."""
    value = result.get("publish_s") or 0.0
    return float(sum(value.values())) if isinstance(value, dict) else float(value)


class Command:
    """One ``gpinfer-run`` under test, with its own folder and store."""

    def __init__(self, label: str, executable: str, root: Path) -> None:
        self.label, self.executable = label, executable
        self.folder = root / label
        self.folder.mkdir()
        self.env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{self.folder / 'mlflow.db'}",
                    "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
        self.env.pop("MLFLOW_EXPERIMENT_NAME", None)
        self.samples: dict[str, list[float]] = {}
        self._runs = 0

    def _add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def run(self, *overrides: str, record: str | None = "run") -> None:
        """One default run; records its wall time, training time and publishing time."""
        self._runs += 1
        out = self.folder / f"run{self._runs}"
        seconds, cpu = _timed([self.executable, f"hydra.run.dir={out}", *overrides],
                              self.folder, self.env)
        if record is None:
            return
        result = json.loads((out / "result.json").read_text())
        self._add(f"{record}.command_s", seconds)
        self._add(f"{record}.command_cpu_s", cpu)
        self._add(f"{record}.train_s", float(result["train_time_s"]))
        self._add(f"{record}.fit_wall_s", float(result.get("wall_time_s") or 0.0))
        self._add(f"{record}.publish_s", _publish_seconds(result))
        self._add(f"{record}.overhead_s", seconds - float(result["train_time_s"]))
        for key, value in result.items():  # publish.model_s, ... (where the run reports them)
            if key.startswith("publish.") and isinstance(value, int | float):
                self._add(f"{record}.{key}", float(value))

    def sweep(self, jobs: int) -> None:
        """A multirun of ``jobs`` default runs (seeds 1..jobs) under Hydra's basic launcher,
        in one process: the imports are paid once. Records the command's wall time and the
        jobs' summed training time (``sweep<jobs>.*``)."""
        self._runs += 1
        out = self.folder / f"sweep{self._runs}"
        seeds = ",".join(str(seed) for seed in range(1, jobs + 1))
        seconds, cpu = _timed([self.executable, "-m", f"hydra.sweep.dir={out}", f"seed={seeds}"],
                              self.folder, self.env)
        results = [json.loads(path.read_text()) for path in out.glob("*/result.json")]
        if len(results) != jobs:
            raise RuntimeError(f"the sweep wrote {len(results)} results, not {jobs}")
        self._add(f"sweep{jobs}.command_s", seconds)
        self._add(f"sweep{jobs}.command_cpu_s", cpu)
        self._add(f"sweep{jobs}.train_s", sum(float(r["train_time_s"]) for r in results))

    def per_job(self, small: int, large: int) -> None:
        """The marginal overhead of one more job in a sweep: the difference of the two sweeps'
        wall times less that of their training times, per added job (``sweep.per_job_*``)."""
        for a, b in zip(self.samples[f"sweep{small}.command_s"][-1:],
                        self.samples[f"sweep{large}.command_s"][-1:], strict=True):
            train = (self.samples[f"sweep{large}.train_s"][-1]
                     - self.samples[f"sweep{small}.train_s"][-1])
            self._add("sweep.per_job_overhead_s", (b - a - train) / (large - small))
            self._add("sweep.per_job_train_s", self.samples[f"sweep{large}.train_s"][-1] / large)

    def startup(self) -> None:
        """``gpinfer-run --help``: imports and composition, nothing run."""
        seconds, cpu = _timed([self.executable, "--help"], self.folder, self.env)
        self._add("startup.command_s", seconds)
        self._add("startup.command_cpu_s", cpu)

    def medians(self) -> dict[str, float]:
        return {key: statistics.median(values) for key, values in self.samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--after", default=str(Path(sys.executable).with_name("gpinfer-run")))
    parser.add_argument("--before", default=None, help="another gpinfer-run to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the medians here")
    parser.add_argument("--sweep", default=None, metavar="SMALL,LARGE",
                        help="also time multiruns of SMALL and LARGE default jobs (e.g. 2,6): "
                             "the marginal overhead of one more job in a sweep")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gpinfer-overhead-") as tmp:
        commands = [Command("after", args.after, Path(tmp))]
        if args.before:
            commands.insert(0, Command("before", args.before, Path(tmp)))
        for command in commands:  # the store's tables, and a warm file cache
            command.run(record=None)
        for _ in range(args.repeat):
            for command in commands:  # alternate: both see the same load
                command.startup()
                command.run()
                command.run(*PUBLISH_OFF, record="run_bare")
                if args.sweep:
                    small, large = (int(n) for n in args.sweep.split(","))
                    command.sweep(small)
                    command.sweep(large)
                    command.per_job(small, large)
        medians = {c.label: c.medians() for c in commands}
    keys = sorted({key for m in medians.values() for key in m})
    print(f"medians over {args.repeat} runs (load average at the start: {load_start:.1f}, "
          f"now: {os.getloadavg()[0]:.1f})")
    print(f"{'':28}" + "".join(f"{label:>12}" for label in medians))
    for key in keys:
        print(f"{key:28}" + "".join(f"{m.get(key, float('nan')):12.2f}" for m in medians.values()))
    if args.json:
        Path(args.json).write_text(json.dumps(medians, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
