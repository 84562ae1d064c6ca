"""Tracking URIs without credentials, for everything that is printed or stored.

An MLflow tracking URI may carry a user name and password (``https://user:pw@host``,
``postgresql://user:pw@db/mlflow``) or a secret in its query (``?password=...``,
``?token=...``). ``redact_uri`` removes them; the run itself still connects with the URI as
given. To keep credentials out of the URI altogether, MLflow reads
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (or ``MLFLOW_TRACKING_TOKEN``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["SECRET_QUERY_KEYS", "redact_text", "redact_uri", "scrub_files"]

#: query parameters that hold secrets (compared lower-case)
SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "token", "access_token", "secret",
                               "api_key", "apikey", "key"})


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
        parts = urlsplit(uri)
    except ValueError:  # a malformed authority: keep only the scheme
        return uri.split("://", 1)[0] + "://<redacted>"
    netloc = parts.netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        kept = [(k, v) for k, v in pairs if k.lower() not in SECRET_QUERY_KEYS]
        if len(kept) != len(pairs):
            query = urlencode(kept)
    if netloc == parts.netloc and query == parts.query:
        return uri
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str, uri: str | None) -> str:
    """``text`` with every occurrence of ``uri`` replaced by ``redact_uri(uri)``."""
    safe = redact_uri(uri)
    if not uri or safe == uri:
        return text
    return text.replace(uri, safe or "")


def scrub_files(folder: Path, uri: str | None, pattern: str = "*.yaml") -> list[Path]:
    """Rewrite the files under ``folder`` matching ``pattern`` (e.g. Hydra's ``.hydra/*.yaml``,
    which record the command-line overrides) so that they hold ``uri`` only redacted; returns
    the files changed."""
    changed: list[Path] = []
    if not uri or redact_uri(uri) == uri or not folder.is_dir():
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
