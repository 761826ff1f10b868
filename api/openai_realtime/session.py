"""``/v1/realtime?model=...``: an OpenAI Realtime session on top of the duplex and chat machinery.

``OpenAIRealtime`` is an audio-mode ``RealtimeDuplex`` that speaks the OpenAI protocol. It sends
``session.created`` at once (holding no worker slot yet) and then serves two paths:

- audio: the first ``input_audio_buffer.append`` starts the duplex session (the queue, the slot,
  the init from the session's ``instructions``; the position shows as ``rate_limits.updated``).
  The model decides itself when to speak: its first spoken step becomes
  ``input_audio_buffer.speech_started/speech_stopped/committed``, the user's item, and
  ``response.created``; its speech ``response.output_audio.delta`` (pcm16 24 kHz) and
  ``response.output_audio_transcript.delta``; its end ``response.done``. A model that stops
  to listen (the user spoke over it) ends the response ``cancelled`` (``turn_detected``).
- text (and items without a running audio session): ``conversation.item.create`` adds to the
  conversation; ``response.create`` runs one chat turn (``ChatTurn``, its own place in the
  queue) over it, answered as ``response.output_text.delta`` or, with audio output, as audio
  and its transcript.

Input audio (pcm16 24 kHz) is resampled to the model's 16 kHz float32. ``response.cancel`` ends
the response at once: its remaining output is dropped here and the worker is told to stop
(``force_listen`` for audio; the turn's stop for text). ``conversation.item.truncate`` cuts an
assistant item's transcript to the share that was heard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pybase64
import soxr
from pydantic import ValidationError
from starlette.websockets import WebSocket

from api.gateway.metering import request_usage
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.openai_realtime import client_events as ce
from api.openai_realtime.recording import OpenAIRecording
from api.openai_realtime.server_events import (
    CODE_NAMES,
    ServerEvents,
    error_type,
    message_item,
    new_id,
    response_object,
    session_object,
)
from api.protocol.chat_validation import REALTIME_CHAT_DEFAULTS, chat_request
from api.protocol.dialects import Dialect
from api.protocol.errors import Frame, ProtocolError
from api.protocol.validation import DuplexInit
from api.realtime.chat_turn import ChatTurn
from api.realtime.duplex import RealtimeDuplex
from api.realtime.session import SessionState
from api.relay.task import TaskNotStarted, WorkerLost
from omnicore.audio import (
    INPUT_RATE,
    OUTPUT_RATE,
    AudioFormatError,
    b64_decode,
    b64_to_pcm,
    float32_to_pcm16,
    pcm16_to_float32,
    pcm_to_b64,
)
from streaming.controls import TruncateControl
from streaming.events import (
    AudioDelta,
    Closed,
    Created,
    Done,
    Error,
    ErrorCode,
    Event,
    Gap,
    Listen,
    Speak,
    TextDelta,
)
from streaming.jobs import ChatJob

log = logging.getLogger("omniserve.gateway")

MAX_HELD_S = 30.0  # input audio held while the duplex session starts (then the oldest goes)
PAD_STEP_S = 0.5  # silence fed to the model, this much at a time, while the client sends none
PAD_MAX_S = 30.0  # ... and for at most this long after its commit, if no answer comes
SERVER_VAD = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
    "idle_timeout_ms": None,
}
# internal frames the OpenAI protocol has no event for (its queue, lifecycle, extensions)
DROPPED = frozenset(
    {
        "session.queue_done",
        "session.created",
        "session.closed",
        "session.recovering",
        "session.recovered",
        "session.rollover",
        "session.expiring",
        "session.resync_required",
        "response.output.delta",
    }
)


@dataclass(slots=True)
class Reply:
    """The response being given (one at a time)."""

    id: str
    item_id: str
    modality: str  # "audio" or "text"
    internal_id: str | None = None  # the duplex response it maps (Speak.response_id)
    text: str = ""
    audio_samples: int = 0  # 24 kHz samples sent
    cancelled: bool = False
    usage: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class ConversationItem:
    """One item of the conversation, as the client sees it."""

    id: str
    role: str
    content: list[dict[str, Any]]
    audio_samples: int = 0  # an assistant item's speech, 24 kHz samples
    spoken_by_duplex: bool = False  # the duplex model's response (in its conversation)
    status: str = "completed"  # a response's item ends ``incomplete`` when it was cut short

    def frame(self) -> dict[str, Any]:
        return message_item(self.id, self.role, self.content, self.status)


class OpenAIError(ProtocolError):
    """A client mistake as OpenAI reports it: the offending ``event_id``, and a code of its own
    where OpenAI has one (``name``; clients such as Pipecat treat its two races as harmless,
    every other error as fatal)."""

    def __init__(
        self,
        name: str | None,
        message: str,
        code: ErrorCode = ErrorCode.INVALID_PAYLOAD,
        field: str | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(code, message, field)
        self.name = name
        self.event_id = event_id


class OpenAIRealtime(RealtimeDuplex):
    """One OpenAI Realtime connection (see the module docstring)."""

    # OpenAI clients do not resume: the record is for a failover, and a client that leaves
    # ends its session (its slot goes back at once)
    offers_resume = False

    def __init__(self, gateway: Gateway, ws: WebSocket, model: str) -> None:
        super().__init__(gateway, ws, "audio")
        self.dialect = Dialect.CURRENT
        self.model = model
        self.recording = self.openai_recording = OpenAIRecording(self.recording)
        self.beta = "realtime=v1" in ws.headers.get("openai-beta", "")  # the beta's names
        self.events = ServerEvents(self.beta)
        self.config: dict[str, Any] = {
            "output_modalities": ["audio"],
            "instructions": "",
            "audio_input": {"turn_detection": dict(SERVER_VAD)},
            "audio_output": {"voice": "alloy", "speed": 1.0},
        }
        self.items: list[ConversationItem] = []
        self.reply: Reply | None = None
        # the response a client's truncate ended, until the next one starts: the
        # ``response.cancel`` a client sends right after its truncate finds it already done
        self.truncated_reply: str | None = None
        self.dropped: set[str] = set()  # duplex responses cancelled: their output is not sent
        self.audio_wanted = asyncio.Event()
        self.held: list[np.ndarray] = []  # 16 kHz input while the duplex session starts
        self.held_samples = 0
        self.input_samples = 0  # 24 kHz samples the client sent (its audio clock)
        self.utterance_from = 0  # where the user's next item starts on that clock
        self.utterance_seconds = 0.0  # the length of the user's last item
        self.speech_item: str | None = None  # the user item being spoken (after speech_started)
        self.resampler = soxr.ResampleStream(OUTPUT_RATE, INPUT_RATE, 1, dtype="float32")
        self.text_turn: asyncio.Task[None] | None = None
        self.turn_count = 0
        self.last_audio_at = 0.0  # monotonic: the client's last input_audio_buffer.append
        self.pad: asyncio.Task[None] | None = None  # silence after a commit (``_pad``)

    @staticmethod
    def refusal(code: ErrorCode, message: str) -> Frame:
        """The ``error`` of a connection refused before its session (key, origin, limits,
        shutdown), in OpenAI's shape."""
        return ServerEvents().error(code.value, message, error_type(code))

    # ------------------------------------------------------------------ sending
    async def emit(self, kind: str, **fields: Any) -> None:
        """Send one OpenAI server event (under its beta name to a beta client)."""
        name = self.events.named(kind)
        if name is not None:
            await super().send(self.events.event(name, **fields))

    async def send(self, frame: Frame) -> None:
        """The duplex machinery's own frames, in OpenAI's words: queue positions become
        ``rate_limits.updated``, errors OpenAI errors; the rest has no OpenAI event."""
        kind = frame.get("type")
        if kind in ("session.queued", "session.queue_update"):
            await super().send(
                self.events.rate_limits(
                    int(frame.get("position") or 0), frame.get("estimated_wait_s")
                )
            )
        elif kind == "error":
            err = frame["error"]
            code = ErrorCode(err["code"])
            await self._error(code, err["message"], err.get("field"))
        elif kind in DROPPED:
            return
        elif kind is not None and "event_id" in frame:  # built by ``emit`` or ``ServerEvents``
            await super().send(frame)
        else:
            log.debug("no OpenAI event for %s", kind)

    async def _error(
        self,
        code: ErrorCode,
        message: str,
        param: str | None = None,
        name: str | None = None,
        event_id: str | None = None,
    ) -> None:
        await super().send(
            self.events.error(
                name or CODE_NAMES.get(code, code.value),
                message,
                error_type(code),
                param,
                event_id,
            )
        )

    async def on_client_error(self, exc: ProtocolError) -> None:
        if isinstance(exc, OpenAIError):
            await self._error(exc.code, exc.message, exc.field, exc.name, exc.event_id)
        else:
            await self._error(exc.code, exc.message, exc.field)

    async def on_event_failure(self, event: dict[str, Any]) -> None:
        eid = event.get("event_id")
        await self._error(
            ErrorCode.INFERENCE_ERROR,
            "the server could not handle this event",
            event_id=eid if isinstance(eid, str) else None,
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """``session.created`` at once; the duplex session when audio comes."""
        self.state = SessionState.CONNECTED
        await self.emit("session.created", session=self._session())
        waits = [asyncio.ensure_future(e.wait()) for e in (self.audio_wanted, self.gone)]
        waits.append(asyncio.ensure_future(self.close_wanted.wait()))
        try:
            while not self.audio_wanted.is_set() and not self.stopping():
                await asyncio.wait(waits, timeout=min(1.0, max(0.01, self.time_left())))
        finally:
            for w in waits:
                w.cancel()
        try:
            if self.audio_wanted.is_set() and not self.stopping():
                self.state = SessionState.QUEUED
                self.pending_init = DuplexInit(system_prompt=self.config["instructions"])
                await self.resume.release_queue_frames()  # (queue positions go out as they come)
                await self.run_new()
            elif not self.vanished():
                await self.finish(*self.end_reason())
        finally:
            for task in (self.text_turn, self.pad):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

    def idle_seconds(self) -> float:
        """A client owes no audio while it has not started any (text turns only), nor when it
        takes turns itself (``turn_detection: null``: push to talk, silent between turns)."""
        if not self.audio_wanted.is_set() or self._turns_by_client():
            return 0.0
        return super().idle_seconds()

    def _turns_by_client(self) -> bool:
        return self.config["audio_input"].get("turn_detection") is None

    async def handle(self, ev: Event) -> bool:
        """A worker event of the duplex session, in OpenAI's words."""
        if isinstance(ev, Speak):
            self.meter.event(ev)  # the key's usage (the response's own is OpenAI's usage)
            await self._speak(ev)
            telemetry.relayed(self.gateway.metrics, self.clock, ev)
            return False
        if isinstance(ev, Listen):
            self.meter.event(ev)
            await self._listened()
            telemetry.relayed(self.gateway.metrics, self.clock, ev)
            return False
        if isinstance(ev, Closed) and self.reply is not None and self.reply.modality == "audio":
            await self._end_reply("incomplete", reason="max_output_tokens")
        done = await super().handle(ev)
        if isinstance(ev, Created) and not ev.recovered:
            await self._flush_held()
        return done

    # ------------------------------------------------------------------ client events
    async def on_event(self, event: dict[str, Any]) -> None:
        """One client event; a mistake in it is answered naming its ``event_id``."""
        eid = event.get("event_id")
        event_id = eid if isinstance(eid, str) else None
        try:
            await self._on_event(event)
        except OpenAIError as exc:
            exc.event_id = event_id
            raise
        except ProtocolError as exc:
            raise OpenAIError(None, exc.message, exc.code, exc.field, event_id) from None

    async def _on_event(self, event: dict[str, Any]) -> None:
        self.resume.first_event.set()
        kind = event["type"]
        if kind not in ce.KNOWN_TYPES:
            raise ProtocolError(
                ErrorCode.UNKNOWN_EVENT,
                f"Invalid value: {kind!r}. This server does not support this event type.",
                "type",
            )
        try:
            parsed = ce.CLIENT_EVENTS.validate_python(event)
        except ValidationError as exc:
            err = exc.errors()[0]
            path = ".".join(str(p) for p in err["loc"][1:])
            missing = err["type"] == "missing"
            raise ProtocolError(
                ErrorCode.MISSING_FIELD if missing else ErrorCode.INVALID_PAYLOAD,
                f"{err['msg']}: {path}" if path else str(err["msg"]),
                path or None,
            ) from None
        match parsed:
            case ce.AudioAppend():
                await self._append(parsed.audio)
            case ce.SessionUpdate():
                await self._update(parsed.session)
            case ce.AudioCommit():
                await self._commit()
            case ce.AudioClear():
                self.held, self.held_samples = [], 0
                await self.emit("input_audio_buffer.cleared")
            case ce.ItemCreate():
                await self._add_item(parsed.item, parsed.previous_item_id)
            case ce.ItemTruncate():
                await self._truncate(parsed)
            case ce.ItemDelete():
                item = self._item(parsed.item_id)
                self.items.remove(item)
                await self.emit("conversation.item.deleted", item_id=item.id)
            case ce.ItemRetrieve():
                item = self._item(parsed.item_id)
                await self.emit("conversation.item.retrieved", item=item.frame())
            case ce.ResponseCreate():
                await self._response_create(parsed.response or ce.ResponseParams())
            case ce.ResponseCancel():
                await self._cancel(parsed.response_id)

    async def _update(self, s: ce.SessionConfig) -> None:
        """``session.update``: instructions, modalities, turn detection, voice are taken (the
        instructions prompt the model when its session starts: a later change applies to the
        chat turns only); formats other than pcm16 24 kHz are refused by the model of the event."""
        if s.instructions is not None:
            self.config["instructions"] = s.instructions
            if self.state is SessionState.QUEUED and self.pending_init is not None:
                self.pending_init = DuplexInit(system_prompt=s.instructions)  # not started yet
        modalities = s.output_modalities or s.modalities
        if modalities is not None:
            self.config["output_modalities"] = [ce.modality(modalities)]
        tokens = (
            s.max_output_tokens if s.max_output_tokens is not None else s.max_response_output_tokens
        )
        if tokens is not None:
            self.config["max_output_tokens"] = tokens
        if "turn_detection" in s.model_fields_set:  # (the beta's place)
            td = s.turn_detection
            self.config["audio_input"]["turn_detection"] = (
                None if td is None else {**SERVER_VAD, **td.model_dump(exclude_none=True)}
            )
        audio = s.audio
        if audio is not None and audio.input is not None:
            fields = audio.input.model_fields_set
            if "turn_detection" in fields:
                td = audio.input.turn_detection
                self.config["audio_input"]["turn_detection"] = (
                    None if td is None else {**SERVER_VAD, **td.model_dump(exclude_none=True)}
                )
        voice = s.voice
        if audio is not None and audio.output is not None:
            voice = audio.output.voice or voice
            if audio.output.speed is not None:
                self.config["audio_output"]["speed"] = audio.output.speed
        if voice is not None:
            self.config["audio_output"]["voice"] = voice
        await self.emit("session.updated", session=self._session())

    def _session(self) -> dict[str, Any]:
        return session_object(self.session_id, self.model, self.config, self.beta)

    # ------------------------------------------------------------------ audio in
    async def _append(self, audio_b64: str) -> None:
        try:
            raw = b64_decode(audio_b64)
            pcm24 = pcm16_to_float32(raw)
        except AudioFormatError as exc:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"audio: {exc}", "audio") from None
        if pcm24.size == 0:
            return
        self.input_samples += pcm24.size
        self.last_audio_at = time.monotonic()
        pcm16k = self.resampler.resample_chunk(pcm24)
        self.audio_wanted.set()
        if self.state in (SessionState.ACTIVE, SessionState.RECOVERING):
            await self._flush_held()
            await self._forward(pcm16k)
            return
        self.held.append(pcm16k)
        self.held_samples += pcm16k.size
        while self.held_samples > MAX_HELD_S * INPUT_RATE and len(self.held) > 1:
            self.held_samples -= self.held.pop(0).size

    async def _forward(self, pcm16k: np.ndarray, force_listen: bool = False) -> None:
        """One chunk to the worker, through the duplex session's own input path."""
        if pcm16k.size == 0 and not force_listen:
            return
        if pcm16k.size == 0:
            pcm16k = np.zeros(160, dtype=np.float32)
        inp: dict[str, Any] = {"audio": pcm_to_b64(pcm16k)}
        self.openai_recording.audio_in(inp["audio"])
        if force_listen:
            inp["hints"] = {"force_listen": True}
        await super().on_event({"type": "input.append", "input": inp})

    async def _flush_held(self) -> None:
        held, self.held, self.held_samples = self.held, [], 0
        if held:
            await self._forward(np.concatenate(held))

    async def _commit(self) -> None:
        """The model listens continuously and decides itself; a commit is acknowledged and names
        the user item its next answer will answer."""
        if self.input_samples == 0:
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD,
                "Error committing input audio buffer: buffer is empty.",
                None,
            )
        await self._user_turn_items()
        self._start_pad()

    def _start_pad(self) -> None:
        if self.pad is None or self.pad.done():
            self.pad = asyncio.create_task(self._pad())

    async def _pad(self) -> None:
        """After a commit the user is done speaking, but the model answers only as its input
        goes on: while the client sends no audio itself (push to talk), silence is fed in real
        time until the model's answer ends, or ``PAD_MAX_S`` passes with none."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        started = False
        silence = np.zeros(int(INPUT_RATE * PAD_STEP_S), dtype=np.float32)
        while not self.stopping() and (started or loop.time() - since < PAD_MAX_S):
            if self.reply is not None and self.reply.internal_id is not None:
                started = True
            elif started:
                return  # the answer is over
            if self.state is SessionState.ACTIVE and (
                time.monotonic() - self.last_audio_at >= PAD_STEP_S
            ):
                await self._forward(silence)
            await asyncio.sleep(PAD_STEP_S)

    async def _user_turn_items(self) -> str:
        """``speech_started``/``stopped``, ``committed`` and the user's audio item (once per
        utterance)."""
        if self.speech_item is not None:
            return self.speech_item
        item_id = new_id("item")
        self.speech_item = item_id
        start_ms = self.utterance_from * 1000 // OUTPUT_RATE
        now_ms = self.input_samples * 1000 // OUTPUT_RATE
        self.utterance_seconds = (self.input_samples - self.utterance_from) / OUTPUT_RATE
        self.utterance_from = self.input_samples
        await self.emit(
            "input_audio_buffer.speech_started", audio_start_ms=start_ms, item_id=item_id
        )
        await self.emit("input_audio_buffer.speech_stopped", audio_end_ms=now_ms, item_id=item_id)
        previous = self.items[-1].id if self.items else None
        await self.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        item = ConversationItem(item_id, "user", [{"type": "input_audio", "transcript": None}])
        self.items.append(item)
        await self.emit("conversation.item.added", previous_item_id=previous, item=item.frame())
        await self.emit("conversation.item.done", previous_item_id=previous, item=item.frame())
        return item_id

    # ------------------------------------------------------------------ duplex output
    async def _speak(self, ev: Speak) -> None:
        if ev.response_id in self.dropped:
            return
        reply = self.reply
        if reply is None or reply.internal_id != ev.response_id:
            if reply is not None:  # a text turn's response still going: it ends here
                await self._end_reply("cancelled", reason="turn_detected")
            user_item = await self._user_turn_items()
            self.speech_item = None  # the next utterance gets its own item
            heard = ev.metrics.get("transcript")
            if isinstance(heard, str) and heard.strip():
                await self._transcribed(user_item, heard.strip())
            reply = await self._start_reply("audio", ev.response_id)
        if ev.text:
            await self._delta(reply, ev.text, "")
        if ev.audio:
            await self._delta(reply, "", ev.audio)
        if ev.interrupted:
            await self._end_reply("cancelled", reason="turn_detected")
        elif ev.end_of_turn:
            await self._end_reply("completed")

    async def _transcribed(self, item_id: str, transcript: str) -> None:
        """The words the model heard in the user's item (a backend that transcribes)."""
        for item in self.items:
            if item.id == item_id:
                item.content = [{"type": "input_audio", "transcript": transcript}]
        await self.emit(
            "conversation.item.input_audio_transcription.completed",
            item_id=item_id,
            content_index=0,
            transcript=transcript,
            usage={"type": "duration", "seconds": self.utterance_seconds},
        )

    async def _listened(self) -> None:
        """The model listened in this step: a spoken response still open was cut short."""
        reply = self.reply
        if reply is not None and reply.internal_id is not None:
            await self.emit(
                "input_audio_buffer.speech_started",
                audio_start_ms=self.input_samples * 1000 // OUTPUT_RATE,
                item_id=new_id("item"),
            )
            await self._end_reply("cancelled", reason="turn_detected")

    # ------------------------------------------------------------------ responses
    async def _start_reply(self, modality: str, internal_id: str | None = None) -> Reply:
        reply = Reply(new_id("resp"), new_id("item"), modality, internal_id)
        self.reply = reply
        self.truncated_reply = None
        modalities = [modality]
        await self.emit(
            "response.created", response=response_object(reply.id, "in_progress", modalities, [])
        )
        assistant = ConversationItem(
            reply.item_id,
            "assistant",
            [],
            spoken_by_duplex=internal_id is not None,
            status="in_progress",
        )
        item = assistant.frame()
        previous = self.items[-1].id if self.items else None
        self.items.append(assistant)
        await self.emit(
            "response.output_item.added", response_id=reply.id, output_index=0, item=item
        )
        await self.emit("conversation.item.added", previous_item_id=previous, item=item)
        await self.emit(
            "response.content_part.added",
            response_id=reply.id,
            item_id=reply.item_id,
            output_index=0,
            content_index=0,
            part=self._part(reply),
        )
        return reply

    def _part(self, reply: Reply) -> dict[str, Any]:
        if reply.modality == "text":
            return {"type": "text", "text": reply.text}
        return {"type": "audio", "transcript": reply.text}

    async def _delta(self, reply: Reply, text: str, audio_b64: str) -> None:
        """Text or speech (float32 24 kHz base64 from the worker) of the reply."""
        where = {
            "response_id": reply.id,
            "item_id": reply.item_id,
            "output_index": 0,
            "content_index": 0,
        }
        if text:
            reply.text += text
            kind = (
                "response.output_text.delta"
                if reply.modality == "text"
                else "response.output_audio_transcript.delta"
            )
            await self.emit(kind, **where, delta=text)
        if audio_b64 and reply.modality == "audio":
            pcm = b64_to_pcm(audio_b64)
            reply.audio_samples += pcm.size
            self.openai_recording.audio_out(reply.id, audio_b64)
            delta = pybase64.b64encode(float32_to_pcm16(pcm)).decode("ascii")
            await self.emit("response.output_audio.delta", **where, delta=delta)

    async def _end_reply(
        self, status: str, reason: str | None = None, error: dict[str, Any] | None = None
    ) -> None:
        """The done events of the current reply, then ``response.done``."""
        reply, self.reply = self.reply, None
        if reply is None:
            return
        if reply.internal_id is not None and status != "completed":
            self.dropped.add(reply.internal_id)
        where = {"response_id": reply.id, "item_id": reply.item_id, "output_index": 0}
        if reply.modality == "text":
            await self.emit("response.output_text.done", **where, content_index=0, text=reply.text)
            content = {"type": self.events.content_type("output_text"), "text": reply.text}
        else:
            await self.emit("response.output_audio.done", **where, content_index=0)
            await self.emit(
                "response.output_audio_transcript.done",
                **where,
                content_index=0,
                transcript=reply.text,
            )
            content = {"type": self.events.content_type("output_audio"), "transcript": reply.text}
        await self.emit(
            "response.content_part.done", **where, content_index=0, part=self._part(reply)
        )
        item_status = "completed" if status == "completed" else "incomplete"
        for it in self.items:
            if it.id == reply.item_id:
                it.content = [content]
                it.audio_samples = reply.audio_samples
                it.status = item_status
                item = it.frame()
                break
        else:  # deleted by the client meanwhile
            item = message_item(reply.item_id, "assistant", [content], item_status)
        await self.emit(
            "response.output_item.done", response_id=reply.id, output_index=0, item=item
        )
        await self.emit("conversation.item.done", item=item)
        response = response_object(
            reply.id,
            status,
            [reply.modality],
            [item],
            reason=reason,
            usage=reply.usage or {"output_tokens": len(reply.text.split())},
            error=error,
        )
        await self.emit("response.done", response=response)

    async def _cancel(self, response_id: str | None) -> None:
        """``response.cancel``: the response ends now; the worker stops producing it."""
        reply = self.reply
        ended = self.truncated_reply
        if reply is None and ended is not None and response_id in (None, ended):
            # ended by the client's own truncate (an interruption sends both): already done
            self.truncated_reply = None
            return
        if reply is None or (response_id is not None and response_id != reply.id):
            raise OpenAIError(
                "response_cancel_not_active", "Cancellation failed: no active response found."
            )
        await self._stop_reply("client_cancelled")

    async def _stop_reply(self, reason: str) -> None:
        """End the current reply ``cancelled`` at once: what the worker still sends of it is
        dropped, and a speaking model is told to listen."""
        reply = self.reply
        if reply is None:
            return
        reply.cancelled = True
        await self._end_reply("cancelled", reason=reason)
        if reply.internal_id is not None and self.state is SessionState.ACTIVE:
            await self._forward(np.zeros(0, dtype=np.float32), force_listen=True)

    async def _response_create(self, params: ce.ResponseParams) -> None:
        """``response.create``: a chat turn over the conversation; in a running audio session
        the model decides itself when to answer what it hears, so there it only acknowledges
        the user's turn."""
        if self.reply is not None or (self.text_turn is not None and not self.text_turn.done()):
            raise OpenAIError(
                "conversation_already_has_active_response",
                "Conversation already has an active response in progress.",
            )
        if self.audio_wanted.is_set() and not self._has_unanswered_text():
            if self.input_samples:
                await self._user_turn_items()
                self._start_pad()
            return
        modality = ce.modality(
            params.output_modalities or params.modalities or self.config["output_modalities"]
        )
        instructions = params.instructions
        if instructions is None:
            instructions = self.config["instructions"]
        request = self._chat_request(instructions, modality == "audio", params.max_output_tokens)
        reply = await self._start_reply(modality)
        self.text_turn = asyncio.create_task(self._chat_turn(reply, request))

    def _has_unanswered_text(self) -> bool:
        return (
            bool(self.items)
            and self.items[-1].role == "user"
            and any(c.get("type") in ("input_text", "text") for c in self.items[-1].content)
        )

    def _chat_request(
        self, instructions: str, speak: bool, max_tokens: int | str | None
    ) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if instructions:
            messages.append({"role": "system", "content": instructions})
        for item in self.items:
            parts: list[dict[str, Any]] = []
            for c in item.content:
                text = c.get("text") or c.get("transcript")
                if text:
                    parts.append({"type": "text", "text": text})
                elif c.get("type") == "input_audio" and c.get("audio"):
                    parts.append({"type": "audio", "data": c["audio"], "sample_rate": INPUT_RATE})
            if parts:
                messages.append({"role": item.role, "content": parts})
        if not messages:
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD, "the conversation is empty: add an item first", None
            )
        value: dict[str, Any] = {"messages": messages, "tts": {"enabled": speak}}
        if isinstance(max_tokens, int):
            value["generation"] = {"max_new_tokens": max(1, min(max_tokens, 8192))}
        voices = self.gateway.settings.voices_dir
        return chat_request(value, REALTIME_CHAT_DEFAULTS, voices_dir=voices)

    async def _chat_turn(self, reply: Reply, request: dict[str, Any]) -> None:
        """One chat turn on a worker, its events as the reply's."""
        self.turn_count += 1
        turn_id = f"{self.session_id}_o{self.turn_count}"
        try:
            task = WaitingTask(turn_id, ChatJob.task)
            admitted = await self.acquire_slot(task, self.send)
            if admitted is None:
                return
            self.clock.input_sent(turn_id)
            self.meter.add(request_usage(request))
            self.openai_recording.chat_request(request)
            turn = ChatTurn(
                self.gateway,
                turn_id,
                admitted,
                request,
                self.deadline,
                on_overflow=self.output_overflow,
            )

            def stop() -> bool:  # (cancelled, or cut short by the model's own speech)
                return self.reply is not reply or self.stopping()

            async with aclosing(turn.events(stop, (self.gone, self.close_wanted))) as events:
                async for ev in events:
                    if self.reply is not reply:
                        continue
                    await self._turn_event(reply, ev)
                    telemetry.relayed(self.gateway.metrics, self.clock, ev, turn_id)
        except TaskNotStarted as exc:
            await self._fail(reply, ErrorCode.WORKER_CONNECT_FAILED, f"Worker failed: {exc.detail}")
        except WorkerLost:
            await self._fail(reply, ErrorCode.INFERENCE_ERROR, "the worker of this turn was lost")
        finally:
            if self.reply is reply and not reply.cancelled and not self.gone.is_set():
                await self._end_reply("incomplete", reason="max_output_tokens")

    async def _turn_event(self, reply: Reply, ev: Event) -> None:
        self.meter.event(ev)  # the key's usage
        match ev:
            case TextDelta():
                await self._delta(reply, ev.text, "")
            case AudioDelta():
                await self._delta(reply, "", ev.audio)
            case Done():
                if ev.last_audio:
                    await self._delta(reply, "", ev.last_audio)
                elif ev.audio and not reply.audio_samples:
                    await self._delta(reply, "", ev.audio)
                if ev.text and not reply.text:
                    await self._delta(reply, ev.text, "")
                reply.usage = {
                    "input_tokens": ev.input_tokens,
                    "output_tokens": ev.generated_tokens,
                }
                await self._end_reply("completed")
            case Error():
                await self._fail(reply, ev.code, ev.message)
            case Gap():
                await self._error(ErrorCode.OUTPUT_GAP, "output of this response was lost")

    async def _fail(self, reply: Reply, code: ErrorCode, message: str) -> None:
        await self._error(code, message)
        if self.reply is reply:
            err = {"type": error_type(code), "code": code.value, "message": message}
            await self._end_reply("failed", error=err)

    # ------------------------------------------------------------------ conversation
    def _item(self, item_id: str) -> ConversationItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"Conversation item with item_id '{item_id}' does not exist.",
            "item_id",
        )

    async def _add_item(self, item: ce.MessageItem | ce.OtherItem, previous: str | None) -> None:
        item_id = item.id or new_id("item")
        if any(it.id == item_id for it in self.items):
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD, f"an item with id {item_id!r} exists", "item.id"
            )
        if isinstance(item, ce.OtherItem):  # no tools here: kept, never run
            content: list[dict[str, Any]] = []
            role = "user"
        else:
            role = item.role
            content = []
            for i, part in enumerate(item.content):
                c: dict[str, Any] = {"type": part.type}
                if part.text is not None:
                    c["text"] = part.text
                if part.transcript is not None:
                    c["transcript"] = part.transcript
                if part.audio is not None:
                    try:
                        pcm = pcm16_to_float32(b64_decode(part.audio))
                    except AudioFormatError as exc:
                        where = f"item.content.{i}.audio"
                        raise ProtocolError(
                            ErrorCode.INVALID_PAYLOAD, f"{where}: {exc}", where
                        ) from None
                    pcm16k = soxr.resample(pcm, OUTPUT_RATE, INPUT_RATE).astype(np.float32)
                    c["audio"] = pcm_to_b64(pcm16k)
                content.append(c)
        new = ConversationItem(item_id, role, content)
        prev = self.items[-1].id if self.items else None
        if previous is not None and previous != "root":
            at = self.items.index(self._item(previous)) + 1
            self.items.insert(at, new)
            prev = previous
        else:
            self.items.append(new)
        shown = {k: v for k, v in new.frame().items()}
        shown["content"] = [{k: v for k, v in c.items() if k != "audio"} for c in content]
        await self.emit("conversation.item.added", previous_item_id=prev, item=shown)
        await self.emit("conversation.item.done", previous_item_id=prev, item=shown)

    def _latest_duplex_reply(self) -> ConversationItem | None:
        for item in reversed(self.items):
            if item.spoken_by_duplex:
                return item
        return None

    async def _truncate(self, t: ce.ItemTruncate) -> None:
        """Only what the user heard stays: the transcript is cut at ``audio_end_ms``'s share
        of the item's speech. Truncating the response still being given ends it (the user
        spoke over it: a client's own turn detection, as Pipecat's)."""
        item = self._item(t.item_id)
        if item.role != "assistant":
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD, "only assistant messages can be truncated", "item_id"
            )
        if t.content_index >= max(1, len(item.content)):
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD, "content_index is out of range", "content_index"
            )
        live = self.reply is not None and self.reply.item_id == item.id
        samples = (
            self.reply.audio_samples if self.reply is not None and live else item.audio_samples
        )
        heard = t.audio_end_ms * OUTPUT_RATE // 1000
        if heard > samples:
            ms = samples * 1000 // OUTPUT_RATE
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD,
                f"audio_end_ms {t.audio_end_ms} is longer than the item's audio ({ms} ms)",
                "audio_end_ms",
            )
        if live and self.reply is not None:  # the user cut it short while it played: it ends
            self.truncated_reply = self.reply.id
            await self._stop_reply("turn_detected")
        for c in item.content:
            transcript = c.get("transcript")
            if isinstance(transcript, str) and item.audio_samples:
                words = transcript.split(" ")
                keep = round(len(words) * heard / item.audio_samples)
                c["transcript"] = " ".join(words[:keep])
                if item.spoken_by_duplex and self._latest_duplex_reply() is item:
                    # what a failover or rollover replays to the model keeps only this much
                    cut = TruncateControl(spoken=transcript, heard=c["transcript"])
                    await self.gateway.inputs.control(self.session_id, cut)
        item.audio_samples = heard
        await self.emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=t.content_index,
            audio_end_ms=t.audio_end_ms,
        )
