"""Settings for the whole test suite (core tests and every plugin's tests).

BLAS runs single-threaded: the suite's matrices are small, and on a 2-core machine OpenBLAS's
threads oversubscribe the cores (measured: plugin suites ran about ten times slower).
"""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def _one_blas_thread():
    with threadpool_limits(limits=1):
        yield
