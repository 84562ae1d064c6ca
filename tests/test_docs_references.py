"""Every specification reference in a docstring or comment (``spec binary §2.4``, ``§3.2``)
resolves inside the repository: to a section anchor of the family's page in ``docs/methods/``.

The family of a reference: the name written before it (``binary``, ``ep-sep``, ``ivm``,
``jj-taylor-svi``, ``power-ep``, or the specification's file name), else the plugin the file
belongs to, else the one family the file names elsewhere. ``§N.M.K`` resolves to ``§N.M``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "methods"

#: names used in the code for each family's page
FAMILIES = {
    "binary": "binary", "binary-approximations-and-mcmc": "binary",
    "ep-sep": "ep-sep", "ep-sep-multiclass": "ep-sep",
    "ivm": "ivm", "ivm-multiclass": "ivm",
    "jj-taylor-svi": "jj-taylor-svi",
    "power-ep": "power-ep",
}
PLUGIN_FAMILY = {
    "gpinfer-binary": "binary", "gpinfer-laplace": "binary", "gpinfer-mcmc": "binary",
    "gpinfer-ep": "ep-sep", "gpinfer-ivm": "ivm", "gpinfer-jj": "jj-taylor-svi",
    "gpinfer-svi": "jj-taylor-svi", "gpinfer-pep": "power-ep",
}
_NAMES = "|".join(sorted(FAMILIES, key=len, reverse=True))
_REF = re.compile(r"(?:(" + _NAMES + r")(?:\.md)?`{0,2}(?:\s+spec)?\s+)?§\s?(\d+(?:\.\d+)*)")
_NAMED = re.compile(r"(" + _NAMES + r")(?:\.md)?`{0,2}(?:\s+spec)?\s+§")


def _anchors(family: str) -> set[str]:
    text = (PAGES / f"{family}.md").read_text(encoding="utf-8")
    return set(re.findall(r'<a id="s([\d.]+)"></a>', text))


def _sources() -> list[Path]:
    files = list((ROOT / "gpinfer").rglob("*.py"))
    files += [p for p in (ROOT / "plugins").rglob("*.py")
              if "tests" not in p.relative_to(ROOT / "plugins").parts]
    return sorted(files)


def _family(path: Path, text: str, named: str | None) -> str | None:
    if named:
        return FAMILIES[named]
    rel = path.relative_to(ROOT).parts
    if rel[0] == "plugins":
        return PLUGIN_FAMILY.get(rel[1])
    found = {FAMILIES[m] for m in _NAMED.findall(text)}
    return found.pop() if len(found) == 1 else None


def test_every_family_page_exists():
    for family in set(FAMILIES.values()):
        assert (PAGES / f"{family}.md").is_file(), family


def test_every_spec_reference_resolves_to_a_section_anchor():
    anchors = {family: _anchors(family) for family in set(FAMILIES.values())}
    bad: list[str] = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for m in _REF.finditer(text):
            family = _family(path, text, m.group(1))
            section = m.group(2).split(".")
            key = ".".join(section[:2])
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if family is None:
                bad.append(f"{where}: §{m.group(2)} names no family")
            elif key not in anchors[family] and section[0] not in anchors[family]:
                bad.append(f"{where}: §{m.group(2)} has no anchor in docs/methods/{family}.md")
    assert not bad, "unresolved specification references:\n" + "\n".join(bad)
