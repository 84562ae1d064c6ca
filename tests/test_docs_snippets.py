"""The README's and the plugin guide's Python blocks run as written.

Each document's ```python blocks are executed in order in one fresh namespace (a later block
may use an earlier block's names), in a subprocess-free way: a failing block names the
document and the block's first line. Every block is run, so blocks added later are covered.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(path: Path) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown file, in order."""
    return [m.group(1) for m in _BLOCK.finditer(path.read_text())]


def test_block_extraction() -> None:
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x + 1\n```\n"
    doc = Path(__file__).with_name("_blocks.md")
    try:
        doc.write_text(text)
        assert python_blocks(doc) == ["x = 1\n", "y = x + 1\n"]
    finally:
        doc.unlink()


@pytest.mark.parametrize("doc", ["README.md", "docs/plugins.md"])
def test_python_blocks_run(doc: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpinfer.testing import SUITES

    blocks = python_blocks(REPO / doc)
    assert blocks, f"{doc} has no python blocks"
    suites = set(SUITES)
    # the guide's test block imports the example plugin, as an installed plugin's test would
    monkeypatch.syspath_prepend(str(REPO / "docs" / "example_plugin"))
    namespace: dict[str, object] = {"__name__": f"docs_{Path(doc).stem}"}
    try:
        for i, code in enumerate(blocks, 1):
            first = code.strip().splitlines()[0]
            try:
                exec(compile(code, f"{doc}[python block {i}]", "exec"), namespace)
            except Exception as exc:
                pytest.fail(f"{doc}, python block {i} ({first!r}) failed: "
                            f"{type(exc).__name__}: {exc}")
    finally:  # a guide's example test suite must not count as a registered plugin's suite
        SUITES.difference_update(set(SUITES) - suites)


def test_import_gpinfer_reaches_kernels_and_likelihoods() -> None:
    """In a fresh interpreter: ``gpinfer.kernels`` works without importing it first."""
    import subprocess
    import sys

    code = ("import gpinfer; k = gpinfer.kernels.RBF(lengthscale=5.0); "
            "print(type(k).__name__, gpinfer.likelihoods.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RBF", "gpinfer.likelihoods"]
