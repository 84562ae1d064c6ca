"""The thread policy: one BLAS thread per training worker unless the user asks otherwise.

Why: the methods' linear algebra is a stream of matrices of a few hundred rows (M ~ 100-500).
On such sizes a multi-threaded BLAS call costs more in hand-off than it gains, and on a machine
with other work running its threads spin while waiting for cores: a SEP fit on digits took 17x
longer with OpenBLAS's default threads than with one, a Laplace fit 8-30x. Sweeps run one job
per core, so one thread per job is also what fills a machine without oversubscribing it.

The one knob is the environment variable ``GPINFER_BLAS_THREADS``:

* unset or ``1``: every fit runs with one BLAS (and OpenMP) thread;
* a positive integer ``n``: ``n`` threads (large problems, for example ``M`` in the thousands,
  where one BLAS call is big enough to share; measure before raising it);
* ``inherit``: gpinfer leaves the thread settings of the process as they are.

``training_threads()`` applies the setting around a fit (the estimators' ``fit`` enters it, so
library fits, ``gpinfer-run`` and every sweep job get it), to torch's CPU threads as well when
the torch backend is loaded. It limits every BLAS library loaded in
the process (numpy's and scipy's own OpenBLAS are distinct libraries; both are loaded first, so a
limit reaches scipy's even when scipy's linear algebra was not yet imported). ``export_policy()``
writes the setting into the environment variables that BLAS libraries read when they load, for
processes started later (joblib / submitit workers) and libraries loaded later. ``run_tags()``
is what a ``gpinfer-run`` run records of them (MLflow tags), so that a timing can be read with
the threads it ran on.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from gpinfer.errors import InputError

#: the environment variable that sets the number of BLAS threads a fit uses
THREADS_ENV = "GPINFER_BLAS_THREADS"
#: its value that leaves the process's thread settings alone
INHERIT = "inherit"
#: the environment variables BLAS / OpenMP runtimes read when they are loaded
RUNTIME_ENVS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def blas_threads(value: str | int | None = None) -> int | None:
    """The number of BLAS threads a fit uses (``None``: inherit the process's settings).

    ``value``: a setting to check (default: ``GPINFER_BLAS_THREADS``, unset meaning 1).
    ``InputError`` when it is neither a positive integer nor ``"inherit"``.
    """
    raw = os.environ.get(THREADS_ENV) if value is None else value
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return 1
    if isinstance(raw, str) and raw.strip().lower() == INHERIT:
        return None
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit() or int(text) < 1:
        raise InputError(
            f"{THREADS_ENV} must be a positive integer (BLAS threads per fit) or "
            f"{INHERIT!r}; got {raw!r}"
        )
    return int(text)


def _load_blas_libraries() -> None:
    """Import the modules that load numpy's and scipy's BLAS, so that a limit reaches both."""
    import numpy.linalg  # noqa: F401
    import scipy.linalg  # noqa: F401


@contextlib.contextmanager
def training_threads(n: int | None = None) -> Iterator[None]:
    """A context in which every loaded BLAS and OpenMP library uses ``n`` threads.

    ``n`` defaults to ``blas_threads()``; ``None`` from the policy (``inherit``) changes nothing.
    The previous limits are restored on exit.
    """
    limit = blas_threads() if n is None else n
    if limit is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    _load_blas_libraries()
    with threadpool_limits(limits=int(limit)), _torch_threads(int(limit)):
        yield


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op CPU threads held to ``n`` (its own pool, which threadpoolctl does not
    reach) when torch is loaded (the torch backend, ``gpinfer.backend``); restored on exit."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def export_policy() -> None:
    """Set the BLAS runtimes' environment variables from the policy where the user has not.

    Call it before starting worker processes: a process inherits the variables, and a BLAS
    library reads them when it is loaded. Variables the user set are kept. An invalid setting
    changes nothing here (each fit reports it as an ``InputError`` before training).
    """
    try:
        limit = blas_threads()
    except InputError:
        return
    if limit is None:
        return
    for name in RUNTIME_ENVS:
        os.environ.setdefault(name, str(limit))


#: the MLflow tags of ``run_tags``
BLAS_THREADS_TAG = "gpinfer.blas_threads"
THREAD_ENV_TAG = "gpinfer.thread_env"


def run_tags() -> dict[str, str]:
    """The thread settings of this process as a run's tags: ``gpinfer.blas_threads``, the
    policy's count (``inherit`` when it leaves the process alone), and ``gpinfer.thread_env``,
    ``GPINFER_BLAS_THREADS`` and the BLAS runtimes' variables that are set, as ``NAME=value``
    separated by spaces (``none`` when none is)."""
    limit = blas_threads()
    env = [f"{name}={os.environ[name]}" for name in (THREADS_ENV, *RUNTIME_ENVS)
           if name in os.environ]
    return {BLAS_THREADS_TAG: INHERIT if limit is None else str(limit),
            THREAD_ENV_TAG: " ".join(env) or "none"}
