"""api/realtime/chat_resume.py: a chat session's numbered frames, frame log and turn lease,
driven against a real gateway and Redis.

The sessions are ``tests/support/session_host.Host`` (what ``ChatResume`` and ``SessionResume``
reach through their host protocols); the record, the frame log, the turn lease and the slot
given back are the real ones. Whole chat sessions resumed by a real client are
tests/e2e/test_resume_chat.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
import redis.asyncio as aioredis

from api.gateway.state import Gateway
from api.protocol.dialects import Dialect
from api.protocol.errors import Frame
from api.realtime.chat_resume import ChatResume
from api.realtime.recovery import ResumeRequest
from api.realtime.resume import SessionResume
from api.realtime.slot_wait import Admitted
from streaming.keys import Keys
from tests.support.session_host import Host, gateway_on

SID = "rt_1_chat"
INIT = orjson.dumps({"instructions": "be brief"})


class Connection:
    """One chat connection's collaborators on its host, as ``RealtimeChat`` owns them."""

    def __init__(self, gateway: Gateway, host: Host) -> None:
        self.host = host
        self.resume = SessionResume(gateway, host)
        self.chat = ChatResume(gateway, host, self.resume)


@pytest.fixture
async def gateway(redis_server: str, keys: Keys) -> AsyncIterator[Gateway]:
    async with gateway_on(redis_server, keys) as g:
        yield g


def delta(text: str) -> Frame:
    return {"type": "response.output_text.delta", "session_id": SID, "delta": text}


async def created(gateway: Gateway, dialect: Dialect = Dialect.CURRENT) -> tuple[Connection, str]:
    """A new chat session whose client got ``session.created``; its resume token ('' none)."""
    conn = Connection(gateway, Host(SID, gateway=gateway, public_mode="chat", dialect=dialect))
    frame: Frame = {"type": "session.created", "session_id": SID, "mode": "turn_based"}
    await conn.chat.offer(frame, INIT)
    return conn, str(frame.get("resume_token", ""))


async def resumed(
    gateway: Gateway, token: str, last_seq: int
) -> tuple[Connection, asyncio.Task[None]]:
    """A second connection that took the session over and is catching up (a task: it follows
    a turn another connection still runs)."""
    conn = Connection(gateway, Host("rt_2_new", gateway=gateway, public_mode="chat"))
    taken = await conn.resume.take_over(ResumeRequest(SID, token, last_seq))
    assert taken is not None
    return conn, asyncio.create_task(conn.chat.catch_up(last_seq, *taken))


def admitted(slot_id: str = "w1#1|0") -> Admitted:
    return Admitted(ticket_id="ticket_t_1", slot_id=slot_id, waited=False)


async def test_a_current_client_gets_a_token_and_numbered_logged_frames(gateway: Gateway) -> None:
    conn, token = await created(gateway)
    assert token and conn.chat.enabled and conn.resume.offered
    for text in ("a", "b", "c"):
        await conn.chat.emit(delta(text))
    await conn.chat.logged()
    assert [f["seq"] for f in conn.host.sent] == [1, 2, 3]
    assert conn.chat.frames is not None
    assert await conn.chat.frames.after(0) == [(f["seq"], f) for f in conn.host.sent]


async def test_an_older_client_gets_neither_token_nor_numbers(gateway: Gateway) -> None:
    conn, token = await created(gateway, Dialect.OLDER)
    assert token == "" and not conn.chat.enabled and not conn.resume.resumable
    assert await gateway.resumes.owner(SID) is None
    await conn.chat.emit(frame := delta("a"))
    assert conn.host.sent == [frame] and "seq" not in frame


async def test_a_resumed_connection_replays_what_the_client_missed_and_numbers_on(
    gateway: Gateway,
) -> None:
    first, token = await created(gateway)
    for _ in range(2):
        first.chat.note_input()
    await first.chat.note_waiting_input()
    for text in ("a", "b", "c"):
        await first.chat.emit(delta(text))
    await first.chat.logged()
    first.host.gone.set()
    await first.chat.note_gone()
    assert first.resume.detached

    second, catching_up = await resumed(gateway, token, last_seq=1)
    await asyncio.wait_for(catching_up, 10)
    assert second.host.types() == ["session.resumed", *(["response.output_text.delta"] * 2)]
    assert second.host.sent[0]["last_seq"] == 1
    assert [f["seq"] for f in second.host.sent[1:]] == [2, 3]
    assert (second.chat.seq, second.chat.input_seq) == (3, 2)  # the counts go on
    await second.chat.emit(delta("d"))
    assert second.host.sent[-1]["seq"] == 4


async def test_frames_the_log_no_longer_holds_are_named_in_resync_required(
    redis_server: str, keys: Keys
) -> None:
    async with gateway_on(redis_server, keys, output_log_maxlen=2) as gateway:
        first, token = await created(gateway)
        for text in ("a", "b", "c", "d"):
            await first.chat.emit(delta(text))
        await first.chat.logged()
        second, catching_up = await resumed(gateway, token, last_seq=0)
        await asyncio.wait_for(catching_up, 10)
    assert second.host.sent[1] == {
        "type": "session.resync_required",
        "session_id": SID,
        "first_missing_seq": 1,
        "last_missing_seq": 2,
    }
    assert [f["seq"] for f in second.host.sent[2:]] == [3, 4]


async def test_a_resumed_connection_follows_the_turn_the_old_one_finishes(
    gateway: Gateway,
) -> None:
    """The client dropped mid-turn: its old connection finishes the turn into the log, and the
    new one relays it live until the old one's turn lease is gone."""
    first, token = await created(gateway)

    async def acquire() -> Admitted:
        return admitted()

    async with first.chat.hold_turn(acquire) as slot:
        assert slot == admitted()
        assert first.chat.frames is not None
        assert await first.chat.frames.turn_holder() == first.resume.conn_id
        await first.chat.emit(delta("a"))
        await first.chat.logged()  # (in the log before the client comes back)
        first.host.gone.set()  # the client drops
        await first.chat.note_gone()
        second, catching_up = await resumed(gateway, token, last_seq=0)
        await first.chat.emit(delta("b"))
        await first.chat.emit(delta("c"))
        await asyncio.sleep(0.2)
        assert not catching_up.done()  # it follows while the old connection holds the lease
    await first.chat.turn_ended()
    await asyncio.wait_for(catching_up, 10)
    assert await first.chat.frames.turn_holder() is None
    assert [f.get("delta") for f in second.host.sent[1:]] == ["a", "b", "c"]
    assert second.chat.seq == 3


async def test_a_turn_while_another_connection_holds_the_lease_gives_its_slot_back_and_follows(
    gateway: Gateway, async_redis: aioredis.Redis, keys: Keys
) -> None:
    """The session was just resumed here while its old connection still took the lease for a
    turn: the new connection's turn gives back the slot it got alongside, follows that turn,
    then runs with a new slot, numbering on from the log."""
    first, token = await created(gateway)
    first.host.gone.set()
    await first.chat.note_gone()
    second, catching_up = await resumed(gateway, token, last_seq=0)
    await asyncio.wait_for(catching_up, 10)
    slot_id = "w1#1|0"
    await async_redis.set(keys.worker_alive("w1#1"), "1")
    asks: list[Admitted] = []

    async def acquire() -> Admitted:  # (a slot that was free: it comes at once)
        asks.append(admitted(slot_id))
        return asks[-1]

    async with first.chat.hold_turn(acquire):
        await async_redis.sadd(keys.busy_slots, slot_id)  # the slot the next acquire hands out
        turn = asyncio.create_task(run_turn(second.chat, acquire))
        for _ in range(500):
            if await async_redis.lrange(keys.free_slots, 0, -1):
                break
            await asyncio.sleep(0.01)
        assert await async_redis.lrange(keys.free_slots, 0, -1) == [slot_id.encode()]
        await first.chat.emit(delta("a"))
        assert not turn.done()  # it waits for the old connection's turn
    assert await asyncio.wait_for(turn, 10) == 1  # it followed frame 1, then numbered on
    assert len(asks) == 3  # the old connection's, the one given back, the one it ran with
    assert [(f.get("delta"), f["seq"]) for f in second.host.sent[1:]] == [("a", 1), ("mine", 2)]


async def run_turn(chat: ChatResume, acquire: Callable[[], Awaitable[Admitted | None]]) -> int:
    """A turn of ``chat``: the seq it numbers on from once it holds the lease."""
    async with chat.hold_turn(acquire) as slot:
        assert slot is not None
        seen = chat.seq
        await chat.emit(delta("mine"))
    await chat.turn_ended()
    return seen


async def test_without_resume_a_turn_takes_no_lease(gateway: Gateway) -> None:
    conn, _ = await created(gateway, Dialect.OLDER)

    async def acquire() -> Admitted:
        return admitted()

    async with conn.chat.hold_turn(acquire) as slot:
        assert slot == admitted()
    await conn.chat.turn_ended()


async def test_a_turn_whose_acquire_ends_the_session_yields_none(gateway: Gateway) -> None:
    conn, _ = await created(gateway)

    async def acquire() -> None:
        return None  # the session ended while it waited (the client was told)

    async with conn.chat.hold_turn(acquire) as slot:
        assert slot is None


async def test_an_ended_record_refuses_a_later_resume(gateway: Gateway) -> None:
    conn, token = await created(gateway)
    await conn.chat.end_record()
    late = Connection(gateway, Host("rt_2_new", gateway=gateway, public_mode="chat"))
    assert await late.resume.take_over(ResumeRequest(SID, token, 0)) is None
    assert late.host.sent[0]["error"]["code"] == "resume_expired"


async def test_a_client_that_asked_to_close_is_not_detached(gateway: Gateway) -> None:
    conn, _ = await created(gateway)
    conn.host.close_asked = True
    conn.host.gone.set()
    await conn.chat.note_gone()
    assert not conn.resume.detached and await gateway.resumes.owner(SID) == conn.resume.conn_id
