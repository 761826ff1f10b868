"""The protocol's names as data: ``GET /v1/protocol`` (JSON) and ``GET /web/protocol.js``.

Both are made from the enums themselves (``api/protocol/events.py``, ``errors.py``), so a client
that reads them, the browser client (``api/web/``) first of all, never keeps its own copy of an
event type, an error code or a close reason.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import Any

import orjson

from api.protocol import events
from api.protocol.errors import CLOSING_ERRORS, RESUME_ERRORS, CloseReason, ErrorCode, ErrorType

ENUMS: tuple[type[StrEnum], ...] = (
    events.ClientEvent,
    events.ServerEvent,
    events.DeltaKind,
    events.LegacyChatEvent,
    events.OfficialClientEvent,
    events.OfficialEvent,
    events.ContentType,
    ErrorCode,
    ErrorType,
    CloseReason,
)
"""Every enum of the protocol, each published under its own name (``{NAME: value}``)."""


@cache
def catalog() -> dict[str, Any]:
    """Each enum as ``{member name: value}``, and the sets a client acts on."""
    out: dict[str, Any] = {enum.__name__: {m.name: m.value for m in enum} for enum in ENUMS}
    out["CLIENT_ERRORS"] = sorted(c.value for c in ErrorCode if c.is_client_error)
    out["CLOSING_ERRORS"] = sorted(c.value for c in CLOSING_ERRORS)
    out["RESUME_ERRORS"] = sorted(c.value for c in RESUME_ERRORS)
    out["EXTENSIONS"] = sorted(events.EXTENSIONS)
    return out


@cache
def javascript_module() -> str:
    """The catalog as an ES module: one frozen ``export const`` per entry."""
    lines = ["// The protocol's names, made by the gateway from api/protocol (GET /v1/protocol)."]
    for name, value in catalog().items():
        lines.append(f"export const {name} = Object.freeze({orjson.dumps(value).decode()});")
    return "\n".join(lines) + "\n"


__all__ = ["ENUMS", "catalog", "javascript_module"]
