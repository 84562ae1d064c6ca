"""Credentials out of tracking URIs, before anything can print, log or save them.

A tracking URI may carry a password: ``http://alice:s3cret@mlflow.example.org`` or a database
URI such as ``postgresql://alice:s3cret@db/mlflow``. gpinfer takes it out at the start:

* **http(s)**: ``take_credentials`` moves the ``user:password@`` part into
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (MLflow's own variables for basic
  auth) and a ``token`` / ``access_token`` query parameter into ``MLFLOW_TRACKING_TOKEN``; the
  URI without them is the one used, stored and printed, so MLflow's own "View run at ..." lines
  hold no secret either. Credentials in the URI replace those already in the environment.
* **other schemes** (a database whose driver needs the password in the URI): the URI is used
  as given and only ever written redacted (``gpinfer.experiment.redact``).

``protect_command_line`` does this for ``gpinfer-run`` before Hydra starts, so that Hydra never
sees a secret: neither its saved configs (``.hydra/config.yaml``, ``hydra.yaml``,
``overrides.yaml``, ``multirun.yaml``), nor the ``hydra.overrides`` tag, nor its "Error
executing job with overrides" line. An ``mlflow.tracking_uri=...`` override is rewritten to the
URI without credentials; one whose secret must stay in the URI (the database case) moves whole
into ``$GPINFER_TRACKING_URI`` and the override becomes ``${oc.env:GPINFER_TRACKING_URI}``, which
Hydra saves unresolved. ``$MLFLOW_TRACKING_URI`` is cleaned the same way. Sweep jobs inherit the
environment. The safest way remains not to put credentials in the URI at all::

    export MLFLOW_TRACKING_USERNAME=alice MLFLOW_TRACKING_PASSWORD=...   # or MLFLOW_TRACKING_TOKEN
    gpinfer-run mlflow.tracking_uri=https://mlflow.example.org
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from urllib.parse import unquote, urlsplit

from gpinfer.experiment.redact import redact_uri, strip_uri

__all__ = [
    "PASSWORD_ENV", "SECRET_URI_ENV", "TOKEN_ENV", "USERNAME_ENV", "protect_command_line",
    "split_credentials", "take_credentials",
]

USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
#: where ``protect_command_line`` keeps a URI whose secret cannot leave it (a database URI)
SECRET_URI_ENV = "GPINFER_TRACKING_URI"
#: MLflow's switch for its "View run at ..." lines, set while a URI still holds a secret
_QUIET_URLS_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
_URI_ENV = "MLFLOW_TRACKING_URI"
_TOKEN_KEYS = ("token", "access_token")
#: an ``mlflow.tracking_uri`` override, also appended (``+``) or forced (``++``), its value
#: possibly quoted
_OVERRIDE = re.compile(r"^(?P<key>\+{0,2}mlflow\.tracking_uri=)(?P<q>['\"]?)(?P<uri>.*?)(?P=q)$")


def split_credentials(uri: str) -> tuple[str, dict[str, str]]:
    """``(uri without credentials, MLflow's environment variables holding them)`` for an
    http(s) URI; any other URI comes back unchanged with no variables."""
    try:
        scheme = urlsplit(uri).scheme.lower()
        clean, userinfo, tokens = strip_uri(uri, _TOKEN_KEYS)
    except ValueError:
        return uri, {}
    if scheme not in ("http", "https"):
        return uri, {}
    env: dict[str, str] = {}
    user, has_password, password = userinfo.partition(":")
    if user:
        env[USERNAME_ENV] = unquote(user)
    if has_password:
        env[PASSWORD_ENV] = unquote(password)
    for _, value in tokens:
        env[TOKEN_ENV] = value
    if not env:
        return uri, {}
    return clean, env


def take_credentials(uri: str, environ: MutableMapping[str, str] | None = None) -> str:
    """``uri`` without its credentials, which go to MLflow's variables in ``environ`` (default:
    ``os.environ``); while the URI still holds a secret (another scheme, another query key),
    MLflow's "View run at" lines are switched off so that they cannot print it."""
    environ = os.environ if environ is None else environ
    clean, env = split_credentials(uri)
    environ.update(env)
    if redact_uri(clean) != clean:
        environ[_QUIET_URLS_ENV] = "true"
    return clean


def _protect_override(arg: str, environ: MutableMapping[str, str]) -> str:
    match = _OVERRIDE.match(arg)
    if match is None:
        return arg
    uri = match["uri"]
    if redact_uri(uri) == uri:
        return arg  # no credentials: exactly as given
    clean = take_credentials(uri, environ)
    if redact_uri(clean) != clean:  # the secret must stay in the URI: hand it over unseen
        environ[SECRET_URI_ENV] = clean
        clean = "${oc.env:" + SECRET_URI_ENV + "}"
    return f"{match['key']}{match['q']}{clean}{match['q']}"


def protect_command_line(argv: list[str],
                         environ: MutableMapping[str, str] | None = None) -> list[str]:
    """``argv`` with the credentials of an ``mlflow.tracking_uri=...`` override taken out (see
    the module docstring), and ``$MLFLOW_TRACKING_URI`` in ``environ`` without them; arguments
    without credentials are returned as given."""
    environ = os.environ if environ is None else environ
    env_uri = environ.get(_URI_ENV)
    if env_uri:
        environ[_URI_ENV] = take_credentials(env_uri, environ)
    return [_protect_override(arg, environ) for arg in argv]
