"""Where a default ``gpinfer-run`` spends its time, phase by phase (issue 26, item 7): the
evidence behind ``run_overhead.py``'s totals.

Runs ``gpinfer-run`` in this process (``app.main`` with the given overrides), with each phase's
CPU seconds (``time.process_time``: this process only, little affected by other load) and wall
seconds recorded by wrappers around the functions that make it:

* ``imports``: ``import gpinfer.experiment.app`` (Hydra, OmegaConf, gpinfer's core), measured
  before ``main``; the interpreter's own start is measured apart (``python -c pass``);
* ``compose``: Hydra's composition of the config, up to the task;
* ``runner import``: the runner and what it imports (scikit-learn, the estimator);
* ``store``: ``RunLogger`` opening the MLflow store (MLflow's import, SQLAlchemy, alembic's
  schema check) and finding the experiment;
* ``data``: the rest of ``prepare`` (loading, splitting, standardising, checking);
* ``stale runs``, ``run start`` (create the run, its params), ``fit`` (training with the
  callback's metric logging; ``train_time_s`` of the result is its training part), ``fit: its
  evaluations`` (the test metrics every ``eval_every`` iterations), ``final evaluation``,
  ``publish`` (the run's side of it: for the figures, the wait for their worker), ``end``
  (result.json, the run's status);
* ``other``: the remainder of ``main`` (Hydra's job set-up, logging, the printed line).

The figures' worker's own CPU is not in these numbers (it runs beside the run, started
before training: ``render.FigureJob.spawn``). Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/run_phases.py [overrides...]
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES: dict[str, list[float]] = {}


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _add(name: str, start: tuple[float, float]) -> None:
    cpu, wall = _clock()
    total = PHASES.setdefault(name, [0.0, 0.0])
    total[0] += cpu - start[0]
    total[1] += wall - start[1]


#: the phases running now (a phase called inside another is counted in both)
_OPEN: list[str] = []


def _wrap(owner: Any, attribute: str, name: str, inside: dict[str, str] | None = None) -> None:
    """Time ``owner.attribute`` as phase ``name`` (as ``inside[outer]`` while phase ``outer``
    runs)."""
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        label = next((inner for outer, inner in (inside or {}).items() if outer in _OPEN), name)
        start = _clock()
        _OPEN.append(name)
        try:
            return original(*args, **kwargs)
        finally:
            _OPEN.pop()
            _add(label, start)

    setattr(owner, attribute, timed)


def main(argv: list[str]) -> int:
    folder = Path(tempfile.mkdtemp(prefix="gpinfer-phases-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    python = _clock()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter_wall = _clock()[1] - python[1]

    start = _clock()
    import gpinfer.experiment.app as app

    _add("imports", start)
    start = _clock()
    import gpinfer.experiment.runner as runner

    _add("runner import", start)
    from gpinfer.estimator import GPClassifierCore
    from gpinfer.experiment import results, tracking

    _wrap(tracking.RunLogger, "__init__", "store")
    _wrap(runner, "prepare", "prepare")
    _wrap(runner, "_end_stale_runs", "stale runs")
    _wrap(tracking.RunLogger, "start", "run start")
    _wrap(GPClassifierCore, "fit", "fit")
    _wrap(runner, "_evaluate", "final evaluation", {"fit": "fit: its evaluations"})
    _wrap(runner, "_publish", "publish")
    _wrap(results, "write_result", "end")
    _wrap(tracking.RunLogger, "end", "end")
    _wrap(app, "task", "task")

    def stop(status: object = 0) -> None:
        raise SystemExit(status)

    app.exit_without_teardown = stop  # type: ignore[assignment]
    sys.argv = ["gpinfer-run", f"hydra.run.dir={folder / 'run'}", *argv]
    start = _clock()
    try:
        app.main()
    except SystemExit:
        pass
    _add("main", start)
    result = json.loads((folder / "run" / "result.json").read_text())
    cpu = {k: v[0] for k, v in PHASES.items()}
    wall = {k: v[1] for k, v in PHASES.items()}
    # nested phases: prepare holds the store; task holds the run; main holds the task
    for table in (cpu, wall):
        table["data"] = table.pop("prepare") - table["store"]
        table["final evaluation"] = table.get("final evaluation", 0.0)
        table["fit: its evaluations"] = table.get("fit: its evaluations", 0.0)
        table["fit"] -= table["fit: its evaluations"]
        inside = ("store", "data", "stale runs", "run start", "fit", "fit: its evaluations",
                  "final evaluation", "publish", "end")
        table["other (in the task)"] = table.pop("task") - sum(table.get(k, 0.0) for k in inside)
        table["compose and other"] = table.pop("main") - sum(
            table.get(k, 0.0) for k in (*inside, "other (in the task)"))
    print(f"load average {os.getloadavg()[0]:.1f}; interpreter start (python -c pass) "
          f"{interpreter_wall:.2f} s wall; train_time_s {result['train_time_s']:.2f}")
    print(f"{'phase':24}{'cpu s':>8}{'wall s':>8}")
    for key in cpu:
        print(f"{key:24}{cpu[key]:8.2f}{wall[key]:8.2f}")
    print(f"{'total':24}{sum(cpu.values()):8.2f}{sum(wall.values()):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
