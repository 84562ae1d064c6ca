"""Rate-limited progress lines, result.json writing, the summary line and peak memory."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.experiment import results
from gpinfer.experiment.progress import ProgressPrinter


def test_progress_waits_then_prints_at_most_one_line_per_interval() -> None:
    now = [100.0]
    out = io.StringIO()
    bar = ProgressPrinter(
        "ep/wine seed=0", total=50, start_after_s=3.0, every_s=2.0, stream=out, clock=lambda: now[0]
    )
    printed = []
    for it, t in enumerate([0.5, 1.0, 2.9, 3.0, 3.5, 4.9, 5.0, 5.1, 9.0], start=1):
        now[0] = 100.0 + t
        printed.append(bar.update(it, -10.0 * it, elapsed=t))
    assert printed == [False, False, False, True, False, False, True, False, True]
    lines = out.getvalue().splitlines()
    assert lines[0] == "[ep/wine seed=0] iter 4/50  objective -40  elapsed 3.0 s"
    assert len(lines) == bar.lines_printed == 3


def test_progress_formats_odd_values_and_rejects_bad_settings() -> None:
    bar = ProgressPrinter("x", start_after_s=0.0, every_s=0.0, stream=io.StringIO())
    assert bar.format(3, math.inf, 1.25) == "[x] iter 3  objective inf  elapsed 1.2 s"
    assert bar.format(3, -1234567.0, 0.0).endswith("objective -1.23457e+06  elapsed 0.0 s")
    with pytest.raises(ValueError):
        ProgressPrinter("x", every_s=-1.0)


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
    assert "ep on wine" in line and "M=0.1 (13)" in line and "test NLL n/a" in line
    assert "M=default (50) " in results.summary_line({**data, "M": None, "M_count": 50})
    assert "M=- " in results.summary_line({**data, "M": None, "M_count": None})


def test_output_folder_check(tmp_path: Path) -> None:
    made = results.check_output_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe file is gone
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="not writable"):
        results.check_output_dir(tmp_path / "f" / "run")


def test_peak_memory_is_per_run() -> None:
    results.reset_peak_rss()
    base = results.peak_rss_mb()
    block = np.ones(40_000_000 // 8)  # 40 MB, touched
    grown = results.peak_rss_mb()
    del block
    assert grown - base > 30.0
    if results.reset_peak_rss():  # Linux: the peak starts again from the current size
        assert results.peak_rss_mb() < grown - 30.0


def test_fitted_inducing_count_reads_the_posterior() -> None:
    from types import SimpleNamespace

    from gpinfer.experiment.runner import fitted_inducing_count

    assert fitted_inducing_count(SimpleNamespace(Z=[np.zeros((7, 2)), np.zeros((7, 2))])) == 7
    assert fitted_inducing_count(SimpleNamespace(Z=np.zeros((4, 3)))) == 4
    assert fitted_inducing_count(object()) is None
