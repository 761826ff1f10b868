"""``client_diagnostic``: what a browser client reports about its own playback.

The official demo's pages send ``{"type": "client_diagnostic", "event": "gap", "gap_ms": ...}``
whenever their audio player ran dry, and a ``session_summary`` when a session ends. These are
the only underrun figures that include the network and the client's own scheduling, so they are
accepted in every session state (never an error), logged with the session id and, for ``gap``
events, counted in ``omniserve_client_playback_gaps_total``.

A client decides what it sends: the log line holds a bounded excerpt and only the first
``LOGGED_PER_SESSION`` events of a session are logged (the counter still moves).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from prometheus_client import Counter

log = logging.getLogger("omniserve.gateway")

GAP_EVENT = "gap"
LOGGED_PER_SESSION = 50
EXCERPT_CHARS = 400


class ClientDiagnostics:
    """Counts and logs one session's ``client_diagnostic`` events."""

    def __init__(self, session_id: str, gaps: Counter) -> None:
        self.session_id = session_id
        self.gaps_counter = gaps  # the gateway's omniserve_client_playback_gaps_total
        self.received = 0
        self.gaps = 0

    def note(self, event: dict[str, Any]) -> None:
        """Take one event (any JSON object with this type); never raises for its content."""
        self.received += 1
        kind = event.get("event")
        kind = kind if isinstance(kind, str) else "unknown"
        if kind == GAP_EVENT:
            self.gaps += 1
            self.gaps_counter.inc()
        if self.received > LOGGED_PER_SESSION:
            return
        details = {k: v for k, v in event.items() if k not in ("type", "event")}
        try:
            excerpt = orjson.dumps(details, default=str).decode()[:EXCERPT_CHARS]
        except orjson.JSONEncodeError:  # e.g. nested deeper than orjson writes
            excerpt = "(not representable)"
        log.info("client_diagnostic session=%s event=%s %s", self.session_id, kind[:40], excerpt)
        if self.received == LOGGED_PER_SESSION:
            log.info(
                "client_diagnostic session=%s: further events are counted, not logged",
                self.session_id,
            )
