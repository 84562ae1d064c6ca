"""The ``gpinfer`` command: inspect what the registry finds.

``gpinfer list [GROUP] [--check] [--no-import]`` prints, per entry-point group, each registered
name with its distribution and version; each plugin is imported to check it, and one that fails
shows ``BROKEN: <error>`` instead of hiding the others, and an entry ignored because this
project's own distribution registers the same name shows ``IGNORED``. The exit code is 1 when
any plugin is broken or ignored (``--check`` is kept for compatibility), else 0. ``GROUP`` is
``methods``, ``likelihoods``, ``kernels``, ``datasets`` or the full ``gpinfer.<group>`` name.

``gpinfer end-stale-runs [--tracking-uri URI] [--experiment NAME] [--idle-hours H] [--dry-run]``
ends as KILLED the RUNNING runs whose process died (``gpinfer.experiment.stale_runs``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from gpinfer import registry
from gpinfer.errors import GPInferError, InputError, PluginLoadError


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
    for name, help_, description, add_arguments in _COMMANDS:
        add_arguments(sub.add_parser(name, help=help_, description=description))
    return parser


def _list_arguments(p_list: argparse.ArgumentParser) -> None:
    """The arguments of ``list``."""
    short = ", ".join(g.split(".", 1)[1] for g in registry.GROUPS)
    p_list.add_argument(
        "group", nargs="?", default=None, help=f"one group ({short}); default: all groups"
    )
    p_list.add_argument(
        "--check", action="store_true",
        help="(the default now) exit with status 1 if any plugin is broken"
    )
    p_list.add_argument(
        "--no-import",
        action="store_true",
        help="only read metadata; do not import plugins (no BROKEN check)",
    )


def _report_arguments(p_report: argparse.ArgumentParser) -> None:
    """The arguments of ``report``."""
    p_report.add_argument("source", help="a sweep folder or an MLflow experiment name")
    _add_tracking_uri(p_report, "MLflow store of the experiment")
    p_report.add_argument(
        "--out", default=None,
        help="folder for the report files (default: the sweep folder, or "
        "outputs/reports/<experiment> for an experiment)",
    )
    p_report.add_argument("--no-mlflow", action="store_true", help="do not log the report")


def _end_stale_runs_arguments(p_stale: argparse.ArgumentParser) -> None:
    """The arguments of ``end-stale-runs``."""
    _add_tracking_uri(p_stale, "the MLflow store")
    p_stale.add_argument("--experiment", default=None,
                         help="only this experiment (default: every experiment of the store)")
    p_stale.add_argument("--idle-hours", type=float, default=None,
                         help="also end other hosts' runs with nothing logged for this long")
    p_stale.add_argument("--dry-run", action="store_true",
                         help="list the stale runs without ending them")


#: the commands: name, one-line help, description, and what adds their arguments
_COMMANDS: tuple[tuple[str, str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("list", "list registered plugins with distribution and version",
     "List registered entry points per group, importing each to check it.", _list_arguments),
    ("report", "sweep report: mean and standard error over seeds per method x dataset",
     "Summarise the finished runs of a sweep folder (outputs/multirun/...) or of an MLflow "
     "experiment: mean and standard error of test error, test NLL and training time per "
     "method x dataset (x kernel, M), as report.md, report.csv and nll_vs_time.png, also "
     "logged to MLflow.", _report_arguments),
    ("end-stale-runs",
     "end as KILLED the RUNNING runs whose process died (SIGKILL, OOM killer)",
     "Find the RUNNING runs of an MLflow store whose process is gone and end them as KILLED. "
     "Runs started on this host are judged by their recorded process id; runs of other hosts "
     "(a shared tracking server) only with --idle-hours, when nothing was logged to them for "
     "that long. gpinfer-run does the same for its host at every start.",
     _end_stale_runs_arguments),
)


def _add_tracking_uri(parser: argparse.ArgumentParser, what: str) -> None:
    """``--tracking-uri``: the MLflow store, ``what`` leading its help (the default resolved by
    ``tracking.resolve_tracking_uri``)."""
    parser.add_argument(
        "--tracking-uri", default=None,
        help=f"{what} (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)",
    )


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
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
    """Print one group's table to ``out``; return the number of broken or ignored entries."""
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
    ignored = {(e.name, e.dist, e.value) for es in registry.shadowed(group).values() for e in es}
    rows = []
    for info in infos:
        status = "not imported" if not check_import else "ok"
        if (info.name, info.dist, info.value) in ignored:
            rows.append((info.name, info.dist, info.version, info.value,
                         "IGNORED: this project's distribution registers the same name"))
            continue
        if info.name in failed:
            status = "BROKEN: " + _first_line(failed[info.name])
            if isinstance(failed[info.name], registry.DuplicatePluginError):
                status = "BROKEN: registered by more than one distribution"
        rows.append((info.name, info.dist, info.version, info.value, status))
    for line in _table(rows, ("name", "distribution", "version", "entry point", "status")):
        print(line, file=out)
    if group == registry.DATASETS:
        _print_data_files(out)
    return len(failed) + len(ignored)


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
        print(f"\n{broken} plugin(s) broken or ignored", file=out)
    return 1 if broken else 0


def _cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from gpinfer.experiment import report, tracking

    source = Path(args.source)
    records = report.collect_folder(source) if source.is_dir() else []
    folder = source
    if not records:  # not a folder of runs: an experiment name (a folder may share it)
        if not source.is_dir() and (len(source.parts) > 1 or source.suffix):
            raise InputError(f"gpinfer report: folder {args.source!r} does not exist")
        try:
            records = report.collect_experiment(
                args.source, tracking.resolve_tracking_uri(args.tracking_uri))
            folder = tracking.REPO_ROOT / "outputs" / "reports" / args.source
        except InputError:
            if not source.is_dir():
                raise
    done = report.write_report(records, Path(args.out) if args.out else folder, args.source,
                               log_to_mlflow=not args.no_mlflow, plan=report.read_plan(folder))
    print(done.markdown, file=out)
    print(f"\n{done.summary}; written: {', '.join(str(p) for p in done.paths)}", file=out)
    if done.mlflow_run_id:
        print(f"logged to MLflow as run {done.mlflow_run_id}", file=out)
    if done.mlflow_error:
        print(f"gpinfer report: not logged to MLflow: {done.mlflow_error}", file=sys.stderr)
    return 0


def _cmd_end_stale_runs(args: argparse.Namespace, out: TextIO) -> int:
    from mlflow.tracking import MlflowClient

    from gpinfer.experiment import stale_runs, tracking
    from gpinfer.experiment.redact import redact_uri, store_error

    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    ids = None
    try:
        if args.experiment is not None:
            exp = client.get_experiment_by_name(args.experiment)
            if exp is None:
                raise InputError(f"gpinfer end-stale-runs: no experiment {args.experiment!r} in "
                                 f"{redact_uri(uri)}")
            ids = [exp.experiment_id]
        stale = stale_runs.end_stale_runs(client, ids, args.idle_hours, dry_run=args.dry_run)
    except GPInferError:
        raise
    except Exception as exc:  # an unreachable or unreadable store: one line, no traceback
        raise InputError(f"gpinfer end-stale-runs: MLflow store {redact_uri(uri)!r} cannot be "
                         f"used: {store_error(exc, uri)}") from None
    verb = "would end" if args.dry_run else "ended"
    for run in stale:
        print(f"{verb} {run.run_id} ({run.run_name or 'unnamed'}) as KILLED: {run.reason}",
              file=out)
    print(f"{len(stale)} stale run(s) {verb} in {redact_uri(uri)}", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``gpinfer`` console script; returns the exit status.

    A closed output pipe (``gpinfer list | head -1``) ends the command quietly.
    """
    out = sys.stdout if out is None else out
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(out)
        return 0
    try:
        commands = {"list": _cmd_list, "report": _cmd_report,
                     "end-stale-runs": _cmd_end_stale_runs}
        if args.command in commands:
            status = commands[args.command](args, out)
            out.flush()  # a closed pipe shows here, inside the handler below
            return status
    except GPInferError as err:
        text = str(err)
        prefix = "" if text.startswith("gpinfer ") else "gpinfer: error: "
        print(f"{prefix}{text}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 0
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it
    return 2  # pragma: no cover


def _silence_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null so that the flush at
    interpreter exit does not raise BrokenPipeError again (Python's documented recipe)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
