"""``/v1/realtime`` video and audio: one long task pinned to one worker slot.

States (docs/PROTOCOL.md): QUEUED until a slot is assigned, CONNECTED until a valid init,
INITIALIZING until the worker's ``Created``, ACTIVE until ``Closed``; then CLOSED. RECOVERING
while a failover looks for a new worker (``api/realtime/recovery.py``).

Resume and failover (docs/PROTOCOL.md, "Resume and failover") are collaborators the session
owns: ``self.resume`` (``SessionResume``, ``api/realtime/resume.py``: the record, take-over,
detach, replaced) and ``self.failover`` (``Failover``, ``api/realtime/recovery.py``).

- ``session.created`` carries a resume token and the session's record goes to Redis
  (``streaming/resume.py``); every later event carries its ``seq`` (the worker's sequence number
  minus that of ``Created``: assigned once, where the events are ordered, never renumbered);
- a client that vanishes detaches the session (``_left``) instead of ending it;
- a connection whose first event is ``session.resume`` drops the new session it was starting and
  takes over an existing one instead (``run_resumed``): it gets what it missed from the replay
  log (or ``session.resync_required``), then the live stream; the connection it replaced learns
  so from the record and closes with ``replaced``;
- ``_restart``: a failover when the worker is gone.

An init sent while QUEUED is validated at once and kept (the latest one wins); it goes to the
worker the moment the slot is assigned. Browser clients (the official demo's pages) send their
``session.update`` shortly after connecting whether or not they had to wait, and the official
gateway does not read client frames while a client waits, so there a queued user simply waits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from starlette import status
from starlette.websockets import WebSocket

from api.gateway import client_watch
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.dialects import Dialect, DuplexMapper
from api.protocol.errors import Frame, ProtocolError
from api.protocol.events import INIT_EVENTS, ClientEvent
from api.protocol.frames import (
    queue_done,
    resync_frame,
    session_recovered,
    session_recovering,
)
from api.protocol.validation import DuplexInit, duplex_append, duplex_init
from api.realtime.recovery import Failover, ResumeRequest, parse_resume
from api.realtime.resume import SessionResume
from api.realtime.session import RealtimeSession, SessionState
from api.relay.retry import start_elsewhere
from api.relay.task import TaskNotStarted, TaskRelay, WorkerLost
from streaming.controls import DetachedControl, InitControl, encode_control
from streaming.events import (
    Closed,
    CloseReason,
    Created,
    Error,
    ErrorCode,
    Event,
    Gap,
    Listen,
    Recovering,
    Speak,
)
from streaming.input import AudioChunk
from streaming.input_link import InputBacklogFull
from streaming.jobs import DuplexJob, claim_id
from streaming.keys import slot_worker
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

DETACHED_TELL_S = 2.0  # telling the worker a session detached waits no longer for Redis

CLOSE_GRACE_S = 5.0  # a worker that does not confirm a close within this is not waited for
CLOSING_LOOK_S = 0.25  # while it is awaited, the relay loop looks this often
LEASE_LOOK_S = 0.1  # a resume after Redis restarted empty looks for the lease this often


class RealtimeDuplex(RealtimeSession):
    """Video / audio full-duplex: one long task pinned to one worker slot."""

    offers_resume = True  # a client of this protocol may resume (else only failover's record)

    def __init__(self, gateway: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gateway, ws, public_mode)
        self.resume = SessionResume(gateway, self)
        self.mapper: DuplexMapper | None = None
        self.init_control: InitControl | None = None  # kept in the record for a failover
        self.created_seq: int | None = None  # client seq = event seq - this
        self.closed_seq: int | None = None
        self.failover = Failover(gateway, self.session_id, public_mode, self.deadline)
        self.input_seq = 0
        self.default_slices = 1
        self.init_since: float | None = None
        self.pending_init: DuplexInit | None = None  # sent while queued; applied at admission
        self.input_failure: asyncio.Task[None] | None = None  # telling of a chunk not queued
        self.unqueued = 0  # input chunks Redis did not take since the last one it took

    def session_goes_on(self) -> bool:
        """Detached for a resume, or taken over by another connection (``SessionResume``)."""
        return self.resume.goes_on()

    async def resume_coming(self) -> bool:
        """Whether this connection resumes another session: its first event decides."""
        return await self.resume.resume_coming()

    # ------------------------------------------------------------------ client side
    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        self.resume.first_event.set()  # (after this call: the held queue events go out, or not)
        kind = self.accept_event(event)
        S = SessionState
        if kind is None:
            return
        if kind == ClientEvent.SESSION_CLOSE:
            if self.state in (S.CONNECTED, S.INITIALIZING, S.ACTIVE):
                await self._tell_worker(self.close_reason)
            return
        if kind == ClientEvent.SESSION_RESUME:
            started = self.init_since is not None or self.pending_init is not None
            if self.resume.request or self.state not in (S.QUEUED, S.CONNECTED) or started:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session.resume must be the first event", "type"
                )
            self.resume.request = parse_resume(event)
            self.superseded.set()
            return
        if kind in INIT_EVENTS:
            if self.state is S.QUEUED:
                self.pending_init = duplex_init(event)  # the latest valid one wins
                return
            if self.state is not S.CONNECTED:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session already initialised", "type"
                )
            init = duplex_init(event)
            self._begin_init()
            await self._send_init(init)
            return
        if self.state is S.QUEUED:
            raise ProtocolError(
                ErrorCode.NOT_READY, f"wait for session.queue_done before sending {kind}"
            )
        # input.append / input_audio_buffer.append
        if self.state not in (S.ACTIVE, S.RECOVERING):
            raise ProtocolError(ErrorCode.NOT_READY, "send input only after session.created")
        chunk = duplex_append(event, self.default_slices)
        frames = chunk.frames[: self.gateway.settings.max_video_frames]
        self.meter.input(len(chunk.audio) // 4, len(frames))
        self.input_seq += 1
        self.clock.input_sent(f"input_{self.input_seq}")
        written = self.gateway.inputs.append(
            self.session_id,
            AudioChunk(
                seq=self.input_seq,
                input_id=f"input_{self.input_seq}",
                audio=chunk.audio,
                frames=frames,
                force_listen=chunk.force_listen,
                max_slice_nums=chunk.max_slice_nums,
            ),
        )
        written.add_done_callback(functools.partial(self._input_written, f"input_{self.input_seq}"))

    def _input_written(self, input_id: str, written: asyncio.Future[None]) -> None:
        """Redis answered a chunk's write. The receive loop does not wait for that answer (the
        next frame is read meanwhile), so a chunk Redis did not take is reported here, as the
        loop reports an event whose handling failed: logged, and ``inference_error`` naming it,
        once for a run of such chunks (a Redis stall fails every chunk sent meanwhile; a full
        Redis refuses each one) that ends with the next chunk Redis takes."""
        exc = None if written.cancelled() else written.exception()
        if exc is not None and self._lost_to_outage(exc):
            # sent as Redis went away (a failover, a restart): it may or may not have been
            # taken, and sent again it could be taken twice; the worker counts a chunk that
            # never came as dropped (``dropped_chunks``), as the protocol's silent drop
            log.warning(
                "session %s: %s lost as Redis went away: %s", self.session_id, input_id, exc
            )
            return
        if exc is None:
            if self.unqueued:
                log.warning(
                    "session %s: %d input chunk(s) before %s were not queued",
                    self.session_id,
                    self.unqueued,
                    input_id,
                )
                self.unqueued = 0
            return
        self.unqueued += 1
        if self.unqueued > 1 or self.failing or self.gone.is_set():
            return
        log.error("session %s: %s was not queued: %s", self.session_id, input_id, exc)
        self.input_failure = asyncio.create_task(
            self.send_error(ErrorCode.INFERENCE_ERROR, f"{input_id} was not queued: {exc}")
        )

    def _lost_to_outage(self, exc: BaseException) -> bool:
        """Whether a chunk's write failed because the connection to Redis was lost, within the
        outage grace (the input link holds what it had not sent yet: ``streaming/input_link.py``).
        A write that timed out (Redis stalls, holding the connection) is told as before."""
        outage = self.gateway.inputs.link_of(self.session_id).outage
        return (
            isinstance(exc, RedisConnectionError)
            and not isinstance(exc, InputBacklogFull)
            and outage.grace_s > 0
            and outage.lasted() <= outage.grace_s
        )

    def _begin_init(self) -> None:
        """Enter INITIALIZING (synchronously: a second init arriving meanwhile is refused)."""
        self.state = SessionState.INITIALIZING
        self.init_since = time.monotonic()
        self.wake_relay()  # its deadline starts now

    async def _send_init(self, init: DuplexInit) -> None:
        self.default_slices = init.max_slice_nums or 1
        control = init.control()
        control.split_deltas = self.dialect is Dialect.CURRENT
        self.init_control = control  # kept in the resume record for a failover
        await self.gateway.inputs.control(self.session_id, control)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """A new session, unless the client's first event is ``session.resume``: then the new
        one stops where it is (its ticket or slot given back) and the old one is taken over."""
        await self.run_new()
        if self.resume.request is not None and not self.gone.is_set():
            await self.run_resumed(self.resume.request)

    async def run_new(self) -> None:
        """Queue, start the task, relay it."""
        task = WaitingTask(claim_id(self.session_id, 0), DuplexJob.task)  # the first attempt's
        admitted = await self.acquire_slot(task, self.resume.queue_frame)
        if admitted is None:
            return
        slot = self.slot_id = admitted.slot_id
        # subscribed before the worker can emit anything
        out = await self.gateway.bus.open(self.session_id, on_overflow=self.output_overflow)
        relay = TaskRelay(self.gateway, out, self.session_id, slot, "session")
        try:
            try:
                await relay.submit(
                    DuplexJob(
                        session_id=self.session_id,
                        slot_id=slot,
                        gateway_id=self.gateway.gateway_id,
                        public_mode=self.public_mode,
                        deadline_ts=self.deadline,
                    )
                )
            except TaskNotStarted as exc:
                log.warning("submitting %s failed: %s", self.session_id, exc.detail)
                await self.send_error(
                    ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
                )
                await self.close(status.WS_1013_TRY_AGAIN_LATER)
                return
            self.state = SessionState.CONNECTED
            await self.resume.release_queue_frames()
            if self.superseded.is_set():  # the client resumes another session instead
                return await relay.stop(CloseReason.CLIENT_CLOSED)
            pending, self.pending_init = self.pending_init, None
            if pending is not None:
                self._begin_init()
            await self.send(queue_done(self.session_id))
            telemetry.handed_off(self.gateway.metrics, admitted.assigned_at)
            if pending is not None:
                await self._send_init(pending)
            await self.relay(relay)
        finally:
            await self.gateway.bus.close(self.session_id, out)
            await self._left()

    async def relay(self, relay: TaskRelay) -> None:
        """Forward worker events until the session closes.

        The loop sleeps until the next event, or until something else wakes it (``wake_relay``:
        the client's close or departure, a resume elsewhere, a replaced connection, a lapsed
        worker lease), or until its next deadline (the session's clock, the task's start, the
        init's answer); at the latest every ``relay_look_s``, a backstop.
        """
        self.relay_waker = relay.out.wake
        relay.out.direct = self._deliver_now
        try:
            await self._relay_loop(relay)
        finally:
            relay.out.direct = None

    async def _relay_loop(self, relay: TaskRelay) -> None:
        closing_since: float | None = None
        while True:
            if self.vanished():
                return
            if self.superseded.is_set() and self.created_seq is None:
                return await relay.stop(CloseReason.CLIENT_CLOSED)  # resuming another one
            if self.resume.resumable and await self.resume.was_replaced_lately():
                return
            if closing_since is None and (self.close_wanted.is_set() or self.time_left() <= 0):
                closing_since = time.monotonic()
                reason, code = self.end_reason()
                if reason != self.close_reason:  # a client's close went with its event
                    await self._tell_worker(reason)
                if self.shutdown_reason or not relay.started:
                    if not relay.started:
                        await self.gateway.abandon(relay.claim_id, relay.slot_id)
                    return await self.finish(reason, code)
            if closing_since is not None and time.monotonic() - closing_since > CLOSE_GRACE_S:
                return await self.finish(self.end_reason()[0])
            timeout = CLOSING_LOOK_S if closing_since is not None else self._sleep_s(relay)
            try:
                events = await relay.next(timeout)
            except TaskNotStarted as exc:
                moved = await start_elsewhere(
                    self.gateway, relay, exc, self.stopping(), until=(self.gone, self.close_wanted)
                )
                if moved is not None:  # its worker died before starting it (api/relay/retry.py)
                    relay = moved
                    self.slot_id, self.worker_id = moved.slot_id, slot_worker(moved.slot_id)
                    continue
                if self.stopping():  # the client closed or left meanwhile: ended as it asked
                    continue
                await self.send_error(
                    ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
                )
                self.closed_sent = True
                return await self.close(status.WS_1013_TRY_AGAIN_LATER)
            except WorkerLost:
                if self._can_recover() and await self.gateway.resumes.restartable(self.session_id):
                    await self.handle(await self.failover.announce(relay.out, "worker_lost"))
                    got = await self._restart(relay.out)
                    if got is None:
                        return None
                    relay = got
                    continue
                await self.send_error(
                    ErrorCode.BACKEND_ERROR, "the worker running this session was lost"
                )
                return await self.finish(CloseReason.BACKEND_ERROR, status.WS_1011_INTERNAL_ERROR)
            for ev in events:
                if await self.handle(ev):
                    return
            if self._init_overdue():
                limit = self.gateway.settings.init_timeout_s
                await self._tell_worker(CloseReason.BACKEND_ERROR)
                await self.send_error(
                    ErrorCode.BACKEND_ERROR,
                    f"the backend did not prepare the session within {limit:.0f} s",
                )
                return await self.finish(CloseReason.BACKEND_ERROR, status.WS_1011_INTERNAL_ERROR)

    async def _deliver_now(self, ev: Event) -> bool:
        """The output bus's direct path (``SessionOutput.direct``): while the relay loop waits,
        the next delta of an active session goes to the client from the bus's task. Declined
        (the loop takes it) for any other event or state, and for a client that cannot take a
        frame without waiting."""
        if (
            not isinstance(ev, Speak | Listen)
            or self.state is not SessionState.ACTIVE
            or self.superseded.is_set()
            or self.resume.replacement_seen
            or not self.can_send_now()
        ):
            return False
        await self.handle(ev)  # (a delta never ends the session)
        return True

    def _sleep_s(self, relay: TaskRelay) -> float:
        """How long the relay loop may sleep when nothing wakes it: until its next deadline."""
        now = time.monotonic()
        sleep = min(self.gateway.settings.relay_look_s, self.time_left(), relay.wait_left(now))
        if self.state is SessionState.INITIALIZING and self.init_since is not None:
            sleep = min(sleep, self.init_since + self.gateway.settings.init_timeout_s - now)
        return max(0.01, sleep)

    def _init_overdue(self) -> bool:
        return (
            self.state is SessionState.INITIALIZING
            and self.init_since is not None
            and time.monotonic() - self.init_since > self.gateway.settings.init_timeout_s
        )

    async def handle(self, ev: Event) -> bool:
        """Send one worker event to the client; True when the session is over."""
        if self.mapper is None:
            self.mapper = DuplexMapper(
                self.dialect or Dialect.CURRENT, self.session_id, self.recording.id
            )
        seq = self._client_seq(ev)
        match ev:
            case Closed():
                self.closed_seq = seq
                reason = self.shutdown_reason or ev.reason or CloseReason.ERROR
                here = not (self.close_wanted.is_set() or self.gone.is_set())
                if reason == CloseReason.CLIENT_CLOSED and here:
                    # the worker took this gateway for gone (frozen past its lease), yet the
                    # client is here: for it, the server failed (no client sees client_closed)
                    log.warning("session %s: its worker took it for gone", self.session_id)
                    reason = CloseReason.ERROR
                await self.finish(reason)
                return True
            case Created(recovered=True):
                self.state = SessionState.ACTIVE
                frame = session_recovered(self.session_id, ev.prompt_length, ev.metrics)
                await self.send(with_seq(frame, seq))
                return False
            case Created():
                self.state = SessionState.ACTIVE
                await self._created(ev)
                return False
            case Recovering():
                self.state = SessionState.RECOVERING
                frame = session_recovering(self.session_id, ev.reason)
                await self.send(with_seq(frame, seq))
                return False
            case Error(code=ErrorCode.INVALID_PAYLOAD) if self.state is SessionState.INITIALIZING:
                self.state = SessionState.CONNECTED  # the init was refused; the client may retry
        usage = self.meter.event(ev)  # a response's record, at its end
        for frame in self.mapper.frames(ev):
            if usage is not None and isinstance(frame.get("metrics"), dict):
                frame["metrics"]["usage"] = usage.as_dict()  # an extension field
            await self.send(with_seq(frame, seq))
        telemetry.relayed(self.gateway.metrics, self.clock, ev)
        return False

    # ------------------------------------------------------------------ resume and failover
    async def _left(self) -> None:
        """The relay ended: a vanished client's session waits for a resume, or is stopped."""
        if not self.vanished() or self.closed_sent or self.resume.replaced:
            return
        if await self.resume.detach():
            if self.resume.detached:  # its worker pauses now, not at its next presence check
                try:
                    told = self.gateway.inputs.control(self.session_id, DetachedControl())
                    await asyncio.wait_for(told, DETACHED_TELL_S)
                except Exception:  # noqa: BLE001 - Redis away: the worker's own check finds it
                    log.warning("could not tell %s's worker it is detached", self.session_id)
            return
        await self._tell_worker(CloseReason.CLIENT_CLOSED)  # the client vanished

    async def run_resumed(self, req: ResumeRequest) -> None:
        """Take over a session with its token; replay what the client missed, then relay."""
        gateway = self.gateway
        taken = await self.resume.take_over(req)
        if taken is None:
            return
        token, record = taken
        sid = self.session_id
        self.created_seq = int(record["created_seq"])
        self.failover = Failover(gateway, sid, self.public_mode, self.deadline)
        self.dialect = Dialect.CURRENT
        self.mapper = DuplexMapper(Dialect.CURRENT, sid, self.recording.id)
        out = await gateway.bus.open(sid, after=self.created_seq + req.last_seq)
        try:
            await self.send(self.resume.resumed_frame(token, req.last_seq))
            for ev in await out.catch_up():
                if isinstance(ev, Gap) and ev.first == self.created_seq + req.last_seq + 1:
                    await self.send(self._resync(ev))
                elif await self.handle(ev):
                    return
            if await self._worker_renews(sid, record):
                relay = TaskRelay(gateway, out, sid, "", "session")
                relay.started = True
            else:  # its slot was given back while the client was away (or its worker died)
                await self.handle(await self.failover.announce(out, "resumed"))
                got = await self._restart(out)
                if got is None:
                    return
                relay = got
            await self.relay(relay)
        finally:
            await gateway.bus.close(sid, out)
            await self._left()

    async def _worker_renews(self, sid: str, record: dict[str, str]) -> bool:
        """Whether the session's worker still runs it. A record its connection wrote again
        (Redis restarted empty, ``SessionResume.rebuild``) comes with no lease until the worker's
        next heartbeat: that one is waited for, up to the lease TTL, before a restart."""
        gateway = self.gateway
        if await gateway.session_alive(sid):
            return True
        if not record.get("rebuilt"):
            return False
        until = time.monotonic() + gateway.settings.lease_ttl_s
        while time.monotonic() < until:
            await asyncio.sleep(LEASE_LOOK_S)
            if await gateway.session_alive(sid):
                return True
        return False

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
        # (a detached record read with the lapsed lease: attached again before the attempt)
        await self.resume.reclaim()
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
            self.resume.resumable
            and self.gateway.settings.failover_wait_s > 0
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
        s = self.gateway.settings
        self.created_seq = ev.seq
        frames = self.mapper.frames(ev)
        if (s.resume_grace_s > 0 or s.failover_wait_s > 0) and self.init_control is not None:
            offer = self.offers_resume and self.dialect is Dialect.CURRENT
            token = await self.resume.offer(ev.seq, encode_control(self.init_control), offer)
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
        that at its next presence check (``tasks/duplex.py``, ``GATEWAY_CHECK_S``) and gives its
        slot back; a later resume gets
        ``resume_expired``. A record Redis would not end now is ended when it will
        (``api/gateway/worker_stops.py``)."""
        if not self.closed_sent and self.resume.resumable and not self.resume.replaced:
            await self.gateway.stops.end_record(self.session_id, self.deadline)
        await super().finish(reason, code)

    async def _tell_worker(self, reason: str | None) -> None:
        """Ask the worker to end the session (until Redis takes it:
        ``api/gateway/worker_stops.py``)."""
        await self.gateway.stops.close(self.session_id, reason, self.deadline)

    def idle_seconds(self) -> float:
        """A client holding a slot owes input: init after queue_done, then audio every second
        (not while its init is being prepared, nor while the answer to its last input is still
        streaming to it)."""
        if self.state not in (SessionState.CONNECTED, SessionState.ACTIVE):
            return 0.0
        return client_watch.idle_seconds(self.last_heard, self.last_sent, self.state_since)

    async def on_evict(self, reason: CloseReason) -> None:
        await super().on_evict(reason)
        if self.state is not SessionState.QUEUED:
            await self._tell_worker(reason)  # its slot is free within a step

    async def on_failure(self) -> None:
        """This handler failed: the client is told (``error``, ``session.closed``), and so is a
        worker that may be running the session, which would otherwise go on until its deadline
        with its slot held."""
        await super().on_failure()
        if self.slot_id is not None or self.created_seq is not None:
            await self._tell_worker(CloseReason.ERROR)

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.state is not SessionState.QUEUED and not self.gone.is_set():
            await self._tell_worker(CloseReason.SERVER_SHUTDOWN)


def with_seq(frame: Frame, seq: int | None) -> Frame:
    """A frame with its session ``seq`` (docs/PROTOCOL.md, "Resume and failover")."""
    if seq is not None:
        frame["seq"] = seq
    return frame
