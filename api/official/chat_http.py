"""``POST /api/chat``: the official gateway's HTTP chat, one turn per request.

The official gateway queues the request for a worker and answers with the worker's
``ChatResponse`` (``text``, ``audio_data``, ``tokens_generated``, ``duration_ms``, ``success``,
...) plus ``queue_wait_ms`` and ``estimated_queue_wait_s``. Here the request is one chat turn of
the whole machinery: validated like every chat request (``api/protocol/chat_validation.py``),
queued in the global FIFO (``wait_for_slot``), run as an ``omniserve.chat_turn`` task on the slot
(``ChatTurn``: start timeout, lost workers, replay), recorded and counted like a ``/ws/chat`` turn.

Errors keep the official dialect's shape, FastAPI's ``{"detail": ...}``: 422 with FastAPI's list
of ``{type, loc, msg}`` for a body the chat request model refuses, 400 for a body that is not
JSON, 413 past ``OMNISERVE_MAX_FRAME_BYTES``, 503 when no slot will come (``Queue full``), 504
when the request's deadline passed. A turn the worker could not answer is the processor's own
failure answer: 200 with ``success: false`` and its ``error``. The client leaving ends the wait
or the turn at once, and the slot comes back in every case.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse

from api.gateway.metering import request_usage
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.chat_validation import ChatDefaults, chat_request
from api.protocol.dialects import legacy_error
from api.protocol.errors import Frame, ProtocolError
from api.protocol.events import LegacyChatEvent
from api.realtime.chat_turn import ChatTurn
from api.realtime.slot_wait import NoSlot, wait_for_slot
from api.relay.task import TaskNotStarted, WorkerLost
from api.security.key_check import identity_of
from omnicore.audio import OUTPUT_RATE
from omnicore.logs import session_context
from streaming.events import Done, Error, ErrorCode, Gap, Prefill
from streaming.jobs import ChatJob
from streaming.keys import slot_worker

#: the official ``ChatRequest`` defaults (``core/schemas``): no speech unless ``tts.enabled``
HTTP_CHAT_DEFAULTS = ChatDefaults(max_new_tokens=512, length_penalty=1.1, tts_enabled=False)
DISCONNECT_POLL_S = 0.5


def detail(status: int, message: Any) -> JSONResponse:
    """An error in the official gateway's (FastAPI's) shape."""
    return JSONResponse({"detail": message}, status_code=status)


def invalid(exc: ProtocolError) -> JSONResponse:
    """422 in FastAPI's validation shape: one ``{type, loc, msg}`` naming the field."""
    loc: list[str] = ["body", *(exc.field.removeprefix("body.").split(".") if exc.field else [])]
    return detail(422, [{"type": exc.code.value, "loc": loc, "msg": exc.message}])


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as JSON; raises ``BodyRefused`` (413, 400)."""
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise BodyRefused(413, f"Request body too large (max {max_bytes} bytes)")
    try:
        return orjson.loads(bytes(body))
    except orjson.JSONDecodeError:
        raise BodyRefused(400, "Request body is not valid JSON") from None


class BodyRefused(Exception):
    """A body refused before validation: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpChat:
    """One ``POST /api/chat`` request: a client that waits for a slot, then one turn.

    It is what ``wait_for_slot`` needs of a client (``SlotClient``) and what the session-end line
    and the close counter read (``telemetry.EndedSession``).
    """

    def __init__(self, gateway: Gateway, request: Request) -> None:
        self.gateway = gateway
        self.request = request
        self.turn_id = self.session_id = f"chat_{uuid.uuid4().hex[:12]}"
        self.public_mode = "chat"
        self.gone = asyncio.Event()  # the client closed its connection
        self.connected_at = time.time()
        self.deadline = self.connected_at + gateway.settings.legacy_chat_timeout_s
        self.admitted_at: float | None = None
        self.worker_id: str | None = None
        self.ended_reason: str | None = None
        self.last_server_error: str | None = None
        self.estimated_wait_s = 0.0  # the last estimate the queue gave (0: never queued)
        self.clock = telemetry.ResponseClock("chat")
        self.recording = gateway.recorder.open(self.turn_id, "legacy_chat", endpoint="/api/chat")
        self.identity = identity_of(request)
        self.meter = gateway.metering.open(self.identity, self.connected_at)

    def session_goes_on(self) -> bool:
        """A turn ends with its request."""
        return False

    async def send(self, frame: Frame) -> None:
        """Queue events: HTTP has no way to tell them; the last estimate goes in the answer."""
        estimate = frame.get("estimated_wait_s")
        if isinstance(estimate, int | float):
            self.estimated_wait_s = float(estimate)

    def stopping(self) -> bool:
        return self.gone.is_set() or time.time() >= self.deadline

    async def _watch_disconnect(self) -> None:
        while not self.gone.is_set():
            if await self.request.is_disconnected():
                self.gone.set()
                return
            await asyncio.sleep(DISCONNECT_POLL_S)

    async def answer(self, body: Any) -> JSONResponse:
        """Validate, queue, run the turn; the answer, in the official shapes."""
        with session_context(self.turn_id):
            watch = asyncio.create_task(self._watch_disconnect())
            try:
                return await self._answer(body)
            finally:
                watch.cancel()
                self.recording.finish(
                    session_id=self.turn_id,
                    close_reason=self.ended_reason,
                    key=self.identity.name,
                    usage=self.meter.session_usage(ended=True).as_dict(),
                )
                telemetry.session_ended(self.gateway.metrics, self)
                await self.meter.close(False)

    def _fail(self, status: int, message: str, reason: str = "error") -> JSONResponse:
        self.ended_reason = self.ended_reason or reason
        return detail(status, message)

    async def _answer(self, body: Any) -> JSONResponse:
        gateway = self.gateway
        if isinstance(body, dict):
            self.recording.client_event(body)
        try:
            request = chat_request(
                body, HTTP_CHAT_DEFAULTS, prefix="body", voices_dir=gateway.settings.voices_dir
            )
        except ProtocolError as exc:
            self.ended_reason = "invalid_request"
            return invalid(exc)
        request["streaming"] = False  # the whole speech in one answer
        refused = await self.meter.admit(self.session_id)
        if refused is not None:  # the key's quota: told before any slot is asked for
            telemetry.rejected(gateway.metrics, ErrorCode.QUOTA_EXCEEDED)
            return self._fail(429, self.meter.refusal_message(refused), "quota_exceeded")
        queued_at = time.monotonic()
        got = await wait_for_slot(
            self,
            self.deadline,
            notify=self.send,
            task=WaitingTask(self.turn_id, ChatJob.task),
        )
        if got is None:
            if self.gone.is_set():
                return self._fail(499, "client closed the request", "client_closed")
            return self._fail(504, "timed out waiting for a worker", "timeout")
        if isinstance(got, NoSlot):
            if got.code in (ErrorCode.QUEUE_FULL, ErrorCode.WORKER_BUSY):
                message = f"Queue full ({gateway.settings.max_queue} requests)"
            else:
                message = f"Service not ready: {got.detail}"
            self.last_server_error = got.code.value
            return self._fail(503, message, got.code.value)
        self.admitted_at, self.worker_id = time.time(), slot_worker(got.slot_id)
        queue_wait_ms = round((time.monotonic() - queued_at) * 1000)
        self.meter.queue_wait(queue_wait_ms / 1000)
        self.meter.add(request_usage(request))
        if got.waited:
            telemetry.handed_off(gateway.metrics, got.assigned_at)
        self.clock.input_sent(self.turn_id)
        started = time.monotonic()
        turn = ChatTurn(gateway, self.turn_id, got, request, self.deadline)
        input_tokens = 0
        try:
            async with aclosing(turn.events(self.stopping, (self.gone,))) as events:
                async for ev in events:
                    telemetry.relayed(gateway.metrics, self.clock, ev, self.turn_id)
                    self.meter.event(ev)
                    match ev:
                        case Prefill():
                            input_tokens = ev.input_tokens
                        case Done():
                            answer = self._done(ev, input_tokens, started)
                            answer["queue_wait_ms"] = queue_wait_ms
                            answer["estimated_queue_wait_s"] = round(self.estimated_wait_s, 1)
                            self.ended_reason = "done"
                            self.recording.sent({"type": LegacyChatEvent.DONE, **answer})
                            return JSONResponse(answer)
                        case Error():
                            self.last_server_error = ev.code.value
                            return self._failed_turn(ev.message or ev.code.value, queue_wait_ms)
                        case Gap():
                            self.last_server_error = ErrorCode.OUTPUT_GAP.value
                            return self._failed_turn(
                                "the answer was lost in transit", queue_wait_ms
                            )
        except TaskNotStarted:
            self.last_server_error = ErrorCode.WORKER_CONNECT_FAILED.value
            return self._fail(503, "Worker connection failed")
        except WorkerLost:
            self.last_server_error = ErrorCode.BACKEND_ERROR.value
            return self._fail(500, "the worker running this request was lost")
        if self.gone.is_set():
            return self._fail(499, "client closed the request", "client_closed")
        if time.time() >= self.deadline:
            return self._fail(504, "generation timed out", "timeout")
        return self._failed_turn("generation ended without a result", queue_wait_ms)

    def _done(self, ev: Done, input_tokens: int, started: float) -> dict[str, Any]:
        """The official ``ChatResponse`` of a finished turn."""
        inputs = ev.input_tokens or input_tokens
        return {
            "text": ev.text,
            "audio_path": None,
            "audio_data": ev.audio or None,
            "audio_sample_rate": OUTPUT_RATE,
            "tokens_generated": ev.generated_tokens,
            "duration_ms": round((time.monotonic() - started) * 1000, 1),
            "prompt": None,
            "token_stats": {
                "cached_tokens": 0,  # no KV cache is kept between requests
                "input_tokens": inputs,
                "generated_tokens": ev.generated_tokens,
                "total_tokens": inputs + ev.generated_tokens,
            },
            "recording_session_id": self.recording.id,
            "error": None,
            "success": True,
        }

    def _failed_turn(self, message: str, queue_wait_ms: int) -> JSONResponse:
        """A turn the worker could not answer: the processor's failure answer (200)."""
        self.ended_reason = "error"
        answer: dict[str, Any] = {
            "text": "",
            "audio_path": None,
            "audio_data": None,
            "audio_sample_rate": OUTPUT_RATE,
            "tokens_generated": None,
            "duration_ms": None,
            "prompt": None,
            "token_stats": None,
            "recording_session_id": self.recording.id,
            "error": message,
            "success": False,
            "queue_wait_ms": queue_wait_ms,
            "estimated_queue_wait_s": round(self.estimated_wait_s, 1),
        }
        self.recording.sent(legacy_error(message))
        return JSONResponse(answer)
