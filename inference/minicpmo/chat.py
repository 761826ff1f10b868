"""Chat turns on the model: ``chat()`` for a plain text turn, the streaming API otherwise.

Streaming (and any turn with speech): ``reset_session`` -> ``init_token2wav_cache(voice)`` ->
``streaming_prefill`` per message segment (one audio chunk per call) -> ``streaming_generate``,
which yields ``(waveform, text)`` pairs with audio or ``(text, finished)`` pairs without.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    OUTPUT_SAMPLE_RATE,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    InferenceError,
    UnsupportedInput,
)
from inference.minicpmo import compat
from inference.minicpmo.messages import streaming_segments
from omnicore.audio import to_mono_float32

log = logging.getLogger("omniserve.inference.minicpmo")


def map_error(exc: Exception) -> Exception:
    """A model exception as the backend error it means: a broken GPU ends the worker's use."""
    text = str(exc)
    if (
        "device-side assert" in text
        or "illegal memory access" in text
        or ("CUDA error" in text and "out of memory" not in text)
    ):
        return BackendError(f"GPU failure: {exc}")
    return InferenceError(f"{type(exc).__name__}: {exc}")


def reset_session(model: Any) -> None:
    """Drop the model's chat session state (KV cache, vocoder cache)."""
    reset = getattr(model, "reset_session", None)
    if reset is not None:
        try:
            compat.call(reset, reset_token2wav_cache=True)
        except Exception:
            log.exception("reset_session failed")


def kv_length(model: Any) -> int:
    """Tokens in the model's chat KV cache."""
    fn = getattr(model, "_get_kv_cache_length", None)
    if fn is None:
        return 0
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - a statistic, never fatal
        return 0


def count_tokens(model: Any, text: str) -> int:
    """Tokens of ``text`` by the model's tokenizer (words when it has none)."""
    tokenizer = getattr(getattr(model, "processor", None), "tokenizer", None)
    if tokenizer is not None and text:
        try:
            return len(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # any tokenizer failure: fall back to a word count
            log.debug("tokenizer.encode failed; counting words", exc_info=True)
    return len(text.split()) if text else 0


def chunk_samples(model: Any) -> tuple[int, int]:
    """(first, later) audio chunk sizes of the model's streaming path, in samples."""
    rate = int(getattr(model, "SAMPLE_RATE", INPUT_SAMPLE_RATE) or INPUT_SAMPLE_RATE)
    first_ms = int(getattr(model, "FIRST_CHUNK_MS", 1035) or 1035)
    chunk_ms = int(getattr(model, "CHUNK_MS", 1000) or 1000)
    return max(1, first_ms * rate // 1000), max(1, chunk_ms * rate // 1000)


def chat_once(
    model: Any, request: ChatRequest, msgs: list[dict[str, Any]], has_video: bool
) -> Iterator[ChatEvent]:
    """A non-streaming text turn through ``model.chat``."""
    reset_session(model)
    gen = request.generation
    t0 = time.monotonic()
    want_prompt = compat.explicit(model.chat, "return_prompt")
    result = compat.call(
        model.chat,
        msgs=msgs,
        max_new_tokens=gen.max_new_tokens,
        do_sample=True,
        temperature=gen.temperature,
        top_p=gen.top_p,
        length_penalty=gen.length_penalty,
        stream=False,
        max_slice_nums=request.max_slice_nums,
        use_image_id=request.use_image_id,
        enable_thinking=request.enable_thinking,
        use_tts_template=request.use_tts_template,
        generate_audio=False,
        omni_mode=request.omni_mode or has_video,
        return_prompt=want_prompt,
    )
    prompt = None
    if isinstance(result, (tuple, list)):
        text = result[0]
        prompt = result[1] if want_prompt and len(result) > 1 else None
    else:
        text = result
    text = text if isinstance(text, str) else str(text or "")
    # chat() keeps no token statistics; the prompt it returns gives the input length,
    # approximately (media placeholders count as their markup, not their embeddings)
    stats = getattr(model, "_last_chat_token_stats", None) or {}
    input_tokens = int(stats.get("input_tokens", 0) or 0)
    if not input_tokens and isinstance(prompt, str):
        input_tokens = count_tokens(model, prompt)
    generated = int(stats.get("generated_tokens", 0) or 0) or count_tokens(model, text)
    yield ChatPrefilled(input_tokens=input_tokens)
    yield ChatDone(
        text=text,
        input_tokens=input_tokens,
        generated_tokens=generated,
        audio=None,
        metrics={"total_s": round(time.monotonic() - t0, 4)},
    )


def _init_vocoder(model: Any, voice: np.ndarray | None) -> None:
    if voice is None:
        raise UnsupportedInput(
            "speech output needs a reference voice (tts.ref_audio_data) and this worker has no "
            "default voice",
            "tts.ref_audio_data",
        )
    with compat.private_tempdir():  # the model writes the voice to a temporary WAV it keeps
        model.init_token2wav_cache(prompt_speech_16k=voice)


def chat_streaming(
    model: Any,
    request: ChatRequest,
    msgs: list[dict[str, Any]],
    has_video: bool,
    tts_on: bool,
    voice: np.ndarray | None,
) -> Iterator[ChatEvent]:
    """A turn through the streaming API: text deltas and ~1 s audio pieces as they come."""
    gen = request.generation
    session_id = f"chat-{uuid.uuid4().hex}"
    use_tts_template = bool(request.use_tts_template or tts_on)
    t0 = time.monotonic()
    reset_session(model)
    if tts_on:
        _init_vocoder(model, voice)
    segments, last_chunk = streaming_segments(msgs, *chunk_samples(model))
    for i, segment in enumerate(segments):
        compat.call(
            model.streaming_prefill,
            session_id=session_id,
            msgs=[segment],
            omni_mode=bool(request.omni_mode or has_video),
            max_slice_nums=request.max_slice_nums,
            use_tts_template=use_tts_template,
            enable_thinking=request.enable_thinking,
            is_last_chunk=i == last_chunk,
        )
    input_tokens = kv_length(model)
    prefill_s = time.monotonic() - t0
    yield ChatPrefilled(input_tokens=input_tokens)

    t1 = time.monotonic()
    texts: list[str] = []
    audio: list[np.ndarray] = []
    first_delta_s: float | None = None
    stream = compat.call(
        model.streaming_generate,
        session_id=session_id,
        generate_audio=tts_on,
        max_new_tokens=gen.max_new_tokens,
        do_sample=True,
        temperature=gen.temperature,
        top_p=gen.top_p,
        length_penalty=gen.length_penalty,
        use_tts_template=use_tts_template,
        enable_thinking=request.enable_thinking,
    )
    for item in stream:
        if item is None or not isinstance(item, (tuple, list)) or len(item) < 2:
            continue
        first, second = item[0], item[1]
        if isinstance(first, str):  # text-only generation: (text_delta, finished)
            text, wave = first, None
        else:  # with audio: (waveform, text_delta)
            wave = None if first is None else to_mono_float32(first)
            text = second if isinstance(second, str) else ""
        if wave is not None and wave.size == 0:
            wave = None
        if not text and wave is None:
            continue
        if first_delta_s is None:
            first_delta_s = time.monotonic() - t1
        if text:
            texts.append(text)
        if wave is not None:
            audio.append(wave)
        if request.streaming:
            yield ChatDelta(text=text, audio=wave)
    full_text = "".join(texts)
    # the model keeps generated ids only when it speaks; a text-only turn counts its text
    generated_ids = getattr(model, "_streaming_generated_token_ids", None) if tts_on else None
    generated = len(generated_ids) if generated_ids else count_tokens(model, full_text)
    yield ChatDone(
        text=full_text,
        input_tokens=input_tokens,
        generated_tokens=int(generated),
        audio=np.concatenate(audio).astype(np.float32) if audio else None,
        metrics={
            "prefill_s": round(prefill_s, 4),
            "generate_s": round(time.monotonic() - t1, 4),
            "first_delta_s": None if first_delta_s is None else round(first_delta_s, 4),
            "audio_seconds": round(sum(a.size for a in audio) / OUTPUT_SAMPLE_RATE, 3),
        },
    )
