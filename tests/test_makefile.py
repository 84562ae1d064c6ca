"""The Makefile's set-up edges, with a stand-in Python that records what make asks of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/bin/bash
echo "python $*" >> "{calls}"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/bash\\necho "venv-python $*" >> "{calls}"\\n' > "$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in ("Makefile", "pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, tmp_path / name)
    fake = tmp_path / "python3.11"
    fake.write_text(FAKE_PYTHON.format(calls=tmp_path / "calls"))
    fake.chmod(0o755)
    return tmp_path


def _make(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args, f"PYTHON={checkout / 'python3.11'}"],
                          cwd=checkout, capture_output=True, text=True, timeout=60, check=False)


def test_a_venv_of_an_unsupported_python_is_rebuilt(checkout: Path) -> None:
    venv_python = checkout / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/bash\nexit 1\n")  # answers "unsupported" to the check
    venv_python.chmod(0o755)
    (checkout / ".venv" / ".installed").touch()  # up to date by its stamp: still rebuilt
    (checkout / "outputs").mkdir()
    (checkout / "outputs" / "mlflow.db").write_text("kept")
    done = _make(checkout, "install")
    assert done.returncode == 0, done.stderr
    assert "made by an unsupported or missing Python: rebuilding it" in done.stdout
    calls = (checkout / "calls").read_text().splitlines()
    assert "python -m venv .venv" in calls
    assert any(c.startswith("venv-python -m pip install -e .[dev]") for c in calls)
    assert (checkout / "outputs" / "mlflow.db").read_text() == "kept"
    # the rebuilt venv is fine: a second install does nothing, quietly
    (checkout / "calls").unlink()
    again = _make(checkout, "install")
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    assert (checkout / "calls").read_text().splitlines() == [
        "venv-python -c import sys; sys.exit(sys.version_info < (3, 11))"]


def test_ui_port_is_a_variable(checkout: Path) -> None:
    done = _make(checkout, "-n", "ui", "PORT=5123")
    assert done.returncode == 0, done.stderr
    assert "--host 127.0.0.1 --port 5123" in done.stdout
