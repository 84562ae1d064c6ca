"""MkDocs hook of gpinfer's docs site (``mkdocs.yml``: ``hooks``): two pages made at build time.

* ``index.md``: the repository's ``README.md`` (the user guide's front page), its links into
  ``docs/`` made relative to the site;
* ``api/method-options.md``: every registered method's options from its ``option_spec`` (name,
  default, what is allowed, the one-line doc), with what the method handles. Nothing is written
  into ``docs/``: the pages exist only in the built site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: README links into docs/ (``](docs/plugins.md)``) become site-relative (``](plugins.md)``)
_DOCS_LINK = re.compile(r"\]\(docs/")


def readme_page() -> str:
    """The README as the site's home page (links into ``docs/`` rewritten)."""
    return _DOCS_LINK.sub("](", (ROOT / "README.md").read_text(encoding="utf-8"))


def _cell(text: Any) -> str:
    """``text`` fit for one Markdown table cell (no pipes, no newlines)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    return f"`{value!r}`" if value is not None else "`None`"


def method_options_page() -> str:
    """Markdown: one section per registered method with its ``option_spec`` as a table."""
    from gpinfer import registry

    lines = ["# Method options", "",
             "Generated at build time from each registered method's `option_spec` "
             "(`gpinfer.options`). Give them as `GPClassifier(method_options={...})` or "
             "`gpinfer-run method=<name> method.options.<option>=<value>`; a value outside "
             "what is allowed is an `InputError` before any training. Shared option names "
             "and their meanings: [Method options (names)](../options.md).", ""]
    for name in registry.names(registry.METHODS):
        cls = registry.load_method(name)
        doc = (cls.__doc__ or "").strip().split("\n\n", 1)[0].replace("\n", " ")
        info = registry.find(registry.METHODS, name)
        lines += [f"## `{name}`", "", doc, "",
                  f"Plugin `{info.dist}`; tasks: {', '.join(cls.tasks)}; "
                  f"{'multi-class' if cls.multiclass else 'binary only'}; "
                  f"inducing points: {'yes' if cls.uses_inducing_points else 'no'}; "
                  f"mini-batches: {'yes' if cls.supports_minibatch else 'no'}; "
                  f"likelihoods: {', '.join(f'`{lik}`' for lik in cls.likelihoods) or 'any'}.",
                  ""]
        spec = cls.option_spec
        if not spec:
            lines += ["No options.", ""]
            continue
        lines += ["| option | default | allowed | meaning |", "|---|---|---|---|"]
        for option, o in spec.items():
            allowed = o.allowed + (" or None" if o.none else "")
            lines.append(f"| `{option}` | {_cell(_code(o.default))} | {_cell(allowed)} "
                         f"| {_cell(o.doc)} |")
        lines.append("")
    return "\n".join(lines)


#: generated pages: site path -> the function making its Markdown
GENERATED = {"index.md": readme_page, "api/method-options.md": method_options_page}


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """MkDocs event: add the ``GENERATED`` pages (a page written in ``docs/`` wins)."""
    from mkdocs.structure.files import File

    for uri, make in GENERATED.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=make()))
    return files
