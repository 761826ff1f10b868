"""What makes a duplex session resumable and restartable, on the gateway (docs/PROTOCOL.md,
"Resume and failover"); ``DuplexSession`` (``api/realtime/duplex.py``) builds on it.

- ``session.created`` carries a resume token and the session's record goes to Redis
  (``streaming/resume.py``); every later event carries its ``seq`` (the worker's sequence number
  minus that of ``Created``: assigned once, where the events are ordered, never renumbered);
- a client that vanishes detaches the session (``_left``) instead of ending it;
- ``resume``: a new connection takes the session over with its token, gets what it missed from
  the replay log (or ``session.resync_required``), then the live stream; the connection it
  replaced learns so from the record (``_was_replaced``) and closes with ``replaced``;
- ``_restart``: a failover (``api/realtime/recovery.py``) when the worker is gone.
"""

from __future__ import annotations

import logging

from starlette import status
from starlette.websockets import WebSocket

from api.gateway.state import Gateway
from api.protocol.dialects import Dialect, DuplexMapper
from api.protocol.errors import Frame
from api.realtime.recovery import Failover, ResumeRequest
from api.realtime.resume import Resumable, resync_frame
from api.realtime.session import SessionState
from api.relay.task import TaskRelay
from streaming.controls import InitControl, encode_control
from streaming.events import CloseReason, Created, ErrorCode, Event, Gap
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")


class ResumableSession(Resumable):
    """The resume and failover half of a duplex session (see the module docstring)."""

    def __init__(self, gw: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gw, ws, public_mode)
        self.mapper: DuplexMapper | None = None
        self.init_control: InitControl | None = None  # kept in the record for a failover
        self.created_seq: int | None = None  # client seq = event seq - this
        self.closed_seq: int | None = None
        self.failover = Failover(gw, self.session_id, public_mode, self.deadline)

    async def handle(self, ev: Event) -> bool:
        """Send one worker event to the client; True when the session is over."""
        raise NotImplementedError

    async def relay(self, relay: TaskRelay) -> None:
        """Forward worker events until the session closes."""
        raise NotImplementedError

    async def _left(self) -> None:
        """The relay ended: a vanished client's session waits for a resume, or is stopped."""
        if not self.vanished() or self.closed_sent or self.replaced:
            return
        if await self.detach():
            return
        await self._tell_worker(CloseReason.CLIENT_CLOSED)  # the client vanished

    # ------------------------------------------------------------------ resume
    async def resume(self, req: ResumeRequest) -> None:
        """Take over a session with its token; replay what the client missed, then relay."""
        gw = self.gw
        taken = await self.take_over(req)
        if taken is None:
            return
        token, record = taken
        sid = self.session_id
        self.created_seq = int(record["created_seq"])
        self.failover = Failover(gw, sid, self.public_mode, self.deadline)
        self.dialect = Dialect.CURRENT
        self.mapper = DuplexMapper(Dialect.CURRENT, sid, self.recording.id)
        out = await gw.bus.open(sid, after=self.created_seq + req.last_seq)
        try:
            await self.send(self.resumed_frame(token, req.last_seq))
            for ev in await out.catch_up():
                if isinstance(ev, Gap) and ev.first == self.created_seq + req.last_seq + 1:
                    await self.send(self._resync(ev))
                elif await self.handle(ev):
                    return
            if await gw.session_alive(sid):
                relay = TaskRelay(gw, out, sid, "", "session")
                relay.started = True
            else:  # its slot was given back while the client was away (or its worker died)
                await self.handle(await self.failover.announce(out, "resumed"))
                got = await self._restart(out)
                if got is None:
                    return
                relay = got
            await self.relay(relay)
        finally:
            await gw.bus.close(sid, out)
            await self._left()

    def _resync(self, gap: Gap) -> Frame:
        assert self.created_seq is not None
        return resync_frame(
            self.session_id, gap.first - self.created_seq, gap.last - self.created_seq
        )

    async def _restart(self, out: SessionOutput) -> TaskRelay | None:
        """Run the failover; None when it failed (the client was told ``backend_error``) or
        the client asked to close while it waited for a slot (the session ends as asked; a
        client that left is not waited for: the session stays resumable meanwhile)."""
        self.state = SessionState.RECOVERING
        await self._reclaim()  # (a detached record read with the lapsed lease: before the attempt)
        relay = await self.failover.start(out, until=(self.close_wanted,))
        if relay is None and self.close_wanted.is_set():
            await self.finish(*self.end_reason())
        elif relay is None:
            await self.send_error(
                ErrorCode.BACKEND_ERROR, "the worker running this session was lost"
            )
            await self.finish(CloseReason.BACKEND_ERROR, status.WS_1011_INTERNAL_ERROR)
        return relay

    def _can_recover(self) -> bool:
        return (
            self.resumable
            and self.gw.settings.failover_wait_s > 0
            and self.state in (SessionState.ACTIVE, SessionState.RECOVERING)
            and not self.stopping()
        )

    def _client_seq(self, ev: Event) -> int | None:
        """The client's ``seq`` of an event after ``session.created`` (current dialect)."""
        if self.created_seq is None or isinstance(ev, Gap) or self.dialect is not Dialect.CURRENT:
            return None
        return ev.seq - self.created_seq if ev.seq > self.created_seq else None

    async def _created(self, ev: Created) -> None:
        """``session.created``, with a resume token; the session's record goes to Redis."""
        assert self.mapper is not None
        s = self.gw.settings
        self.created_seq = ev.seq
        frames = self.mapper.frames(ev)
        if (s.resume_grace_s > 0 or s.failover_wait_s > 0) and self.init_control is not None:
            token = await self.offer_resume(
                ev.seq, encode_control(self.init_control), self.dialect is Dialect.CURRENT
            )
            if token is not None:
                for frame in frames:
                    frame["resume_token"] = token
        for frame in frames:
            await self.send(frame)

    def closed_frame(self, reason: str) -> Frame:
        return with_seq(super().closed_frame(reason), self.closed_seq)

    async def finish(self, reason: str, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        """``session.closed``; the record is ended too. A worker still running the session (its
        close lost with the input streams a failover cleared, or not confirmed within
        ``CLOSE_GRACE_S``, or an attempt that started after its gateway gave up on it) reads
        that within ``DETACHED_CHECK_S`` and gives its slot back; a later resume gets
        ``resume_expired``. A record Redis would not end now is ended when it will
        (``api/gateway/worker_stops.py``)."""
        if not self.closed_sent and self.resumable and not self.replaced:
            await self.gw.stops.end_record(self.session_id, self.deadline)
        await super().finish(reason, code)

    async def _tell_worker(self, reason: str | None) -> None:
        """Ask the worker to end the session (until Redis takes it:
        ``api/gateway/worker_stops.py``)."""
        await self.gw.stops.close(self.session_id, reason, self.deadline)


def with_seq(frame: Frame, seq: int | None) -> Frame:
    """A frame with its session ``seq`` (docs/PROTOCOL.md, "Resume and failover")."""
    if seq is not None:
        frame["seq"] = seq
    return frame
