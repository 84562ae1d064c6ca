"""Plugin registry: entry points found lazily, loaded one at a time, failures isolated.

Every method, likelihood, kernel and dataset is an entry point in one of the groups below,
declared in some distribution's ``pyproject.toml``. The core never imports a plugin by name:

* ``entries(group)`` reads the installed distributions' metadata and imports nothing;
* ``load(group, name)`` imports exactly one entry point (and caches the result);
* ``load_all(group)`` imports every entry point of a group and returns the failures beside the
  successes, so a broken plugin never hides the others.

Errors name the problem: an unknown name lists the nearest known names and the full list; a
plugin that fails to import names its distribution, the entry point ``name = value`` and the
original exception (chained); two distributions registering the same name are both named.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpinfer.errors import InputError, PluginLoadError, UnknownNameError

if TYPE_CHECKING:
    from gpinfer.interfaces import Method

METHODS = "gpinfer.methods"
LIKELIHOODS = "gpinfer.likelihoods"
KERNELS = "gpinfer.kernels"
DATASETS = "gpinfer.datasets"
GROUPS: tuple[str, ...] = (METHODS, LIKELIHOODS, KERNELS, DATASETS)

#: what one entry of each group is called in messages
_KIND = {METHODS: "method", LIKELIHOODS: "likelihood", KERNELS: "kernel", DATASETS: "dataset"}

#: the distributions of this project (the core and the plugins under ``plugins/``): when another
#: distribution registers one of their names, theirs wins and the other is reported, so that an
#: installed package cannot take a built-in method down
OWN_DISTRIBUTIONS = frozenset({
    "gpinfer", "gpinfer-binary", "gpinfer-ep", "gpinfer-ivm", "gpinfer-jj", "gpinfer-laplace",
    "gpinfer-mcmc", "gpinfer-pep", "gpinfer-svi",
})


@dataclass(frozen=True)
class EntryInfo:
    """One registered entry point: ``name = value`` in ``group``, from distribution ``dist``."""

    name: str
    group: str
    value: str
    dist: str
    version: str

    @property
    def spec(self) -> str:
        """The entry point as written in ``pyproject.toml``: ``"name = module:attr"``."""
        return f"{self.name} = {self.value}"


class DuplicatePluginError(PluginLoadError):
    """Two or more distributions register the same name in the same group."""


# caches; the entry cache is keyed on sys.path so that a changed path is seen without refresh()
_entry_cache: dict[tuple[str, tuple[str, ...]], list[EntryInfo]] = {}
_loaded: dict[tuple[str, str], Any] = {}
_failed: dict[tuple[str, str], PluginLoadError] = {}


def refresh() -> None:
    """Forget every cached entry list, loaded object and load failure.

    Call it after installing a plugin into the running interpreter or changing ``sys.path``
    (tests). Modules already imported stay in ``sys.modules``.
    """
    _entry_cache.clear()
    _loaded.clear()
    _failed.clear()
    importlib.invalidate_caches()


def resolve_group(group: str) -> str:
    """Map ``"methods"`` or ``"gpinfer.methods"`` to the full group name; else UnknownNameError."""
    if not isinstance(group, str):
        raise InputError(f"entry-point group must be a string, got {type(group).__name__}")
    if group in GROUPS:
        return group
    full = f"gpinfer.{group}"
    if full in GROUPS:
        return full
    short = [g.split(".", 1)[1] for g in GROUPS]
    raise UnknownNameError(_unknown_message("entry-point group", group, short + list(GROUPS)))


def entries(group: str) -> list[EntryInfo]:
    """All entry points registered in ``group``, sorted by name (then distribution).

    Reads distribution metadata only; imports nothing. A name registered by two distributions
    appears twice here; ``load`` refuses it with an error naming both.
    """
    group = resolve_group(group)
    key = (group, tuple(sys.path))
    if key not in _entry_cache:
        found: set[EntryInfo] = set()
        for ep in metadata.entry_points(group=group):
            dist = ep.dist
            found.add(
                EntryInfo(
                    name=ep.name,
                    group=group,
                    value=ep.value,
                    dist=dist.name if dist is not None else "<unknown>",
                    version=dist.version if dist is not None else "?",
                )
            )
        _entry_cache[key] = sorted(found, key=lambda e: (e.name, e.dist, e.value))
    return list(_entry_cache[key])


def names(group: str) -> list[str]:
    """Registered names in ``group``, sorted and without repeats (imports nothing)."""
    return sorted({e.name for e in entries(group)})


def _canonical(dist: str) -> str:
    return dist.lower().replace("_", "-")


def shadowed(group: str) -> dict[str, list[EntryInfo]]:
    """Entries of ``group`` ignored because one of this project's distributions
    (``OWN_DISTRIBUTIONS``) registers the same name: name -> the ignored entries."""
    group = resolve_group(group)
    out: dict[str, list[EntryInfo]] = {}
    for name in names(group):
        matches = [e for e in entries(group) if e.name == name]
        own = [e for e in matches if _canonical(e.dist) in OWN_DISTRIBUTIONS]
        if len(own) == 1 and len(matches) > 1:
            out[name] = [e for e in matches if e is not own[0]]
    return out


def find(group: str, name: str) -> EntryInfo:
    """The one entry registered as ``name`` in ``group``.

    Raises ``UnknownNameError`` (nearest names and the full list) when there is none. When
    several distributions register it and one of them is this project's (``OWN_DISTRIBUTIONS``),
    that one wins and a ``RuntimeWarning`` names the ignored ones (``gpinfer list`` shows them);
    otherwise ``DuplicatePluginError`` names every distribution.
    """
    group = resolve_group(group)
    matches = [e for e in entries(group) if e.name == name]
    if not matches:
        kind = _KIND[group]
        raise UnknownNameError(
            _unknown_message(kind, name, names(group), where=f"entry-point group {group!r}")
        )
    own = [e for e in matches if _canonical(e.dist) in OWN_DISTRIBUTIONS]
    if len(own) == 1 and len({(e.dist, e.value) for e in matches}) > 1:
        others = "; ".join(f"{e.dist} {e.version} (`{e.spec}`)" for e in matches
                           if e is not own[0])
        warnings.warn(
            f"{_KIND[group]} name {name!r} in group {group!r} is also registered by {others}; "
            f"using {own[0].dist}'s (`{own[0].spec}`). Rename the other plugin's entry point.",
            RuntimeWarning, stacklevel=3,
        )
        return own[0]
    if len({(e.dist, e.value) for e in matches}) > 1:
        who = "; ".join(f"{e.dist} {e.version} (`{e.spec}`)" for e in matches)
        err = DuplicatePluginError(
            f"{_KIND[group]} name {name!r} in group {group!r} is registered by more than one "
            f"distribution: {who}. Uninstall or rename one of them."
        )
        err.entry = matches[0]
        raise err
    return matches[0]


def load(group: str, name: str) -> Any:
    """Import the entry point ``name`` of ``group`` (only that one) and return the object.

    The result, or the failure, is cached until ``refresh()``. Raises ``UnknownNameError`` for
    an unregistered name and ``PluginLoadError`` (naming the distribution, the entry point and
    the original exception, which is chained) when the import fails.
    """
    group = resolve_group(group)
    key = (group, name)
    if key in _loaded:
        return _loaded[key]
    if key in _failed:
        raise _failed[key]
    info = find(group, name)
    try:
        obj = _import(info.value)
    except Exception as exc:
        err = _load_error(info, exc)
        _failed[key] = err
        raise err from exc
    _loaded[key] = obj
    return obj


def load_all(group: str) -> tuple[dict[str, Any], dict[str, PluginLoadError]]:
    """Import every entry point of ``group``.

    Returns ``(loaded, failed)``: name -> object for those that imported, name -> the
    ``PluginLoadError`` for those that did not (including duplicate registrations). One broken
    plugin never stops the others from loading.
    """
    loaded: dict[str, Any] = {}
    failed: dict[str, PluginLoadError] = {}
    for name in names(group):
        try:
            loaded[name] = load(group, name)
        except PluginLoadError as err:
            failed[name] = err
    return loaded, failed


def load_method(name: str) -> type[Method]:
    """Load the method plugin ``name``; check it subclasses ``gpinfer.interfaces.Method``.

    Sets ``cls.name = name`` when the class leaves its ``name`` empty. Raises ``UnknownNameError``
    for an unregistered name and ``PluginLoadError`` when the import fails or the object is not
    a ``Method`` subclass.
    """
    from gpinfer.interfaces import Method

    cls = load(METHODS, name)
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        info = find(METHODS, name)
        err = PluginLoadError(
            f"method plugin {name!r} from distribution {info.dist} {info.version} "
            f"(entry point `{info.spec}`) is {_describe(cls)}, not a subclass of "
            "gpinfer.interfaces.Method"
        )
        err.entry = info
        raise err
    if not cls.name:
        cls.name = name
    return cls


def methods_supporting(predicate: Callable[[type[Method]], bool]) -> list[str]:
    """Sorted names of the method plugins whose class satisfies ``predicate``.

    Example: ``methods_supporting(lambda m: m.multiclass)``. Broken plugins (failed import, not a
    ``Method``, duplicate name) are skipped.
    """
    out = []
    for name in names(METHODS):
        try:
            cls = load_method(name)
        except PluginLoadError:
            continue
        if predicate(cls):
            out.append(name)
    return out


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _import(value: str) -> Any:
    """Import ``"package.module:attr.sub"`` (or a bare module) and return the object."""
    module_name, _, attrs = value.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for attr in filter(None, attrs.strip().split(".")):
        obj = getattr(obj, attr)
    return obj


def _load_error(info: EntryInfo, exc: BaseException) -> PluginLoadError:
    err = PluginLoadError(
        f"{_KIND[info.group]} plugin {info.name!r} from distribution {info.dist} {info.version} "
        f"failed to load: entry point `{info.spec}` in group {info.group!r} raised "
        f"{type(exc).__name__}: {exc}"
    )
    err.entry = info
    return err


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    return f"a {type(obj).__name__} object"


def nearest(name: str, known: list[str], n: int = 3) -> list[str]:
    """Up to ``n`` known names closest to ``name`` (difflib ratio, case-insensitive)."""
    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


def _unknown_message(kind: str, name: str, known: list[str], where: str = "") -> str:
    close = nearest(name, known)
    msg = f"unknown {kind} {name!r}"
    if where:
        msg += f" (no such name in {where})"
    if close:
        msg += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        msg += "."
    msg += f" Known: {', '.join(known) if known else 'none registered'}."
    return msg
