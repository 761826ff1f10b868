"""``WS /v1/realtime``: the session state machine (QUEUED, CONNECTED, ACTIVE, CLOSED) of every mode.

Duplex modes (video, audio) hold one worker slot for the whole session, running one long task.
Chat mode holds no slot between turns: each turn waits in the same global FIFO and runs as a
short task.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing
from typing import Any

from starlette.websockets import WebSocket

from api import errors as E
from api.connection import Connection, NotJSON, new_session_id
from api.dialects import Dialect, DuplexMapper, dialect_of, gap_frame
from api.gateway import CHAT_TASK, DUPLEX_TASK, Gateway
from api.turns import TurnLost, TurnNotStarted, turn_events
from api.validation import REALTIME_CHAT_DEFAULTS, chat_request, duplex_append, duplex_init
from streaming.admission import QueueFull
from streaming.input import AudioChunk
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

QUEUED, CONNECTED, INITIALIZING, ACTIVE, CLOSED = (
    "QUEUED",
    "CONNECTED",
    "INITIALIZING",
    "ACTIVE",
    "CLOSED",
)
CLOSE_GRACE_S = 5.0
LEASE_CHECK_S = 0.5  # with lease_ttl_s (1.5 s): a dead worker's clients are told within ~2.5 s

KNOWN_EVENTS = {
    "session.init",
    "session.update",
    "input.append",
    "input_audio_buffer.append",
    "session.close",
}


class RealtimeSession(Connection):
    """Base of both handlers: queue entry, timing, closing."""

    def __init__(self, gw: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gw, ws)
        self.public_mode = public_mode
        self.session_id = new_session_id()
        self.connected_at = time.time()
        self.deadline = self.connected_at + gw.settings.duration_limit(public_mode)
        self.state = QUEUED
        self.dialect: Dialect | None = None
        self.close_reason: str | None = None  # set when the client asks to close
        self.close_wanted = asyncio.Event()
        self.shutdown_reason: str | None = None

    def time_left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def _dialect_for(self, event_type: str) -> None:
        if self.dialect is None:
            self.dialect = dialect_of(event_type)

    def accept_event(self, event: dict[str, Any]) -> str | None:
        """What every mode does first: fix the dialect, refuse unknown types, note a close.

        Returns the event type, or None when the event was a ``session.close``.
        """
        kind = event["type"]
        self._dialect_for(kind)
        if kind not in KNOWN_EVENTS:
            raise E.ProtocolError(E.UNKNOWN_EVENT, f"unknown event type {kind!r}", "type")
        if kind == "session.close":
            reason = event.get("reason")
            self.close_reason = reason if isinstance(reason, str) and reason else "user_stop"
            self.close_wanted.set()
            return None
        return kind

    async def acquire_slot(self) -> tuple[str, str, bool] | None:
        """Wait for a worker slot (queue events go to the client); None when the wait ended."""
        try:
            ready = await self.gw.has_workers()
        except Exception:  # noqa: BLE001 - Redis unreachable
            ready = False
        if not ready:
            await self.send_error(E.SERVICE_UNAVAILABLE, "Service is not ready: no worker is up")
            await self.close(E.CLOSE_TRY_AGAIN, "service unavailable")
            return None
        acquire = asyncio.ensure_future(self.gw.queue.acquire(self.send))
        gone = asyncio.ensure_future(self.gone.wait())
        close = asyncio.ensure_future(self.close_wanted.wait())
        try:
            done, _ = await asyncio.wait(
                {acquire, gone, close},
                timeout=self.time_left(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for t in (gone, close):
                t.cancel()
        if acquire in done:
            try:
                return acquire.result()
            except QueueFull:
                self.gw.counters["queue_full_total"] += 1
                code = E.WORKER_BUSY if self.gw.settings.max_queue == 0 else E.QUEUE_FULL
                msg = "No idle worker available" if code == E.WORKER_BUSY else "Queue full"
                await self.send_error(code, msg)
                await self.close(E.CLOSE_TRY_AGAIN, msg)
                return None
            except Exception as exc:
                log.exception("admission failed")
                await self.send_error(E.SERVICE_UNAVAILABLE, f"Service is not ready: {exc}")
                await self.close(E.CLOSE_TRY_AGAIN, "service unavailable")
                return None
        acquire.cancel()
        try:
            await acquire
        except (asyncio.CancelledError, Exception):
            pass
        if not self.gone.is_set():
            if self.shutdown_reason:
                await self.finish(self.shutdown_reason, E.CLOSE_GOING_AWAY)
            elif self.close_wanted.is_set():
                await self.finish(self.close_reason or "user_stop")
            else:
                await self.finish("timeout")
        return None

    async def finish(self, reason: str, code: int = E.CLOSE_NORMAL) -> None:
        """Send session.closed (once) and close the socket."""
        if not self.closed_sent:
            self.closed_sent = True
            self.state = CLOSED
            if self.dialect == "older" and reason == (self.close_reason or "user_stop"):
                reason = "stopped"  # spec/04: the confirmation of a client's session.close
            await self.send(self.closed_frame(reason))
        await self.close(code)

    def closed_frame(self, reason: str) -> dict[str, Any]:
        return {"type": "session.closed", "session_id": self.session_id, "reason": reason}

    async def shutdown(self) -> None:
        """Server shutdown: tell the client, end the work."""
        self.shutdown_reason = "server_shutdown"
        self.close_wanted.set()


class DuplexSession(RealtimeSession):
    """Video / audio full-duplex: one long task pinned to one worker slot."""

    def __init__(self, gw: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gw, ws, public_mode)
        self.mapper: DuplexMapper | None = None
        self.input_seq = 0
        self.slot_id: str | None = None
        self.started = False
        self.default_slices = 1
        self.init_since: float | None = None

    # ------------------------------------------------------------------ client side
    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        kind = self.accept_event(event)
        if kind is None:
            if self.state in (CONNECTED, INITIALIZING, ACTIVE):
                await self.gw.inputs.control(
                    self.session_id, {"type": "close", "reason": self.close_reason}
                )
            return
        if self.state == QUEUED:
            raise E.ProtocolError(E.NOT_READY, f"wait for session.queue_done before sending {kind}")
        if kind in ("session.init", "session.update"):
            if self.state != CONNECTED:
                raise E.ProtocolError(E.INVALID_PAYLOAD, "session already initialised", "type")
            init = duplex_init(event)
            self.default_slices = init.max_slice_nums or 1
            self.state = INITIALIZING
            self.init_since = time.monotonic()
            await self.gw.inputs.control(self.session_id, init.control())
            return
        # input.append / input_audio_buffer.append
        if self.state != ACTIVE:
            raise E.ProtocolError(E.NOT_READY, "send input only after session.created")
        chunk = duplex_append(event, self.default_slices)
        self.input_seq += 1
        await self.gw.inputs.append(
            self.session_id,
            AudioChunk(
                seq=self.input_seq,
                input_id=f"input_{self.input_seq}",
                audio=chunk.audio,
                frames=chunk.frames[: self.gw.settings.max_video_frames],
                force_listen=chunk.force_listen,
                max_slice_nums=chunk.max_slice_nums,
            ),
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        got = await self.acquire_slot()
        if got is None:
            return
        _ticket, slot, _waited = got
        self.slot_id = slot
        out = await self.gw.bus.open(self.session_id)
        try:
            await self.gw.submit(
                DUPLEX_TASK,
                slot,
                {
                    "session_id": self.session_id,
                    "slot_id": slot,
                    "gateway_id": self.gw.gateway_id,
                    "public_mode": self.public_mode,
                    "deadline_ts": self.deadline,
                },
            )
        except Exception as exc:
            log.exception("submit failed")
            await self.gw.abandon(self.session_id, slot)
            await self.gw.bus.close(self.session_id)
            await self.send_error(E.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc}")
            await self.close(E.CLOSE_TRY_AGAIN)
            return
        self.gw.counters["sessions_total"] += 1
        self.state = CONNECTED
        await self.send({"type": "session.queue_done", "session_id": self.session_id})
        try:
            await self.relay(out, slot)
        finally:
            await self.gw.bus.close(self.session_id)
            if self.gone.is_set() and not self.closed_sent:
                # the client vanished: make the worker stop now
                try:
                    await self.gw.inputs.control(
                        self.session_id, {"type": "close", "reason": "client_closed"}
                    )
                except Exception:
                    log.warning("could not stop %s", self.session_id, exc_info=True)

    async def relay(self, out: SessionOutput, slot: str) -> None:
        """Forward worker events until the session closes."""
        start_by = time.monotonic() + self.gw.settings.task_start_timeout_s
        closing_since: float | None = None
        next_lease = time.monotonic() + LEASE_CHECK_S
        lease_misses = 0
        while True:
            if self.gone.is_set():
                return
            if closing_since is None and (self.close_wanted.is_set() or self.time_left() <= 0):
                closing_since = time.monotonic()
                reason = self.shutdown_reason or (
                    self.close_reason if self.close_wanted.is_set() else "timeout"
                )
                if reason != (self.close_reason or ""):
                    await self.gw.inputs.control(
                        self.session_id, {"type": "close", "reason": reason}
                    )
                if self.shutdown_reason or not self.started:
                    await self._abandon_if_unstarted(slot)
                    return await self.finish(
                        reason, E.CLOSE_GOING_AWAY if self.shutdown_reason else E.CLOSE_NORMAL
                    )
            if closing_since is not None and time.monotonic() - closing_since > CLOSE_GRACE_S:
                reason = self.shutdown_reason or self.close_reason or "timeout"
                return await self.finish(reason)
            timeout = 0.5 if closing_since is None else 0.25
            if closing_since is None and self.time_left() < timeout:
                timeout = max(0.01, self.time_left())
            try:
                events = await out.get(timeout=timeout)
            except TimeoutError:
                events = []
            for ev in events:
                if await self.handle(ev):
                    return
            now = time.monotonic()
            if not self.started and now > start_by:
                if await self.gw.abandon(self.session_id, slot):
                    await self.send_error(
                        E.WORKER_CONNECT_FAILED,
                        "Worker connection failed: the session did not start",
                    )
                    self.closed_sent = True
                    return await self.close(E.CLOSE_TRY_AGAIN)
                start_by = now + self.gw.settings.task_start_timeout_s
            if (
                self.state == INITIALIZING
                and self.init_since is not None
                and now - self.init_since > self.gw.settings.init_timeout_s
            ):
                await self.gw.inputs.control(
                    self.session_id, {"type": "close", "reason": "backend_error"}
                )
                await self.send_error(
                    E.BACKEND_ERROR,
                    "the backend did not prepare the session "
                    f"within {self.gw.settings.init_timeout_s:.0f} s",
                )
                return await self.finish("backend_error", E.CLOSE_INTERNAL)
            if self.started and now >= next_lease:
                next_lease = now + LEASE_CHECK_S
                if await self.gw.session_alive(self.session_id):
                    lease_misses = 0
                else:
                    lease_misses += 1
                    if lease_misses >= 1:  # the lease TTL is the grace period
                        for ev in await out.catch_up():
                            if await self.handle(ev):
                                return
                        await self.send_error(
                            E.BACKEND_ERROR, "the worker running this session was lost"
                        )
                        return await self.finish("backend_error", E.CLOSE_INTERNAL)

    async def _abandon_if_unstarted(self, slot: str) -> None:
        if not self.started:
            await self.gw.abandon(self.session_id, slot)

    async def handle(self, ev: dict[str, Any]) -> bool:
        """Send one worker event to the client; True when the session is over."""
        kind = ev.get("type")
        if kind == "started":
            self.started = True
            return False
        if self.mapper is None:
            self.mapper = DuplexMapper(self.dialect or "current", self.session_id)
        if kind == "closed":
            await self.finish(self.shutdown_reason or ev.get("reason") or "error")
            return True
        if kind == "created":
            self.state = ACTIVE
        elif kind == "error" and ev.get("code") == E.INVALID_PAYLOAD and self.state == INITIALIZING:
            self.state = CONNECTED  # the init was refused; the client may try again
        elif kind == "gap":
            await self.send(gap_frame(ev))
            return False
        for frame in self.mapper.map(ev):
            await self.send(frame)
        return False

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.state != QUEUED and not self.gone.is_set():
            try:
                await self.gw.inputs.control(
                    self.session_id, {"type": "close", "reason": "server_shutdown"}
                )
            except Exception:  # noqa: BLE001
                pass


class ChatSession(RealtimeSession):
    """Chat mode: turns run one at a time, each taking its own place in the global queue."""

    def __init__(self, gw: Gateway, ws: WebSocket) -> None:
        super().__init__(gw, ws, "chat")
        self.turns: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.turn_count = 0

    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        kind = self.accept_event(event)
        if kind is None:
            return
        if kind in ("session.init", "session.update"):
            if self.state != CONNECTED:
                raise E.ProtocolError(E.INVALID_PAYLOAD, "session already initialised", "type")
            field = "payload" if kind == "session.init" else "session"
            if field not in event:
                raise E.ProtocolError(E.MISSING_FIELD, f"missing required field {field}", field)
            if not isinstance(event[field], dict):
                raise E.ProtocolError(E.INVALID_PAYLOAD, f"{field} must be an object", field)
            self.state = ACTIVE
            await self.send(
                {
                    "type": "session.created",
                    "session_id": self.session_id,
                    "mode": "turn_based",
                    "metrics": {},
                }
            )
            return
        if self.state != ACTIVE:
            raise E.ProtocolError(E.NOT_READY, "send input only after session.created")
        if kind != "input.append":
            raise E.ProtocolError(E.INVALID_PAYLOAD, "chat mode takes input.append", "type")
        if "input" not in event:
            raise E.ProtocolError(E.MISSING_FIELD, "missing required field input", "input")
        self.turns.put_nowait(chat_request(event["input"], REALTIME_CHAT_DEFAULTS))

    async def run(self) -> None:
        self.state = CONNECTED
        await self.send({"type": "session.queue_done", "session_id": self.session_id})
        while True:
            get = asyncio.ensure_future(self.turns.get())
            gone = asyncio.ensure_future(self.gone.wait())
            close = asyncio.ensure_future(self.close_wanted.wait())
            done, _ = await asyncio.wait(
                {get, gone, close}, timeout=self.time_left(), return_when=asyncio.FIRST_COMPLETED
            )
            for t in (gone, close):
                t.cancel()
            if get not in done:
                get.cancel()
                if self.gone.is_set():
                    return
                reason = self.shutdown_reason or (
                    self.close_reason if self.close_wanted.is_set() else "timeout"
                )
                return await self.finish(
                    reason, E.CLOSE_GOING_AWAY if self.shutdown_reason else E.CLOSE_NORMAL
                )
            if not await self.turn(get.result()):
                return

    async def turn(self, request: dict[str, Any]) -> bool:
        """Run one turn through the queue and a worker; False when the session ended."""
        got = await self.acquire_slot()
        if got is None:
            return False
        _ticket, slot, waited = got
        self.turn_count += 1
        if waited:
            await self.send({"type": "session.queue_done", "session_id": self.session_id})
        turn_id = f"{self.session_id}_t{self.turn_count}"
        response_id = f"resp_{uuid.uuid4().hex[:12]}"
        out = await self.gw.bus.open(turn_id)
        self.gw.counters["chat_turns_total"] += 1
        try:
            await self.gw.submit(
                CHAT_TASK,
                slot,
                {
                    "turn_id": turn_id,
                    "slot_id": slot,
                    "gateway_id": self.gw.gateway_id,
                    "request": request,
                    "deadline_ts": self.deadline,
                },
            )
            return await self.relay_turn(out, turn_id, slot, response_id, request)
        finally:
            await self.gw.bus.close(turn_id)

    async def relay_turn(
        self, out: SessionOutput, turn_id: str, slot: str, response_id: str, request: dict[str, Any]
    ) -> bool:
        """Relay one turn; False when the session ended meanwhile."""
        base = {"session_id": self.session_id, "response_id": response_id}

        def stopping() -> bool:
            return self.gone.is_set() or self.close_wanted.is_set() or self.time_left() <= 0

        try:
            async with aclosing(turn_events(self.gw, out, turn_id, slot, stopping)) as events:
                async for ev in events:
                    if ev.get("type") == "closed":
                        # the worker ended the turn early (drain, deadline, cancel)
                        if not stopping():
                            await self.send_error(
                                E.INFERENCE_ERROR, f"turn interrupted: {ev.get('reason')}"
                            )
                        continue
                    await self._chat_event(ev, base, request)
        except TurnNotStarted:
            await self.send_error(
                E.WORKER_CONNECT_FAILED, "Worker connection failed: the turn did not start"
            )
            await self.close(E.CLOSE_TRY_AGAIN)
            return False
        except TurnLost:
            await self.send_error(E.INFERENCE_ERROR, "the worker running this turn was lost")
            return True
        if not stopping():
            return True
        if self.gone.is_set():
            return False
        reason = self.shutdown_reason or (
            self.close_reason if self.close_wanted.is_set() else "timeout"
        )
        await self.finish(reason, E.CLOSE_GOING_AWAY if self.shutdown_reason else E.CLOSE_NORMAL)
        return False

    async def _chat_event(
        self, ev: dict[str, Any], base: dict[str, Any], request: dict[str, Any]
    ) -> None:
        kind = ev.get("type")
        if kind == "text":
            await self.send(
                {
                    "type": "response.output.delta",
                    "kind": "text",
                    **base,
                    "text": ev["text"],
                    "metrics": {},
                }
            )
        elif kind == "audio":
            await self.send(
                {
                    "type": "response.output.delta",
                    "kind": "audio",
                    **base,
                    "audio": ev["audio"],
                    "metrics": {},
                }
            )
        elif kind == "done":
            if ev.get("last_audio"):  # the end of a streamed turn's speech
                await self.send(
                    {
                        "type": "response.output.delta",
                        "kind": "audio",
                        **base,
                        "audio": ev["last_audio"],
                        "metrics": {},
                    }
                )
            frame = {
                "type": "response.done",
                **base,
                "text": ev.get("text", ""),
                "reason": "turn_end",
                "metrics": ev.get("metrics") or {},
            }
            if ev.get("audio"):
                frame["audio"] = ev["audio"]
            await self.send(frame)
        elif kind == "error":
            await self.send_error(
                ev.get("code") or E.INFERENCE_ERROR, ev.get("message") or "", ev.get("field")
            )
        elif kind == "gap":
            await self.send(gap_frame(ev))


async def serve_realtime(gw: Gateway, ws: WebSocket, session: RealtimeSession) -> None:
    """Run a session: the receive loop beside the lifecycle, cleaned up on every exit."""
    gw.sessions[session.session_id] = session
    gw.counters["connections_total"] += 1
    receiver = asyncio.create_task(_receive_loop(session))
    try:
        await session.run()
    except Exception:
        log.exception("session %s failed", session.session_id)
        if not session.closed_sent:
            await session.send_error(E.BACKEND_ERROR, "internal gateway error")
            await session.finish("error", E.CLOSE_INTERNAL)
    finally:
        receiver.cancel()
        try:
            await receiver
        except (asyncio.CancelledError, Exception):
            pass
        gw.sessions.pop(session.session_id, None)
        await session.close()


async def _receive_loop(session: RealtimeSession) -> None:
    while True:
        try:
            event = await session.receive()
        except NotJSON as exc:
            await session.reject_frame(exc)
            return
        except E.ProtocolError as exc:
            session.gw.counters["client_errors_total"] += 1
            await session.send_error(exc.code, exc.message, exc.field)
            continue
        except Exception:  # noqa: BLE001 - socket trouble: treat as a disconnect
            session.gone.set()
            return
        if event is None:
            return
        try:
            await session.on_event(event)  # type: ignore[attr-defined]
        except E.ProtocolError as exc:
            session.gw.counters["client_errors_total"] += 1
            await session.send_error(exc.code, exc.message, exc.field)
        except Exception:
            log.exception("handling %s failed", event.get("type"))
            await session.send_error(E.INFERENCE_ERROR, "the server could not handle this event")
