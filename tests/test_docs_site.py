"""The docs site (``mkdocs.yml``, ``make docs``): its generated pages, its API reference
targets, its navigation, and (when the docs tools are installed) a strict build."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("gpinfer_docs_hook",
                                                  DOCS / "_hooks" / "gpinfer_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for v in node for p in _nav_pages(v)]


def _config() -> dict:
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_method_options_page_lists_every_method_and_option() -> None:
    from gpinfer import registry

    page = _hook().method_options_page()
    for name in registry.names(registry.METHODS):
        assert f"## `{name}`" in page, name
        for option, spec in registry.load_method(name).option_spec.items():
            assert f"| `{option}` |" in page and spec.allowed.replace("|", "\\|") in page


def test_home_page_is_the_readme_with_site_links() -> None:
    page = _hook().readme_page()
    assert page.startswith("# gpinfer") and "](docs/" not in page
    assert "](plugins.md)" in page and "](backends.md)" in page


def test_every_page_is_in_the_nav_and_every_nav_page_exists() -> None:
    config = _config()
    nav = set(_nav_pages(config["nav"]))
    generated = set(_hook().GENERATED)
    written = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
               if p.relative_to(DOCS).parts[0] not in ("_hooks", "example_plugin")}
    assert nav == written | generated


def test_every_api_reference_target_imports() -> None:
    targets = []
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, re.MULTILINE):
            members = re.findall(r"^        - (\w+)$", match.group(2), re.MULTILINE)
            targets.append((page.name, match.group(1), members))
    assert len(targets) >= 8
    for page, path, members in targets:
        module, _, attr = path.rpartition(".")
        try:
            obj = importlib.import_module(path)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr)
        for member in members:
            assert hasattr(obj, member), f"{page}: {path}.{member}"


def test_strict_build(tmp_path: Path) -> None:
    """The whole site, warnings as errors (skipped without the docs extra: make docs)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ,
                                                       "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {str(p.relative_to(tmp_path / "site")) for p in (tmp_path / "site").rglob("*.html")}
    assert {"index.html", "plugins.html", "api/method-options.html", "api/kernels.html",
            "methods/ep-sep.html"} <= pages
    kernels = (tmp_path / "site" / "api" / "kernels.html").read_text()
    assert "Matern52" in kernels and "lengthscale" in kernels
