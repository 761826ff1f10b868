"""``/v1/realtime?mode=chat``: turns run one at a time, each taking its own place in the queue.

The connection holds no worker slot between turns: ``session.queue_done`` is sent at once, and
each ``input.append`` waits in the global FIFO and runs as one ``ChatTurn``. spec/01 sends the
``session.queue*`` events only before ``session.init``, so a turn that has to wait is told with
the extension events ``response.queued`` / ``response.queue_update`` / ``response.queue_done``
(same fields, plus the turn's ``response_id`` and ``input_id``), which a client that knows only
the spec ignores.

A session is resumable: its resume record is a ``SessionResume`` (``api/realtime/resume.py``) and
its numbered frames, input count and turn lease a ``ChatResume`` (``api/realtime/chat_resume.py``),
both collaborators the session owns. Its frames after ``session.created`` carry a ``seq``, and a
connection whose first event is ``session.resume`` takes an existing session over.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import aclosing
from typing import Any

import orjson
from starlette import status
from starlette.websockets import WebSocket

from api.gateway.metering import request_usage
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.chat_validation import REALTIME_CHAT_DEFAULTS, chat_request
from api.protocol.dialects import ChatMapper, Dialect
from api.protocol.errors import Frame, ProtocolError, error_frame
from api.protocol.events import INIT_EVENTS, ClientEvent
from api.protocol.frames import chat_created, queue_done, turn_queue_done, turn_queue_frame
from api.realtime.chat_resume import ChatResume
from api.realtime.chat_turn import ChatTurn
from api.realtime.recovery import ResumeRequest, parse_resume
from api.realtime.resume import SessionResume
from api.realtime.session import RealtimeSession, SessionState
from api.realtime.slot_wait import Admitted
from api.relay.task import TaskNotStarted, WorkerLost
from streaming.controls import CloseControl
from streaming.events import Closed, CloseReason, ErrorCode, Gap
from streaming.jobs import ChatJob
from streaming.keys import slot_worker
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

# a turn its worker stopped while this connection still waits for it: no client sees client_closed
TURN_INTERRUPTED = {CloseReason.CLIENT_CLOSED.value: "its worker took this gateway for gone"}
CHECK_S = 0.5  # how often an idle session checks its clock and (resumable) its record


class RealtimeChat(RealtimeSession):
    """Chat mode: turns run one at a time, each taking its own place in the global queue."""

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        super().__init__(gateway, ws, "chat")
        self.resume = SessionResume(gateway, self)
        self.chat_resume = ChatResume(gateway, self, self.resume)
        self.turns: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.current_turn: str | None = None  # the id of the turn running or last run
        self.turn_running = False  # from taking the turn lease to the turn's end
        # the next turn's output channel, subscribed while the session waits for its input,
        # so a turn's start does not wait for the SUBSCRIBE
        self.next_out: tuple[str, SessionOutput] | None = None

    def session_goes_on(self) -> bool:
        """Detached for a resume, or taken over by another connection (``SessionResume``)."""
        return self.resume.goes_on()

    async def resume_coming(self) -> bool:
        """Whether this connection resumes another session: its first event decides."""
        return await self.resume.resume_coming()

    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        self.resume.first_event.set()  # (after this call: the held queue_done goes out, or not)
        kind = self.accept_event(event)
        if kind is None or kind == ClientEvent.SESSION_CLOSE:
            return
        if kind == ClientEvent.SESSION_RESUME:
            if self.resume.request or self.state is not SessionState.CONNECTED:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session.resume must be the first event", "type"
                )
            self.resume.request = parse_resume(event)
            self.superseded.set()
            return
        if kind in INIT_EVENTS:
            if self.state is not SessionState.CONNECTED:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session already initialised", "type"
                )
            field = "payload" if kind == ClientEvent.SESSION_INIT else "session"
            if field not in event:
                raise ProtocolError(
                    ErrorCode.MISSING_FIELD, f"missing required field {field}", field
                )
            if not isinstance(event[field], dict):
                raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{field} must be an object", field)
            self.state = SessionState.ACTIVE
            created = chat_created(self.session_id, self.recording.id)
            await self.chat_resume.offer(created, orjson.dumps(event[field]))
            await self.send(created)
            return
        if self.state is not SessionState.ACTIVE:
            raise ProtocolError(ErrorCode.NOT_READY, "send input only after session.created")
        if kind != ClientEvent.INPUT_APPEND:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "chat mode takes input.append", "type")
        if "input" not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field input", "input")
        limit = self.gateway.settings.max_chat_turns_queued
        if self.turns.qsize() >= limit:
            raise ProtocolError(
                ErrorCode.TURN_QUEUE_FULL,
                f"{limit} turns are already waiting on this connection; send the next one after"
                " a response.done",
            )
        voices = self.gateway.settings.voices_dir
        request = chat_request(event["input"], REALTIME_CHAT_DEFAULTS, voices_dir=voices)
        self.chat_resume.note_input()
        self.turns.put_nowait((f"input_{self.chat_resume.input_seq}", request))
        if self.turn_running:  # its turn lease was taken with an older count
            await self.chat_resume.note_waiting_input()

    async def on_evict(self, reason: CloseReason) -> None:
        await super().on_evict(reason)
        if self.slot_id is not None and self.current_turn:  # stop the running turn now: its
            # output has nowhere to go
            await self.gateway.inputs.control(self.current_turn, CloseControl(reason=reason))

    async def run(self) -> None:
        """Turns one at a time until the session ends; a vanished client's session is kept
        for a resume (detached) when it has a token."""
        self.state = SessionState.CONNECTED
        await self.resume.queue_frame(queue_done(self.session_id))
        try:
            await self.run_turns()
        finally:
            await self._drop_next_output()
            await self.chat_resume.turn_ended()
            await self.chat_resume.logged()
            await self.chat_resume.note_gone()

    async def run_turns(self) -> None:
        resumed = False
        while True:
            if self.resume.request is not None and not resumed:
                resumed = True
                if not await self.resume_session(self.resume.request):
                    return
                self.superseded.clear()  # this connection's own turns queue from now on
            if self.state is SessionState.ACTIVE and self.turns.empty():
                await self._open_next_output()
            if not self.turns.empty() and not self.gone.is_set():
                # an input that came while the last turn ended runs now, with no wait set up
                if not await self.turn(*self.turns.get_nowait()):
                    return
                continue
            get = asyncio.ensure_future(self.turns.get())
            stops = [self.gone, self.close_wanted] + ([] if resumed else [self.superseded])
            waits = [asyncio.ensure_future(ev.wait()) for ev in stops]
            done, _ = await asyncio.wait(
                {get, *waits},
                timeout=min(self.time_left(), CHECK_S),
                return_when=asyncio.FIRST_COMPLETED,
            )
            for t in waits:
                t.cancel()
            if get not in done:
                get.cancel()
            if self.vanished():
                return
            if self.close_wanted.is_set() or self.time_left() <= 0:
                return await self.finish(*self.end_reason())
            if get in done:
                if not await self.turn(*get.result()):
                    return
            elif self.resume.resumable and await self.resume.was_replaced():
                return

    async def resume_session(self, req: ResumeRequest) -> bool:
        """Take the session over and bring the client up to date; False when refused."""
        taken = await self.resume.take_over(req)
        if taken is None:
            return False
        self.dialect = Dialect.CURRENT
        await self.chat_resume.catch_up(req.last_seq, *taken)
        return not self.gone.is_set()

    def must_stop_turn(self) -> bool:
        """A turn stops for a close, the clock, or a client gone for good (not resumable)."""
        gone = self.gone.is_set() and not self.chat_resume.enabled
        return self.close_wanted.is_set() or self.time_left() <= 0 or gone

    def turn_stops(self) -> tuple[asyncio.Event, ...]:
        """``must_stop_turn``'s events, which end a turn's wait for another slot (the clock
        bounds that wait by itself)."""
        if self.chat_resume.enabled:
            return (self.close_wanted,)
        return (self.close_wanted, self.gone)

    def turn_id(self, input_seq: int) -> str:
        """The id (and output channel) of the turn that answers ``input_<input_seq>`` (input
        ids are unique in a session, across resumes: so are the turn ids)."""
        return f"{self.session_id}_t{input_seq}"

    async def _open_next_output(self) -> None:
        """Subscribe the next input's turn channel now, while the session is idle."""
        turn_id = self.turn_id(self.chat_resume.input_seq + 1)
        if self.next_out is not None and self.next_out[0] == turn_id:
            return
        await self._drop_next_output()
        try:
            out = await self.gateway.bus.open(turn_id, on_overflow=self.output_overflow)
        except Exception:  # Redis away: the turn subscribes for itself
            log.debug("could not subscribe %s ahead", turn_id, exc_info=True)
            return
        self.next_out = (turn_id, out)

    def _take_next_output(self, turn_id: str) -> SessionOutput | None:
        """The channel subscribed ahead, if it is this turn's (the turn closes it)."""
        if self.next_out is None or self.next_out[0] != turn_id:
            return None
        out, self.next_out = self.next_out[1], None
        return out

    async def _drop_next_output(self) -> None:
        if self.next_out is not None:
            turn_id, out = self.next_out
            self.next_out = None
            await self.gateway.bus.close(turn_id, out)

    async def turn(self, input_id: str, request: dict[str, Any]) -> bool:
        """Run one turn through the queue and a worker; False when the session ended."""
        names: Frame = {
            "session_id": self.session_id,
            "response_id": f"resp_{uuid.uuid4().hex[:12]}",
            "input_id": input_id,
        }

        async def queue_event(frame: Frame) -> None:
            await self.send(turn_queue_frame(frame, names))

        self.turn_running = True
        self.meter.add(request_usage(request))
        try:
            task = WaitingTask(self.turn_id(int(input_id.removeprefix("input_"))), ChatJob.task)
            hold = self.chat_resume.hold_turn(lambda: self.acquire_slot(task, queue_event))
            async with hold as admitted:
                if admitted is None:
                    return False
                return await self.run_turn(admitted, input_id, request, names)
        finally:
            self.turn_running = False

    def _moved(self, slot_id: str) -> None:
        """The running turn went to another slot (its first worker died before starting it)."""
        self.slot_id, self.worker_id = slot_id, slot_worker(slot_id)

    async def run_turn(
        self, admitted: Admitted, input_id: str, request: dict[str, Any], names: Frame
    ) -> bool:
        """Relay one admitted turn; False when the session ended."""
        self.slot_id = admitted.slot_id
        if admitted.waited:
            await self.send(turn_queue_done(names))
            telemetry.handed_off(self.gateway.metrics, admitted.assigned_at)
        turn_id = self.turn_id(int(input_id.removeprefix("input_")))
        self.current_turn = turn_id
        self.clock.input_sent(turn_id)
        turn = ChatTurn(
            self.gateway,
            turn_id,
            admitted,
            request,
            self.deadline,
            on_overflow=self.output_overflow,
            out=self._take_next_output(turn_id),
            on_slot=self._moved,
        )
        mapper = ChatMapper(self.session_id, names["response_id"], input_id)
        try:
            async with aclosing(turn.events(self.must_stop_turn, self.turn_stops())) as events:
                async for ev in events:
                    if isinstance(ev, Closed):
                        # the worker ended the turn early (drain, deadline, cancel)
                        if not self.must_stop_turn():
                            why = TURN_INTERRUPTED.get(ev.reason, ev.reason)
                            await self.chat_resume.emit(
                                error_frame(ErrorCode.INFERENCE_ERROR, f"turn interrupted: {why}")
                            )
                        continue
                    usage = self.meter.event(ev)
                    for frame in mapper.frames(ev):
                        if usage is not None and frame["type"] == "response.done":
                            frame["usage"] = usage.as_dict()  # an extension field
                        # (an output_gap error is about this connection: not replayed)
                        emit = self.send if isinstance(ev, Gap) else self.chat_resume.emit
                        await emit(frame)
                    telemetry.relayed(self.gateway.metrics, self.clock, ev, turn_id)
        except TaskNotStarted as exc:
            await self.chat_resume.emit(
                error_frame(
                    ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
                )
            )
            await self.chat_resume.end_record()
            await self.close(status.WS_1013_TRY_AGAIN_LATER)
            return False
        except WorkerLost:
            await self.chat_resume.emit(
                error_frame(ErrorCode.INFERENCE_ERROR, "the worker running this turn was lost")
            )
            return True
        finally:
            self.slot_id = None
        if not self.stopping():
            return True
        if not self.vanished():
            await self.finish(*self.end_reason())
        return False

    async def finish(self, reason: str, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        """``session.closed`` (numbered and logged when resumable); the record is ended, so a
        later resume is told ``resume_expired``."""
        if not self.closed_sent and self.chat_resume.enabled:
            self.closed_sent = True
            self.state = SessionState.CLOSED
            await self.chat_resume.emit(self.closed_frame(reason))
            await self.chat_resume.logged()
            await self.chat_resume.end_record()
        await super().finish(reason, code)
