"""A ``/v1/realtime`` session's resume state and behaviour, duplex and chat alike
(docs/PROTOCOL.md, "Resume and failover"): the resume record it offers with
``session.created``, taking a session over with its token, detaching when the client vanishes,
noticing it was replaced, and writing the record again when Redis lost it (restarted empty)
while this connection relays the session or detaches it: the connection keeps what it wrote.

``SessionResume`` is a collaborator of the session it serves (``RealtimeDuplex``,
``RealtimeChat``), which it reaches only through ``ResumeHost``. The modes differ only in where
their numbered events come from: a duplex session's from its worker's replay log
(``api/realtime/duplex.py``), a chat session's from the frame log its gateway writes
(``api/realtime/chat_resume.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from starlette import status

from api.gateway.liveness import DETACHED, MISSING, Answer
from api.gateway.metering import SessionMeter
from api.gateway.state import Gateway
from api.protocol.errors import Frame
from api.protocol.frames import session_closed, session_resumed
from api.realtime.recovery import ResumeRequest
from api.realtime.session import SessionState
from streaming.events import ErrorCode
from streaming.resume import AttachResult, new_conn_id, new_token, token_hash

log = logging.getLogger("omniserve.gateway")

# a record's fields that say who holds it now, not what the session is (``rebuild``)
_NOT_COPIED = ("gateway", "conn", "detached_at", "rebuilt")
QUEUE_HOLD_S = 0.25  # a resuming client's session.resume arrives within this of its connect


class ResumeHost(Protocol):
    """What a ``SessionResume`` needs of its session (``RealtimeSession`` is one)."""

    @property
    def session_id(self) -> str: ...
    @property
    def public_mode(self) -> str: ...
    @property
    def deadline(self) -> float: ...
    @property
    def gone(self) -> asyncio.Event: ...  # the client left (or was closed)
    @property
    def superseded(self) -> asyncio.Event: ...  # the client resumes another session instead
    @property
    def meter(self) -> SessionMeter: ...  # its usage and its quota place

    state: SessionState
    closed_sent: bool  # session.closed (or the answer that ends the socket) went out

    def time_left(self) -> float: ...
    def wake_relay(self) -> None: ...
    def adopt(self, session_id: str, deadline: float) -> None: ...
    async def send(self, frame: Frame) -> None: ...
    async def send_error(self, code: ErrorCode, message: str, field: str | None = None) -> None: ...
    async def close(self, code: int = status.WS_1000_NORMAL_CLOSURE, reason: str = "") -> None: ...


class SessionResume:
    """One connection's part in its session's resume record (``streaming/resume.py``), which
    lets another connection take the session over."""

    def __init__(self, gateway: Gateway, host: ResumeHost) -> None:
        self.gateway = gateway
        self.host = host
        self.conn_id = new_conn_id()  # owner id in the session's resume record
        self.resumable = False  # the record exists: watch for being replaced
        self.offered = False  # the client has a token: a drop detaches, not closes
        self.replaced = False
        self.detached = False  # the client vanished and the session waits for a resume
        self.request: ResumeRequest | None = None  # the client's session.resume, if it sent one
        self.opened = time.monotonic()
        self.first_event = asyncio.Event()  # the client's first event arrived
        self._held: list[Frame] | None = []  # queue events of the new session, held briefly
        self._flusher: asyncio.Future[None] | None = None
        # (session, conn) that gateway.liveness watches
        self._replaced_watch: tuple[str, str] | None = None
        self._replaced_seen = False  # the watch read another owner
        self._detached_seen = False  # the watch read no owner while this connection relays
        self._missing_seen = False  # the watch read no record while this connection relays
        # the record as this connection wrote or took it (the token as its hash): written again
        # when Redis lost it
        self._copy: dict[str, str | bytes] = {}

    @property
    def replacement_seen(self) -> bool:
        """The liveness watch read another owner (``was_replaced_lately`` acts on it)."""
        return self._replaced_seen

    # ------------------------------------------------------------------ a new session's queue
    async def queue_frame(self, frame: Frame) -> None:
        """The new session's queue events wait until the client's first event, at most
        ``QUEUE_HOLD_S`` after connect: a client that resumes instead never sees them."""
        if self._held is None:
            if not self.host.superseded.is_set():
                await self.host.send(frame)
            return
        self._held.append(frame)
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._release_later())

    async def _release_later(self) -> None:
        wait = QUEUE_HOLD_S - (time.monotonic() - self.opened)
        try:
            await asyncio.wait_for(self.first_event.wait(), max(0.0, wait))
        except TimeoutError:
            pass
        await self.release_queue_frames()

    async def resume_coming(self) -> bool:
        """A connection over its key's quota may be one about to resume a session (which
        keeps its own place): its first event decides, as for the held queue events."""
        wait = QUEUE_HOLD_S - (time.monotonic() - self.opened)
        try:
            await asyncio.wait_for(self.first_event.wait(), max(0.0, wait))
        except TimeoutError:
            pass
        return self.host.superseded.is_set()

    async def release_queue_frames(self) -> None:
        """Send the held queue events (none once the client resumes another session)."""
        held, self._held = self._held, None
        if held and not self.host.superseded.is_set():
            for frame in held:
                await self.host.send(frame)

    # ------------------------------------------------------------------ the record
    async def offer(self, created_seq: int, init: bytes, offer: bool) -> str | None:
        """Write the session's record; the token for ``session.created`` when ``offer`` (and
        resume is on), else None. A Redis failure leaves the session simply not resumable."""
        gateway, s, host = self.gateway, self.gateway.settings, self.host
        token = new_token()
        try:
            await gateway.resumes.create(
                host.session_id,
                token=token,
                mode=host.public_mode,
                gateway=gateway.gateway_id,
                conn=self.conn_id,
                created_seq=created_seq,
                deadline=host.deadline,
                init=init,
                ttl_s=host.time_left() + s.resume_grace_s + 60,
            )
        except Exception:
            log.warning("no resume record for %s", host.session_id, exc_info=True)
            return None
        self._copy = {
            "token": token_hash(token),
            "mode": host.public_mode,
            "created_seq": str(created_seq),
            "deadline": str(host.deadline),
            "init": init,
        }
        self.resumable = True
        if offer and s.resume_grace_s > 0:
            self.offered = True
            return token
        return None

    async def take_over(self, req: ResumeRequest) -> tuple[str, dict[str, str]] | None:
        """Attach to ``req``'s session: its new token and record, the host now serving it
        (``adopt``); None when refused (the client got the documented error and the socket is
        closed)."""
        gateway, s, host = self.gateway, self.gateway.settings, self.host
        token = new_token()
        result = AttachResult.NOT_FOUND
        if s.resume_grace_s > 0:
            result = await gateway.resumes.attach(
                req.session_id,
                req.resume_token,
                token,
                host.public_mode,
                gateway.gateway_id,
                self.conn_id,
                s.resume_grace_s,
            )
        if result is not AttachResult.OK:
            expired = result is AttachResult.EXPIRED
            code = ErrorCode.RESUME_EXPIRED if expired else ErrorCode.SESSION_NOT_FOUND
            what = (
                "can no longer be resumed" if expired else "was not found (or the token is wrong)"
            )
            await host.send_error(code, f"session {req.session_id} {what}", "session_id")
            host.closed_sent = True
            await host.close(status.WS_1008_POLICY_VIOLATION)
            return None
        record = await gateway.resumes.fields(req.session_id)
        self._copy = {
            **{k: v for k, v in record.items() if k not in _NOT_COPIED},
            "token": token_hash(token),
            "init": await gateway.resumes.init(req.session_id),
        }
        host.adopt(req.session_id, float(record["deadline"]))
        self.resumable, self.offered = True, True
        await host.meter.admit(req.session_id, claim=True)  # its own quota place, held here
        return token, record

    def resumed_frame(self, token: str, last_seq: int) -> Frame:
        """``session.resumed``, the first answer to an accepted ``session.resume``."""
        return session_resumed(self.host.session_id, token, last_seq)

    # ------------------------------------------------------------------ the client gone
    def goes_on(self) -> bool:
        """This connection ended but the session did not: it waits for a resume (detached), or
        another connection took it over (replaced)."""
        return self.detached or self.replaced

    async def detach(self) -> bool:
        """The client vanished: start the grace period. False (the caller then stops the worker:
        a session nobody can resume must not keep its slot): not resumable, or its record is gone
        (Redis restarted empty), or Redis away."""
        session_id = self.host.session_id
        if not self.offered or self.replaced:
            return False
        try:
            detached = await self.gateway.resumes.detach(session_id, self.conn_id)
        except Exception:
            log.warning("could not detach %s", session_id, exc_info=True)
            return False
        if detached:
            log.info("session %s detached: resumable", session_id)
            self.detached = True
            return True
        try:
            owner = await self.gateway.resumes.owner(session_id)
        except Exception:  # noqa: BLE001 - Redis away: the caller stops the worker
            owner = None
        if owner is not None:  # already detached, or another connection resumed it meanwhile
            self.replaced = owner != ""
            self.detached = not self.replaced
            return True
        # no record any more (Redis restarted empty): written again, detached, it can be resumed
        if await self.rebuild(detached=True):
            self.detached = True
            return True
        log.warning("session %s: its resume record is gone; the session ends", session_id)
        return False

    # ------------------------------------------------------------------ the record lost
    def note(self, name: str, value: str) -> None:
        """A field the connection wrote to the record later (kept for ``rebuild``)."""
        if self._copy:
            self._copy[name] = value

    async def rebuild(self, detached: bool = False) -> bool:
        """Write the record again from this connection's copy, where Redis has none (it
        restarted empty): attached to this connection, or ``detached`` from now on. False when
        there is nothing to write, a record exists, or Redis is away."""
        host, s = self.host, self.gateway.settings
        if not self._copy or self.replaced or host.closed_sent:
            return False
        fields = {
            **self._copy,
            "gateway": "" if detached else self.gateway.gateway_id,
            "conn": "" if detached else self.conn_id,
            "detached_at": str(time.time()) if detached else "",
            "ended": "",
            "rebuilt": "1",  # a resume waits for the worker's lease on the new server
        }
        try:
            written = await self.gateway.resumes.rebuild(
                host.session_id, fields, host.time_left() + s.resume_grace_s + 60
            )
        except Exception:  # Redis away: the next read finds it missing again
            log.warning("could not write %s's resume record again", host.session_id, exc_info=True)
            return False
        if written:
            log.warning(
                "session %s: its resume record was gone (Redis restarted empty); written again%s",
                host.session_id,
                ", detached" if detached else "",
            )
        return written

    # ------------------------------------------------------------------ replaced
    async def was_replaced(self) -> bool:
        """Another connection resumed this session: tell the client and stop relaying."""
        try:
            owner = await self.gateway.resumes.owner(self.host.session_id)
        except Exception:  # noqa: BLE001 - Redis away: decided at the next check
            return False
        if owner is None or owner == self.conn_id or owner == "":
            return False
        return await self._close_replaced()

    async def was_replaced_lately(self) -> bool:
        """``was_replaced`` from the gateway's batched liveness read (``api/gateway/liveness.py``),
        for a relay loop that must not wait on Redis: the first call starts a watch (read every
        tick; a replacement wakes the loop), later ones see what it found (a failed read: the
        next tick decides)."""
        key = (self.host.session_id, self.conn_id)
        if self._replaced_watch != key:  # (a connection that resumed another session: its id)
            self._replaced_watch, self._replaced_seen = key, False
            self.gateway.liveness.watch_replaced(
                *key, lambda answer: self._replaced_read(key, answer)
            )
        await self.reclaim()
        if self._missing_seen:
            self._missing_seen = False
            await self.rebuild()
        return self._replaced_seen and await self._close_replaced()

    async def reclaim(self) -> None:
        """When the watch read that nobody relays the session, yet this connection does: its
        worker took this gateway for gone (frozen past its lease) and would give the slot back,
        and each failover's new attempt would read the record detached again. Attach it again."""
        if not self._detached_seen:
            return
        self._detached_seen = False
        session_id = self.host.session_id
        try:
            if await self.gateway.resumes.reclaim(
                session_id, self.conn_id, self.gateway.gateway_id
            ):
                log.warning(
                    "session %s: its worker took this gateway for gone; attached again",
                    session_id,
                )
        except Exception:  # Redis away: the next tick reads the record again
            log.warning("could not attach %s again", session_id, exc_info=True)

    def _replaced_read(self, key: tuple[str, str], answer: Answer) -> bool:
        """A tick's read of the owner: False (stop watching) once replaced or no longer
        relayed."""
        if self.host.gone.is_set() or key != self._replaced_watch:
            return False
        if answer is True:
            self._replaced_seen = True
            self.host.wake_relay()
            return False
        if answer == DETACHED:
            self._detached_seen = True
            self.host.wake_relay()
        if answer == MISSING and self._copy:
            self._missing_seen = True
            self.host.wake_relay()
        return True

    async def _close_replaced(self) -> bool:
        """Tell the client that another connection took the session over, and close."""
        host = self.host
        self.replaced = True
        host.closed_sent = True
        host.state = SessionState.CLOSED
        await host.send(session_closed(host.session_id, "replaced"))
        await host.close(status.WS_1000_NORMAL_CLOSURE)
        return True
