"""The benchmarks' timer: the best of repeated calls (the least disturbed by other load)."""

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeats: int = 3,
            clock: Callable[[], float] = time.process_time) -> float:
    """The shortest of ``repeats`` calls of ``fn()`` in seconds of ``clock`` (process CPU time
    by default)."""
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best
