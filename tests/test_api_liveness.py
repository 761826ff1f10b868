"""api/liveness.py: the sessions' lease and resume-owner checks, answered together per tick.

A real Redis; the relays that use these answers (lost worker, replaced session) are exercised
end to end by tests/test_failover.py, tests/test_resume*.py and tests/faults/.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from api import liveness
from api.liveness import Liveness
from streaming import lua
from streaming.keys import Keys


class CountingRedis(aioredis.Redis):
    """A client that counts its round trips: the commands it sends itself and its pipelines
    (a command sent inside a pipeline is not counted again)."""

    pipelines = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.pipelines += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        CountingRedis.pipelines += 1
        return super().pipeline(*args, **kwargs)


async def test_one_read_answers_every_question(redis_server: str, keys: Keys) -> None:
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        await client.set(keys.session_lease("a"), b"w1")
        await client.hset(keys.session_resume("a"), "conn", "c1")
        await client.hset(keys.session_resume("b"), "conn", "")
        await client.script_load(lua.LIVENESS)  # (not a round trip of the tick)
        CountingRedis.pipelines = 0
        live.start()
        asks = [live.lease("a"), live.lease("b")]
        asks += [live.replaced("a", "c1"), live.replaced("a", "c2"), live.replaced("b", "c1")]
        asks.append(live.replaced("gone", "c1"))
        assert live.lease("a") is asks[0]  # the same question twice: one answer
        assert live.replaced("a", "c2") is asks[3]
        got = await asyncio.gather(*asks)
        # c2 asks about a session that c1 holds; "b" is detached; "gone" has no record
        assert got == [True, False, False, True, False, False]
        assert CountingRedis.pipelines == 1
    finally:
        await live.stop()
        await client.delete(keys.session_lease("a"), *(keys.session_resume(s) for s in "ab"))
        await client.aclose()


async def test_an_answer_is_read_after_its_question(redis_server: str, keys: Keys) -> None:
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        await client.set(keys.session_lease("s"), b"w1")
        live.start()
        assert await live.lease("s") is True
        await client.delete(keys.session_lease("s"))  # the worker stopped renewing
        assert await live.lease("s") is False
    finally:
        await live.stop()
        await client.aclose()


async def test_a_failed_read_fails_its_questions(keys: Keys) -> None:
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    live = Liveness(client, keys, tick_s=0.01)
    try:
        live.start()
        lease, owner = live.lease("s"), live.replaced("s", "c1")
        await asyncio.wait([lease, owner])
        with pytest.raises(aioredis.ConnectionError):
            lease.result()
        with pytest.raises(aioredis.ConnectionError):
            owner.result()
    finally:
        await live.stop()
        await client.aclose()


async def test_stop_cancels_open_questions(redis_server: str, keys: Keys) -> None:
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=60)
    live.start()
    ask = live.replaced("s", "c1")
    await live.stop()
    assert ask.cancelled()
    await client.aclose()


async def test_read_every_tick_while_asked_then_dropped(redis_server: str, keys: Keys) -> None:
    """An answered session's next question is open at once (read at the next tick, before its
    relay comes back for it); one nobody asks about any more is read once more, then dropped."""
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        await client.set(keys.session_lease("s"), b"w1")
        await client.script_load(lua.LIVENESS)
        CountingRedis.pipelines = 0
        live.start()
        assert await live.lease("s") is True
        await asyncio.sleep(0.3)  # the relay is busy elsewhere for several ticks
        assert CountingRedis.pipelines == 2
        later = live.lease("s")
        assert not later.done()  # never an answer read before the question
        await client.delete(keys.session_lease("s"))
        assert await later is False
    finally:
        await live.stop()
        await client.aclose()


async def test_a_large_tick_is_read_in_parts(
    redis_server: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More keys than one script call reads: one call per part, and every answer still lands
    on its own question (leases and resume records split across parts)."""
    monkeypatch.setattr(liveness, "KEYS_PER_CALL", 3)
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    sids = [f"s{i}" for i in range(5)]
    try:
        for i, sid in enumerate(sids):
            if i % 2 == 0:
                await client.set(keys.session_lease(sid), b"w1")
            await client.hset(keys.session_resume(sid), "conn", "mine" if i < 3 else "theirs")
        await client.script_load(lua.LIVENESS)
        CountingRedis.pipelines = 0
        live.start()
        leases = await asyncio.gather(*(live.lease(sid) for sid in sids))
        assert leases == [True, False, True, False, True]
        assert CountingRedis.pipelines == 2  # 5 keys, 3 a call
        leases_again = [live.lease(sid) for sid in sids]
        replaced = await asyncio.gather(*(live.replaced(sid, "mine") for sid in sids))
        assert replaced == [False, False, False, True, True]
        assert await asyncio.gather(*leases_again) == leases
    finally:
        await live.stop()
        await client.delete(*(keys.session_lease(s) for s in sids))
        await client.delete(*(keys.session_resume(s) for s in sids))
        await client.aclose()


async def test_a_short_reply_fails_its_questions_and_the_ticks_go_on(
    redis_server: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer that does not fit the questions fails them (never a wrong answer), and the
    next tick is read as usual."""
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    read = live._read

    async def short(keys: list[str], leases: int, conns: list[str]) -> bytes:
        return (await read(keys, leases, conns))[:-1]

    try:
        await client.set(keys.session_lease("s"), b"w1")
        monkeypatch.setattr(live, "_read", short)
        live.start()
        asks = [live.lease("s"), live.replaced("s", "c1")]
        await asyncio.wait(asks)
        assert all(isinstance(a.exception(), ValueError) for a in asks)
        monkeypatch.setattr(live, "_read", read)
        assert await live.lease("s") is True
    finally:
        await live.stop()
        await client.delete(keys.session_lease("s"))
        await client.aclose()
