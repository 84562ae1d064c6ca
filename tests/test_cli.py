"""The ``gpinfer`` command: help, listing per group, BROKEN plugins, ``--check`` exit status.

The throw-away plugin distribution is written as an installed ``*.dist-info`` (METADATA and
entry_points.txt) plus its package into a temporary directory on ``sys.path`` (see
tests/test_registry.py for why no build step is used).
"""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import sys
from pathlib import Path

import pytest

from gpinfer import registry
from gpinfer.cli import main

PKG = "gpinfer_clitoy_zz"


@pytest.fixture
def cli_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A good and a broken method plugin from the distribution ``gpinfer-clitoy 1.2.3``."""
    site = tmp_path / "site"
    (site / PKG).mkdir(parents=True)
    (site / PKG / "__init__.py").write_text("")
    (site / PKG / "good.py").write_text(
        "from gpinfer.interfaces import Method\n\n"
        "class Good(Method):\n"
        "    def fit(self, problem, callback=None):\n"
        "        raise NotImplementedError\n\n"
        "NOT_A_METHOD = 42\n"
    )
    (site / PKG / "bad.py").write_text("raise ImportError('clitoy cannot find libfoo')\n")
    info = site / "gpinfer_clitoy-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpinfer-clitoy\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(
        f"[gpinfer.methods]\nclitoy_good = {PKG}.good:Good\nclitoy_bad = {PKG}.bad:Bad\n"
        f"clitoy_int = {PKG}.good:NOT_A_METHOD\n"
    )
    monkeypatch.syspath_prepend(str(site))
    registry.refresh()
    yield site
    for mod in [m for m in sys.modules if m.startswith(PKG)]:
        del sys.modules[mod]
    monkeypatch.undo()
    registry.refresh()


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def _line(text: str, name: str) -> str:
    return next(ln for ln in text.splitlines() if ln.split()[:1] == [name])


def test_help_works(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "list" in capsys.readouterr().out


def test_no_command_prints_help():
    code, text = run()
    assert code == 0 and "usage: gpinfer" in text


def test_list_kernels_shows_name_distribution_version():
    code, text = run("list", "kernels")
    assert code == 0
    assert text.startswith("gpinfer.kernels")
    line = _line(text, "rbf")
    assert "gpinfer" in line and importlib.metadata.version("gpinfer") in line
    assert "gpinfer.likelihoods" not in text  # only the group asked for


def test_list_all_groups_and_data_files():
    code, text = run("list", "--no-import")
    assert code == 0
    for group in registry.GROUPS:
        assert group in text
    assert "waveform" in text and "not imported" in text
    assert "data directory" in text


def test_broken_plugin_reported_and_others_still_listed(cli_plugin):
    code, text = run("list", "methods")
    assert code == 1  # broken plugins are an error, with or without --check
    good = _line(text, "clitoy_good")
    assert "gpinfer-clitoy" in good and "1.2.3" in good and good.rstrip().endswith("ok")
    bad = _line(text, "clitoy_bad")
    assert "BROKEN: ImportError: clitoy cannot find libfoo" in bad
    assert "gpinfer-clitoy" in bad
    assert "BROKEN: " in _line(text, "clitoy_int") and "not a subclass" in _line(text, "clitoy_int")


def test_check_flag_sets_exit_status(cli_plugin):
    code, _ = run("list", "methods", "--check")
    assert code == 1
    code, _ = run("list", "datasets", "--check")
    assert code == 0


def test_unknown_group_is_an_error_with_suggestion(capsys):
    code, _ = run("list", "kernelz")
    assert code == 2
    assert "did you mean 'kernels'" in capsys.readouterr().err


def test_console_script_help():
    script = Path(sys.executable).with_name("gpinfer")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "gpinfer.cli"]
    res = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "usage: gpinfer" in res.stdout


def test_list_reports_an_ignored_duplicate_and_fails(tmp_path: Path, monkeypatch):
    """Another distribution's ``laplace`` is listed as IGNORED and the exit status is 1."""
    site = tmp_path / "dup"
    info = site / "thirdparty_gp-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-gp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpinfer.methods]\nlaplace = thirdparty_gp:Fake\n")
    monkeypatch.syspath_prepend(str(site))
    registry.refresh()
    try:
        with pytest.warns(RuntimeWarning, match="also registered by thirdparty-gp"):
            code, text = run("list", "methods")
    finally:
        monkeypatch.undo()
        registry.refresh()
    assert code == 1
    rows = [ln for ln in text.splitlines() if ln.split()[:1] == ["laplace"]]
    assert len(rows) == 2
    assert any("gpinfer-laplace" in r and r.rstrip().endswith("ok") for r in rows)
    assert any("thirdparty-gp" in r and "IGNORED: this project's distribution" in r for r in rows)
    assert "1 plugin(s) broken or ignored" in text


def test_a_closed_pipe_ends_the_listing_quietly(tmp_path: Path) -> None:
    """``gpinfer list | head -1``: no BrokenPipeError, exit status 0 for gpinfer."""
    exe = Path(sys.executable).with_name("gpinfer")
    script = f"set -o pipefail; '{exe}' list --no-import | head -1"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpinfer.methods")
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
    # a reader gone before the first byte (`true` reads nothing): the write itself fails
    closed = subprocess.run(["bash", "-c", f"set -o pipefail; '{exe}' list --no-import | true"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            check=False)
    assert closed.returncode == 0 and closed.stderr == "", closed.stderr
