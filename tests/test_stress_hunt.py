"""``benchmarks/stress_hunt.py``: a case replays from its seed, its data carry every class in
the training part, and the judge flags what it should (no fitting: fast)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _hunt():
    spec = importlib.util.spec_from_file_location("stress_hunt", ROOT / "benchmarks" /
                                                  "stress_hunt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stress_hunt"] = module
    spec.loader.exec_module(module)
    return module


def test_a_case_replays_from_its_seed_and_trains_on_every_class():
    hunt = _hunt()
    for seed in (4001, 5003, 5006, 5016):
        case = hunt.draw_case(seed)
        assert case == hunt.draw_case(seed)
        X, y, Xt, yt = hunt.make_data(case)
        X2, y2, Xt2, yt2 = hunt.make_data(case)
        np.testing.assert_array_equal(X, X2)
        np.testing.assert_array_equal(yt, yt2)
        assert X.shape[0] == y.shape[0] and Xt.shape[0] == yt.shape[0]
        assert X.shape[1] == Xt.shape[1]
        assert np.bincount(y, minlength=case.c).min() >= 2, case.label()
        assert set(np.unique(yt)) <= set(np.unique(y))


def test_the_judge_flags_unnormalised_rows_and_poor_fits():
    hunt = _hunt()

    class Fitted:
        classes_ = np.array([0, 1, 2])

    yt = np.array([0, 1, 2, 2])
    P = np.full((4, 3), 1.0 / 3.0)
    row = {"ref_err": 0.1, "maj_err": 0.5, "kinds": []}
    hunt.judge(row, Fitted(), P, P, yt)
    assert row["kinds"] == ["poor"]  # every row predicted class 0: err 0.75
    raw = P.copy()
    raw[0, 0] += 1e-4
    row = {"ref_err": 0.6, "maj_err": 0.6, "kinds": []}
    hunt.judge(row, Fitted(), P, raw, yt)
    assert row["kinds"] == ["raw-sum"]
    bad = P.copy()
    bad[1, 1] = np.nan
    row = {"ref_err": 0.6, "maj_err": 0.6, "kinds": []}
    hunt.judge(row, Fitted(), bad, P, yt)
    assert row["kinds"] == ["nonfinite"]


def test_summarise_judges_poor_again_and_keeps_the_recorded_findings(tmp_path):
    """``--summarise`` (``load_rows``) re-judges ``poor`` from the row's errors; an
    ``unnormalised`` row (the estimator's own rows) stays one, even when the posterior's rows
    were off too (``raw_sum_dev``): it used to become ``raw-sum``."""
    import json

    hunt = _hunt()
    rows = [{"kinds": ["unnormalised"], "raw_sum_dev": 1e-3, "err": 0.3, "ref_err": 0.3,
             "maj_err": 0.5},
            {"kinds": ["raw-sum"], "raw_sum_dev": 0.0, "err": 0.3, "ref_err": 0.3,
             "maj_err": 0.5},
            {"kinds": ["poor"], "err": 0.42, "ref_err": 0.25, "maj_err": 0.7},
            {"kinds": [], "err": 0.75, "ref_err": 0.1, "maj_err": 0.5},
            {"kinds": ["fit-failed"], "ref_err": 0.1, "maj_err": 0.5}]
    path = tmp_path / "hunt.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["kinds"] for r in hunt.load_rows(str(path))] == [
        ["unnormalised"], ["raw-sum"], [], ["poor"], ["fit-failed"]]


def test_error_kinds_names_each_failure_the_most_specific_way():
    """A fit guard's refusal is ``fit-failed`` (``!`` where the data carried signal), not the
    ``numerical`` of its base class; a ``NumericalError`` naming no number is ``vague``."""
    from gpinfer.errors import FitFailedError, GPInferError, InputError, NumericalError

    hunt = _hunt()
    kinds = hunt.error_kinds
    assert kinds(hunt._Timeout("fit exceeded 90 s"), False) == ["timeout"]
    assert kinds(InputError("M=0"), True) == ["input"]
    assert kinds(FitFailedError("no better"), False) == ["fit-failed"]
    assert kinds(FitFailedError("no better"), True) == ["fit-failed!"]
    assert kinds(NumericalError("Kuu: jitter 1e-2"), False) == ["numerical"]
    assert kinds(NumericalError("Kuu failed"), False) == ["numerical", "vague"]
    assert kinds(GPInferError("other"), False) == ["gpinfer-error"]
    assert kinds(ValueError("bad"), False) == ["crash"]
