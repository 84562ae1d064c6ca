"""Where the shared dataset files live: ``GPINFER_DATA_DIR``, else ``../shared/data``."""

from __future__ import annotations

import os
from pathlib import Path

from gpinfer.errors import InputError

#: environment variable that overrides the data directory
DATA_DIR_ENV = "GPINFER_DATA_DIR"

#: repository root (the folder holding the ``gpinfer`` package)
_REPO_ROOT = Path(__file__).resolve().parents[2]


def default_data_dirs() -> list[Path]:
    """Candidate directories tried, in order, when ``GPINFER_DATA_DIR`` is not set.

    The repository's sibling ``../shared/data`` and, for checkouts that carry it inside,
    ``<repo>/shared/data``.
    """
    return [_REPO_ROOT.parent / "shared" / "data", _REPO_ROOT / "shared" / "data"]


def data_dir() -> Path | None:
    """The data directory, or ``None`` when there is none.

    ``GPINFER_DATA_DIR`` wins when set (non-empty); it must name an existing directory, else
    ``InputError``. Otherwise the first existing of ``default_data_dirs()``.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise InputError(
                f"{DATA_DIR_ENV}={env!r} is not an existing directory; point it at the folder "
                "holding the dataset .npz files or unset it"
            )
        return path.resolve()
    for path in default_data_dirs():
        if path.is_dir():
            return path
    return None


def data_files(root: Path | None = None) -> list[str]:
    """Sorted stems of the ``.npz`` files in ``root`` (default: ``data_dir()``); ``[]`` if none."""
    root = data_dir() if root is None else root
    if root is None or not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*.npz") if p.is_file())
