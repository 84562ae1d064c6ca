"""Every module a page of ``docs/`` or the README names exists: paths (``gpinfer/sites/ep.py``,
``plugins/gpinfer-ep/``, ``benchmarks/same_fits.py``, ``tests/...``) and dotted names
(``gpinfer.training.loop.TrainingLoop``, ``gpinfer_jj.taylor``, ``hydra_plugins.gpinfer_hydra``).

A dotted name resolves to the longest module (file or package) it starts with; what follows
that module must be a name the module defines or imports (read from its source, nothing is
imported), one level deep (``module.Class``; ``module.Class.method`` checks ``Class``). A
dotted name that is no module at all must be one the code spells as a string: an entry-point
group (``gpinfer.methods``), an MLflow tag (``gpinfer.heartbeat``), a logger name. A name
with a file suffix (``gpinfer.log``) is a file name, not a module.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the pages checked: the README and every Markdown page under docs/
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: the folders whose paths a page may name
PATH_ROOTS = ("gpinfer", "plugins", "benchmarks", "tests", "hydra_plugins", "conf")
_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(PATH_ROOTS) + r")/[\w./-]*[\w/])")
_DOTTED = re.compile(r"(?<![\w./-])((?:gpinfer|gpinfer_\w+|hydra_plugins)(?:\.\w+)+)")
#: folders of the installed package that come from elsewhere in the repository: setup.py
#: ships the top-level ``conf/`` as ``gpinfer/conf`` (``gpinfer.conf``)
WHEEL_FOLDERS = {"gpinfer/conf": "conf"}
#: pages that also describe the example plugin's own layout (its paths are relative to the
#: plugin's folder or to its package)
EXAMPLE = ROOT / "docs" / "example_plugin"
EXTRA_BASES = {"docs/plugins.md": (EXAMPLE, EXAMPLE / "gpinfer_labelreg")}
#: suffixes of file names that look like dotted names (``gpinfer.log``, ``result.json``)
_FILE_SUFFIXES = {"log", "json", "yaml", "yml", "py", "md", "npz", "db", "toml", "txt", "png",
                  "csv", "skops"}


@functools.cache
def _packages() -> dict[str, Path]:
    """Top-level package name -> its folder: ``gpinfer``, every plugin's (``gpinfer_ep``),
    the example plugin's (``gpinfer_labelreg``) and ``hydra_plugins``."""
    found = {"gpinfer": ROOT / "gpinfer", "hydra_plugins": ROOT / "hydra_plugins"}
    for init in [*(ROOT / "plugins").glob("*/gpinfer_*/__init__.py"),
                 *(ROOT / "docs" / "example_plugin").glob("gpinfer_*/__init__.py")]:
        found[init.parent.name] = init.parent
    return found


def _module_file(parts: list[str]) -> Path | None:
    """The source file of the module ``parts`` (``["gpinfer", "sites", "ep"]``), or None."""
    base = _packages().get(parts[0])
    if base is None:
        return None
    path = base.joinpath(*parts[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


@functools.cache
def _defined(source: Path) -> frozenset[str]:
    """Names a module's source binds at its top level: functions, classes, assignments,
    imports, ``__all__`` entries, and what its ``__getattr__`` compares names with."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):  # TYPE_CHECKING imports
            for inner in node.body:
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    names.update((a.asname or a.name).split(".")[0] for a in inner.names)
    lazy = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    for fn in lazy:  # a module's lazy names: ``if name == "GPClassifier"``
        names.update(c.value for c in ast.walk(fn)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return frozenset(names)


@functools.cache
def _code_strings() -> str:
    """All source text of the core, the plugins, the Hydra plugin and pyproject files: where a
    dotted name that is not a module must appear as a string."""
    files = [*(ROOT / "gpinfer").rglob("*.py"), *(ROOT / "plugins").rglob("*.py"),
             *(ROOT / "hydra_plugins").rglob("*.py"), *ROOT.glob("**/pyproject.toml")]
    return "\n".join(p.read_text(encoding="utf-8") for p in files if ".venv" not in p.parts)


def dotted_name_problem(name: str) -> str | None:
    """Why ``name`` does not resolve (None when it does)."""
    parts = name.split(".")
    if parts[-1] in _FILE_SUFFIXES:
        return None
    for cut in range(len(parts), 0, -1):
        source = _module_file(parts[:cut])
        if source is None:
            continue
        if cut == len(parts) or parts[cut] in _defined(source) or _spelled(name):
            return None
        return f"{'.'.join(parts[:cut])} defines no {parts[cut]!r}"
    return None if _spelled(name) else "no such module"


def _spelled(name: str) -> bool:
    """Whether the code spells ``name`` as a string: an entry-point group, a tag, a logger."""
    return re.search(r"[\"'`]" + re.escape(name) + r"\b", _code_strings()) is not None


def path_problem(path: str, bases: tuple[Path, ...] = ()) -> str | None:
    """Why the repository path ``path`` does not resolve (None when it exists under the
    repository or one of ``bases``)."""
    path = path.rstrip(".")
    for wheel, repo in WHEEL_FOLDERS.items():
        if path == wheel or path.startswith(wheel + "/"):
            path = repo + path[len(wheel):]
    if any((base / path).exists() for base in (ROOT, *bases)):
        return None
    return "no such file or folder"


def _paths(text: str) -> set[str]:
    """The repository paths ``text`` names, less patterns (``plugins/*/``,
    ``conf/experiment/bui2017_*.yaml``, ``plugins/<name>``)."""
    return {m.group(1) for m in _PATH.finditer(text)
            if text[m.end():m.end() + 1] not in ("*", "<", "{")}


def problems(text: str, bases: tuple[Path, ...] = ()) -> list[str]:
    """Every module path and dotted module name in ``text`` that does not resolve (paths
    also against ``bases``)."""
    found = [f"{p}: {why}" for p in sorted(_paths(text))
             if (why := path_problem(p, bases)) is not None]
    found += [f"{n}: {why}" for n in sorted(set(_DOTTED.findall(text)))
              if (why := dotted_name_problem(n)) is not None]
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_module_a_page_names_exists(page):
    bases = EXTRA_BASES.get(str(page.relative_to(ROOT)), ())
    bad = problems(page.read_text(encoding="utf-8"), bases)
    assert not bad, f"{page.relative_to(ROOT)} names what does not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, bad", [
    ("see `gpinfer/sites/no_such_module.py`", "gpinfer/sites/no_such_module.py"),
    ("see plugins/gpinfer-nothing/", "plugins/gpinfer-nothing/"),
    ("`gpinfer.training.no_such_loop`", "gpinfer.training.no_such_loop"),
    ("`gpinfer.training.loop.NoSuchClass`", "gpinfer.training.loop.NoSuchClass"),
    ("`gpinfer_ep.no_such_module`", "gpinfer_ep.no_such_module"),
])
def test_a_made_up_name_is_reported(text, bad):
    """The check can fail: made-up paths and names are found."""
    assert [p.split(":")[0] for p in problems(text)] == [bad]


def test_the_wheel_folders_are_what_setup_py_ships():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    for wheel, repo in WHEEL_FOLDERS.items():
        assert (ROOT / repo).is_dir() and f'"{wheel.replace("/", ".")}"' in setup


def test_real_names_resolve():
    assert problems("`gpinfer/sites/ep.py`, gpinfer.errors.InputError, "
                    "gpinfer.GPClassifier, gpinfer.methods, gpinfer.log") == []


# --------------------------------------------------------------------------------------------
# code pointers: ``gpinfer/sites/stacked.py:StackedTerms.to_whitened`` in the docs and in the
# FLOP models' terms (``benchmarks/flop_models.py``, where each counted product is formed)
# --------------------------------------------------------------------------------------------

_POINTER = re.compile(r"((?:gpinfer|plugins|benchmarks)/[\w./-]+\.py):([A-Za-z_][\w.]*(?:/\w+)?)")


def _scope_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    return {n.name: n for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def pointer_problem(path: str, qualname: str) -> str | None:
    """Why ``path:qualname`` (``Class.method``, ``function.inner``, ``Class.a/b`` for two
    siblings) names nothing in that file's source (None when it resolves)."""
    source = ROOT / path
    if not source.is_file():
        return "no such file"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    head, _, sibling = qualname.partition("/")
    parts = head.split(".")
    chains = [parts] + ([parts[:-1] + [sibling]] if sibling else [])
    for chain in chains:
        body: list[ast.stmt] = tree.body
        for name in chain:
            node = _scope_names(body).get(name)
            if node is None:
                return f"no {name!r} in {'.'.join(chain[:chain.index(name)]) or path}"
            body = node.body  # type: ignore[attr-defined]
    return None


def pointer_problems(text: str) -> list[str]:
    """Every ``path.py:qualname`` pointer in ``text`` that does not resolve."""
    return [f"{p}:{q}: {why}" for p, q in sorted(set(_POINTER.findall(text)))
            if (why := pointer_problem(p, q)) is not None]


def _flop_terms_where() -> str:
    """The ``where`` of every term of the FLOP models (small sizes: only the text matters)."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location("flop_models", ROOT / "benchmarks" /
                                                  "flop_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    found = []
    for name, fn in vars(module).items():
        if name.endswith("_terms") and inspect.isfunction(fn):
            required = [p for p, v in inspect.signature(fn).parameters.items()
                        if v.default is inspect.Parameter.empty]
            found += [t.where for t in fn(**dict.fromkeys(required, 4))]
    assert len(found) > 50  # every model's terms were read
    return "\n".join(found)


def test_every_code_pointer_of_the_docs_resolves():
    bad = [f"{page.relative_to(ROOT)}: {p}" for page in PAGES
           for p in pointer_problems(page.read_text(encoding="utf-8"))]
    assert not bad, "pointers to code that does not exist:\n" + "\n".join(bad)


def test_every_code_pointer_of_the_flop_models_resolves():
    bad = pointer_problems(_flop_terms_where() + (ROOT / "benchmarks" / "flop_models.py")
                           .read_text(encoding="utf-8"))
    assert not bad, "benchmarks/flop_models.py points at code that does not exist:\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("text", [
    "gpinfer/sites/stacked.py:NoSuchClass",
    "gpinfer/sites/stacked.py:StackedTerms.no_such_method",
    "gpinfer/sites/no_such_file.py:f",
])
def test_a_made_up_pointer_is_reported(text):
    assert len(pointer_problems(text)) == 1


def test_the_readme_layout_names_every_core_package():
    """The README's layout block lists each package of the core as ``gpinfer/<name>/``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    packages = sorted(p.parent.name for p in (ROOT / "gpinfer").glob("*/__init__.py"))
    missing = [name for name in packages if f"gpinfer/{name}/" not in layout]
    assert packages and not missing, f"README.md's layout lacks gpinfer/{missing}"
