"""The floor of a default ``gpinfer-run`` (issue 26, item 7): the CPU seconds of each import
and store step on the run's critical path, in the order the run takes them, each measured in
one fresh process (``time.process_time``: this process only, little affected by other load).

What ``run_overhead.py`` and ``run_phases.py`` report as ``store`` and ``publish`` is mostly
these imports; this script splits them:

* ``hydra + app``: Hydra, OmegaConf and ``gpinfer.experiment.app`` (what ``--help`` needs);
* ``runner``: ``gpinfer.experiment.runner`` and the estimator (numpy, scipy, the backend);
* ``mlflow``: ``import mlflow``; its ``__init__`` imports ``genai``, ``data`` (pandas),
  ``gateway`` (fastapi) and the rest eagerly, so any ``mlflow.<sub>`` import pays all of it;
* ``store module``: ``mlflow.store.tracking.sqlalchemy_store`` (SQLAlchemy, alembic, the
  table models), imported when the client opens a ``sqlite:`` store;
* ``store open``: ``MlflowClient`` on the store and one experiment lookup (engine, schema
  check), on an existing store;
* ``scikit-learn``: ``sklearn.pipeline``, ``sklearn.preprocessing`` and ``mlflow.sklearn`` for
  the deployable model (scikit-learn's own import pulls ``scipy.stats``);
* ``skops``: ``skops.io`` (``safe_model.import_skops_io``), whose import lists every
  scikit-learn estimator by importing every scikit-learn module.

and, as a whole command, the **MLflow floor**: a fresh interpreter that imports ``mlflow``, opens
the store, creates a run, logs two metrics and a parameter in one batch, ends the run and exits
without the interpreter's teardown (as ``gpinfer-run`` does): the cheapest process that records
a run in MLflow's default (``sqlite:``) store. Its wall time bounds from below the overhead of
any command that logs its run to MLflow in its own process, before Hydra, data, training,
evaluation or the model (issue 26's 2 s target; measured 2026-12-05 below).

Usage (``MLFLOW_TRACKING_URI`` must name an existing store; medians of ``--repeat`` runs)::

    MLFLOW_TRACKING_URI=sqlite:////tmp/x/mlflow.db OPENBLAS_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/run_floor.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_STEPS = """
import json, os, time
clock = time.process_time
steps = {}
start = clock()
import hydra, omegaconf, gpinfer.experiment.app
steps["hydra + app"] = clock() - start
start = clock()
import gpinfer.experiment.runner, gpinfer.estimator
steps["runner"] = clock() - start
start = clock()
import mlflow
steps["mlflow"] = clock() - start
start = clock()
import mlflow.store.tracking.sqlalchemy_store
steps["store module"] = clock() - start
start = clock()
from mlflow.tracking import MlflowClient
MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_experiment_by_name("gpinfer")
steps["store open"] = clock() - start
start = clock()
import sklearn.pipeline, sklearn.preprocessing, mlflow.sklearn
steps["scikit-learn"] = clock() - start
start = clock()
from gpinfer.experiment.safe_model import import_skops_io
import_skops_io()
steps["skops"] = clock() - start
print(json.dumps(steps))
"""

#: the MLflow floor: record one run in the store, nothing else (``os._exit`` as gpinfer-run)
_MLFLOW_ONLY = """
import os, sys, time
import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
found = client.get_experiment_by_name("gpinfer-floor")
experiment = found.experiment_id if found else client.create_experiment("gpinfer-floor")
run = client.create_run(experiment)
stamp = int(time.time() * 1000)
client.log_batch(run.info.run_id, metrics=[Metric("test_error", 0.1, stamp, 0),
                 Metric("test_nll", 0.3, stamp, 0)], params=[Param("method", "sep")])
client.set_terminated(run.info.run_id)
sys.stdout.flush()
os._exit(0)
"""


def _command_seconds(code: str) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``python -c code`` as a whole process."""
    before, start = os.times(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    wall, after = time.perf_counter() - start, os.times()
    return wall, (after.children_user + after.children_system
                  - before.children_user - before.children_system)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        parser.error("set MLFLOW_TRACKING_URI to an existing store (a new one costs seconds once)")
    samples: dict[str, list[float]] = {}
    interpreter = []
    for _ in range(args.repeat):
        before = os.times()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        after = os.times()
        interpreter.append(after.children_user + after.children_system
                           - before.children_user - before.children_system)
        done = subprocess.run([sys.executable, "-c", _STEPS], check=True, capture_output=True,
                              text=True)
        for key, value in json.loads(done.stdout.strip().splitlines()[-1]).items():
            samples.setdefault(key, []).append(value)
    print(f"medians over {args.repeat} runs, CPU s (load average now "
          f"{os.getloadavg()[0]:.1f})")
    print(f"{'interpreter (python -c pass)':32}{statistics.median(interpreter):6.2f}")
    for key, values in samples.items():
        print(f"{key:32}{statistics.median(values):6.2f}")
    total = statistics.median(interpreter) + sum(statistics.median(v) for v in samples.values())
    print(f"{'total':32}{total:6.2f}")
    _command_seconds(_MLFLOW_ONLY)  # the floor's experiment exists from here on
    floor = [_command_seconds(_MLFLOW_ONLY) for _ in range(args.repeat)]
    print(f"MLflow floor (a process that only records one run): wall "
          f"{statistics.median(w for w, _ in floor):.2f} s, CPU "
          f"{statistics.median(c for _, c in floor):.2f} s (load average now "
          f"{os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
