"""A worker's start of a session or chat turn: claim, lease and request in one step, then the
slot's hold.

One script for the session's keys, not a command each: the worker's pickup is a large share of
a chat turn's first delta. It keeps the guarantees of separate steps: the claim is taken only
once, and a task whose claim fails writes nothing and consumes no request. The slot's hold is
an admission key (``streaming/keys.py``: on Redis Cluster it lives on another slot than the
session's, and a script touches one slot), so it is renewed by a second command, sent only once
the claim is this worker's (dispatch set it with a short TTL, which this lengthens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from streaming import lua
from streaming.chat_requests import parse_chat_request
from streaming.keys import Keys


@dataclass(frozen=True)
class Claimed:
    """A session this worker now runs; ``request`` is a chat turn's (None: expired or lost)."""

    request: dict[str, Any] | None = None


class SessionClaimer:
    """Claims sessions for one worker process (``claim_ttl_s``: how long a claim bars a re-run)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        worker_id: str,
        claim_ttl_s: float,
        lease_ttl_s: float,
    ) -> None:
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.claim_ttl_s = max(1, int(claim_ttl_s))
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        self._claim = client.register_script(lua.CLAIM_SESSION)

    def claim(
        self, claim_id: str, slot_id: str, session_id: str, chat_turn: bool = False
    ) -> Claimed | None:
        """Take ``claim_id`` once and hold ``slot_id`` for ``session_id``; None when the claim
        was already taken (a re-delivered or stale task). ``chat_turn``: read its request too."""
        k = self.keys
        keys = [k.session_claim(claim_id), k.session_lease(session_id)]
        if chat_turn:
            keys.append(k.chat_request(session_id))
        reply = self._claim(
            keys=keys, args=[self.worker_id, self.claim_ttl_s, self.lease_ttl_ms, slot_id]
        )
        if not reply:
            return None
        self.client.set(k.slot_hold(slot_id), session_id, px=self.lease_ttl_ms)
        if not chat_turn:
            return Claimed()
        return Claimed(parse_chat_request(reply[1] if len(reply) > 1 else None))
