"""``run_experiment`` in a process group of two gloo ranks (what ``torchrun`` starts): rank 0
records the run (``result.json``, one MLflow run), rank 1 takes its part of the fit and writes
nothing (no output folder, no MLflow store opened)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import REPO, store_runs

pytest.importorskip("torch", reason="torch.distributed needs PyTorch (make test installs it)")


def test_only_rank_zero_records_the_run(tmp_path: Path) -> None:
    from gpinfer.testing.ranks import run_ranks

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_ranks(f"""
        from tests.experiment.helpers import store_cfg
        from gpinfer.experiment.runner import run_experiment
        cfg = store_cfg({uri!r}, "method=svi", "method.likelihood=null", "M=5",
                        "batch_size=64", "iterations=10", "method.options.optimizer=adam",
                        "method.options.report_every=2",
                        "method.options.optimizer_options={{learning_rate: 0.05}}")
        result = run_experiment(cfg, output_dir={str(tmp_path)!r} + f"/rank{{RANK}}")
        save(status=result["status"], keys=sorted(result))
    """, 2, tmp_path / "ranks", cwd=REPO)
    assert [str(o["status"]) for o in out] == ["FINISHED", "FINISHED"]
    saved = json.loads((tmp_path / "rank0" / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["n_iter"] == 10
    assert not (tmp_path / "rank1").exists()
    assert list(out[1]["keys"]) == ["rank", "status"]
    runs = store_runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"


def test_a_full_batch_method_is_refused_before_the_store(tmp_path: Path) -> None:
    """``gpinfer-run`` with laplace in a process group: every rank's ``InputError`` names the
    methods that train in a group, raised before the MLflow store is opened or the output
    folder made (``prepare`` checks the method as soon as the group is started)."""
    from gpinfer.testing.ranks import run_ranks

    db = tmp_path / "mlflow.db"
    out = run_ranks(f"""
        from gpinfer.errors import InputError
        from tests.experiment.helpers import store_cfg
        from gpinfer.experiment.runner import run_experiment
        cfg = store_cfg({f"sqlite:///{db}"!r}, "method=laplace", "iterations=5")
        try:
            run_experiment(cfg, output_dir={str(tmp_path)!r} + f"/rank{{RANK}}")
            msg = "ran"
        except InputError as e:
            msg = str(e)
        save(msg=np.array(msg))
    """, 2, tmp_path / "ranks", cwd=REPO)
    for o in out:
        assert "method 'laplace' does not train data-parallel" in str(o["msg"])
        assert "sep" in str(o["msg"]) and "svi" in str(o["msg"])
    assert not db.exists() and not (tmp_path / "rank0").exists()
