"""The plugin registry: built-ins listed, lazy loading, nearest-name errors, isolated failures.

The throw-away plugin distribution is "installed" by writing what an installer leaves behind:
a package directory and a ``<name>-<version>.dist-info`` folder with ``METADATA`` and
``entry_points.txt``, in a temporary directory put on ``sys.path``. (The venv's setuptools 65
has no ``wheel`` package, so an offline ``pip install --no-build-isolation`` cannot build one;
``importlib.metadata`` reads exactly these files either way.)
"""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpinfer import registry
from gpinfer.errors import PluginLoadError, UnknownNameError

TOY_DIST = "gpinfer-toyplug"
TOY_VERSION = "0.3.1"
TOY_PACKAGE = "gpinfer_toyplug_zz"

TOY_MODULES = {
    "__init__.py": "",
    "method.py": """
        from gpinfer.interfaces import Method

        IMPORT_COUNT = globals().get("IMPORT_COUNT", 0) + 1


        class ToyMethod(Method):
            multiclass = True

            def fit(self, problem, callback=None):
                raise NotImplementedError


        class BinaryToy(Method):
            name = "binary-toy-own-name"

            def fit(self, problem, callback=None):
                raise NotImplementedError


        NOT_A_METHOD = object()
    """,
    "broken.py": """
        raise ImportError("toy plugin needs the library 'nonexistent_lib'")
    """,
}

TOY_ENTRY_POINTS = {
    registry.METHODS: {
        "toy": f"{TOY_PACKAGE}.method:ToyMethod",
        "toy_binary": f"{TOY_PACKAGE}.method:BinaryToy",
        "toy_broken": f"{TOY_PACKAGE}.broken:Thing",
        "toy_notmethod": f"{TOY_PACKAGE}.method:NOT_A_METHOD",
    },
    registry.KERNELS: {"toykernel": f"{TOY_PACKAGE}.method:NOT_A_METHOD"},
}


def write_distribution(
    site: Path,
    dist: str,
    version: str,
    entry_points: dict[str, dict[str, str]],
    package: str | None = None,
    modules: dict[str, str] | None = None,
) -> Path:
    """Install a distribution into ``site`` the way an installer does (no build step)."""
    site.mkdir(parents=True, exist_ok=True)
    if package is not None:
        pkg = site / package
        pkg.mkdir(exist_ok=True)
        for fname, src in (modules or {}).items():
            (pkg / fname).write_text(textwrap.dedent(src))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: throw-away plugin\n"
    )
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    (info / "RECORD").write_text("")
    return info


def _forget_modules(prefix: str) -> None:
    for mod in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[mod]


@pytest.fixture
def toy_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary site directory holding the toy distribution, first on ``sys.path``."""
    site = tmp_path / "site"
    write_distribution(
        site, TOY_DIST, TOY_VERSION, TOY_ENTRY_POINTS, package=TOY_PACKAGE, modules=TOY_MODULES
    )
    monkeypatch.syspath_prepend(str(site))
    registry.refresh()
    yield site
    _forget_modules(TOY_PACKAGE)
    monkeypatch.undo()
    registry.refresh()


# ------------------------------------------------------------------------------------------
# built-ins
# ------------------------------------------------------------------------------------------


def test_builtin_groups_are_listed_with_distribution_and_version():
    version = importlib.metadata.version("gpinfer")
    kernels = registry.names(registry.KERNELS)
    assert {"rbf", "matern32", "matern52", "linear", "white"} <= set(kernels)
    assert {"probit", "logit", "gaussian", "robustmax", "softmax"} <= set(
        registry.names(registry.LIKELIHOODS)
    )
    datasets = registry.names(registry.DATASETS)
    assert {"waveform", "synthetic2d", "wine", "iris", "digits", "breast_cancer", "file"} <= set(
        datasets
    )
    rbf = next(e for e in registry.entries(registry.KERNELS) if e.name == "rbf")
    assert (rbf.dist, rbf.version, rbf.group) == ("gpinfer", version, registry.KERNELS)
    assert rbf.value == "gpinfer.kernels.stationary:RBF"
    assert rbf.spec == "rbf = gpinfer.kernels.stationary:RBF"


def test_entries_are_sorted_and_groups_resolve_short_names():
    infos = registry.entries("datasets")
    assert [e.name for e in infos] == sorted(e.name for e in infos)
    assert registry.GROUPS == (
        registry.METHODS,
        registry.LIKELIHOODS,
        registry.KERNELS,
        registry.DATASETS,
    )
    assert registry.resolve_group("kernels") == "gpinfer.kernels"
    with pytest.raises(UnknownNameError, match="did you mean 'kernels'"):
        registry.entries("kernls")


def test_builtin_dataset_loads():
    from gpinfer.data.generators import waveform

    assert registry.load(registry.DATASETS, "waveform") is waveform


def test_unknown_name_suggests_nearest_and_lists_all():
    with pytest.raises(UnknownNameError) as info:
        registry.load(registry.KERNELS, "rfb")
    msg = str(info.value)
    assert "unknown kernel 'rfb'" in msg
    assert "did you mean 'rbf'" in msg
    for name in registry.names(registry.KERNELS):
        assert name in msg
    assert isinstance(info.value, KeyError)  # UnknownNameError is also a KeyError


def test_unknown_name_without_close_match_still_lists_known():
    with pytest.raises(UnknownNameError) as info:
        registry.load(registry.DATASETS, "zzzzzz")
    assert "did you mean" not in str(info.value)
    assert "waveform" in str(info.value)


# ------------------------------------------------------------------------------------------
# a throw-away plugin distribution
# ------------------------------------------------------------------------------------------


def test_installed_plugin_is_registered_without_importing(toy_site: Path):
    infos = {e.name: e for e in registry.entries(registry.METHODS)}
    assert {"toy", "toy_binary", "toy_broken", "toy_notmethod"} <= set(infos)
    toy = infos["toy"]
    assert (toy.dist, toy.version) == (TOY_DIST, TOY_VERSION)
    assert toy.value == f"{TOY_PACKAGE}.method:ToyMethod"
    assert "toykernel" in registry.names("kernels")
    assert TOY_PACKAGE not in sys.modules  # listing imported nothing


def test_load_imports_one_plugin_and_caches_it(toy_site: Path):
    cls = registry.load(registry.METHODS, "toy")
    assert cls.__name__ == "ToyMethod"
    assert f"{TOY_PACKAGE}.method" in sys.modules
    assert f"{TOY_PACKAGE}.broken" not in sys.modules  # only that entry point was imported
    assert registry.load(registry.METHODS, "toy") is cls
    assert sys.modules[f"{TOY_PACKAGE}.method"].IMPORT_COUNT == 1


def test_load_method_checks_type_and_sets_name(toy_site: Path):
    cls = registry.load_method("toy")
    assert cls.name == "toy"  # empty name filled from the entry point
    assert registry.load_method("toy_binary").name == "binary-toy-own-name"  # kept
    with pytest.raises(PluginLoadError) as info:
        registry.load_method("toy_notmethod")
    msg = str(info.value)
    assert "not a subclass of gpinfer.interfaces.Method" in msg
    assert TOY_DIST in msg and "toy_notmethod = " in msg


def test_broken_plugin_is_named_with_its_error(toy_site: Path):
    with pytest.raises(PluginLoadError) as info:
        registry.load(registry.METHODS, "toy_broken")
    msg = str(info.value)
    assert "'toy_broken'" in msg
    assert f"{TOY_DIST} {TOY_VERSION}" in msg
    assert f"toy_broken = {TOY_PACKAGE}.broken:Thing" in msg
    assert "ImportError: toy plugin needs the library 'nonexistent_lib'" in msg
    assert isinstance(info.value.__cause__, ImportError)
    # the failure is cached: asking again gives the same error without re-importing
    with pytest.raises(PluginLoadError) as again:
        registry.load(registry.METHODS, "toy_broken")
    assert again.value is info.value


def test_load_all_isolates_the_broken_plugin(toy_site: Path):
    loaded, failed = registry.load_all(registry.METHODS)
    assert "toy_broken" in failed and "toy_broken" not in loaded
    assert loaded["toy"].__name__ == "ToyMethod"
    assert "toy_notmethod" in loaded  # imports fine; only load_method checks the type
    assert set(loaded) | set(failed) == set(registry.names(registry.METHODS))
    assert "nonexistent_lib" in str(failed["toy_broken"])


def test_methods_supporting_skips_broken_plugins(toy_site: Path):
    multi = registry.methods_supporting(lambda m: m.multiclass)
    assert "toy" in multi
    assert "toy_binary" not in multi
    assert "toy_broken" not in multi and "toy_notmethod" not in multi
    assert "toy_binary" in registry.methods_supporting(lambda m: not m.multiclass)


def test_duplicate_name_across_distributions_names_both(toy_site: Path):
    write_distribution(
        toy_site, "gpinfer-othertoy", "2.0", {registry.METHODS: {"toy": "othertoy:Method"}}
    )
    registry.refresh()
    assert registry.names(registry.METHODS).count("toy") == 1
    assert [e.dist for e in registry.entries(registry.METHODS) if e.name == "toy"] == [
        "gpinfer-othertoy",
        TOY_DIST,
    ]
    with pytest.raises(registry.DuplicatePluginError) as info:
        registry.load(registry.METHODS, "toy")
    msg = str(info.value)
    assert TOY_DIST in msg and "gpinfer-othertoy" in msg
    _, failed = registry.load_all(registry.METHODS)
    assert isinstance(failed["toy"], PluginLoadError)


def test_removed_plugin_disappears_after_path_change(toy_site: Path, monkeypatch):
    assert "toy" in registry.names(registry.METHODS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(toy_site)])
    assert "toy" not in registry.names(registry.METHODS)  # entry cache is keyed on sys.path
    with pytest.raises(UnknownNameError) as info:
        registry.load(registry.METHODS, "toy_broken")
    assert "unknown method 'toy_broken'" in str(info.value)
    assert "Known:" in str(info.value) and "toy_notmethod" not in str(info.value)


def test_refresh_forgets_loaded_objects(toy_site: Path):
    first = registry.load(registry.METHODS, "toy")
    registry.refresh()
    _forget_modules(TOY_PACKAGE)
    second = registry.load(registry.METHODS, "toy")
    assert second is not first and second.__name__ == "ToyMethod"


def test_own_distribution_wins_a_duplicate_name_and_the_other_is_reported(toy_site: Path):
    """A third-party distribution registering ``laplace`` cannot take the built-in down."""
    write_distribution(
        toy_site, "thirdparty-gp", "0.1", {registry.METHODS: {"laplace": "thirdparty_gp:Fake"}}
    )
    registry.refresh()
    assert sorted(e.dist for e in registry.entries(registry.METHODS) if e.name == "laplace") == [
        "gpinfer-laplace", "thirdparty-gp"]
    with pytest.warns(RuntimeWarning, match=r"'laplace'.*also registered by thirdparty-gp 0\.1 "
                      r"\(`laplace = thirdparty_gp:Fake`\); using gpinfer-laplace's"):
        cls = registry.load_method("laplace")
    assert cls.__module__ == "gpinfer_laplace.method"
    assert [e.dist for e in registry.shadowed(registry.METHODS)["laplace"]] == ["thirdparty-gp"]
    assert set(registry.shadowed(registry.METHODS)) == {"laplace"}


def test_own_distributions_are_the_plugins_of_this_repository():
    repo = Path(__file__).resolve().parents[1]
    names = {"gpinfer"} | {
        next(line.split("=", 1)[1].strip().strip('"') for line in p.read_text().splitlines()
             if line.startswith("name"))
        for p in repo.glob("plugins/*/pyproject.toml")
    }
    assert names == registry.OWN_DISTRIBUTIONS
