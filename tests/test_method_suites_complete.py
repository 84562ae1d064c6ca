"""Every method this project registers must have a MethodTestSuite subclass in its plugin's
tests, and a method config.

Imports every test module under ``plugins/*/tests/`` (by path, so it works without pytest
collecting them) and compares the method names recorded in ``gpinfer.testing.SUITES`` with the
names registered in the entry-point group ``gpinfer.methods`` by the project's own
distributions (the core and ``plugins/*``): a third-party plugin installed beside them is its
authors' business.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

from gpinfer import registry
from gpinfer.testing import SUITES

REPO_ROOT = Path(__file__).resolve().parent.parent


def project_distributions(root: Path = REPO_ROOT) -> set[str]:
    """Names of the core's and ``plugins/*``'s distributions (from their pyproject.toml)."""
    names = set()
    for path in [root / "pyproject.toml", *sorted(root.glob("plugins/*/pyproject.toml"))]:
        with open(path, "rb") as fh:
            names.add(tomllib.load(fh)["project"]["name"])
    return names


def project_methods() -> list[str]:
    """Methods registered by the project's own distributions."""
    ours = {n.lower().replace("_", "-") for n in project_distributions()}
    return sorted(info.name for info in registry.entries(registry.METHODS)
                  if info.dist.lower().replace("_", "-") in ours)


def _plugin_test_modules(root: Path = REPO_ROOT) -> list[Path]:
    """``root/plugins/*/tests/**/test_*.py`` and ``*_test.py``, sorted."""
    found: set[Path] = set()
    for pattern in ("test_*.py", "*_test.py"):
        found.update(root.glob(f"plugins/*/tests/**/{pattern}"))
    return sorted(found)


def _import_by_path(path: Path, root: Path = REPO_ROOT) -> None:
    """Import ``path`` under a private module name, with its folder importable (for helpers)."""
    parts = path.relative_to(root / "plugins").with_suffix("").parts
    module_name = "_suite_check__" + "__".join(p.replace("-", "_") for p in parts)
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    finally:
        if added:
            sys.path.remove(folder)


def test_repo_root_is_found():
    assert (REPO_ROOT / "gpinfer" / "interfaces.py").is_file()
    assert (REPO_ROOT / "plugins").is_dir()


def test_every_registered_method_has_a_suite():
    failures: list[str] = []
    for path in _plugin_test_modules():
        try:
            _import_by_path(path)
        except Exception as exc:  # report every broken module, not just the first
            failures.append(f"{path.relative_to(REPO_ROOT)}: {type(exc).__name__}: {exc}")
    registered = project_methods()
    missing = sorted(set(registered) - SUITES)
    message = []
    if missing:
        message.append(
            f"registered method(s) without a MethodTestSuite subclass: {', '.join(missing)}. "
            "Add `class Test...(gpinfer.testing.MethodTestSuite)` with `method_name = ...` "
            "under the plugin's tests/"
        )
    if failures:
        message.append("plugin test modules that failed to import:\n  " + "\n  ".join(failures))
    assert not message, "\n".join(message)


def test_import_machinery_records_suites(tmp_path):
    """A plugin test module importing a sibling helper is imported and its suite recorded."""
    tests = tmp_path / "plugins" / "gpinfer-tmp" / "tests"
    tests.mkdir(parents=True)
    (tests / "_helper_tmp_suite.py").write_text("NAME = 'tmp-suite-method'\n")
    (tests / "test_tmp.py").write_text(
        "from _helper_tmp_suite import NAME\n"
        "from gpinfer.testing import MethodTestSuite\n"
        "class TestTmp(MethodTestSuite):\n"
        "    method_name = NAME\n"
    )
    (tests / "helper.py").write_text("raise RuntimeError('not a test module')\n")
    paths = _plugin_test_modules(tmp_path)
    assert [p.name for p in paths] == ["test_tmp.py"]
    assert "tmp-suite-method" not in SUITES
    try:
        _import_by_path(paths[0], tmp_path)
        assert "tmp-suite-method" in SUITES
        assert str(tests) not in sys.path
    finally:
        SUITES.discard("tmp-suite-method")
        sys.modules.pop("_helper_tmp_suite", None)


def test_project_distributions_are_read() -> None:
    names = project_distributions()
    assert {"gpinfer", "gpinfer-laplace", "gpinfer-ep"} <= names
    assert "laplace" in project_methods()


def test_every_registered_method_has_a_config() -> None:
    """``gpinfer-run method=<name>`` composes for every method of the project: its config is
    in the core's conf/ or in its plugin's own package (found by the search-path plugin)."""
    from gpinfer.experiment.config_paths import core_conf_dir, plugin_conf_dirs

    configs = {p.stem for d in [core_conf_dir(), *plugin_conf_dirs()]
               for p in (d / "method").glob("*.yaml")}
    missing = sorted(set(project_methods()) - configs)
    assert not missing, f"registered methods without conf/method/<name>.yaml: {missing}"
