"""Rate-limited progress lines for long runs: iteration, objective and elapsed time.

A run that ends within ``start_after_s`` seconds prints nothing; after that at most one line is
written every ``every_s`` seconds, so a fast method never floods the terminal. Lines go to
``stderr`` by default, leaving ``stdout`` to the one-line summary.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressPrinter:
    """Print ``label  iter i/n  objective v  elapsed t s`` lines, at most one per ``every_s``.

    ``clock`` is injectable for tests (monotonic seconds). ``update`` returns whether it printed.
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        start_after_s: float = 3.0,
        every_s: float = 2.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if start_after_s < 0 or every_s < 0:
            raise ValueError("progress start_after_s and every_s must be >= 0")
        self.label = label
        self.total = total
        self.start_after_s = float(start_after_s)
        self.every_s = float(every_s)
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._last: float | None = None
        self.lines_printed = 0

    @property
    def stream(self) -> TextIO:
        """Where lines go (``sys.stderr`` at call time unless a stream was given)."""
        return self._stream if self._stream is not None else sys.stderr

    def format(self, iteration: int, objective: float, elapsed: float) -> str:
        """One progress line (no trailing newline)."""
        it = f"{iteration}/{self.total}" if self.total else f"{iteration}"
        obj = f"{objective:.6g}" if math.isfinite(objective) else str(objective)
        return f"[{self.label}] iter {it}  objective {obj}  elapsed {elapsed:.1f} s"

    def update(self, iteration: int, objective: float, elapsed: float | None = None) -> bool:
        """Report one iteration; print it only if the rate limit allows. Returns True if printed."""
        now = self._clock()
        since_start = now - self._start
        if since_start < self.start_after_s:
            return False
        if self._last is not None and now - self._last < self.every_s:
            return False
        self._last = now
        shown = since_start if elapsed is None else float(elapsed)
        print(self.format(iteration, float(objective), shown), file=self.stream, flush=True)
        self.lines_printed += 1
        return True
