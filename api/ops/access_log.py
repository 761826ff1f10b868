"""The gateway's access log: one line per HTTP request and per WebSocket, never a query string.

uvicorn's own access log writes the request line as received, query included, and clients may
send their API key as ``?api_key=``; so uvicorn's is turned off (``omniserve gateway`` runs it with
``access_log=False``) and this middleware writes the line instead, with the path and only the
query parameters in ``LOGGED_PARAMS``. uvicorn also logs every WebSocket handshake with its query
(``"WebSocket /v1/realtime?..." [accepted]``, on ``uvicorn.error``, whatever ``access_log`` says):
``quiet_uvicorn_request_lines`` drops those lines, which this log repeats without the query. The
redacting log formatter (``omnicore.redact``) is the second line of defence behind both.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("omniserve.access")

LOGGED_PARAMS = ("mode",)  # harmless and useful; everything else is left out


_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def _printable(text: str) -> str:
    """No control characters in a log line (a forged line break would forge a log entry)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def safe_target(scope: Scope) -> str:
    """The request path as sent (still percent-encoded) with only the harmless parameters."""
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else str(scope.get("path", ""))
    path = _printable(path)
    query = scope.get("query_string", b"")
    if not query:
        return path
    params = QueryParams(query.decode("latin-1"))
    kept = [
        f"{k}={params[k] if _PLAIN_VALUE.fullmatch(params[k]) else '(other)'}"
        for k in LOGGED_PARAMS
        if k in params
    ]
    return f"{path}?{'&'.join(kept)}" if kept else path


class _NoRequestLines(logging.Filter):
    """Drops uvicorn's ``<client> - "WebSocket <path?query>" ...`` records."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith('%s - "WebSocket %s"'))


def quiet_uvicorn_request_lines() -> None:
    """Stop uvicorn from logging WebSocket request lines (they carry the query string)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoRequestLines) for f in logger.filters):
        logger.addFilter(_NoRequestLines())


class AccessLog:
    """ASGI middleware writing the access line when the request or WebSocket ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        outcome: dict[str, Any] = {}

        async def tracking_send(message: Message) -> None:
            t = message["type"]
            if t == "http.response.start":
                outcome["status"] = message["status"]
            elif t == "websocket.accept":
                outcome["status"] = 101
            elif t == "websocket.close":
                outcome["close"] = message.get("code", 1000)
                outcome.setdefault("status", 403)  # closed before accept: refused handshake
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            client = scope.get("client")
            who = f"{client[0]}:{client[1]}" if client else "-"
            method = scope.get("method", "GET") if kind == "http" else "WebSocket"
            took = time.perf_counter() - started
            close = f" close={outcome['close']}" if "close" in outcome else ""
            log.info(
                '%s - "%s %s" %s%s %.3fs',
                who,
                method,
                safe_target(scope),
                outcome.get("status", "-"),
                close,
                took,
            )
