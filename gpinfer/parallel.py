"""Independent per-latent work (one kernel, one inducing set, one Gaussian per class) on threads.

Multi-class sparse methods repeat the same ``O(M^2 n + M n D)`` algebra for each class with no
data shared between classes until the tilted moments couple them. The large pieces of that
work (matrix products, Cholesky factorisations, element-wise exponentials) release the GIL, so
a small thread pool runs classes side by side in one process, sharing every array without
copies. ``map_latents`` is the only entry point: ``n_jobs == 1`` is a plain loop (same order,
same floating-point results); ``n_jobs > 1`` gives the same results, in order, with each item
computed exactly as the loop would (threads never split one class's work).

Pair it with one BLAS thread per worker (``blas_threads_for``): on small matrices (M ~ 200) a
multi-threaded BLAS call costs more in hand-off than it saves, and ``n_jobs`` threads each
starting BLAS threads oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from threadpoolctl import threadpool_limits

from gpinfer.errors import InputError

T = TypeVar("T")
R = TypeVar("R")

_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def check_n_jobs(n_jobs: object, owner: str = "n_jobs") -> int:
    """``n_jobs`` as a positive int (``-1``: one per CPU, as in scikit-learn); ``InputError``
    naming ``owner`` otherwise."""
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or (n_jobs < 1 and n_jobs != -1):
        raise InputError(
            f"{owner} must be a positive integer (threads) or -1 (one per CPU), got {n_jobs!r}"
        )
    return (os.cpu_count() or 1) if n_jobs == -1 else n_jobs


def blas_threads_for(n_jobs: int) -> contextlib.AbstractContextManager:
    """A context with one BLAS thread when ``n_jobs > 1`` (the caller's setting otherwise)."""
    return threadpool_limits(limits=1, user_api="blas") if n_jobs > 1 else contextlib.nullcontext()


def _pool(n_jobs: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(n_jobs)
        if pool is None:
            pool = _pools[n_jobs] = ThreadPoolExecutor(n_jobs, thread_name_prefix="gpinfer")
        return pool


def map_latents(fn: Callable[[T], R], items: Iterable[T], n_jobs: int = 1) -> list[R]:
    """``[fn(item) for item in items]``, on ``n_jobs`` threads when ``n_jobs > 1``.

    The first exception raised by any item is re-raised here (after the others finish), so
    callers handle numerical failures exactly as in the serial loop. Calls from inside a
    worker run serially (no nested pools, no deadlock).
    """
    items = list(items)
    if n_jobs <= 1 or len(items) <= 1 or threading.current_thread().name.startswith("gpinfer"):
        return [fn(item) for item in items]
    futures = [_pool(n_jobs).submit(fn, item) for item in items]
    results, error = [], None
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as err:  # noqa: BLE001 - re-raised below, after all have finished
            error = error or err
    if error is not None:
        raise error
    return results
