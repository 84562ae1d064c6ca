"""The C allocator's priming before a fit (``prime_allocator``, called by the estimators' fit,
in memory and out of core): a fit's steps allocate and free the same tens of MB of temporaries,
which glibc's malloc would otherwise give back to the operating system after every step and
fault in afresh at the next.
"""

from __future__ import annotations

import numpy as np

#: bytes of the block ``prime_allocator`` allocates and frees: under glibc's largest dynamic
#: mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit), NumPy's overhead included
ALLOCATOR_PRIME_BYTES = 30 * 2**20


def prime_allocator() -> None:
    """Allocates and frees one block of ``ALLOCATOR_PRIME_BYTES`` (never written: no page of
    it becomes resident). glibc's malloc serves a block at least its dynamic mmap threshold in
    size by ``mmap`` (fresh pages, each faulted in when first written) and, when such a block
    is freed, raises the threshold to its size and the heap's trim threshold to twice that;
    from then on blocks below ~30 MB come from the heap, which keeps up to ~60 MB free between
    steps. Unprimed, a process whose largest freed block is a step's own temporaries never
    lifts the threshold above them (a block of the threshold's size is still mapped), and its
    heap is trimmed after every step: svi on a 1e6 x 20 memmap (B 5000, M 50, C 3) took 1.6
    million minor page faults an epoch, 3.0 s of system CPU against 9.7 s of user CPU; in
    memory the same fit at 1e6 paid nothing (a block its set-up frees lifts the threshold),
    at 1e7 (the set-up's blocks over 32 MiB, which do not lift it) 0.92 s of
    system CPU and 386 000 faults per 100 steps (``benchmarks/scale_out.py``). The threshold
    only rises, so one call a process would do; the estimators call it at every fit (a
    mapping made and unmade, or a heap block reused: microseconds). The thresholds are the
    process's, every thread's arena included, so a fit in a thread primes them as well. The
    values computed are
    unchanged; other allocators, or thresholds fixed by the user (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_`` or ``mallopt``, which turn the dynamic thresholds off), only
    see one unused block come and go. Peak memory is unchanged (the block is never
    touched)."""
    block = np.empty(ALLOCATOR_PRIME_BYTES, dtype=np.uint8)
    del block
