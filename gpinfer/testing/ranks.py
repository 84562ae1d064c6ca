"""K processes in one gloo group for tests (no port: a ``file://`` rendezvous under a folder).

``run_ranks(code, K, folder)`` runs ``code`` (Python source) in ``K`` fresh interpreters at
once, each after ``gpinfer.training.distributed.start_group("gloo", "file://...")`` (the
group ``init_process_group`` would start, its store kept for the failure post) with ``RANK``
and ``WORLD_SIZE`` set; the code writes its results with ``save(**arrays)``
(``numpy.savez`` into the folder, one file per rank) and ``run_ranks`` returns them in rank
order. A rank that fails (or runs past ``timeout_s``) fails the call with its output.
``launch_ranks`` runs them alike and gives each rank's exit status and output (for a rank
that is meant to fail or be killed).
``worst_rank_differences(source, folder)`` runs a source that builds a dict ``fits`` of arrays
as ``K`` ranks and once in this process, and gives each array's largest relative difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

_PRELUDE = """
import os, numpy as np, torch.distributed as dist
from gpinfer.training.distributed import start_group
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
start_group("gloo", {init!r}, {timeout}, rank=RANK, world_size=WORLD)
def save(**arrays):
    np.savez(os.path.join({folder!r}, f"rank{{RANK}}.npz"), **arrays)
"""

# a rank whose group was ended by a failure (distributed.leave_on_failure) has none to close
_EPILOGUE = "\nif dist.is_initialized():\n    dist.barrier()\n    dist.destroy_process_group()\n"


def launch_ranks(code: str, K: int, folder: Path, timeout_s: float = 120.0,
                 cwd: Path | None = None, epilogue: str = "",
                 collective_s: float | None = None) -> list[tuple[int, str]]:
    """``code`` (then ``epilogue``) run as ``K`` gloo ranks at once (see the module doc; the
    collective timeout is ``collective_s``, default ``timeout_s``); each rank's exit status
    and output, in rank order (a rank past ``timeout_s`` is killed: status -9)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    init = f"file://{folder / 'rendezvous'}"
    timeout = timeout_s if collective_s is None else collective_s
    source = _PRELUDE.format(init=init, timeout=timeout, folder=str(folder)) + \
        textwrap.dedent(code) + epilogue
    procs = []
    for r in range(K):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(K),
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", source], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=cwd))
    ended = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n(killed after {timeout_s} s)"
        ended.append((int(p.returncode), out))
    return ended


def run_ranks(code: str, K: int, folder: Path, timeout_s: float = 120.0,
              cwd: Path | None = None) -> list[dict[str, np.ndarray]]:
    """``code`` run as ``K`` gloo ranks (see the module doc) in the folder ``cwd`` (``None``:
    this one; the code imports from there); each rank's saved arrays, in rank order."""
    ended = launch_ranks(code, K, folder, timeout_s, cwd, _EPILOGUE)
    failed = [f"rank {r} exited {rc}:\n{out}" for r, (rc, out) in enumerate(ended) if rc != 0]
    if failed:
        raise RuntimeError("\n".join(failed))
    return [dict(np.load(Path(folder) / f"rank{r}.npz")) for r in range(K)]


def one_process(source: str) -> dict[str, np.ndarray]:
    """The dict ``fits`` of arrays that ``source`` (Python code) builds, run in this process:
    the reference of a data-parallel fit."""
    scope: dict[str, object] = {}
    exec(source, scope)  # noqa: S102 - the same source as the ranks run
    fits = scope["fits"]
    assert isinstance(fits, dict)
    return fits


def worst_rank_differences(source: str, folder: Path, K: int = 2) -> dict[str, float]:
    """``source`` (which builds a dict ``fits`` of finite arrays) run by ``K`` gloo ranks and
    once in this process (``one_process``): per array, the largest relative difference of any
    rank's array from this process's (``inf`` where an array is not finite or its shape
    differs)."""
    ranks = run_ranks(source + "\nsave(**fits)\n", K, folder)
    worst: dict[str, float] = {}
    for name, p in one_process(source).items():
        diffs = [float(np.max(np.abs(out[name] - p) / np.abs(p)))
                 if out[name].shape == p.shape and np.all(np.isfinite(p)) else np.inf
                 for out in ranks]
        worst[name] = max(diffs)
    return worst
