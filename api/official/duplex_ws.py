"""``WS /ws/duplex/{session_id}``: the official gateway's duplex WebSocket, on omniserve's workers.

What its clients rely on (the official ``gateway.py`` and its worker): ``queued {position,
estimated_wait_s, ticket_id, queue_length}`` and ``queue_update`` while waiting, then always
``queue_done``; ``prepare`` -> ``prepared {prompt_length}``; each ``audio_chunk`` -> one
``result``; ``pause`` -> ``paused {timeout}`` (the session ends with ``timeout`` if it is not
resumed in time), ``resume`` -> ``resumed``; ``stop`` -> ``stopped``, then the socket closes.
Errors are ``{"type": "error", "error": "<message>"}``; a client mistake leaves the session
open. ``session_id`` names the client's session in the logs; an ``adx_`` prefix makes it an audio
session, any other a video (omni) session, as the official gateway routes them.

Here the session is one ``omniserve.duplex_session`` task on a slot won in the global queue
(``wait_for_slot``), relayed through ``TaskRelay`` (start timeout, lost workers), under the mode's
duration limit, the idle-client and backpressure watches, recorded and counted like a
``/v1/realtime`` session. A prepare sent while queued (the official pages send it 100 ms after
connecting, queued or not) is kept and applied at admission. Sessions here are not resumable: a
lost worker ends the session with an error. The slot is given back on every exit.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from starlette import status
from starlette.websockets import WebSocket

from api.gateway import client_watch
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.official.duplex_frames import (
    ResultMapper,
    official_error,
    official_frame,
    official_paused,
    official_queue_frame,
    official_timeout,
)
from api.official.duplex_requests import audio_chunk, prepare_control
from api.protocol.diagnostics import ClientDiagnostics
from api.protocol.errors import Frame, ProtocolError
from api.protocol.events import ClientEvent, OfficialClientEvent, OfficialEvent
from api.realtime.connection import ClientSocket, Flag, NotJSON, new_session_id, parse_json
from api.realtime.slot_wait import NoSlot, wait_for_slot
from api.relay.task import TaskNotStarted, TaskRelay, WorkerLost
from api.security.key_check import identity_of
from omnicore.logs import session_context
from streaming.controls import InitControl
from streaming.events import Closed, CloseReason, Created, Error, ErrorCode, Listen, Speak
from streaming.input import AudioChunk
from streaming.jobs import DuplexJob, claim_id
from streaming.keys import slot_worker

log = logging.getLogger("omniserve.gateway")

PAUSE_TIMEOUT_S = 60.0  # the official worker's default pause timeout
CLOSE_GRACE_S = 5.0  # a worker that does not confirm a close within this is not waited for
CLOSING_LOOK_S = 0.25


class OfficialDuplex(ClientSocket):
    """One ``/ws/duplex`` connection: one duplex session pinned to one worker slot."""

    def __init__(self, gateway: Gateway, ws: WebSocket, client_session_id: str) -> None:
        super().__init__(gateway, ws)
        self.client_session_id = client_session_id
        self.public_mode = "audio" if client_session_id.startswith("adx_") else "video"
        self.session_id = self.log_id = new_session_id()
        self.connected_at = time.time()
        self.deadline = self.connected_at + gateway.settings.duration_limit(self.public_mode)
        self.state = "QUEUED"  # then CONNECTED, PREPARING, ACTIVE, CLOSED
        self.state_since = time.monotonic()
        self.dialect = "official"
        self.slot_id: str | None = None
        self.slot_since: float | None = None
        self.admitted_at: float | None = None
        self.worker_id: str | None = None
        self.ended_reason: str | None = None
        self.stop_wanted = Flag(self.wake_relay)
        self.stop_reason: str = CloseReason.USER_STOP
        self.timeout_message = ""
        self.pending: InitControl | None = None  # a prepare sent while queued
        self.prepare_since: float | None = None
        self.default_slices = 1
        self.paused_until: float | None = None  # monotonic
        self.input_seq = 0
        self.received: dict[str, float] = {}  # input id -> when its chunk arrived (monotonic)
        self.diagnostics = ClientDiagnostics(self.session_id, gateway.metrics.client_playback_gaps)
        self.clock = telemetry.ResponseClock(self.public_mode)
        self.recording = gateway.recorder.open(
            self.session_id, self.public_mode, endpoint="/ws/duplex"
        )
        self.mapper = ResultMapper(self.recording.id)
        self.identity = identity_of(ws)
        self.meter = gateway.metering.open(self.identity, self.connected_at)
        self._error_sends: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------ what others read
    def session_goes_on(self) -> bool:
        return False

    def recording_info(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "client_session_id": self.client_session_id,
            "dialect": self.dialect,
            "close_reason": self.ended_reason,
            "key": self.identity.name,
            "usage": self.meter.session_usage(ended=True).as_dict(),
        }

    def set_state(self, state: str) -> None:
        self.state = state
        self.state_since = time.monotonic()

    def time_left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def idle_seconds(self) -> float:
        """A client holding a slot owes a prepare, then audio (not while paused: the pause has
        its own timeout; nor while its prepare is being answered)."""
        if self.state not in ("CONNECTED", "ACTIVE") or self.paused_until is not None:
            return 0.0
        return client_watch.idle_seconds(self.last_heard, self.last_sent, self.state_since)

    # ------------------------------------------------------------------ lifecycle
    async def serve(self) -> None:
        self.gateway.sessions[self.session_id] = self
        with session_context(self.session_id):
            log.info("/ws/duplex session %s (%s)", self.client_session_id, self.public_mode)
            try:
                await super().serve()
            finally:
                self.gateway.sessions.pop(self.session_id, None)
                telemetry.session_ended(self.gateway.metrics, self)
                await self.meter.close(False)

    async def shutdown(self) -> None:
        self.stop_reason = CloseReason.SERVER_SHUTDOWN
        self.stop_wanted.set()

    async def on_evict(self, reason: CloseReason) -> None:
        self.stop_reason = reason
        self.stop_wanted.set()
        if self.state != "QUEUED":
            await self._tell_worker(reason)

    async def on_failure(self) -> None:
        await self.send(official_error("internal gateway error"))
        self.ended_reason = self.ended_reason or CloseReason.ERROR
        await self.close(status.WS_1011_INTERNAL_ERROR)
        if self.slot_id is not None:
            await self._tell_worker(CloseReason.ERROR)

    async def queue_frame(self, frame: Frame) -> None:
        """The queue's events under the official names (``queued``, ``queue_update``)."""
        out = official_queue_frame(frame)
        if out is not None:
            await self.send(out)

    async def run(self) -> None:
        gateway = self.gateway
        refused = await self.meter.admit(self.session_id)
        if refused is not None:  # the key's quota: told before any slot is asked for
            telemetry.rejected(gateway.metrics, ErrorCode.QUOTA_EXCEEDED)
            self.ended_reason = ErrorCode.QUOTA_EXCEEDED.value
            message = self.meter.refusal_message(refused)
            await self.send(official_error(message))
            return await self.close(status.WS_1008_POLICY_VIOLATION, "quota exceeded")
        task = WaitingTask(claim_id(self.session_id, 0), DuplexJob.task)
        asked = time.time()
        got = await wait_for_slot(
            self, self.deadline, self.stop_wanted, notify=self.queue_frame, task=task
        )
        if got is None:
            if not self.gone.is_set():
                await self._end()
            return
        if isinstance(got, NoSlot):
            full = got.code in (ErrorCode.QUEUE_FULL, ErrorCode.WORKER_BUSY)
            message = (
                f"Queue full ({gateway.settings.max_queue} requests)"
                if full
                else f"Service not ready: {got.detail}"
            )
            self.ended_reason = got.code.value
            await self.send(official_error(message))
            return await self.close(status.WS_1013_TRY_AGAIN_LATER, message[:120])
        self.slot_id = got.slot_id
        self.slot_since = self.admitted_at = time.time()
        self.meter.queue_wait(self.admitted_at - asked)
        self.worker_id = slot_worker(got.slot_id)
        out = await gateway.bus.open(self.session_id, on_overflow=self.output_overflow)
        relay = TaskRelay(gateway, out, self.session_id, got.slot_id, "session")
        try:
            try:
                await relay.submit(
                    DuplexJob(
                        session_id=self.session_id,
                        slot_id=got.slot_id,
                        gateway_id=gateway.gateway_id,
                        public_mode=self.public_mode,
                        deadline_ts=self.deadline,
                    )
                )
            except TaskNotStarted as exc:
                return await self._fail(f"Worker connection failed: {exc.detail}", 1013)
            self.set_state("CONNECTED")
            await self.send(official_frame(OfficialEvent.QUEUE_DONE))
            telemetry.handed_off(gateway.metrics, got.assigned_at)
            if self.pending is not None:
                pending, self.pending = self.pending, None
                await self._prepare(pending)
            self.relay_waker = relay.out.wake
            await self._relay(relay)
        finally:
            self.relay_waker = None
            await gateway.bus.close(self.session_id, out)
            if self.gone.is_set() and self.state != "CLOSED":
                await self._tell_worker(CloseReason.CLIENT_CLOSED)  # the client vanished

    async def _relay(self, relay: TaskRelay) -> None:
        """Forward the worker's events until the session ends."""
        closing_since: float | None = None
        while not self.gone.is_set():
            now = time.monotonic()
            if closing_since is None:
                self._check_clocks(now)
                if self.stop_wanted.is_set():
                    closing_since = now
                    if self.stop_reason != CloseReason.USER_STOP:  # (a stop told the worker)
                        await self._tell_worker(self.stop_reason)
                    shutdown = self.stop_reason == CloseReason.SERVER_SHUTDOWN
                    if shutdown or not relay.started:
                        if not relay.started:
                            await self.gateway.abandon(relay.claim_id, relay.slot_id)
                        return await self._end()
            elif now - closing_since > CLOSE_GRACE_S:
                return await self._end()
            timeout = CLOSING_LOOK_S if closing_since is not None else self._sleep_s(relay, now)
            try:
                events = await relay.next(timeout)
            except TaskNotStarted as exc:
                return await self._fail(f"Worker connection failed: {exc.detail}", 1013)
            except WorkerLost:
                return await self._fail("the worker running this session was lost", 1011)
            for ev in events:
                if isinstance(ev, Closed):
                    if not self.stop_wanted.is_set():  # the worker ended it (limit, failure)
                        ended = ev.reason or CloseReason.ERROR
                        self.stop_reason = (
                            CloseReason.ERROR if ended == CloseReason.CLIENT_CLOSED else ended
                        )
                    return await self._end()
                await self._forward(ev)
            if self._prepare_overdue():
                await self._tell_worker(CloseReason.BACKEND_ERROR)
                limit = self.gateway.settings.init_timeout_s
                return await self._fail(
                    f"the backend did not prepare the session within {limit:.0f} s", 1011
                )

    async def _forward(self, ev: Any) -> None:
        match ev:
            case Created():
                self.set_state("ACTIVE")
            case Error(code=ErrorCode.INVALID_PAYLOAD) if self.state == "PREPARING":
                self.set_state("CONNECTED")  # the prepare was refused; the client may retry
        self.meter.event(ev)
        received = self.received.pop(ev.input_id, None) if isinstance(ev, Listen | Speak) else None
        for frame in self.mapper.frames(ev, received):
            await self.send(frame)
        telemetry.relayed(self.gateway.metrics, self.clock, ev)

    def _check_clocks(self, now: float) -> None:
        """The pause timeout and the duration limit end the session with ``timeout``."""
        if self.stop_wanted.is_set():
            return
        if self.paused_until is not None and now >= self.paused_until:
            self.stop_reason = CloseReason.TIMEOUT
            self.timeout_message = "Pause timeout"
            self.stop_wanted.set()
        elif self.time_left() <= 0:
            self.stop_reason = CloseReason.TIMEOUT
            limit = self.gateway.settings.duration_limit(self.public_mode)
            self.timeout_message = f"Session duration limit ({limit:.0f}s)"
            self.stop_wanted.set()

    def _sleep_s(self, relay: TaskRelay, now: float) -> float:
        sleep = min(self.gateway.settings.relay_look_s, self.time_left(), relay.wait_left(now))
        if self.paused_until is not None:
            sleep = min(sleep, self.paused_until - now)
        if self.prepare_since is not None and self.state == "PREPARING":
            sleep = min(sleep, self.prepare_since + self.gateway.settings.init_timeout_s - now)
        return max(0.01, sleep)

    def _prepare_overdue(self) -> bool:
        return (
            self.state == "PREPARING"
            and self.prepare_since is not None
            and time.monotonic() - self.prepare_since > self.gateway.settings.init_timeout_s
        )

    async def _end(self) -> None:
        """The session's last frame (``stopped``, ``timeout`` or an error), then close."""
        if self.state == "CLOSED":
            return
        reason = self.stop_reason
        self.set_state("CLOSED")
        if reason == CloseReason.USER_STOP:
            self.ended_reason = "stopped"
            await self.send(official_frame(OfficialEvent.STOPPED))
        elif reason == CloseReason.TIMEOUT:
            self.ended_reason = str(reason)
            await self.send(official_timeout(self.timeout_message or "timeout"))
        else:
            self.ended_reason = str(reason)
            await self.send(official_error(f"session ended: {reason}"))
        code = status.WS_1001_GOING_AWAY if reason == CloseReason.SERVER_SHUTDOWN else 1000
        await self.close(code)

    async def _fail(self, message: str, code: int) -> None:
        self.set_state("CLOSED")
        self.ended_reason = self.ended_reason or CloseReason.ERROR
        await self.send(official_error(message))
        await self.close(code)

    async def _tell_worker(self, reason: str | None) -> None:
        await self.gateway.stops.close(self.session_id, reason, self.deadline)

    # ------------------------------------------------------------------ client frames
    def decode(self, text: str | None) -> dict[str, Any]:
        try:
            event = parse_json(text)
        except NotJSON as exc:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, str(exc)) from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "a message is a JSON object with a type")
        return event

    async def on_client_error(self, exc: ProtocolError) -> None:
        await self.send(official_error(exc.message))

    async def on_event_failure(self, event: dict[str, Any]) -> None:
        await self.send(official_error("the server could not handle this message"))

    async def on_event(self, event: dict[str, Any]) -> None:
        kind: str = event["type"]
        match kind:
            case OfficialClientEvent.PREPARE:
                await self._on_prepare(event)
            case OfficialClientEvent.AUDIO_CHUNK:
                self._on_chunk(event)
            case OfficialClientEvent.PAUSE:
                timeout = event.get("timeout", PAUSE_TIMEOUT_S)
                if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                    raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "timeout must be a number")
                timeout = max(0.0, min(float(timeout), self.time_left()))
                self.paused_until = time.monotonic() + timeout
                self.wake_relay()
                await self.send(official_paused(timeout))
            case OfficialClientEvent.RESUME:
                self.paused_until = None
                self.set_state(self.state)  # an idle client is counted from its resume
                await self.send(official_frame(OfficialEvent.RESUMED))
            case OfficialClientEvent.INTERRUPT:  # the official worker's deprecated one: only
                # acknowledged
                await self.send(official_frame(OfficialEvent.INTERRUPTED))
            case OfficialClientEvent.STOP:
                self.stop_reason = CloseReason.USER_STOP
                if self.state in ("CONNECTED", "PREPARING", "ACTIVE"):
                    await self._tell_worker(CloseReason.USER_STOP)
                self.stop_wanted.set()
            case ClientEvent.CLIENT_DIAGNOSTIC:
                self.diagnostics.note(event)
            case _:
                raise ProtocolError(ErrorCode.UNKNOWN_EVENT, f"Unknown message type: {kind}")

    async def _on_prepare(self, event: dict[str, Any]) -> None:
        if self.state in ("PREPARING", "ACTIVE"):
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "Session already prepared")
        voices = self.gateway.settings.voices_dir
        control = await asyncio.to_thread(prepare_control, event, voices)
        if self.state == "QUEUED":
            self.pending = control  # the latest valid one wins; sent at admission
        elif self.state == "CONNECTED":
            await self._prepare(control)

    async def _prepare(self, control: InitControl) -> None:
        self.set_state("PREPARING")
        self.prepare_since = time.monotonic()
        self.default_slices = control.max_slice_nums or 1
        self.wake_relay()  # its deadline starts now
        await self.gateway.inputs.control(self.session_id, control)

    def _on_chunk(self, event: dict[str, Any]) -> None:
        if self.state != "ACTIVE":
            raise ProtocolError(ErrorCode.NOT_READY, "Not prepared yet")
        if self.paused_until is not None:
            raise ProtocolError(ErrorCode.NOT_READY, "Worker is paused")
        chunk = audio_chunk(event, self.default_slices)
        frames = chunk.frames[: self.gateway.settings.max_video_frames]
        self.meter.input(len(chunk.audio) // 4, len(frames))
        self.input_seq += 1
        input_id = f"input_{self.input_seq}"
        self.received[input_id] = time.monotonic()
        self.clock.input_sent(input_id)
        written = self.gateway.inputs.append(
            self.session_id,
            AudioChunk(
                seq=self.input_seq,
                input_id=input_id,
                audio=chunk.audio,
                frames=frames,
                force_listen=chunk.force_listen,
                max_slice_nums=chunk.max_slice_nums,
            ),
        )
        written.add_done_callback(functools.partial(self._written, input_id))

    def _written(self, input_id: str, written: asyncio.Future[None]) -> None:
        """A chunk Redis did not take is reported (its result will not come)."""
        exc = None if written.cancelled() else written.exception()
        if exc is None or self.gone.is_set():
            return
        log.error("session %s: %s was not queued: %s", self.session_id, input_id, exc)
        self.received.pop(input_id, None)
        task = asyncio.ensure_future(self.send(official_error(f"{input_id} was not queued")))
        self._error_sends.add(task)
        task.add_done_callback(self._error_sends.discard)
