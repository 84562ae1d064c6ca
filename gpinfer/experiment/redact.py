"""Tracking URIs without credentials, for everything that is printed or stored.

An MLflow tracking URI may carry a user name and password (``https://user:pw@host``,
``postgresql://user:pw@db/mlflow``) or a secret in its query (``?password=...``,
``?token=...``). ``redact_uri`` removes them; the run itself still connects with the URI as
given. To keep credentials out of the URI altogether, MLflow reads
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (or ``MLFLOW_TRACKING_TOKEN``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["SECRET_QUERY_KEYS", "redact_text", "redact_uri", "redact_urls", "scrub_files",
           "store_error"]

#: query parameters that hold secrets (compared lower-case)
SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "token", "access_token", "secret",
                               "api_key", "apikey", "key"})


def strip_uri(uri: str, query_keys: Collection[str]) -> tuple[str, str, list[tuple[str, str]]]:
    """``(uri without its user info and without the query parameters whose lower-cased name is in
    query_keys, the user info removed, the removed (name, value) pairs)``; ``uri`` itself when
    nothing is removed. ``ValueError`` for a URI whose authority does not parse."""
    parts = urlsplit(uri)
    userinfo, _, netloc = parts.netloc.rpartition("@")
    pairs = parse_qsl(parts.query, keep_blank_values=True) if parts.query else []
    removed = [(k, v) for k, v in pairs if k.lower() in query_keys]
    if netloc == parts.netloc and not removed:
        return uri, "", []
    query = urlencode([(k, v) for k, v in pairs if k.lower() not in query_keys]) if removed \
        else parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)), userinfo, removed


def redact_uri(uri: str | None) -> str | None:
    """``uri`` without the ``user:password@`` part of its authority and without secret query
    parameters; other URIs (``sqlite:///path``, file paths, ``None``) are returned unchanged.

    Examples: ``https://alice:s3cret@mlflow.example.org/`` -> ``https://mlflow.example.org/``;
    ``postgresql://u@db:5432/m?password=x&sslmode=require`` -> ``postgresql://db:5432/m?
    sslmode=require``.
    """
    if not uri or "://" not in uri:
        return uri
    try:
        return strip_uri(uri, SECRET_QUERY_KEYS)[0]
    except ValueError:  # a malformed authority: keep only the scheme
        return uri.split("://", 1)[0] + "://<redacted>"


def redact_text(text: str, uri: str | None) -> str:
    """``text`` with every occurrence of ``uri`` replaced by ``redact_uri(uri)``, and the
    ``user:password@`` part of any other URI in it removed (``redact_urls``)."""
    safe = redact_uri(uri)
    if uri and safe != uri:
        text = text.replace(uri, safe or "")
    return redact_urls(text)


#: a URI with a ``user[:password]@`` part, anywhere in a text; Hydra escapes the colons of
#: override values in what it records (``http\://alice\:pw@host``)
_URL_WITH_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*\\?://)[^\s/@'\"\]]+@")


def redact_urls(text: str) -> str:
    """``text`` with the ``user:password@`` part of every URI in it removed (for messages from
    libraries that may quote the URI they were given, and Hydra's records of overrides)."""
    return _URL_WITH_USERINFO.sub(r"\g<scheme>", text)


def store_error(exc: BaseException, uri: str | None, limit: int = 300) -> str:
    """``"<ExceptionType>: <first line of its message>"`` with ``uri`` and any credentials in
    URIs redacted, cut to ``limit`` characters: what a one-line store error may say."""
    lines = redact_text(str(exc), uri).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def scrub_files(folder: Path, uri: str | None, pattern: str = "*.yaml") -> list[Path]:
    """Rewrite the files under ``folder`` matching ``pattern`` (e.g. Hydra's ``.hydra/*.yaml``,
    which record the command-line overrides) so that they hold ``uri``, and any URI with
    credentials, only redacted (``redact_text``); returns the files changed."""
    changed: list[Path] = []
    if not folder.is_dir():
        return changed
    for path in sorted(folder.rglob(pattern)):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        clean = redact_text(text, uri)
        if clean != text:
            path.write_text(clean)
            changed.append(path)
    return changed
