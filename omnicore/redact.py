"""Secrets out of log lines: passwords in URLs, keys in query strings, bearer tokens.

Every omniserve process formats its log records through ``RedactingFormatter`` (set up by
``omnicore.logs.setup_logging``), so a line written by any library (uvicorn's WebSocket lines
quote the request path with its query string, for example) is cleaned before it is written. The
configured secrets themselves (API keys, the admin token, the Redis password) are also replaced
wherever they appear, whatever the surrounding text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_CHARS = 4  # shorter configured secrets are not replaced literally (they would mangle)
#: query parameters whose values are secrets (compared case-insensitively)
SECRET_PARAMS = ("api_key", "apikey", "api-key", "key", "token", "access_token", "password")

_PARAM = re.compile(
    r"(?i)([?&;](?:" + "|".join(re.escape(p) for p in SECRET_PARAMS) + r")=)[^&;#\s\"']*"
)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")


def redact_url(url: str) -> str:
    """``url`` with the password of its user part replaced (``redis://:***@host:6379/0``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if parts.password is None:
        return redact(url)
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return redact(urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}")))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without URL passwords, secret query parameters, bearer tokens or ``secrets``."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = _PARAM.sub(rf"\g<1>{MASK}", text)
    return _BEARER.sub(rf"\g<1>{MASK}", text)


class RedactingFormatter(logging.Formatter):
    """A formatter whose output (message, arguments and traceback alike) is redacted."""

    def __init__(self, fmt: str | None = None, secrets: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        # longest first, so a secret containing another is replaced whole
        self.secrets = sorted(set(secrets), key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.secrets)
