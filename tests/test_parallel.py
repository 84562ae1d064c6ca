"""``gpinfer.parallel.map_latents``: the serial loop's results, order and errors, on threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from gpinfer.errors import InputError, NumericalError
from gpinfer.parallel import check_n_jobs, map_latents


@pytest.mark.parametrize("n_jobs", [1, 2, 3])
def test_results_in_order_and_equal_to_the_loop(n_jobs):
    rng = np.random.default_rng(0)
    mats = [rng.normal(size=(60, 60)) for _ in range(7)]
    serial = [m @ m.T for m in mats]
    out = map_latents(lambda m: m @ m.T, mats, n_jobs)
    for a, b in zip(out, serial):
        np.testing.assert_array_equal(a, b)


def test_work_runs_on_worker_threads_and_nested_calls_stay_serial():
    names = map_latents(lambda _: threading.current_thread().name, range(4), 2)
    assert all(n.startswith("gpinfer") for n in names)
    inner = map_latents(lambda i: map_latents(lambda j: (i, j, threading.current_thread().name),
                                              range(2), 2), range(2), 2)
    for row in inner:  # the inner map ran in its caller's worker thread
        assert row[0][2] == row[1][2]


def test_first_error_is_reraised_after_all_items_finish():
    done = []

    def work(i):
        if i in (1, 3):
            raise NumericalError(f"item {i}")
        done.append(i)
        return i

    with pytest.raises(NumericalError, match="item 1"):
        map_latents(work, range(5), 2)
    assert sorted(done) == [0, 2, 4]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True, None])
def test_bad_n_jobs_is_refused(bad):
    with pytest.raises(InputError, match="n_jobs"):
        check_n_jobs(bad)
    assert [check_n_jobs(n) for n in (1, 2, 3, 7)] == [1, 2, 3, 7]
    assert check_n_jobs(-1) == (os.cpu_count() or 1)  # scikit-learn's "one per CPU"


def test_blas_is_held_to_one_thread_only_with_several_jobs():
    from threadpoolctl import threadpool_info

    from gpinfer.parallel import blas_threads_for

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    with blas_threads_for(2):
        assert all(n == 1 for n in blas_threads())
    assert blas_threads() == before
    with blas_threads_for(1):
        assert blas_threads() == before
