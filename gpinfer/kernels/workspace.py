"""Reused ``[C, M, D]`` buffers of the stacked kernels' numpy forward (``gpinfer.kernels.stacked``).

Why: numpy asks the operating system for transparent huge pages on every allocation of 4 MiB
or more (``madvise(MADV_HUGEPAGE)``); where the kernel's THP ``defrag`` setting is ``madvise``
(a common default), the first touch of each fresh array then pays synchronous compaction and
zeroing of huge pages. At MNIST size (``C = 10``, ``M = 200``, ``D = 784``: 12.5 MB per array)
a fresh array cost 20-25 ms of process-CPU time where its arithmetic costs ~1 ms (measured
2026-12-05; see ``benchmarks/engine_step.py``, item 3). The forward's two ``[C, M, D]`` arrays
are therefore kept here and written with ``out=`` on every evaluation: their pages are paid
once, not once per step.

Ownership:

- ``scratch``: a temporary of one evaluation (the scaled inputs ``A``), never handed out: the
  same buffer serves every evaluation (one at a time: a family is evaluated by one thread).
- ``lend``: the unscaled inputs ``Zs = Z - shift`` that a ``StackedCovariances`` keeps for its
  VJP. The buffer is lent to that covariances object (its *holder*, held by a weak reference)
  and reused only once the holder is gone; while the holder is still referenced, a new buffer
  is allocated for the new holder and becomes the workspace's (the old one stays with the old
  holder and is freed with it). A covariances object that is still referenced never sees its
  arrays overwritten.

Buffers take the shape and dtype of the last request (another shape or dtype: new buffers), so
memory is two ``[C, M, D]`` arrays, independent of the number of training points.
"""

from __future__ import annotations

import weakref

import numpy as np


def _fitting(buffer: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    """``buffer`` when it has ``like``'s shape and dtype, else a new C-contiguous array."""
    if buffer is not None and buffer.shape == like.shape and buffer.dtype == like.dtype:
        return buffer
    return np.empty(like.shape, dtype=like.dtype)


class Workspace:
    """Buffers shaped like the inducing stack ``Z [C, M, D]`` (numpy), reused across
    evaluations under the ownership rule of the module docstring."""

    def __init__(self) -> None:
        self._scratch: np.ndarray | None = None
        self._lent: np.ndarray | None = None
        self._holder: weakref.ref[object] | None = None

    def scratch(self, like: np.ndarray) -> np.ndarray:
        """A buffer of ``like``'s shape and dtype for use within one evaluation only."""
        self._scratch = _fitting(self._scratch, like)
        return self._scratch

    def lend(self, like: np.ndarray, holder: object) -> np.ndarray:
        """A buffer of ``like``'s shape and dtype that ``holder`` may keep: the last lent one
        when its holder is gone, else a new one (``holder`` must support weak references)."""
        if self._holder is not None and self._holder() is not None:
            self._lent = None  # its holder is alive and keeps it
        self._lent = _fitting(self._lent, like)
        self._holder = weakref.ref(holder)
        return self._lent

    def __getstate__(self) -> dict:
        """Copies and pickles start without buffers (and without the weak reference)."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]
