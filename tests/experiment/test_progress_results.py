"""result.json writing, the summary line and peak memory (the progress bar: tests/test_progress.py)."""

from __future__ import annotations

import json
import math
import mmap
from pathlib import Path

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.experiment import results


def test_result_json_is_strict_json(tmp_path: Path) -> None:
    path = results.write_result(
        tmp_path,
        {
            "method": "ep",
            "dataset": "wine",
            "M": 0.1,
            "seed": np.int64(2),
            "test_error": np.float64(0.25),
            "test_nll": math.inf,
            "log_evidence": math.nan,
            "train_time_s": 1.5,
            "n_iter": 3,
            "peak_rss_mb": 120.0,
            "nested": {"a": [np.float32(1.5), math.nan]},
        },
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data == results.read_result(tmp_path)
    assert data["seed"] == 2 and data["test_error"] == 0.25
    assert data["test_nll"] is None and data["log_evidence"] is None
    assert data["nested"] == {"a": [1.5, None]}
    line = results.summary_line({**data, "status": "FINISHED", "M_count": 13})
    assert "\n" not in line
    assert "ep on wine" in line and "test NLL n/a" in line
    # one spelling of M: the inducing points used, however M was given; none without them
    assert " M=13 " in line
    assert " M=50 " in results.summary_line({**data, "M": None, "M_count": 50})
    assert " M=" not in results.summary_line({**data, "M": None, "M_count": None})


def test_the_result_line_shows_paths_relative_to_the_working_directory(tmp_path: Path) -> None:
    result = {"method": "sep", "dataset": "waveform", "kernel": "rbf", "M": None, "M_count": 50,
              "seed": 0, "test_error": 0.1614, "test_nll": 0.3621, "log_evidence": -114.5,
              "n_iter": 50, "train_time_s": 0.35, "peak_rss_mb": 300.0, "status": "FINISHED",
              "output_dir": str(tmp_path / "outputs" / "runs" / "x"), "mlflow_run_id": "abc",
              "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"}
    line = results.summary_line(result, cwd=tmp_path)
    assert str(tmp_path) not in line
    assert line.endswith("| outputs/runs/x | MLflow run abc in sqlite:///outputs/mlflow.db")
    elsewhere = results.summary_line(result, cwd=tmp_path / "other")  # outside: as given
    assert str(tmp_path / "outputs" / "runs" / "x") in elsewhere
    server = results.summary_line({**result, "mlflow_tracking_uri": "http://host:5000"}, tmp_path)
    assert server.endswith("in http://host:5000")


def test_output_folder_check(tmp_path: Path) -> None:
    made = results.check_output_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe file is gone
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="not writable"):
        results.check_output_dir(tmp_path / "f" / "run")


def _touched_pages(n_bytes: int) -> mmap.mmap:
    """``n_bytes`` of fresh anonymous memory with every 4 KiB page written, in small pages.

    Not a numpy array: in a full test run on a fresh clone ``VmHWM`` was the same before and
    after touching a 40 MB array. An allocator may serve one from memory the process already
    holds resident, and numpy asks for huge pages for large arrays; this block depends on
    neither."""
    block = mmap.mmap(-1, n_bytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        block.madvise(mmap.MADV_NOHUGEPAGE)
    for offset in range(0, n_bytes, 4096):
        block[offset] = 1
    return block


def test_peak_memory_is_per_run() -> None:
    results.reset_peak_rss()
    base = results.peak_rss_mb()
    block = _touched_pages(40 * 2**20)  # 40 MiB
    grown = results.peak_rss_mb()
    block.close()
    assert grown - base > 30.0
    if results.reset_peak_rss():  # Linux: the peak starts again from the current size
        assert results.peak_rss_mb() < grown - 30.0


def test_fitted_inducing_count_reads_the_posterior() -> None:
    from types import SimpleNamespace

    from gpinfer.experiment.runner import fitted_inducing_count

    assert fitted_inducing_count(SimpleNamespace(Z=[np.zeros((7, 2)), np.zeros((7, 2))])) == 7
    assert fitted_inducing_count(SimpleNamespace(Z=np.zeros((4, 3)))) == 4
    assert fitted_inducing_count(object()) is None
