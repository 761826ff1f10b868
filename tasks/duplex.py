"""The duplex-session task: one long task pinned to one worker slot for the whole session."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from inference import (
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    InferenceError,
    UnsupportedInput,
)
from omnicore.audio import b64_decode, bytes_to_pcm, pcm_or_wav_to_16k
from streaming.controls import CloseControl, Control, ForceListenControl, InitControl
from streaming.events import CloseReason, Created, ErrorCode, Listen, Speak
from streaming.input import AudioChunk
from tasks.audio_chunks import AudioChunker
from tasks.celery_app import DUPLEX_TASK, app
from tasks.endings import DUPLEX
from tasks.session import SessionContext, audio_b64, new_id, running_session
from tasks.units import Unit, UnitAssembler

log = logging.getLogger("omniserve.worker")

MAX_CONSECUTIVE_FAILURES = 3
POLL_MS = 250
GATEWAY_CHECK_S = 2.0


def _voice(b64: str | None) -> np.ndarray | None:
    if not b64:
        return None
    return pcm_or_wav_to_16k(b64_decode(b64))


def duplex_config(init: InitControl, public_mode: str) -> DuplexConfig:
    """The backend configuration from a (validated) init control event."""
    ref = _voice(init.ref_audio)
    tts_ref = _voice(init.tts_ref_audio)
    return DuplexConfig(
        mode="video" if public_mode == "video" else "audio",
        system_prompt=init.system_prompt,
        ref_audio=ref,
        tts_ref_audio=tts_ref if tts_ref is not None else ref,
        config=dict(init.config),
    )


class DuplexRunner:
    """Drives one backend duplex session from the input streams to the output channel."""

    def __init__(self, ctx: SessionContext, public_mode: str) -> None:
        self.ctx = ctx
        self.public_mode = public_mode
        self.backend = ctx.rt.backend
        self.session: DuplexSession | None = None
        self.chunker = AudioChunker()
        self.units = UnitAssembler(
            getattr(self.backend, "unit_samples", None), ctx.rt.settings.max_video_frames
        )
        self.response_id: str | None = None
        self.failures = 0
        self.dropped = 0
        self.steps = 0

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        ctx = self.ctx
        next_gw_check = time.monotonic() + GATEWAY_CHECK_S
        try:
            while True:
                if ctx.rt.shutting_down.is_set():
                    return self.close(CloseReason.SERVER_SHUTDOWN)
                if time.time() >= ctx.deadline_ts:
                    return self.close(CloseReason.TIMEOUT)
                if time.monotonic() >= next_gw_check:
                    next_gw_check = time.monotonic() + GATEWAY_CHECK_S
                    if not ctx.rt.gateway_alive(ctx.gateway_id):
                        log.info("session %s: gateway gone", ctx.session_id)
                        return self.close(CloseReason.CLIENT_CLOSED)
                batch = ctx.inputs.read(POLL_MS)
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

    def close(self, reason: str) -> None:
        """End the session with a reason."""
        self.end_response(interrupted=True)
        self.ctx.closed(reason)

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

    def init(self, control: InitControl) -> bool:
        """Prepare the backend session; True when the session is over (a fatal failure)."""
        ctx = self.ctx
        if self.session is not None:
            ctx.error(ErrorCode.INVALID_PAYLOAD, "session already initialised", field="type")
            return False
        assert self.backend is not None
        t0 = time.perf_counter()
        try:
            config = duplex_config(control, self.public_mode)
            session = self.backend.open_duplex()
            with ctx.rt.watchdog.guard(ctx, DUPLEX, "prepare"):
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
        ctx.emit(
            Created(
                prompt_length=int(prompt_length),
                metrics={
                    "backend": self.backend.name,
                    "prepare_s": round(time.perf_counter() - t0, 4),
                    "kv_cache_length": int(prompt_length),
                },
            )
        )
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
            with ctx.rt.watchdog.guard(ctx, DUPLEX):
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
        metrics["step_s"] = round(time.perf_counter() - t0, 4)
        if self.dropped:
            metrics["dropped_chunks"] = self.dropped
        if result.listen:
            self.end_response(interrupted=True)
            ctx.emit(
                Listen(
                    input_id=chunk.input_id,
                    kv_cache_length=result.kv_cache_length,
                    metrics=metrics,
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
        if result.kv_cache_length >= self.backend.max_context_tokens:
            self.close(CloseReason.CONTEXT_FULL)
            return True
        return False

    def speak(
        self,
        input_id: str,
        text: str,
        audio: np.ndarray | None,
        end_of_turn: bool,
        kv: int,
        metrics: dict[str, Any],
    ) -> None:
        """Emit one speaking step as protocol-sized pieces (text rides on the first)."""
        if self.response_id is None:
            self.response_id = new_id("resp")
        pieces: list[np.ndarray | None] = list(self.chunker.push(audio))
        if end_of_turn:
            rest = self.chunker.flush()
            if rest is not None:
                pieces.append(rest)
        if not pieces:
            pieces = [None]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            self.ctx.emit(
                Speak(
                    response_id=self.response_id,
                    input_id=input_id,
                    text=text if i == 0 else "",
                    audio=audio_b64(piece),
                    end_of_turn=bool(end_of_turn and last),
                    kv_cache_length=kv,
                    metrics=metrics if i == 0 else {"kv_cache_length": kv},
                )
            )
        if end_of_turn:
            self.response_id = None

    def end_response(self, interrupted: bool) -> None:
        """Close an open response: flush its audio as the last delta."""
        if self.response_id is None:
            return
        rest = self.chunker.flush()
        self.ctx.emit(
            Speak(
                response_id=self.response_id,
                input_id=None,
                audio=audio_b64(rest),
                end_of_turn=True,
                interrupted=interrupted,
            )
        )
        self.response_id = None


@app.task(name=DUPLEX_TASK, ignore_result=True)
def duplex_session(
    session_id: str, slot_id: str, gateway_id: str, public_mode: str, deadline_ts: float
) -> None:
    """Run one full-duplex session until it closes; the slot is freed on every exit path."""
    with running_session(session_id, slot_id, gateway_id, deadline_ts) as ctx:
        if ctx is None:
            return
        try:
            DuplexRunner(ctx, public_mode).run()
        except Exception as exc:
            log.exception("session %s failed", session_id)
            try:
                ctx.error(ErrorCode.BACKEND_ERROR, f"session failed: {exc}", recoverable=False)
                ctx.closed(CloseReason.ERROR)
            except Exception:  # nothing more can be told
                log.warning("session %s: could not report its failure", session_id, exc_info=True)
