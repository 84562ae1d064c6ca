"""Paper protocols say what they need before they start; the sweeper checks a covering set."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gpinfer.experiment.app import CONF_DIR
from gpinfer.experiment.protocols import describe, sweep_values


def _protocol(name: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}"],
                      return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    return (OmegaConf.to_container(cfg.protocol),
            OmegaConf.to_container(params) if params else {}, cfg)


def test_villacampa_notice_counts_jobs_and_names_missing_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPINFER_DATA_DIR", str(tmp_path))
    (tmp_path / "vowel.npz").write_bytes(b"")
    protocol, params, cfg = _protocol("villacampa2017_uci")
    assert len(sweep_values(params)["seed"]) == 20
    text = describe(protocol, params)
    assert "jobs: 1200 (4 method x 5 dataset x 3 M x 20 seed)" in text
    # waveform and wine are generated or bundled: they need no file
    assert "vowel found; MISSING: new_thyroid, svmguide2 (their jobs will fail)" in text
    assert "time on 2 cores: about" in text
    assert cfg.hydra.sweeper._target_.endswith("GPInferSweeper")


@pytest.mark.parametrize("name", ["bui2017_classification", "izmailov2017", "seeger2004_mnist"])
def test_every_gpinfer_run_protocol_tells_its_cost(name: str) -> None:
    protocol, params, _ = _protocol(name)
    text = describe(protocol, params)
    assert text.startswith(f"protocol {name}: ") and "jobs: " in text
    assert "time on 2 cores: " in text and "_TIME" not in text


def test_sweeper_checks_a_covering_set_of_a_large_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from hydra_plugins.gpinfer_hydra.sweeper import ANNOUNCE_FROM, GPInferSweeper

    composed: list[list[str]] = []
    loader = SimpleNamespace(load_sweep_config=lambda master_config, sweep_overrides:
                             composed.append(sweep_overrides))
    sweeper = GPInferSweeper(max_batch_size=None, params=None)
    sweeper.hydra_context = SimpleNamespace(config_loader=loader)
    sweeper.config = OmegaConf.create({"hydra": {"runtime": {"choices": {"method": "ep"}}}})
    batch = [[f"method={m}", f"seed={i}"] for m in ("ep", "sep") for i in range(ANNOUNCE_FROM)]
    sweeper.validate_batch_is_legal(batch)
    # the config group method has two choices: two jobs use both (seed is a plain value)
    assert composed == [["method=ep", "seed=0"], ["method=sep", "seed=1"]]
    err = capsys.readouterr().err
    assert (f"{2 * ANNOUNCE_FROM} jobs; checking the configs of the 2 that use every swept "
            "config-group choice") in err
    sweeper.validate_batch_is_legal(batch[:3])  # small sweeps: silent
    assert capsys.readouterr().err == "" and len(composed) == 3
