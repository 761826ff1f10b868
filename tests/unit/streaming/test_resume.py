"""streaming/resume.py against a real Redis: ``reclaim``, the one change of hands that needs no
token (the connection that still relays a session its worker took for abandoned)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from streaming.keys import Keys
from streaming.resume import ResumeStore, WorkerResume

SID = "rt_reclaim"


async def record(store: ResumeStore) -> None:
    await store.create(
        SID,
        token="t",
        mode="audio",
        gateway="gw1",
        conn="c1",
        created_seq=1,
        deadline=0.0,
        init=b"{}",
        ttl_s=60,
    )


async def test_only_a_detached_record_that_has_not_ended_is_attached_again(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    store = ResumeStore(async_redis, keys)
    worker = WorkerResume(sync_redis, keys, SID)
    try:
        await record(store)
        assert not await store.reclaim(SID, "c1", "gw1")  # attached: nothing to take back
        worker.note_gateway_gone("gw1")  # the worker took gw1 for dead
        att = worker.attachment()
        assert att is not None and att.gateway == "" and att.detached_at is not None
        assert await store.reclaim(SID, "c1", "gw1")
        att = worker.attachment()
        assert att is not None and (att.gateway, att.detached_at) == ("gw1", None)
        assert await store.owner(SID) == "c1"
        # another connection resumed it meanwhile: it keeps it
        await store.attach(SID, "t", "t2", "audio", "gw2", "c2", grace_s=30)
        assert not await store.reclaim(SID, "c1", "gw1")
        assert await store.owner(SID) == "c2"
        # ended: nobody takes it back
        assert await store.detach(SID, "c2")
        await store.mark_ended(SID)
        assert not await store.reclaim(SID, "c1", "gw1")
        assert await store.owner(SID) == ""
        assert not await store.reclaim("rt_none", "c1", "gw1")  # no record at all
    finally:
        await async_redis.delete(keys.session_resume(SID))
