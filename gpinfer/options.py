"""Method options declared once, with a type, a range and a default, and checked before training.

A method plugin declares its options as a mapping ``name -> Option`` in the class attribute
``option_spec``; ``gpinfer.interfaces.Method`` derives ``default_options`` from it and checks
every option value given to ``__init__`` against it, so that a wrong type or an out-of-range
value is one ``InputError`` naming the method, the option, the value and what is allowed, raised
before any training (and, in ``gpinfer-run``, before any MLflow run). Example::

    from gpinfer.options import choice, integer, real

    class MyMethod(Method):
        option_spec = {
            "damping": real(0.5, "(0, 1]", doc="step fraction of each site update"),
            "max_sweeps": integer(200, "[1, inf)"),
            "schedule": choice("sequential", ("sequential", "parallel")),
        }

Ranges are written as intervals: ``"(0, 1]"``, ``"[0, inf)"``, ``"(-inf, inf)"``.
``none=True`` also allows ``None`` (printed ``null`` in Hydra configs).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpinfer.errors import InputError

__all__ = [
    "Interval",
    "Option",
    "bounds",
    "check_options",
    "choice",
    "custom",
    "flag",
    "integer",
    "mapping",
    "real",
]

_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,]+?)\s*,\s*([^,]+?)\s*([\])])\s*$")


@dataclass(frozen=True)
class Interval:
    """A real interval such as ``(0, 1]``: ``low``/``high`` (``±inf`` for none) and whether
    each end is included."""

    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        """``"(0, 1]"`` -> ``Interval(0, 1, False, True)``; ``ValueError`` for a malformed text."""
        match = _INTERVAL.match(text)
        if match is None:
            raise ValueError(f"malformed interval {text!r}; write e.g. '(0, 1]' or '[1, inf)'")
        left, lo, hi, right = match.groups()
        return cls(float(lo), float(hi), left == "[", right == "]")

    def __contains__(self, x: float) -> bool:
        above = x >= self.low if self.low_closed else x > self.low
        below = x <= self.high if self.high_closed else x < self.high
        return bool(above and below)

    def __str__(self) -> str:
        def end(v: float) -> str:
            if math.isinf(v):
                return "-inf" if v < 0 else "inf"
            return f"{v:g}" if v != int(v) or abs(v) >= 1e16 else str(int(v))

        left = "[" if self.low_closed else "("
        right = "]" if self.high_closed else ")"
        return f"{left}{end(self.low)}, {end(self.high)}{right}"


_ANY_REAL = Interval(-math.inf, math.inf, False, False)


@dataclass(frozen=True)
class Option:
    """One declared option: its ``default``, what is ``allowed`` (in words, for messages),
    the ``check`` that returns the normalised value or ``None`` when the value is not allowed,
    whether ``None`` is allowed, and a one-line ``doc``.

    Build options with ``real``, ``integer``, ``flag``, ``choice``, ``bounds``, ``mapping`` or
    ``custom`` rather than directly.
    """

    default: Any
    allowed: str
    check: Callable[[Any], tuple[bool, Any]] = field(repr=False, compare=False)
    none: bool = False
    doc: str = ""

    def with_default(self, default: Any) -> Option:
        """The same option with another default (a preset of a method, say)."""
        return replace(self, default=default)

    def validate(self, value: Any, method: str, name: str) -> Any:
        """``value`` normalised (e.g. an int given for a real becomes a float); else
        ``InputError`` naming ``method``, the option ``name``, the value and what is allowed."""
        if value is None and self.none:
            return None
        ok, normalised = self.check(value)
        if not ok:
            allowed = self.allowed + (" or null" if self.none else "")
            raise InputError(
                f"method {method!r}: option {name!r} = {value!r} is not allowed; expected "
                f"{allowed}"
            )
        return normalised


def _is_real(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def _range(range_: str | None) -> Interval:
    return _ANY_REAL if range_ is None else Interval.parse(range_)


def real(default: Any, range: str | None = None, *, none: bool = False, doc: str = "") -> Option:
    """A finite real number (ints accepted, returned as float) in the interval ``range``."""
    interval = _range(range)

    def check(v: Any) -> tuple[bool, Any]:
        ok = _is_real(v) and float(v) in interval
        return ok, float(v) if ok else None

    where = "" if interval == _ANY_REAL else f" in {interval}"
    return Option(default, f"a real number{where}", check, none, doc)


def integer(default: Any, range: str | None = None, *, none: bool = False,
            also: Sequence[int] = (), doc: str = "") -> Option:
    """An integer (not a bool) in the interval ``range``, or one of the special values ``also``
    (e.g. ``-1`` for "one per CPU")."""
    interval = _range(range)

    def check(v: Any) -> tuple[bool, Any]:
        ok = (isinstance(v, numbers.Integral) and not isinstance(v, bool)
              and (int(v) in interval or int(v) in also))
        return ok, int(v) if ok else None

    where = "" if interval == _ANY_REAL else f" in {interval}"
    extra = "".join(f" or {a}" for a in also)
    return Option(default, f"an integer{where}{extra}", check, none, doc)


def flag(default: Any, *, none: bool = False, doc: str = "") -> Option:
    """``True`` or ``False``."""

    def check(v: Any) -> tuple[bool, Any]:
        ok = isinstance(v, bool | np.bool_)
        return ok, bool(v) if ok else None

    return Option(default, "true or false", check, none, doc)


def choice(default: Any, choices: Sequence[Any], *, doc: str = "") -> Option:
    """One of ``choices`` (strings, and ``None`` when listed)."""
    allowed_values = tuple(choices)
    none = None in allowed_values
    named = [c for c in allowed_values if c is not None]

    def check(v: Any) -> tuple[bool, Any]:
        ok = isinstance(v, str) and v in named
        return ok, v if ok else None

    return Option(default, "one of " + ", ".join(repr(c) for c in named), check, none, doc)


def bounds(default: Any, range: str | None = None, *, none: bool = False,
           doc: str = "") -> Option:
    """A pair ``[low, high]`` of reals in ``range`` with ``low < high`` (returned as a tuple)."""
    interval = _range(range)

    def check(v: Any) -> tuple[bool, Any]:
        if isinstance(v, str | bytes | Mapping) or not isinstance(v, Sequence) or len(v) != 2:
            return False, None
        lo, hi = v
        ok = (_is_real(lo) and _is_real(hi) and float(lo) < float(hi)
              and float(lo) in interval and float(hi) in interval)
        return ok, (float(lo), float(hi)) if ok else None

    where = "" if interval == _ANY_REAL else f" in {interval}"
    return Option(default, f"a pair [low, high] of real numbers{where} with low < high",
                  check, none, doc)


def mapping(default: Any = None, *, none: bool = True, doc: str = "") -> Option:
    """A mapping of keyword options (e.g. an optimiser's), checked by whoever consumes it;
    where ``None`` is allowed an empty mapping is ``None`` (no options: a Hydra group's
    ``options: {}`` and the code's default are the same setting)."""

    def check(v: Any) -> tuple[bool, Any]:
        if not isinstance(v, Mapping):
            return False, None
        return True, (dict(v) or None) if none else dict(v)

    return Option(default, "a mapping (key: value)", check, none, doc)


def custom(default: Any, allowed: str, check: Callable[[Any], bool], *, none: bool = False,
           doc: str = "") -> Option:
    """Any value for which ``check(value)`` is true (returned unchanged); ``allowed`` says
    what that is, in words, for the error message."""
    return Option(default, allowed, lambda v: (bool(check(v)), v), none, doc)


def check_options(method: str, spec: Mapping[str, Option],
                  options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every declared value validated and normalised (undeclared keys are
    passed through unchanged: the caller rejects unknown names); ``InputError`` otherwise."""
    return {key: spec[key].validate(value, method, key) if key in spec else value
            for key, value in options.items()}
