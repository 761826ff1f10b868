"""A chat turn's request travels through Redis, not through Celery.

The request holds the conversation (prompts) and its media in base64 (images, audio, video,
reference voices). Celery task arguments are visible to anyone who can read the broker's event
stream (Flower shows them), so a ``ChatJob`` carries only ids and the deadline; the gateway
stores the request under ``Keys.chat_request(turn_id)`` in the transaction that submits the
task, and the task takes it (``GETDEL``: read once, then gone). The TTL only covers a turn
that never starts after a gateway crash; the gateway deletes an untaken request itself when the
turn ends.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from streaming.codec import dumps, loads
from streaming.keys import Keys

TTL_MARGIN_S = 60  # beyond the task start timeout: a task reads its request as it starts


def chat_request_value(
    keys: Keys, turn_id: str, request: dict[str, Any], start_timeout_s: float
) -> dict[str, tuple[bytes, int]]:
    """Gateway: the request as the key to write (value, TTL in s), for ``Gateway.submit`` to
    write in the same transaction as the task (one round trip, never a task without it)."""
    return {keys.chat_request(turn_id): (dumps(request), int(start_timeout_s) + TTL_MARGIN_S)}


async def store_chat_request(
    r: aioredis.Redis, keys: Keys, turn_id: str, request: dict[str, Any], start_timeout_s: float
) -> None:
    """Gateway: keep the request until the turn's task takes it (on its own)."""
    for key, (value, ttl_s) in chat_request_value(keys, turn_id, request, start_timeout_s).items():
        await r.set(key, value, ex=ttl_s)


async def drop_chat_request(r: aioredis.Redis, keys: Keys, turn_id: str) -> None:
    """Gateway: the turn is over; remove its request if no task took it."""
    await r.delete(keys.chat_request(turn_id))


def parse_chat_request(raw: bytes | None) -> dict[str, Any] | None:
    """Worker: a turn's request as its claim read it (None when it expired or Redis lost it)."""
    if raw is None:
        return None
    request = loads(raw)
    return request if isinstance(request, dict) else None
