"""The chat-turn task: one short stateless turn on any free worker slot."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from inference import ChatDelta, ChatDone, ChatPrefilled, InferenceError, UnsupportedInput
from streaming.events import (
    AudioDelta,
    CloseReason,
    Done,
    ErrorCode,
    Prefill,
    TextDelta,
    TurnEnd,
)
from streaming.jobs import claim_id
from tasks.audio_chunks import AudioChunker
from tasks.celery_app import CHAT_TASK, app
from tasks.chat_request import build_chat_request
from tasks.endings import CHAT
from tasks.session import SessionContext, SessionFailed, audio_b64, running_session

log = logging.getLogger("omniserve.worker")

CANCEL_CHECK_S = 0.2


def _cancelled(ctx: SessionContext) -> CloseReason | None:
    """A close reason if the gateway asked to stop this turn, the deadline passed or we drain."""
    if ctx.runtime.must_close():
        return CloseReason.SERVER_SHUTDOWN
    if time.time() >= ctx.deadline_ts:
        return CloseReason.TIMEOUT
    if not ctx.runtime.gateway_alive(ctx.gateway_id):
        return CloseReason.CLIENT_CLOSED
    if ctx.inputs.poll_controls():  # the only control a turn gets is a close
        return CloseReason.CLIENT_CLOSED
    return None


def run_turn(ctx: SessionContext, request: dict[str, Any]) -> None:
    """Stream one turn's events: prefill, text/audio deltas (when streaming), done."""
    backend = ctx.runtime.backend
    assert backend is not None
    try:
        req = build_chat_request(request, ctx.runtime.settings.voices_dir)
    except UnsupportedInput as exc:
        ctx.error(ErrorCode.INVALID_PAYLOAD, str(exc), field=exc.field_name)
        return
    except (ValueError, TypeError, KeyError) as exc:
        ctx.error(ErrorCode.INVALID_PAYLOAD, f"request rejected: {exc}")
        return
    chunker = AudioChunker()
    t0 = time.perf_counter()
    first_delta_s: float | None = None
    next_check = time.monotonic() + CANCEL_CHECK_S
    try:
        for ev in ctx.runtime.watchdog.guarded(ctx, CHAT, backend.chat(req)):
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CANCEL_CHECK_S
                reason = _cancelled(ctx)
                if reason:
                    ctx.closed(reason)
                    return
            if isinstance(ev, ChatPrefilled):
                ctx.emit(
                    Prefill(
                        input_tokens=ev.input_tokens,
                        prefill_s=round(time.perf_counter() - t0, 4),
                    )
                )
            elif isinstance(ev, ChatDelta):
                first = first_delta_s is None
                if first:
                    first_delta_s = time.perf_counter() - t0
                if not req.streaming:
                    continue
                # the step's text and audio in one round trip; the turn's first written by this
                # thread when the writer is idle (one round trip's wait for the model, against a
                # thread hand-off for the client's first delta: docs/BENCHMARKS.md)
                with ctx.out.together(now=first):
                    if ev.text:
                        ctx.emit(TextDelta(text=ev.text))
                    for piece in chunker.push(ev.audio):
                        ctx.emit(AudioDelta(audio=audio_b64(piece)))
            elif isinstance(ev, ChatDone):
                # a streamed turn's last (short) piece of speech rides on "done" as last_audio
                rest = chunker.flush() if req.streaming else None
                audio = ev.audio if isinstance(ev.audio, np.ndarray) else None
                ctx.emit(
                    Done(
                        text=ev.text,
                        input_tokens=ev.input_tokens,
                        generated_tokens=ev.generated_tokens,
                        audio=audio_b64(audio) if not req.streaming else "",
                        last_audio=audio_b64(rest) if rest is not None else "",
                        worker_s=time.perf_counter() - t0,
                        metrics={
                            **ev.metrics,
                            "backend": backend.name,
                            "input_tokens": ev.input_tokens,
                            "generated_tokens": ev.generated_tokens,
                            "first_delta_s": round(first_delta_s or 0.0, 4),
                            "total_s": round(time.perf_counter() - t0, 4),
                            **({"transcript": ev.heard} if ev.heard else {}),
                        },
                    )
                )
                return
    except UnsupportedInput as exc:
        ctx.error(ErrorCode.INVALID_PAYLOAD, str(exc), field=exc.field_name)
        return
    except InferenceError as exc:
        ctx.error(ErrorCode.INFERENCE_ERROR, str(exc) or "inference failed")
        return
    except Exception as exc:
        log.exception("chat turn %s failed", ctx.session_id)
        ctx.error(ErrorCode.INFERENCE_ERROR, f"inference failed: {exc}")
        return
    ctx.error(ErrorCode.INFERENCE_ERROR, "backend ended the turn without a result")


@app.task(name=CHAT_TASK, ignore_result=True, throws=(SessionFailed,))
def chat_turn(
    turn_id: str, slot_id: str, gateway_id: str, deadline_ts: float, attempt: int = 0
) -> None:
    """Run one chat turn and free the slot (its request waits in Redis, read once by its claim).

    ``attempt`` > 0: the gateway sent the turn again, to another slot, because the worker of the
    first was gone before it started; each attempt claims its own id.
    """
    claim = claim_id(turn_id, attempt)
    with running_session(turn_id, slot_id, gateway_id, deadline_ts, claim, kind=CHAT) as ctx:
        if ctx is None:
            return
        request = ctx.request
        if request is None:
            ctx.error(
                ErrorCode.INFERENCE_ERROR,
                "the turn's request was not found (expired, or Redis restarted); send it again",
            )
        else:
            run_turn(ctx, request)
        ctx.emit(TurnEnd())
