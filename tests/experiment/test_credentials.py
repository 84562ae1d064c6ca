"""Credentials leave the tracking URI at the start: MLflow's variables, a clean command line,
one-line store errors without them (no server needed; the real server: test_secrets_server)."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterator

import pytest
from omegaconf import OmegaConf

from gpinfer.cli import main as gpinfer_main
from gpinfer.experiment import credentials as cred
from gpinfer.experiment.redact import redact_urls, store_error
from gpinfer.experiment.runner import config_to_dict
from gpinfer.experiment.tracking import resolve_tracking_uri

from .helpers import compose_cfg

_VARIABLES = (cred.USERNAME_ENV, cred.PASSWORD_ENV, cred.TOKEN_ENV, cred.SECRET_URI_ENV,
              "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "MLFLOW_TRACKING_URI")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The credential variables unset here, and put back as they were afterwards."""
    for name in _VARIABLES:
        monkeypatch.setenv(name, "-")  # recorded, so the teardown restores the original
        monkeypatch.delenv(name)
    yield


@pytest.mark.parametrize(
    "uri, clean, env",
    [
        ("http://alice:s3cret@127.0.0.1:5000", "http://127.0.0.1:5000",
         {cred.USERNAME_ENV: "alice", cred.PASSWORD_ENV: "s3cret"}),
        ("https://al%40ice:p%3Aw%2F@h.example/mlflow/", "https://h.example/mlflow/",
         {cred.USERNAME_ENV: "al@ice", cred.PASSWORD_ENV: "p:w/"}),
        ("https://h.example/?token=abc&x=1", "https://h.example/?x=1", {cred.TOKEN_ENV: "abc"}),
        ("http://alice@h:1", "http://h:1", {cred.USERNAME_ENV: "alice"}),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000", {}),
        ("postgresql://u:p@db/mlflow", "postgresql://u:p@db/mlflow", {}),
        ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db", {}),
    ],
)
def test_split_credentials(uri: str, clean: str, env: dict[str, str]) -> None:
    assert cred.split_credentials(uri) == (clean, env)


def test_take_credentials_sets_mlflow_variables(clean_env: None) -> None:
    assert resolve_tracking_uri("http://alice:s3cret@h:1") == "http://h:1"
    assert os.environ[cred.USERNAME_ENV] == "alice" and os.environ[cred.PASSWORD_ENV] == "s3cret"
    os.environ["MLFLOW_TRACKING_URI"] = "https://bob:other@h:2"
    assert resolve_tracking_uri() == "https://h:2"
    assert os.environ[cred.USERNAME_ENV] == "bob"  # the URI's credentials win
    # a database URI keeps its password (its driver needs it); MLflow must not print it
    assert cred.take_credentials("postgresql://u:p@db/m") == "postgresql://u:p@db/m"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"


def test_plain_uris_leave_the_environment_alone(clean_env: None) -> None:
    before = dict(os.environ)
    for uri in ("http://127.0.0.1:5000", "sqlite:///x.db", "file:///tmp/mlruns"):
        assert resolve_tracking_uri(uri) == uri
    argv = ["method=sep", "mlflow.tracking_uri=http://127.0.0.1:5000", "seed=1"]
    assert cred.protect_command_line(list(argv)) == argv
    assert dict(os.environ) == before


def test_protect_command_line(clean_env: None) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = "http://carol:envpw@h:3"
    argv = ["-m", "seed=0,1", "mlflow.tracking_uri=http://alice:s3cret@127.0.0.1:5000",
            "+mlflow.tracking_uri='https://alice:s3cret@h.example/'",
            "++mlflow.tracking_uri=\"postgresql://u:dbpw@db/mlflow\"", "other=alice:s3cret@x"]
    out = cred.protect_command_line(argv)
    assert out == ["-m", "seed=0,1", "mlflow.tracking_uri=http://127.0.0.1:5000",
                   "+mlflow.tracking_uri='https://h.example/'",
                   '++mlflow.tracking_uri="${oc.env:GPINFER_TRACKING_URI}"',
                   "other=alice:s3cret@x"]  # not a tracking URI: untouched
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://h:3"
    assert os.environ[cred.PASSWORD_ENV] == "s3cret"
    assert os.environ[cred.SECRET_URI_ENV] == "postgresql://u:dbpw@db/mlflow"


def test_an_environment_interpolation_resolves_in_the_run_but_not_in_hydra_files(
        clean_env: None) -> None:
    """The override Hydra saves is the interpolation; the run resolves the real URI."""
    os.environ[cred.SECRET_URI_ENV] = "sqlite:///tmp/x.db?password=s3cret"
    cfg = compose_cfg("mlflow.tracking_uri=${oc.env:GPINFER_TRACKING_URI}")
    saved = OmegaConf.to_yaml(cfg)  # what .hydra/config.yaml holds (unresolved)
    assert "s3cret" not in saved and "${oc.env:GPINFER_TRACKING_URI}" in saved
    assert config_to_dict(cfg)["mlflow"]["tracking_uri"] == os.environ[cred.SECRET_URI_ENV]


def test_redact_urls_and_store_error() -> None:
    text = ("API request to http://alice:s3cret@127.0.0.1:1/api failed; see "
            "postgresql://u:p@db/x and sqlite:////a@b/c")
    assert redact_urls(text) == ("API request to http://127.0.0.1:1/api failed; see "
                                 "postgresql://db/x and sqlite:////a@b/c")
    err = ConnectionError("to http://alice:s3cret@h:1/x\nsecond line with s3cret")
    assert store_error(err, "http://alice:s3cret@h:1") == "ConnectionError: to http://h:1/x"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", [["end-stale-runs"], ["report", "some-experiment"]])
def test_unreachable_server_is_one_line_without_the_secret(
        command: list[str], clean_env: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://alice:s3cret@127.0.0.1:{_closed_port()}"
    assert gpinfer_main([*command, "--tracking-uri", uri], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "alice" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "MLflow store 'http://127.0.0.1:" in err
