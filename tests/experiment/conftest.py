"""Shared fixtures for the experiment tests: a toy plugin site, a temporary MLflow store, compose.

The toy methods (``toy_methods.py``) are installed as a real distribution (``*.dist-info`` with
entry points) in a temporary folder on ``sys.path``, the same trick as tests/test_registry.py,
so the registry, ``GPClassifier`` and subprocesses (through ``PYTHONPATH``) all find them.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpinfer import registry

from .helpers import HERE, TOY_DIST, TOY_PKG, TOY_VERSION


@pytest.fixture(scope="package")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A site folder holding the toy plugin distribution, on ``sys.path`` for this package.

    Package scope: the toy methods leave the registry when the experiment tests are done, so
    the suite-completeness test does not see them.
    """
    site = tmp_path_factory.mktemp("toy_site")
    (site / TOY_PKG).mkdir()
    (site / TOY_PKG / "__init__.py").write_text("")
    shutil.copy(HERE / "toy_methods.py", site / TOY_PKG / "methods.py")
    info = site / f"{TOY_DIST.replace('-', '_')}-{TOY_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {TOY_DIST}\nVersion: {TOY_VERSION}\n"
    )
    (info / "entry_points.txt").write_text(
        "[gpinfer.methods]\n"
        f"toygp = {TOY_PKG}.methods:ToyGP\n"
        f"toysparse = {TOY_PKG}.methods:ToySparse\n"
    )
    sys.path.insert(0, str(site))
    registry.refresh()
    yield site
    sys.path.remove(str(site))
    for mod in [m for m in sys.modules if m.startswith(TOY_PKG)]:
        del sys.modules[mod]
    registry.refresh()


@pytest.fixture(scope="package")
def toy_methods(toy_site: Path):
    """The imported toy module (``ToyGP``, ``ToySparse``) as the registry loads it."""
    registry.load_method("toygp")
    return sys.modules[f"{TOY_PKG}.methods"]


@pytest.fixture(scope="session")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One temporary SQLite MLflow store shared by the in-process tests (one costs ~1 s)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
