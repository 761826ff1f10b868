"""Logging setup for omniserve processes: text or JSON lines, each with its session id.

The session a line is about comes from a context variable (``SESSION_ID``) that the gateway's
session handler and the worker's session task set for their own work: asyncio tasks started
inside inherit it, and so does every library log call made on their behalf, so no call site has
to pass the id; Celery's own lines about a task name it by its task id, which is the session id.
Text lines append ``session=<id>``; JSON lines carry a ``session_id`` field.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson

from omnicore.redact import RedactingFormatter, redact

FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s%(session_suffix)s"

SESSION_ID: ContextVar[str | None] = ContextVar("omniserve_session_id", default=None)

#: LogRecord attributes that are not extra fields of a JSON line
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "session_id", "session_suffix"}
)


@contextmanager
def session_context(session_id: str) -> Iterator[None]:
    """Every log line written inside the block (and by tasks it starts) names ``session_id``."""
    token = SESSION_ID.set(session_id)
    try:
        yield
    finally:
        SESSION_ID.reset(token)


def _celery_task_id(record: logging.LogRecord) -> str | None:
    """The task id of Celery's own task lines (received, succeeded, failed): they pass it in a
    mapping of arguments. A session's task id is its session id (``api/gateway/state.py``)."""
    if record.name.startswith("celery.") and isinstance(record.args, Mapping):
        task_id = record.args.get("id")
        return task_id if isinstance(task_id, str) else None
    return None


class SessionFilter(logging.Filter):
    """Puts the current session id on each record (``extra={"session_id": ...}`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        sid = getattr(record, "session_id", None) or SESSION_ID.get() or _celery_task_id(record)
        record.session_id = sid
        record.session_suffix = f" session={sid}" if sid else ""
        return True


class JsonFormatter(RedactingFormatter):
    """One JSON object per line: time, level, logger, pid, message, session_id, the record's
    ``extra`` fields, and the traceback if any; redacted like the text lines."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": redact(record.getMessage(), self.secrets),
        }
        sid = getattr(record, "session_id", None)
        if sid:
            out["session_id"] = sid
        out.update(
            (k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        )
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info), self.secrets)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str = "info", secrets: Iterable[str] = (), fmt: str = "text") -> None:
    """One line per record, with the process id (several workers share a terminal).

    ``fmt`` is ``text`` or ``json`` (``OMNISERVE_LOG_FORMAT``). Every line goes through the
    redaction of ``omnicore.redact``: URL passwords, secret query parameters, bearer tokens and
    the given ``secrets`` never reach the output.
    """
    logging.basicConfig(level=level.upper(), format=FORMAT)
    formatter: logging.Formatter = (
        JsonFormatter(None, secrets) if fmt == "json" else RedactingFormatter(FORMAT, secrets)
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, SessionFilter) for f in handler.filters):
            handler.addFilter(SessionFilter())
