"""Old import paths of modules that moved from the core into a method plugin (issue 23: a
method's maths lives in its plugin). The core module left behind is a stub whose module-level
``__getattr__`` is ``moved_to(old, new)``: ``from gpinfer.sites.rank_one import X``
still works for one release, importing ``X`` lazily from the plugin's module with a
``DeprecationWarning`` that names the new path.

    # gpinfer/sites/rank_one.py
    from gpinfer.moved import moved_to

    __getattr__ = moved_to(__name__, "gpinfer_pep.rank_one")
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

#: every stub left in the core: old module -> (new module, the distribution that ships it);
#: ``tests/test_moved.py`` checks each
MOVED: dict[str, tuple[str, str]] = {}

_MISSING = object()


def moved_to(old: str, new: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of stub ``old``: a name is imported from ``new`` (its home in
    a plugin: ``gpinfer_pep.rank_one`` ships with the distribution ``gpinfer-pep``) with a
    ``DeprecationWarning``; a dunder or unknown name is an ``AttributeError``, and a missing
    plugin an ``ImportError`` naming it."""
    plugin = new.split(".")[0].replace("_", "-")
    MOVED[old] = (new, plugin)

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # the import machinery's probes (``__path__``, ...)
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(new)
        except ImportError as exc:
            raise ImportError(f"{old} moved to {new}, which ships with the plugin {plugin!r}: "
                              f"install it (pip install -e plugins/{plugin})") from exc
        value = getattr(module, name, _MISSING)  # once: a name ``renamed`` there warns itself
        if value is _MISSING:
            raise AttributeError(f"module {old!r} (moved to {new!r}) has no attribute {name!r}")
        warnings.warn(f"{old} moved to {new} (plugin {plugin!r}): import {name!r} from {new}; "
                      "the old path works for one more release", DeprecationWarning,
                      stacklevel=2)
        return value

    return __getattr__


def renamed(module: str, names: dict[str, str], hint: str = "") -> Callable[[str], Any]:
    """The module ``__getattr__`` of a live module ``module`` some of whose names were
    replaced: ``names`` maps each old name to its successor ``"package.module:name"``, imported
    lazily with a ``DeprecationWarning`` that names it (one release); any other name is an
    ``AttributeError``; ``hint`` ends the warning (how to spell the calls now). A private
    successor (``_name``: a shim that keeps the old calls working) is not named: the warning
    says the old name is deprecated and ``hint`` gives the new spelling. Install it at
    run time only (``if not TYPE_CHECKING:``), so that mypy
    keeps checking the imports from ``module``."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, new = names[name].split(":")
        now = "deprecated" if new.startswith("_") else f"{home}.{new} now"
        # reported at the user's line, past ``module``'s own ``__getattr__`` around this one
        # and a ``moved_to`` stub's lookup (the default filters show it only there)
        inside = {__file__, getattr(sys.modules.get(module), "__file__", None)}
        warnings.warn(f"{module}.{name} is {now}{hint}; the old name works for one "
                      "more release", DeprecationWarning, stacklevel=_level_outside(inside))
        return getattr(importlib.import_module(home), new)

    return __getattr__


def _level_outside(files: set[str | None]) -> int:
    """The ``stacklevel`` of a ``warnings.warn`` in the caller (a module ``__getattr__``)
    that reports the first frame above it whose file is none of ``files`` (at least its own
    caller's: ``stacklevel=2``)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename in files:
        frame, level = frame.f_back, level + 1
    return level
