"""The numbered server frames of a chat session, kept in Redis for a resume.

A chat session holds no worker slot between turns, and each turn has its own output channel, so
its session-wide ``seq`` is assigned by the gateway connection that runs the turns: every frame
after ``session.created`` goes to this STREAM (``Keys.chat_frames``, entry id ``<seq>-1``, capped
at ``output_log_maxlen`` entries) as the client gets it. Only one connection writes at a time:
the one holding the turn lease (``Keys.chat_turn_lease``, renewed while a turn runs). A client
that drops mid-turn leaves that connection finishing the turn into the log; the connection that
resumes the session reads the log after the client's ``last_seq`` and follows it until the lease
is gone, then runs the next turns itself.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from streaming import lua
from streaming.keys import Keys
from streaming.redis_connection import unblocked

Frame = dict[str, Any]
EXPIRE_EVERY = 32  # frames per renewal of the log's TTL (see ChatLog.append)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _holder(conn: str, turn: int) -> str:
    """The turn lease's value: the connection and its turn number."""
    return f"{conn}#{turn}"


def _entries(raw: Any) -> list[tuple[int, Frame]]:
    return [
        (int(_text(eid).split("-", 1)[0]), orjson.loads(fields.get(b"f") or fields["f"]))
        for eid, fields in raw
    ]


class ChatLog:
    """One chat session's frame log and turn lease (asyncio client)."""

    def __init__(
        self, client: aioredis.Redis, keys: Keys, session_id: str, maxlen: int, ttl_s: float
    ) -> None:
        self.redis = client
        self.key = keys.chat_frames(session_id)
        self.lease_key = keys.chat_turn_lease(session_id)
        self.maxlen = maxlen
        self.ttl_s = max(1, int(ttl_s))  # the session's time left plus the grace
        self._appended = 0  # frames this connection logged
        self._take = client.register_script(lua.TAKE_LEASE)
        self._release = client.register_script(lua.DELETE_IF_HELD)

    async def append(self, seq: int, frame: Frame) -> None:
        """Log ``frame`` (which carries ``seq``); a seq not above the last one is refused.

        Mostly one command per frame: the log's TTL (the session's time left plus the grace,
        from when this connection opened it) goes with this connection's first frame and every
        ``EXPIRE_EVERY``-th after it (a log that Redis lost and an XADD re-created has one again
        soon).
        """
        fields: dict[FieldT, EncodableT] = {"f": orjson.dumps(frame)}
        entry_id = f"{seq}-1"
        if self._appended % EXPIRE_EVERY:
            await self.redis.xadd(
                self.key, fields, id=entry_id, maxlen=self.maxlen, approximate=False
            )
        else:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self.key, fields, id=entry_id, maxlen=self.maxlen, approximate=False)
                pipe.expire(self.key, self.ttl_s)
                await pipe.execute()
        self._appended += 1

    async def last_seq(self) -> int:
        """The newest logged seq (0: none)."""
        got = await self.redis.xrevrange(self.key, "+", "-", count=1)
        return int(_text(got[0][0] or b"0").split("-", 1)[0]) if got else 0

    async def after(self, seq: int) -> list[tuple[int, Frame]]:
        """Every logged frame with a seq above ``seq``, oldest first."""
        return _entries(await self.redis.xrange(self.key, min=f"{seq + 1}-0"))

    async def wait_after(self, seq: int, timeout_s: float) -> list[tuple[int, Frame]]:
        """Frames above ``seq``, waiting up to ``timeout_s`` for the first one."""
        try:
            got: Any = await self.redis.xread(
                {self.key: f"{seq}-1"}, block=max(1, int(timeout_s * 1000))
            )
        except ResponseError as exc:
            if not unblocked(exc):
                raise
            return []  # nothing read: the caller waits again
        return _entries(got[0][1]) if got else []  # RESP2: [[key, entries]]

    async def take_turn(
        self, conn: str, turn: int, ttl_s: float, record: tuple[str, str, int] | None = None
    ) -> bool:
        """Hold the turn lease for turn number ``turn`` of ``conn``, in one step: taken when
        free or held by another turn of ``conn`` (one whose hand-back is still on its way; its
        ``release_turn`` then leaves this one alone), renewed when held by this turn.

        ``record``: (key, field, value) of a hash field to set in the same step (the session's
        resume record), so starting a turn costs one command exchange, not two.
        """
        return await self._take_lease(_holder(conn, turn), ttl_s, f"{conn}#", record)

    async def renew_turn(self, conn: str, turn: int, ttl_s: float) -> bool:
        """Renew the lease of turn ``turn`` of ``conn`` (taken again if Redis lost it)."""
        return await self._take_lease(_holder(conn, turn), ttl_s, "")

    async def _take_lease(
        self, holder: str, ttl_s: float, owner: str, record: tuple[str, str, int] | None = None
    ) -> bool:
        keys = [self.lease_key]
        args: list[str | int] = [holder, int(ttl_s * 1000), owner]
        if record is not None:
            keys.append(record[0])
            args += [record[1], record[2]]
        return bool(await self._take(keys=keys, args=args))

    async def turn_holder(self) -> str | None:
        """The connection running a turn now (None: no turn in flight)."""
        got = await self.redis.get(self.lease_key)
        if got is None:
            return None
        holder = _text(got)
        return holder.rpartition("#")[0] or holder

    async def release_turn(self, conn: str, turn: int) -> None:
        """Give the turn lease back (only while turn ``turn`` of ``conn`` holds it), in one
        step."""
        await self._release(keys=[self.lease_key], args=[_holder(conn, turn)])
