"""``result.json`` for one run, its one-line summary, peak memory and output-folder checks."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpinfer.errors import InputError

#: the file every run writes into its output folder
RESULT_FILE = "result.json"

#: keys every result.json has (others may follow)
RESULT_KEYS = (
    "method",
    "dataset",
    "M",
    "seed",
    "test_error",
    "test_nll",
    "log_evidence",
    "train_time_s",
    "n_iter",
    "peak_rss_mb",
)


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` if needed and prove it writable; ``InputError`` naming it otherwise."""
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-", delete=True) as fh:
            fh.write(b"ok")
    except OSError as exc:
        raise InputError(
            f"output folder {str(out)!r} is not writable ({exc.strerror or exc}); choose another "
            "one with hydra.run.dir=... (hydra.sweep.dir=... for -m) or fix its permissions"
        ) from exc
    return out.resolve()


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter for this process (Linux ``clear_refs``), if possible.

    Lets a sequential sweep report each run's own peak rather than the process's lifetime peak.
    Returns whether the reset worked.
    """
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (since the last ``reset_peak_rss``).

    Linux: ``VmHWM`` from ``/proc/self/status``; elsewhere ``getrusage`` (kilobytes on Linux,
    bytes on macOS), then ``psutil`` as a last resort (current RSS).
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0
    except (OSError, ValueError):  # pragma: no cover - platform without getrusage
        import psutil

        return psutil.Process().memory_info().rss / (1024.0 * 1024.0)


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars to Python, non-finite floats to ``None``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_result(out_dir: str | os.PathLike[str], result: Mapping[str, Any]) -> Path:
    """Write ``result`` to ``<out_dir>/result.json`` atomically (strict JSON); returns the path."""
    path = Path(out_dir) / RESULT_FILE
    text = json.dumps(_jsonable(result), indent=2, sort_keys=False, allow_nan=False)
    tmp = path.with_name(f".{RESULT_FILE}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def read_result(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``<out_dir>/result.json``."""
    return json.loads((Path(out_dir) / RESULT_FILE).read_text())


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "n/a"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def shown_path(path: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """``path`` relative to ``cwd`` (default: the working directory) when it lies inside it,
    else as given (a ``../../..`` chain would be longer and no clearer)."""
    here = Path.cwd() if cwd is None else Path(cwd)
    try:
        return str(Path(path).resolve().relative_to(here.resolve())) or "."
    except (ValueError, OSError):
        return str(path)


def shown_store(uri: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """A tracking URI as printed: a SQLite store's file relative to the working directory
    (``sqlite:///outputs/mlflow.db`` is a valid URI there), any other URI as given."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and len(uri) > len(prefix):
        path, _, query = uri[len(prefix):].partition("?")
        return prefix + shown_path(path, cwd) + (f"?{query}" if query else "")
    return uri


def m_text(result: Mapping[str, Any]) -> str:
    """How a run's M is spelt everywhere it is printed: ``M=<inducing points used>`` (the
    count, whether M was given as a count, a fraction or left to the method), or nothing for a
    method without inducing points."""
    count = result.get("M_count")
    return "" if count is None else f" M={count}"


def summary_line(result: Mapping[str, Any], cwd: str | os.PathLike[str] | None = None) -> str:
    """The one line printed at the end of a run; paths relative to ``cwd`` (default: the
    working directory) when inside it."""
    return (
        f"{result.get('status', 'FINISHED')}: {result['method']} on {result['dataset']} "
        f"kernel={result.get('kernel', '?')}{m_text(result)} seed={result['seed']} | "
        + ("" if "test_rmse" in result else f"test error {_fmt(result['test_error'], '.4f')}  ")
        + (f"test RMSE {_fmt(result['test_rmse'], '.4g')}  " if "test_rmse" in result else "")
        + f"test NLL {_fmt(result['test_nll'], '.4f')}  "
        f"log evidence {_fmt(result['log_evidence'], '.4g')} | "
        f"{result['n_iter']} iterations in {_fmt(result['train_time_s'], '.2f')} s, "
        f"peak {_fmt(result['peak_rss_mb'], '.0f')} MB | "
        f"{shown_path(result.get('output_dir') or '.', cwd)}"
        + (f" | WARNING: {', '.join(result['fit_warnings'])}" if result.get("fit_warnings")
           else "")
        + (
            f" | MLflow run {result['mlflow_run_id']} in "
            f"{shown_store(str(result.get('mlflow_tracking_uri')), cwd)}"
            if result.get("mlflow_run_id")
            else ""
        )
    )
