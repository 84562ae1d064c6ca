"""The ``gpinfer`` command: inspect what the registry finds.

``gpinfer list [GROUP] [--check] [--no-import]`` prints, per entry-point group, each registered
name with its distribution and version; each plugin is imported to check it, and one that fails
shows ``BROKEN: <error>`` instead of hiding the others. The exit code is 0 unless ``--check``
is given and something is broken (then 1). ``GROUP`` is ``methods``, ``likelihoods``,
``kernels``, ``datasets`` or the full ``gpinfer.<group>`` name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from gpinfer import registry
from gpinfer.errors import GPInferError, PluginLoadError


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gpinfer")
    except Exception:  # pragma: no cover - only when run from an uninstalled tree
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpinfer`` command."""
    parser = argparse.ArgumentParser(
        prog="gpinfer",
        description="Approximate inference for GP classification: inspect the plugin registry. "
        "Experiments run with `gpinfer-run` (Hydra).",
    )
    parser.add_argument("--version", action="version", version=f"gpinfer {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_list = sub.add_parser(
        "list",
        help="list registered plugins with distribution and version",
        description="List registered entry points per group, importing each to check it.",
    )
    short = ", ".join(g.split(".", 1)[1] for g in registry.GROUPS)
    p_list.add_argument(
        "group", nargs="?", default=None, help=f"one group ({short}); default: all groups"
    )
    p_list.add_argument(
        "--check", action="store_true", help="exit with status 1 if any plugin is broken"
    )
    p_list.add_argument(
        "--no-import",
        action="store_true",
        help="only read metadata; do not import plugins (no BROKEN check)",
    )
    return parser


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    """Left-aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _first_line(err: BaseException) -> str:
    cause = err.__cause__
    text = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def list_group(group: str, out: TextIO, check_import: bool = True) -> int:
    """Print one group's table to ``out``; return the number of broken entries."""
    infos = registry.entries(group)
    print(f"{group} ({len(registry.names(group))} registered)", file=out)
    if not infos:
        print("  (none)", file=out)
        return 0
    failed: dict[str, PluginLoadError] = {}
    if check_import:
        loaded, failed = registry.load_all(group)
        if group == registry.METHODS:  # a method must also be a Method subclass
            for name in loaded:
                try:
                    registry.load_method(name)
                except PluginLoadError as err:
                    failed[name] = err
    rows = []
    for info in infos:
        status = "not imported" if not check_import else "ok"
        if info.name in failed:
            status = "BROKEN: " + _first_line(failed[info.name])
            if isinstance(failed[info.name], registry.DuplicatePluginError):
                status = "BROKEN: registered by more than one distribution"
        rows.append((info.name, info.dist, info.version, info.value, status))
    for line in _table(rows, ("name", "distribution", "version", "entry point", "status")):
        print(line, file=out)
    if group == registry.DATASETS:
        _print_data_files(out)
    return len(failed)


def _print_data_files(out: TextIO) -> None:
    """List the ``.npz`` files of the data directory (loadable by name too)."""
    from gpinfer.data.paths import data_dir, data_files

    root = data_dir()
    if root is None:
        print("  data directory: none (set GPINFER_DATA_DIR)", file=out)
        return
    files = data_files(root)
    print(f"  data directory {root}: {', '.join(files) if files else '(no .npz files)'}", file=out)


def _cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    groups = registry.GROUPS if args.group is None else (registry.resolve_group(args.group),)
    broken = 0
    for i, group in enumerate(groups):
        if i:
            print(file=out)
        broken += list_group(group, out, check_import=not args.no_import)
    if broken:
        print(f"\n{broken} plugin(s) broken", file=out)
    return 1 if (args.check and broken) else 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``gpinfer`` console script; returns the exit status."""
    out = sys.stdout if out is None else out
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(out)
        return 0
    try:
        if args.command == "list":
            return _cmd_list(args, out)
    except GPInferError as err:
        print(f"gpinfer: error: {err}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
