"""A tqdm progress bar over a fit's outer iterations: rate, ETA, objective, last test error.

Used by ``gpinfer-run`` (config ``progress.bar``) and by library fits with ``verbose``
(``GPClassifier(..., verbose=True)``). ``show``:

* ``"auto"``: a bar only when the stream is a terminal and the ``CI`` variable is unset, so
  logs, pipes and CI stay clean;
* ``True``: always (asked for: a log file gets tqdm's periodic lines); ``False``: never.

The bar goes to ``stderr`` by default, leaving ``stdout`` to results.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: seconds between two redraws of the bar
MIN_INTERVAL_S = 0.5


def wants_bar(show: bool | str, stream: TextIO | None = None) -> bool:
    """Whether a bar is drawn for ``show`` (``True``, ``False`` or ``"auto"``) on ``stream``."""
    if isinstance(show, str):
        if show.lower() != "auto":
            raise ValueError(f"progress must be true, false or 'auto'; got {show!r}")
        target = stream if stream is not None else sys.stderr
        isatty = getattr(target, "isatty", None)
        return bool(isatty and isatty()) and not os.environ.get("CI")
    return bool(show)


def _fmt(value: float) -> str:
    return f"{value:.5g}" if math.isfinite(value) else str(value)


class ProgressBar:
    """One tqdm bar of ``total`` iterations labelled ``label`` (disabled: every call is free).

    ``update(iteration, objective, test_error=None)`` moves the bar to ``iteration`` and shows
    the objective and the latest test error (kept until the next one is computed).
    """

    def __init__(self, total: int | None, label: str, *, show: bool | str = "auto",
                 stream: TextIO | None = None) -> None:
        self.enabled = wants_bar(show, stream)
        self.bar: Any = None
        self._test_error: float | None = None
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=label, unit="it", file=stream or sys.stderr,
                            mininterval=MIN_INTERVAL_S, dynamic_ncols=True, leave=True)

    def update(self, iteration: int, objective: float | None = None,
               test_error: float | None = None) -> None:
        if self.bar is None:
            return
        if test_error is not None:
            self._test_error = float(test_error)
        parts = [] if objective is None else [f"objective={_fmt(float(objective))}"]
        if self._test_error is not None:
            parts.append(f"test error={self._test_error:.4f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)
        step = int(iteration) - int(self.bar.n)
        if step > 0:
            self.bar.update(step)
        else:
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def progress_callback(
    show: bool | str, total: int | None, label: str,
    callback: Callable[[Any], Any] | None = None, stream: TextIO | None = None,
) -> Iterator[Callable[[Any], Any] | None]:
    """``callback`` wrapped so that each ``IterationInfo`` also moves a bar (library fits).

    With no bar to draw, ``callback`` itself is yielded unchanged.
    """
    bar = ProgressBar(total, label, show=show, stream=stream)
    if not bar.enabled:
        yield callback
        return

    def wrapped(info: Any) -> Any:
        out = callback(info) if callback is not None else None
        bar.update(int(info.iteration), float(info.objective))
        return out

    try:
        yield wrapped
    finally:
        bar.close()
