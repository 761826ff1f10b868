"""api/realtime/resume.py: a session's resume record, driven against a real gateway and Redis.

The session is ``tests/support/session_host.Host`` (what ``SessionResume`` reaches through
``ResumeHost``); the record, the liveness read and the worker's side of the record are the real
ones. A whole session resumed by a real client is tests/e2e/test_resume.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.gateway.state import Gateway
from api.realtime.recovery import ResumeRequest
from api.realtime.resume import QUEUE_HOLD_S, SessionResume
from api.realtime.session import SessionState
from streaming.keys import Keys
from streaming.resume import WorkerResume
from tests.support.session_host import Host, gateway_on

SID = "rt_1_resumed"
INIT = b'{"type": "init"}'


@pytest.fixture
async def gateway(redis_server: str, keys: Keys) -> AsyncIterator[Gateway]:
    async with gateway_on(redis_server, keys) as g:
        yield g


async def offered(gateway: Gateway) -> tuple[SessionResume, Host, str]:
    """A session whose client got ``session.created`` with a token."""
    host = Host(SID, gateway=gateway)
    resume = SessionResume(gateway, host)
    token = await resume.offer(7, INIT, True)
    assert token is not None
    return resume, host, token


async def taken_over(gateway: Gateway, token: str) -> tuple[SessionResume, Host, str]:
    """A second connection that resumed ``SID`` with ``token``."""
    host = Host("rt_2_new", gateway=gateway)
    resume = SessionResume(gateway, host)
    taken = await resume.take_over(ResumeRequest(SID, token, 0))
    assert taken is not None
    return resume, host, taken[0]


async def test_an_offered_record_names_this_connection_and_gives_a_token(
    gateway: Gateway, async_redis: aioredis.Redis, keys: Keys
) -> None:
    resume, host, token = await offered(gateway)
    record = await gateway.resumes.fields(SID)
    assert record["conn"] == resume.conn_id
    assert record["gateway"] == gateway.gateway_id
    assert (record["mode"], record["created_seq"], record["ended"]) == ("audio", "7", "")
    assert float(record["deadline"]) == host.deadline
    assert await async_redis.hget(keys.session_resume(SID), "init") == INIT
    # it outlives the session by the grace, so a client that drops at the end may still resume
    assert await async_redis.ttl(keys.session_resume(SID)) > host.time_left() + 30
    assert resume.resumable and resume.offered and len(token) == 43


async def test_a_record_not_offered_is_kept_but_a_drop_does_not_detach(
    gateway: Gateway,
) -> None:
    resume = SessionResume(gateway, Host(SID, gateway=gateway))
    assert await resume.offer(0, INIT, False) is None
    assert resume.resumable and not resume.offered
    assert await resume.detach() is False
    assert await gateway.resumes.owner(SID) == resume.conn_id
    assert not resume.goes_on()


async def test_with_resume_off_no_token_is_offered(redis_server: str, keys: Keys) -> None:
    async with gateway_on(redis_server, keys, resume_grace_s=0) as gateway:
        resume = SessionResume(gateway, Host(SID, gateway=gateway))
        assert await resume.offer(0, INIT, True) is None
        assert resume.resumable and not resume.offered  # (failover still reads the record)
        refused = SessionResume(gateway, host := Host("rt_2_new", gateway=gateway))
        assert await refused.take_over(ResumeRequest(SID, "any", 0)) is None
        assert host.sent[0]["error"]["code"] == "session_not_found"


async def test_a_take_over_moves_the_session_and_the_old_connection_closes_replaced(
    gateway: Gateway,
) -> None:
    first, old, token = await offered(gateway)
    second, new, new_token = await taken_over(gateway, token)
    assert new.adopted == [(SID, old.deadline)] and new.session_id == SID
    assert second.resumable and second.offered and new_token != token
    assert await gateway.resumes.owner(SID) == second.conn_id
    assert second.resumed_frame(new_token, 3) == {
        "type": "session.resumed",
        "session_id": SID,
        "resume_token": new_token,
        "last_seq": 3,
    }
    assert await second.was_replaced() is False  # it is the owner

    assert await first.was_replaced() is True
    assert old.sent == [{"type": "session.closed", "session_id": SID, "reason": "replaced"}]
    assert old.close_codes == [1000] and old.closed_sent and old.state is SessionState.CLOSED
    assert first.replaced and first.goes_on()
    # the token rotated: the first one cannot resume the session
    third = SessionResume(gateway, late := Host("rt_3_late", gateway=gateway))
    assert await third.take_over(ResumeRequest(SID, token, 0)) is None
    assert late.sent[0]["error"]["code"] == "session_not_found"


async def test_a_wrong_token_is_refused_and_the_socket_closed(gateway: Gateway) -> None:
    await offered(gateway)
    resume = SessionResume(gateway, host := Host("rt_2_new", gateway=gateway))
    assert await resume.take_over(ResumeRequest(SID, "not-the-token", 0)) is None
    assert host.sent == [
        {
            "type": "error",
            "error": {
                "code": "session_not_found",
                "message": f"session {SID} was not found (or the token is wrong)",
                "type": "client_error",
                "field": "session_id",
            },
        }
    ]
    assert host.close_codes == [1008] and host.closed_sent
    assert host.adopted == [] and host.session_id == "rt_2_new" and not resume.resumable


async def test_an_ended_session_is_refused_as_expired(gateway: Gateway) -> None:
    _, _, token = await offered(gateway)
    await gateway.resumes.mark_ended(SID)
    resume = SessionResume(gateway, host := Host("rt_2_new", gateway=gateway))
    assert await resume.take_over(ResumeRequest(SID, token, 0)) is None
    assert host.sent[0]["error"]["code"] == "resume_expired"
    assert host.close_codes == [1008]


async def test_a_vanished_client_detaches_the_session_for_a_resume(gateway: Gateway) -> None:
    resume, host, token = await offered(gateway)
    host.gone.set()
    assert await resume.detach() is True
    assert resume.detached and resume.goes_on() and not resume.replaced
    record = await gateway.resumes.fields(SID)
    assert (record["conn"], record["gateway"]) == ("", "")
    assert record["detached_at"] != ""
    await taken_over(gateway, token)  # within the grace


async def test_a_drop_after_another_connection_took_over_is_noted_replaced(
    gateway: Gateway,
) -> None:
    first, _, token = await offered(gateway)
    second, _, _ = await taken_over(gateway, token)
    assert await first.detach() is True  # nothing to stop: the session goes on elsewhere
    assert first.replaced and not first.detached and first.goes_on()
    assert await gateway.resumes.owner(SID) == second.conn_id


async def test_a_session_whose_record_is_gone_is_detached_with_it_written_again(
    gateway: Gateway, async_redis: aioredis.Redis, keys: Keys
) -> None:
    resume, _, token = await offered(gateway)
    await async_redis.delete(keys.session_resume(SID))  # Redis restarted empty
    assert await resume.detach() is True
    assert resume.detached and resume.goes_on()
    record = await gateway.resumes.fields(SID)
    assert (record["conn"], record["gateway"], record["created_seq"]) == ("", "", "7")
    assert float(record["detached_at"]) > 0
    assert await async_redis.hget(keys.session_resume(SID), "init") == INIT
    await taken_over(gateway, token)  # the token the client holds still resumes it


async def test_a_connection_that_never_offered_writes_no_record_again(
    gateway: Gateway, async_redis: aioredis.Redis, keys: Keys
) -> None:
    resume = SessionResume(gateway, Host(SID, gateway=gateway))
    assert await resume.detach() is False  # the caller stops its worker
    assert await resume.rebuild() is False
    assert not await async_redis.exists(keys.session_resume(SID))


async def test_a_record_redis_lost_is_written_again_by_the_connection_relaying_it(
    gateway: Gateway, async_redis: aioredis.Redis, keys: Keys
) -> None:
    """Redis restarted empty: the liveness read finds no record, and the relaying connection
    writes it from its copy, attached to itself; the client's token still resumes it."""
    first, host, token = await offered(gateway)
    assert await first.was_replaced_lately() is False  # starts the watch
    await async_redis.delete(keys.session_resume(SID))
    await gateway.liveness.check()
    assert host.woken.is_set()
    assert await first.was_replaced_lately() is False
    record = await gateway.resumes.fields(SID)
    assert (record["conn"], record["gateway"], record["detached_at"]) == (
        first.conn_id,
        gateway.gateway_id,
        "",
    )
    assert (record["mode"], record["created_seq"], record["rebuilt"]) == ("audio", "7", "1")
    assert await async_redis.hget(keys.session_resume(SID), "init") == INIT
    assert await async_redis.ttl(keys.session_resume(SID)) > host.time_left() + 30
    # an existing record is never overwritten
    assert await first.rebuild() is False
    second, _, newer = await taken_over(gateway, token)
    assert await gateway.resumes.owner(SID) == second.conn_id
    # the connection that took it over keeps its own copy, with the newer token
    await async_redis.delete(keys.session_resume(SID))
    assert await second.rebuild() is True
    third, _, _ = await taken_over(gateway, newer)
    assert await gateway.resumes.owner(SID) == third.conn_id


async def test_queue_events_wait_for_the_clients_first_event(gateway: Gateway) -> None:
    resume = SessionResume(gateway, host := Host(SID, lasts_s=60, gateway=gateway))
    queued = {"type": "session.queued", "session_id": SID, "position": 1}
    update = {"type": "session.queue_update", "session_id": SID, "position": 1}
    resume.first_event.set()  # before the hold is over
    await resume.queue_frame(queued)
    await resume.queue_frame(update)
    for _ in range(500):
        if len(host.sent) == 2:
            break
        await asyncio.sleep(0.01)
    assert host.sent == [queued, update]
    done = {"type": "session.queue_done", "session_id": SID}
    await resume.queue_frame(done)  # once released, at once
    assert host.sent == [queued, update, done]


async def test_queue_events_go_out_after_the_hold_without_an_event(gateway: Gateway) -> None:
    resume = SessionResume(gateway, host := Host(SID, gateway=gateway))
    queued = {"type": "session.queued", "session_id": SID, "position": 1}
    await resume.queue_frame(queued)
    assert host.sent == []  # held
    for _ in range(500):
        if host.sent:
            break
        await asyncio.sleep(0.01)
    assert host.sent == [queued]


async def test_a_client_resuming_another_session_never_sees_the_queue_events(
    gateway: Gateway,
) -> None:
    resume = SessionResume(gateway, host := Host(SID, gateway=gateway))
    await resume.queue_frame({"type": "session.queued", "session_id": SID, "position": 1})
    host.superseded.set()  # its first event is session.resume
    resume.first_event.set()
    await asyncio.sleep(QUEUE_HOLD_S * 2)  # (the hold is over)
    await resume.release_queue_frames()
    await resume.queue_frame({"type": "session.queue_done", "session_id": SID})
    assert host.sent == []


async def test_the_liveness_read_notices_a_replacement_and_wakes_the_relay(
    gateway: Gateway,
) -> None:
    first, old, token = await offered(gateway)
    assert await first.was_replaced_lately() is False  # starts the watch
    await gateway.liveness.check()
    assert not old.woken.is_set() and not first.replacement_seen
    await taken_over(gateway, token)
    await gateway.liveness.check()
    assert old.woken.is_set() and first.replacement_seen
    assert await first.was_replaced_lately() is True
    assert old.types() == ["session.closed"] and old.sent[0]["reason"] == "replaced"
    assert old.close_codes == [1000]


async def test_a_record_its_worker_detached_while_this_connection_relays_is_attached_again(
    gateway: Gateway, sync_redis: redis.Redis, keys: Keys
) -> None:
    """A gateway frozen past its lease: the worker notes it gone (the record detached), yet
    this connection still relays the session; the next look attaches it again."""
    resume, host, _ = await offered(gateway)
    assert await resume.was_replaced_lately() is False
    WorkerResume(sync_redis, keys, SID).note_gateway_gone(gateway.gateway_id)
    assert await gateway.resumes.owner(SID) == ""
    await gateway.liveness.check()
    assert host.woken.is_set() and not resume.replacement_seen
    assert await resume.was_replaced_lately() is False
    record = await gateway.resumes.fields(SID)
    assert (record["conn"], record["gateway"], record["detached_at"]) == (
        resume.conn_id,
        gateway.gateway_id,
        "",
    )
    assert host.sent == [] and not host.gone.is_set()


async def test_reclaim_leaves_a_session_another_connection_resumed_meanwhile(
    gateway: Gateway, sync_redis: redis.Redis, keys: Keys
) -> None:
    first, _, token = await offered(gateway)
    assert await first.was_replaced_lately() is False
    WorkerResume(sync_redis, keys, SID).note_gateway_gone(gateway.gateway_id)
    await gateway.liveness.check()  # read detached
    second, _, _ = await taken_over(gateway, token)
    await first.reclaim()
    assert await gateway.resumes.owner(SID) == second.conn_id
