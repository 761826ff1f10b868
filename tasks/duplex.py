"""The duplex-session task: one long task pinned to one worker slot for the whole session."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np

from inference import (
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    HistoryTurn,
    InferenceError,
    UnsupportedInput,
)
from omnicore.audio import INPUT_RATE, b64_decode, bytes_to_pcm, pcm_or_wav_to_16k
from streaming.controls import (
    BadControl,
    CloseControl,
    Control,
    DetachedControl,
    ForceListenControl,
    InitControl,
    TruncateControl,
    decode_control,
)
from streaming.events import (
    CloseReason,
    Created,
    ErrorCode,
    ExpiringReason,
    Listen,
    Rollover,
    Speak,
)
from streaming.input import AudioChunk
from streaming.jobs import claim_id
from streaming.resume import WorkerResume
from tasks.audio_chunks import AudioChunker
from tasks.celery_app import DUPLEX_TASK, app
from tasks.conversation import Conversation
from tasks.endings import DUPLEX
from tasks.expiry import ExpiryNotice
from tasks.presence import Presence, PresenceWatch
from tasks.prime import Prime, prime_history
from tasks.rollover import RolloverPolicy
from tasks.session import SessionContext, SessionFailed, audio_b64, new_id, running_session
from tasks.units import Unit, UnitAssembler

log = logging.getLogger("omniserve.worker")

MAX_CONSECUTIVE_FAILURES = 3
POLL_MS = 250  # a paused session looks at its client this often
MAX_READ_MS = 1000  # an input read waits at most this long (it returns as input arrives)
GATEWAY_CHECK_S = 2.0
FIRST_RECORD_CHECK_S = 0.2  # after Created, the first check of the client's presence


def backend_config(
    init: InitControl, public_mode: str, history: list[HistoryTurn] | None = None
) -> DuplexConfig:
    """The backend's session configuration from a (validated) init control: the voice
    references decoded to 16 kHz, the TTS voice falling back to the reference voice."""
    ref = _voice(init.ref_audio)
    tts_ref = _voice(init.tts_ref_audio)
    return DuplexConfig(
        mode="video" if public_mode == "video" else "audio",
        system_prompt=init.system_prompt,
        ref_audio=ref,
        tts_ref_audio=tts_ref if tts_ref is not None else ref,
        config=dict(init.config),
        history=list(history or []),
    )


def _voice(b64: str | None) -> np.ndarray | None:
    if not b64:
        return None
    return pcm_or_wav_to_16k(b64_decode(b64))


class DuplexRunner:
    """Drives one backend duplex session from the input streams to the output channel."""

    def __init__(self, ctx: SessionContext, public_mode: str, recover: bool = False) -> None:
        self.ctx = ctx
        self.public_mode = public_mode
        self.recover = recover
        runtime = ctx.runtime
        s = runtime.settings
        self.conversation = Conversation(
            runtime.redis, runtime.keys, ctx.session_id, s.session_ttl_s
        )
        self.resume = WorkerResume(runtime.redis, runtime.keys, ctx.session_id)
        self.presence = PresenceWatch(ctx, self.resume, s.resume_grace_s, s.resume_slot_hold_s)
        self.split = False  # InitControl.split_deltas
        self.whole = False  # InitControl.whole_steps
        self.parked = False
        self.backend = runtime.backend
        self.session: DuplexSession | None = None
        self.chunker = AudioChunker()
        self.units = UnitAssembler(getattr(self.backend, "unit_samples", None), s.max_video_frames)
        self.response_id: str | None = None
        self.response_input_id = ""  # the input of the open response's latest speaking step
        self.failures = 0
        self.dropped = 0
        self.steps = 0
        self.init_control: InitControl | None = None  # what a rollover primes the model with
        limit = self.backend.max_context_tokens if self.backend is not None else 0
        self.policy = RolloverPolicy.of(s, limit)
        self.rollovers = 0
        self.expiry: ExpiryNotice | None = None  # with a client that opted in to it
        self.step_worker_s = 0.0  # the compute time of the step being emitted (usage)
        self.next_presence_check = 0.0  # monotonic (set by ``run``)

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        ctx = self.ctx
        self.next_presence_check = time.monotonic() + GATEWAY_CHECK_S
        paused = False
        try:
            if self.recover and self.restart():
                return None
            while True:
                if ctx.runtime.was_taken(ctx.slot_id):
                    return self.taken_over()
                if ctx.runtime.must_close():
                    return self.close(CloseReason.SERVER_SHUTDOWN)
                if time.time() >= ctx.deadline_ts:
                    return self.close(CloseReason.TIMEOUT)
                if self.expiry is not None:
                    notice = self.expiry.duration(time.time())
                    if notice is not None:
                        ctx.emit(notice)
                if paused or time.monotonic() >= self.next_presence_check:
                    interval = self.presence.interval(GATEWAY_CHECK_S)
                    self.next_presence_check = time.monotonic() + interval
                    state = self.presence.check()
                    if not ctx.inputs.outage.away:
                        self.conversation.after_outage(ctx.inputs.outage.outages)
                    if state is Presence.GONE:
                        log.info("session %s: client gone", ctx.session_id)
                        return self.close(CloseReason.CLIENT_CLOSED)
                    if state is Presence.PARK:
                        return self.park()
                    paused = state is Presence.DETACHED
                if paused:  # the client is away: its input waits, the deadline runs
                    time.sleep(POLL_MS / 1000)
                    continue
                batch = ctx.inputs.read(self.read_ms())
                self.dropped += batch.dropped
                for control in batch.controls:
                    if self.control(control):
                        return None
                if self.session is None:
                    continue  # chunks before init were refused by the gateway
                for chunk in batch.chunks:
                    if self.chunk(chunk):
                        return None
        finally:
            if self.session is not None:
                try:
                    self.session.close()
                except Exception:
                    log.exception("session %s: backend close failed", ctx.session_id)

    def read_ms(self) -> int:
        """How long the next input read may wait: until the next presence check, the
        session's deadline or its duration notice, whichever comes first (at most
        ``MAX_READ_MS``). Input ends the wait
        at once, so a wait of its own costs Redis a blocked read, not a round trip every
        ``POLL_MS``."""
        due = [self.next_presence_check - time.monotonic(), self.ctx.deadline_ts - time.time()]
        if self.expiry is not None and ExpiringReason.DURATION not in self.expiry.told:
            due.append(self.expiry.deadline_ts - self.expiry.lead_s - time.time())
        return max(10, min(MAX_READ_MS, int(min(due) * 1000)))

    def close(self, reason: str) -> None:
        """End the session with a reason."""
        self.end_response(interrupted=True)
        self.ctx.closed(reason)

    def taken_over(self) -> None:
        """The gateway took this worker for lost and restarted the session on another slot,
        which holds its lease now: this attempt ends without a word (its client hears the new
        one) and leaves the session's keys and resume record to it.

        The warning tells the operator which attempt gave way: the heartbeat's own line says
        when the slot was found taken, this one that the attempt has ended."""
        log.warning(
            "session %s: running on another slot now; this attempt ends", self.ctx.session_id
        )
        self.ctx.silence()
        self.ctx.taken = True

    def park(self) -> None:
        """The client has been away ``resume_slot_hold_s``: give the slot back (the task ends)
        but keep the session resumable; a resume restarts it on a slot like a failover."""
        log.info("session %s: client away, slot given back until it resumes", self.ctx.session_id)
        self.end_response(interrupted=True)
        self.parked = self.ctx.parked = True
        self.ctx.log_linger_s = self.ctx.runtime.settings.resume_grace_s + 60

    def restart(self) -> bool:
        """A failover: prepare the backend as the session's first init did, with the
        conversation so far; True when the session is over."""
        raw = self.resume.init()
        try:
            control = decode_control(raw) if raw else None
        except BadControl:
            control = None
        if not isinstance(control, InitControl):
            self.ctx.error(
                ErrorCode.BACKEND_ERROR, "the session cannot be restarted", recoverable=False
            )
            self.ctx.closed(CloseReason.BACKEND_ERROR)
            return True
        return self.init(control, self.prime(self.conversation.load()).history)

    def prime(self, turns: list[HistoryTurn]) -> Prime:
        """What of the conversation a fresh model session gets (``tasks/prime.py``)."""
        assert self.backend is not None
        return prime_history(turns, self.policy.prime, self.backend.text_tokens)

    # ------------------------------------------------------------------ controls
    def control(self, control: Control) -> bool:
        """Apply one control event; True when the session is over."""
        match control:
            case CloseControl(reason=reason):
                self.close(reason or CloseReason.USER_STOP)
                return True
            case ForceListenControl():
                if self.session is not None:
                    self.session.interrupt()
                self.units.interrupt()  # the unit being filled listens, however little it holds
                self.end_response(interrupted=True)
                return False
            case InitControl():
                return self.init(control)
            case TruncateControl(spoken=spoken, heard=heard):
                self.conversation.truncate(spoken, heard)
                return False
            case DetachedControl():
                self.next_presence_check = 0.0  # the record says so: look at it now
                return False

    def init(self, control: InitControl, history: list[HistoryTurn] | None = None) -> bool:
        """Prepare the backend session; True when the session is over (a fatal failure)."""
        ctx = self.ctx
        if self.session is not None:
            ctx.error(ErrorCode.INVALID_PAYLOAD, "session already initialised", field="type")
            return False
        assert self.backend is not None
        t0 = time.perf_counter()
        try:
            config = backend_config(control, self.public_mode, history)
            session = self.backend.open_duplex()
            with ctx.runtime.watchdog.guard(ctx, DUPLEX, "prepare"):
                prompt_length = session.prepare(config)
        except UnsupportedInput as exc:
            ctx.error(
                ErrorCode.INVALID_PAYLOAD,
                f"session init rejected: {exc}",
                field=exc.field_name or "payload",
            )
            return False
        except (ValueError, TypeError) as exc:
            ctx.error(ErrorCode.INVALID_PAYLOAD, f"session init rejected: {exc}", field="payload")
            return False
        except Exception as exc:
            log.exception("session %s: prepare failed", ctx.session_id)
            ctx.error(
                ErrorCode.BACKEND_ERROR,
                f"backend failed to start the session: {exc}",
                recoverable=False,
            )
            ctx.closed(CloseReason.BACKEND_ERROR)
            return True
        self.session = session
        self.split = control.split_deltas
        self.whole = control.whole_steps
        self.init_control = control
        if control.expiring:
            full_at = None if self.policy.enabled else self.backend.max_context_tokens
            lead = ctx.runtime.settings.expiring_notice_s
            self.expiry = ExpiryNotice(lead, ctx.deadline_ts, full_at)
            self.expiry.started(int(prompt_length))
        metrics: dict[str, Any] = {
            "backend": self.backend.name,
            "prepare_s": round(time.perf_counter() - t0, 4),
            "kv_cache_length": int(prompt_length),
        }
        if history is not None:
            metrics["history_turns"] = len(history)
        ctx.emit(
            Created(
                prompt_length=int(prompt_length), metrics=metrics, recovered=history is not None
            )
        )
        self.presence.created()
        # soon: the record its gateway writes now is seen before anything can lose it
        self.next_presence_check = time.monotonic() + FIRST_RECORD_CHECK_S
        return False

    # ------------------------------------------------------------------ steps
    def chunk(self, chunk: AudioChunk) -> bool:
        """Buffer one client chunk, step each unit it completes; True when the session is over."""
        done = self.units.push(
            bytes_to_pcm(chunk.audio),
            chunk.input_id,
            chunk.frames,
            chunk.force_listen,
            chunk.max_slice_nums,
        )
        return any(self.step(unit) for unit in done)

    def step(self, chunk: Unit) -> bool:
        """Run one backend step on one unit; True when the session is over."""
        ctx = self.ctx
        assert self.session is not None and self.backend is not None
        step_in = DuplexInput(
            audio=chunk.audio,
            frames=chunk.frames,
            force_listen=chunk.force_listen,
            max_slice_nums=chunk.max_slice_nums,
        )
        t0 = time.perf_counter()
        try:
            with ctx.runtime.watchdog.guard(ctx, DUPLEX):
                result = self.session.step(step_in)
        except UnsupportedInput as exc:
            ctx.error(
                ErrorCode.INVALID_PAYLOAD,
                str(exc),
                field=exc.field_name or "input",
                input_id=chunk.input_id,
            )
            return False
        except InferenceError as exc:
            self.failures += 1
            ctx.error(
                ErrorCode.INFERENCE_ERROR,
                str(exc) or "inference failed",
                input_id=chunk.input_id,
            )
            if self.failures >= MAX_CONSECUTIVE_FAILURES:
                ctx.closed(CloseReason.BACKEND_ERROR)
                return True
            return False
        except Exception as exc:
            log.exception("session %s: step failed", ctx.session_id)
            ctx.error(ErrorCode.BACKEND_ERROR, f"backend failed: {exc}", recoverable=False)
            ctx.closed(CloseReason.BACKEND_ERROR)
            return True
        self.failures = 0
        self.steps += 1
        metrics = dict(result.metrics)
        metrics.setdefault("kv_cache_length", result.kv_cache_length)
        step_s = time.perf_counter() - t0
        metrics["step_s"] = round(step_s, 4)
        ctx.runtime.metrics.step(step_s, len(chunk.audio) / INPUT_RATE)
        self.step_worker_s = step_s  # the usage of the step's first event
        if self.dropped:
            metrics["dropped_chunks"] = self.dropped
        if result.heard:
            self.conversation.heard(result.heard)
            metrics["transcript"] = result.heard
        # the step's text and audio go out in one round trip, written by this thread itself
        # when the slot's writer has nothing queued: this thread has nothing else to do before
        # the next input, and handing the batch over would only add a thread wake-up
        with ctx.out.together(now=True):
            if result.listen:
                self.end_response(interrupted=True)
                ctx.emit(
                    Listen(
                        input_id=chunk.input_id,
                        kv_cache_length=result.kv_cache_length,
                        metrics=metrics,
                        worker_s=step_s,
                    )
                )
            else:
                self.speak(
                    chunk.input_id,
                    result.text,
                    result.audio,
                    result.end_of_turn,
                    result.kv_cache_length,
                    metrics,
                )
        kv = result.kv_cache_length
        if self.policy.due(kv, speaking=self.response_id is not None):
            return self.rollover(kv)
        if kv >= self.backend.max_context_tokens:
            self.close(CloseReason.CONTEXT_FULL)
            return True
        if self.expiry is not None:
            notice = self.expiry.context(kv, len(chunk.audio) / INPUT_RATE)
            if notice is not None:
                ctx.emit(notice)
        return False

    # ------------------------------------------------------------------ rollover
    def rollover(self, kv: int) -> bool:
        """The KV cache passed its budget: go on in a fresh model session primed with the
        conversation so far (``tasks/rollover.py``); True when the session is over (the prime
        alone does not fit: ``context_full``; the backend failed: ``backend_error``)."""
        ctx = self.ctx
        assert self.session is not None and self.init_control is not None
        self.end_response(interrupted=True)  # of a reply cut short, only what was sent
        t0 = time.perf_counter()
        prime = self.prime(self.conversation.turns)
        try:
            with ctx.runtime.watchdog.guard(ctx, DUPLEX, "prepare"):
                length = self._reprime(prime)
                if not self.policy.fits(length) and prime.history:
                    # the estimate was short: the system prompt and the voice alone
                    prime = Prime(dropped=prime.dropped + len(prime.history))
                    length = self._reprime(prime)
        except Exception as exc:
            log.exception("session %s: rollover failed", ctx.session_id)
            ctx.error(ErrorCode.BACKEND_ERROR, f"backend failed: {exc}", recoverable=False)
            ctx.closed(CloseReason.BACKEND_ERROR)
            return True
        if not self.policy.fits(length):
            log.info(
                "session %s: the prime alone takes %d tokens, the budget is %d",
                ctx.session_id,
                length,
                self.policy.budget,
            )
            self.close(CloseReason.CONTEXT_FULL)
            return True
        self.rollovers += 1
        ctx.runtime.metrics.count("omniserve_duplex_rollovers_total", ctx.runtime.backend_name)
        log.info(
            "session %s: rolled over at %d tokens to %d (%d turns, %d dropped)",
            ctx.session_id,
            kv,
            length,
            len(prime.history),
            prime.dropped,
        )
        if self.expiry is not None:
            self.expiry.started(length)
        ctx.emit(
            Rollover(
                kv_cache_length=length,
                metrics={
                    "rollovers": self.rollovers,
                    "kv_cache_length_before": kv,
                    "prepare_s": round(time.perf_counter() - t0, 4),
                    "history_turns": len(prime.history),
                    "dropped_turns": prime.dropped,
                },
            )
        )
        return False

    def _reprime(self, prime: Prime) -> int:
        """Start the backend afresh from the session's init and ``prime``: in the same
        session where the backend can, else in a new one; the new prompt length."""
        assert self.session is not None and self.backend is not None
        assert self.init_control is not None
        config = backend_config(self.init_control, self.public_mode, prime.history)
        length = self.session.reprime(config)
        if length is None:
            old, self.session = self.session, None
            old.close()
            session = self.backend.open_duplex()
            length = session.prepare(config)
            self.session = session
        return int(length)

    def speak(
        self,
        input_id: str,
        text: str,
        audio: np.ndarray | None,
        end_of_turn: bool,
        kv: int,
        metrics: dict[str, Any],
    ) -> None:
        """Emit one speaking step as protocol-sized pieces (text rides on the first); with
        ``whole`` as one piece."""
        if self.response_id is None:
            self.response_id = new_id("resp")
        self.response_input_id = input_id
        pieces: list[np.ndarray | None]
        if self.whole:  # the step's speech in one piece (nothing is held back for a next one)
            pieces = [audio] if audio is not None and audio.size else []
        else:
            pieces = list(self.chunker.push(audio))
            if end_of_turn:
                rest = self.chunker.flush()
                if rest is not None:
                    pieces.append(rest)
        if not pieces:
            pieces = [None]
        self.conversation.said(text)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            self._out(
                Speak(
                    response_id=self.response_id,
                    input_id=input_id,
                    text=text if i == 0 else "",
                    audio=audio_b64(piece),
                    end_of_turn=bool(end_of_turn and last),
                    kv_cache_length=kv,
                    metrics=metrics if i == 0 else {"kv_cache_length": kv},
                    worker_s=self.step_worker_s if i == 0 else 0.0,
                    text_tokens=self._tokens(text) if i == 0 else 0,
                )
            )
        self.step_worker_s = 0.0
        if end_of_turn:
            self.response_id = None
            self.conversation.end_response()

    def _tokens(self, text: str) -> int:
        return self.backend.text_tokens(text) if text and self.backend is not None else 0

    def _out(self, ev: Speak) -> None:
        """Emit a Speak; with ``split`` (the current dialect) as one event per client frame:
        its text, then its audio, and nothing for a piece that has neither."""
        if not self.split:
            self.ctx.emit(ev)
            return
        if ev.text:
            self.ctx.emit(replace(ev, audio="", end_of_turn=ev.end_of_turn and not ev.audio))
        if ev.audio:  # (the step's usage went with its text, if it had any)
            if ev.text:
                ev = replace(ev, worker_s=0.0, text_tokens=0)
            self.ctx.emit(replace(ev, text=""))

    def end_response(self, interrupted: bool) -> None:
        """Close an open response: flush its audio as the last delta."""
        if self.response_id is None:
            return
        rest = self.chunker.flush()
        self._out(
            Speak(
                response_id=self.response_id,
                input_id=self.response_input_id,
                audio=audio_b64(rest),
                end_of_turn=True,
                interrupted=interrupted,
            )
        )
        self.response_id = None
        self.conversation.end_response()


@app.task(name=DUPLEX_TASK, ignore_result=True, throws=(SessionFailed,))
def duplex_session(
    session_id: str,
    slot_id: str,
    gateway_id: str,
    public_mode: str,
    deadline_ts: float,
    attempt: int = 0,
    fresh: bool = False,
) -> None:
    """Run one full-duplex session until it closes; the slot is freed on every exit path.

    ``attempt`` > 0: a failover (or a resume after the slot was given back) restarts it here;
    with ``fresh``, no earlier attempt started (its worker died first): it starts as the first.
    """
    recover = attempt > 0 and not fresh
    claim = claim_id(session_id, attempt)
    with running_session(session_id, slot_id, gateway_id, deadline_ts, claim, recover) as ctx:
        if ctx is None:
            return
        runner = DuplexRunner(ctx, public_mode, recover)
        try:
            runner.run()
        except Exception as exc:
            log.exception("session %s failed", session_id)
            try:
                ctx.error(ErrorCode.BACKEND_ERROR, f"session failed: {exc}", recoverable=False)
                ctx.closed(CloseReason.ERROR)
            except Exception:  # nothing more can be told
                log.warning("session %s: could not report its failure", session_id, exc_info=True)
        if not runner.parked and not ctx.taken:
            try:
                runner.resume.mark_ended()
            except Exception:  # noqa: BLE001 - Redis away: the record expires by itself
                log.warning("session %s: could not mark its record ended", session_id)
