"""What makes a chat session resumable (docs/PROTOCOL.md, "Resume and failover"): ``ChatResume``,
a collaborator of ``RealtimeChat`` (``api/realtime/chat.py``), which it reaches only through
``ChatResumeHost``.

A chat session holds no worker slot between turns and each turn streams on its own channel, so
its session-wide ``seq`` is numbered here, on the gateway: every frame after ``session.created``
(``emit``) goes to the session's frame log (``streaming/chat_log.py``) alongside the client.
The resume record (``SessionResume``, ``api/realtime/resume.py``) keeps the init payload and the
number of accepted inputs; the conversation itself travels in each turn's ``messages``.

- a client that drops mid-turn: the connection detaches the session and finishes the turn in
  flight into the log (a turn still waiting for a slot is withdrawn, as are turns not started);
- ``catch_up``: a new connection that took the session over replays the log after the client's
  ``last_seq`` (or ``session.resync_required``), follows the turn another connection is still
  finishing (``follow``) until its turn lease is gone, then runs the next turns itself;
- only the holder of the turn lease runs a turn and writes the log (``hold_turn``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Protocol

from api.gateway.state import Gateway
from api.protocol.dialects import Dialect
from api.protocol.errors import Frame
from api.protocol.frames import resync_frame
from api.realtime.resume import SessionResume
from api.realtime.slot_wait import Admitted
from streaming.chat_log import ChatLog

log = logging.getLogger("omniserve.gateway")

TURN_LEASE_S = 5.0  # the turn lease's TTL: a dead gateway's turn stops being followed this soon
RENEW_S = 1.0  # how often the connection running a turn renews it (and checks its client)
FOLLOW_POLL_S = 0.5  # how long one read of another connection's turn waits


class ChatResumeHost(Protocol):
    """What a ``ChatResume`` needs of its chat session (``RealtimeChat`` is one)."""

    @property
    def session_id(self) -> str: ...
    @property
    def dialect(self) -> Dialect | None: ...
    @property
    def deadline(self) -> float: ...
    @property
    def gone(self) -> asyncio.Event: ...  # the client left (or was closed)
    @property
    def closed_sent(self) -> bool: ...

    def time_left(self) -> float: ...
    def vanished(self) -> bool: ...  # the client left without asking to close
    async def send(self, frame: Frame) -> None: ...


class ChatResume:
    """The frame log, the input count and the turn lease of one chat session (see the module
    docstring); ``resume`` is the session's own record."""

    def __init__(self, gateway: Gateway, host: ChatResumeHost, resume: SessionResume) -> None:
        self.gateway = gateway
        self.host = host
        self.resume = resume
        self.frames: ChatLog | None = None  # None: resume is off for this session
        self.seq = 0  # the last client seq emitted
        self.input_seq = 0  # accepted input.append events: input_1, input_2, ...
        self._logging: asyncio.Task[None] | None = None  # the last frame's log write
        self._unlogged = 0  # frames Redis did not take since the last one it took
        self._turn_ends: set[asyncio.Task[None]] = set()  # lease hand-backs under way
        self._turns_held = 0  # the turn leases this connection took (each has its number)

    @property
    def enabled(self) -> bool:
        """Whether the session is resumable: its frames are numbered and logged."""
        return self.frames is not None

    def _open_log(self) -> ChatLog:
        s = self.gateway.settings
        ttl = self.host.time_left() + s.resume_grace_s + 60
        return ChatLog(
            self.gateway.redis, self.gateway.keys, self.host.session_id, s.output_log_maxlen, ttl
        )

    async def offer(self, created: Frame, init: bytes) -> None:
        """Give ``session.created`` a resume token (current dialect, resume on)."""
        if self.gateway.settings.resume_grace_s <= 0 or self.host.dialect is not Dialect.CURRENT:
            return
        token = await self.resume.offer(0, init, True)
        if token is not None:
            created["resume_token"] = token
            self.frames = self._open_log()

    async def emit(self, frame: Frame) -> None:
        """Send a frame of the session's sequence: numbered and logged when resumable.

        The log write goes out alongside the send, and nothing waits for it until the next
        frame is numbered (``logged``), so the log stays in order while neither the client nor
        the end of a turn waits for a Redis round trip per frame. A gateway that dies between
        the two leaves the log a frame short of what the client saw, which a resume handles
        already (it numbers on from the larger of the client's ``last_seq`` and the log's).
        """
        if self.frames is None:
            await self.host.send(frame)
            return
        await self.logged()
        self.seq += 1
        frame["seq"] = self.seq
        self._logging = asyncio.ensure_future(self._log(self.frames, self.seq, frame))
        await self.host.send(frame)

    async def logged(self) -> None:
        """Wait until the last frame emitted is in the log (or failed to get there)."""
        pending = self._logging
        if pending is not None:
            await pending
            if self._logging is pending:  # (not a newer frame's, emitted meanwhile)
                self._logging = None

    async def _log(self, frames: ChatLog, seq: int, frame: Frame) -> None:
        """Log one frame; a run of frames Redis refused (full, away) is logged once at each
        end, not frame by frame."""
        try:
            await frames.append(seq, frame)
        except Exception:
            self._unlogged += 1
            if self._unlogged == 1:
                log.warning("frame %d of %s not logged", seq, self.host.session_id, exc_info=True)
            return
        if self._unlogged:
            log.warning(
                "%d frame(s) of %s before %d not logged", self._unlogged, self.host.session_id, seq
            )
            self._unlogged = 0

    def note_input(self) -> None:
        """Count one accepted ``input.append``: the resume record gets the count when the turn
        that answers it starts (with its turn lease, one round trip), or at once when the turn
        must wait behind another (``note_waiting_input``); a resume continues the count."""
        self.input_seq += 1

    async def note_waiting_input(self) -> None:
        """Keep the count of an input that waits behind a running turn in the record now."""
        if self.frames is None:
            return
        try:
            await self.gateway.resumes.note(self.host.session_id, "inputs", self.input_seq)
        except Exception:
            log.warning("input count of %s not kept", self.host.session_id, exc_info=True)

    async def note_gone(self) -> None:
        """The client vanished: start the grace period once (a resumable session)."""
        resume = self.resume
        if self.host.vanished() and not resume.detached and not self.host.closed_sent:
            # (also when another connection resumed it meanwhile: no second try)
            resume.detached = await resume.detach()

    # ------------------------------------------------------------------ resume
    async def catch_up(self, last_seq: int, token: str, record: dict[str, str]) -> None:
        """Bring a client that took the session over (``SessionResume.take_over``: ``token``,
        ``record``) up to date from its ``last_seq``: replay the log, then follow."""
        self.input_seq = int(record.get("inputs") or 0)
        frames = self.frames = self._open_log()
        await self.host.send(self.resume.resumed_frame(token, last_seq))
        newest = await frames.last_seq()  # first: a frame logged between the reads is held
        held = await frames.after(last_seq)
        first = held[0][0] if held else newest + 1
        if first > last_seq + 1:
            await self.host.send(resync_frame(self.host.session_id, last_seq + 1, first - 1))
        await self.follow(await self._relay(held, last_seq))

    async def follow(self, seq: int) -> None:
        """Relay the frames another connection writes (the turn it is finishing) until its turn
        lease is gone; then this connection numbers the next frames."""
        frames = self.frames
        assert frames is not None
        while not self.host.gone.is_set():
            holder = await frames.turn_holder()
            if holder is None or holder == self.resume.conn_id:
                break
            if await self.resume.was_replaced():
                return
            seq = await self._relay(await frames.wait_after(seq, FOLLOW_POLL_S), seq)
        seq = await self._relay(await frames.after(seq), seq)
        self.seq = max(seq, await frames.last_seq())

    async def _relay(self, entries: list[tuple[int, Frame]], seq: int) -> int:
        """Send logged frames; the last seq sent (``seq`` when none)."""
        for number, frame in entries:
            await self.host.send(frame)
            seq = number
        return seq

    # ------------------------------------------------------------------ the turn lease
    @asynccontextmanager
    async def hold_turn(
        self, acquire: Callable[[], Awaitable[Admitted | None]]
    ) -> AsyncIterator[Admitted | None]:
        """Run a turn holding the turn lease (first following one another connection runs) and
        a worker slot (``acquire``; None: the session ended); meanwhile renew the lease,
        detach when the client vanishes and notice being replaced.

        The lease and the slot are asked for at once, so starting a turn waits for one Redis
        round trip, not two. Another connection holds the lease only when this session was just
        resumed elsewhere; then the slot goes back before following it. The lease goes back
        after the turn without holding up the session (``_end_turn``); a next turn does not wait
        for that, it takes the lease over.
        """
        frames = self.frames
        if frames is None:
            yield await acquire()
            return
        self._turns_held += 1
        turn = self._turns_held
        conn_id = self.resume.conn_id
        while True:
            slot = asyncio.ensure_future(acquire())
            key = self.gateway.keys.session_resume(self.host.session_id)
            record = (key, "inputs", self.input_seq)
            try:
                taken = await frames.take_turn(conn_id, turn, TURN_LEASE_S, record)
            except BaseException:
                await self._give_back(slot)
                raise
            if taken:
                self.resume.note("inputs", str(self.input_seq))
                break
            if not await self._give_back(slot):
                yield None  # the acquire ended the session meanwhile (and told the client)
                return
            await self.follow(self.seq)
            if self.host.gone.is_set():
                slot = asyncio.ensure_future(acquire())
                break
        keeper = asyncio.create_task(self._keep_turn(frames, turn))
        try:
            yield await slot
        finally:
            keeper.cancel()
            # given back behind the session's back: a next turn sent at once does not wait for it
            ending = asyncio.create_task(self._end_turn(frames, keeper, turn))
            self._turn_ends.add(ending)
            ending.add_done_callback(self._turn_ends.discard)

    async def _end_turn(self, frames: ChatLog, keeper: asyncio.Task[None], turn: int) -> None:
        """Give the turn lease back once the turn's last frame is logged (whoever takes the
        lease next numbers on from the log); a next turn of this connection may have taken it
        over already (``ChatLog.take_turn``), and keeps it."""
        with suppress(asyncio.CancelledError):
            await keeper
        await self.logged()
        try:
            await frames.release_turn(self.resume.conn_id, turn)
        except Exception:
            log.warning("turn lease of %s not released", self.host.session_id, exc_info=True)

    async def turn_ended(self) -> None:
        """Wait until the turns that ended gave their leases back."""
        if self._turn_ends:
            await asyncio.gather(*self._turn_ends)

    async def _give_back(self, slot: asyncio.Future[Admitted | None]) -> bool:
        """Withdraw an acquire made alongside a lease that was not ours: the slot goes back if
        it came. False when the acquire had ended the session instead."""
        slot.cancel()
        try:
            got = await slot
        except asyncio.CancelledError:
            return True
        except Exception:
            log.warning("acquire of %s failed", self.host.session_id, exc_info=True)
            return True
        if got is None:
            return False
        await self.gateway.admission.release(got.slot_id)
        return True

    async def _keep_turn(self, frames: ChatLog, turn: int) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await frames.renew_turn(self.resume.conn_id, turn, TURN_LEASE_S)
                await self.note_gone()
                if not self.resume.replaced and not self.host.gone.is_set():
                    await self.resume.was_replaced()
            except Exception:
                log.warning("turn lease of %s not renewed", self.host.session_id, exc_info=True)

    # ------------------------------------------------------------------ ending
    async def end_record(self) -> None:
        """The session is over: its record says so (until Redis takes it, as a duplex
        session's: ``api/gateway/worker_stops.py``; else a resume of the closed session would be
        let in)."""
        if not self.resume.resumable:
            return
        await self.gateway.stops.end_record(self.host.session_id, self.host.deadline)
