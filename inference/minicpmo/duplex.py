"""A duplex session on the backend's one wrapper, driven as the official demo's worker drives it.

Per session: ``prepare`` (raw system text or markup, as the revision takes it; the LLM voice;
the TTS voice as a WAV path). Per one-second unit (exactly ``unit_samples`` samples: the
model consumes one second per call and answers a shorter one with "audio not enough" after it
has already fed ``<unit>``): ``streaming_prefill`` -> ``streaming_generate`` ->
``finalize_unit`` where the revision has it. A forced listen closes the model's speaking turn
(``<|turn_eos|>``, TTS and vocoder reset) before it listens. On close: ``set_session_stop``,
then the wrapper's streaming state, KV cache, vocoder caches and the model session are reset
and the chat streaming constants restored, so nothing reaches the next session or chat turn.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    BackendError,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    InferenceError,
    UnsupportedInput,
)
from inference.minicpmo import compat
from inference.minicpmo.chat import map_error, reset_session
from inference.minicpmo.loading import LoadedModel, torch_module
from inference.minicpmo.messages import as_float_audio, decode_image
from inference.minicpmo.options import GENERATE_ARGUMENTS, validate_settings
from omnicore.audio import to_mono_float32, write_wav

log = logging.getLogger("omniserve.inference.minicpmo")


class DuplexHost(Protocol):
    """What a duplex session uses of its backend: the loaded model and wrapper, the duplex
    settings, and the call that frees the model for the next session.

    (``MiniCPMOBackend`` is one; naming the needs here keeps this module below backend.py,
    which imports it, instead of the two importing each other.)
    """

    model: Any
    duplex_wrapper: Any
    loaded: LoadedModel
    device: str
    default_voice: np.ndarray | None
    duplex_defaults: dict[str, Any]
    duplex_generate_audio: bool
    duplex_system_prompt: str
    duplex_prompt_format: str
    max_context_tokens: int
    step_token_reserve: int
    vision_tokens_per_slice: int
    vision_query_tokens: int

    def session_closed(self, session: MiniCPMODuplexSession) -> None:
        """A duplex session ended: the model serves the next session or chat turn."""
        ...


_TOKENIZER_CACHES = ("stream_cache", "hift_cache_dict", "cache")  # the vocoder's live caches


def _voice(samples: np.ndarray | None, field_name: str) -> np.ndarray | None:
    if samples is None or not np.asarray(samples).size:
        return None
    return as_float_audio(samples, field_name)


class MiniCPMODuplexSession(DuplexSession):
    """One full-duplex conversation on the shared model and wrapper."""

    def __init__(self, backend: DuplexHost) -> None:
        self._backend = backend
        self._model = backend.model
        self._duplex: Any = None
        self._settings: dict[str, Any] = {}
        self._prompt_wav_path: str | None = None
        self._llm_voice: np.ndarray | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._interrupt = False
        self._closed = False
        self._context_full = False
        self._steps = 0
        self.prompt_length = 0

    # ------------------------------------------------------------------ prepare

    def prepare(self, config: DuplexConfig) -> int:
        if self._closed:
            raise BackendError("duplex session is closed")
        if self._duplex is not None:
            raise BackendError("duplex session is already prepared")
        b = self._backend
        if b.duplex_wrapper is None:
            self._abort()
            raise BackendError(
                "this MiniCPM-o remote code has no as_duplex(); duplex sessions need the model "
                "repository's modeling_minicpmo.py revision that provides it"
            )
        try:
            settings = dict(b.duplex_defaults)
            settings.update(validate_settings(dict(config.config or {})))
            llm_voice = _voice(config.ref_audio, "voice.ref_audio_base64")
            if llm_voice is None:
                llm_voice = b.default_voice
            tts_voice = _voice(config.tts_ref_audio, "voice.tts_ref_audio_base64")
            if tts_voice is None:
                tts_voice = llm_voice
            if b.duplex_generate_audio and tts_voice is None:
                raise UnsupportedInput(
                    "speech output needs a reference voice and this worker has no default voice "
                    "(ref_audio_path)",
                    "voice.tts_ref_audio_base64",
                )
        except UnsupportedInput:
            self._abort()
            raise
        self._settings = settings
        self._duplex = duplex = b.duplex_wrapper
        compat.apply_stream_constants(self._model, b.loaded.duplex_constants)
        # a wrapper attribute (read by streaming_generate), not an argument: set per session
        if hasattr(duplex, "force_listen_count"):
            duplex.force_listen_count = settings["force_listen_count"]
        if b.duplex_generate_audio:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="omniserve-voice-")
            self._prompt_wav_path = str(Path(self._tmpdir.name) / "tts_ref.wav")
            write_wav(self._prompt_wav_path, tts_voice, INPUT_SAMPLE_RATE)
        self._llm_voice = llm_voice
        try:
            return self._prime(config)
        except BackendError:
            self._abort()
            raise

    def _prime(self, config: DuplexConfig) -> int:
        """``prepare`` on the wrapper: the system prompt (with the conversation so far after a
        failover or a rollover: the model cannot take the earlier audio back, only what was
        said), the LLM voice as 16 kHz samples, the TTS voice as the session's WAV file."""
        b, duplex = self._backend, self._duplex
        previous = [(t.role, t.text) for t in config.history]
        system = config.system_prompt or b.duplex_system_prompt
        text = compat.primed_text(duplex.prepare, system, previous)
        prompt = compat.prepare_kwargs(
            duplex.prepare, text, self._llm_voice is not None, b.duplex_prompt_format
        )
        t0 = time.monotonic()
        try:
            compat.call(
                duplex.prepare,
                **prompt,
                ref_audio=self._llm_voice,
                prompt_wav_path=self._prompt_wav_path,
            )
        except Exception as exc:
            raise BackendError(f"duplex prepare failed: {exc}") from exc
        self.prompt_length = compat.kv_length(duplex) or 0
        log.info(
            "duplex session prepared in %.2f s; prompt %d tokens",
            time.monotonic() - t0,
            self.prompt_length,
        )
        return self.prompt_length

    def reprime(self, config: DuplexConfig) -> int:
        """A rollover in place: ``prepare`` again on the same wrapper, as the model starts a
        session afresh (it resets its streaming state, KV cache and TTS caches itself), with
        the session's own voices and settings and the conversation in ``config.history``.

        The forced listening of a session's first units is not repeated: the conversation is
        under way (``force_listen_count`` 0 from here on)."""
        self._check_open()
        self._interrupt = False
        self._context_full = False
        length = self._prime(config)
        if hasattr(self._duplex, "force_listen_count"):
            self._duplex.force_listen_count = 0
        return length

    def _abort(self) -> None:
        try:
            self._teardown()
        finally:
            self._closed = True
            self._backend.session_closed(self)

    # ------------------------------------------------------------------ steps

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("duplex session is closed")
        if self._duplex is None:
            raise BackendError("duplex session is not prepared")

    def _frames(self, chunk: DuplexInput) -> tuple[list[Any], int]:
        """Decoded frames and the number of images the model will encode for them."""
        frames = [decode_image(f) for f in chunk.frames]
        slices_each = max(1, int(chunk.max_slice_nums or 1))
        processor = getattr(self._duplex, "processor", None)
        slices = sum(compat.image_slices(processor, f.size, slices_each) for f in frames)
        return frames, slices

    def step(self, chunk: DuplexInput) -> DuplexStep:
        self._check_open()
        b = self._backend
        audio = as_float_audio(chunk.audio, "audio")
        unit = b.loaded.unit_samples
        if audio.size != unit:
            raise UnsupportedInput(
                f"a MiniCPM-o duplex step takes exactly {unit} samples "
                f"({unit / INPUT_SAMPLE_RATE:g} s), got {audio.size}",
                "audio",
            )
        frames, slices = self._frames(chunk)
        duplex = self._duplex
        kv = compat.kv_length(duplex) or 0
        limit = b.max_context_tokens
        reserve = (
            b.step_token_reserve
            + int(self._settings["max_new_speak_tokens_per_chunk"])
            + slices * b.vision_tokens_per_slice
        )
        if self._context_full or kv + reserve > limit:
            # never run a step that could cross the window: report it full, the worker closes
            self._context_full = True
            return DuplexStep(
                listen=True,
                kv_cache_length=max(kv, limit),
                metrics={"context_full": True, "kv_cache_length_actual": kv, "skipped": True},
            )
        force_listen = bool(chunk.force_listen or self._interrupt)
        self._interrupt = False
        t0 = time.monotonic()
        try:
            prefill = compat.call(
                duplex.streaming_prefill,
                audio_waveform=audio,
                frame_list=frames or None,
                max_slice_nums=max(1, int(chunk.max_slice_nums or 1)),
            )
        except Exception as exc:
            raise map_error(exc) from exc
        prefill_s = time.monotonic() - t0
        self._steps += 1
        if isinstance(prefill, dict) and prefill.get("success") is False:
            raise InferenceError(f"the model refused the unit: {prefill.get('reason') or '?'}")
        if isinstance(prefill, dict) and isinstance(prefill.get("n_vision_images"), int):
            slices = int(prefill["n_vision_images"])
        vision = {
            "vision_frames": len(frames),
            "vision_slices": slices,
            "vision_tokens": slices * b.vision_query_tokens if frames else 0,
        }
        result = self._generate(force_listen)
        generate_s = time.monotonic() - t0 - prefill_s
        return self._outcome(result, force_listen, prefill_s, generate_s, vision)

    def _generate_kwargs(self) -> dict[str, Any]:
        kwargs = {key: self._settings[key] for key in GENERATE_ARGUMENTS}
        kwargs["prompt_wav_path"] = self._prompt_wav_path
        return kwargs

    def _generate(self, force_listen: bool) -> Any:
        """``streaming_generate`` (a forced listen closes a speaking turn), ``finalize_unit``."""
        duplex = self._duplex
        fn = duplex.streaming_generate
        kwargs = self._generate_kwargs()
        saved_count = None
        if force_listen:
            if compat.explicit(fn, "force_listen_override"):
                kwargs["force_listen_override"] = True  # the model closes its turn itself
            elif hasattr(duplex, "force_listen_count") and hasattr(
                duplex, "_streaming_generate_count"
            ):
                compat.close_turn(duplex)
                # this revision forces only the first N calls: make this call one of them
                saved_count = duplex.force_listen_count
                duplex.force_listen_count = int(duplex._streaming_generate_count) + 1
            else:
                log.warning("this duplex wrapper cannot be forced to listen; generating normally")
        try:
            result = compat.call(fn, **kwargs)
        except Exception as exc:
            self._finalize(quiet=True)  # a unit left pending would refuse the next prefill
            raise map_error(exc) from exc
        finally:
            if saved_count is not None:
                duplex.force_listen_count = saved_count
        self._finalize()
        if not isinstance(result, dict):
            raise InferenceError(
                f"streaming_generate returned {type(result).__name__}, expected dict"
            )
        return result

    def _finalize(self, quiet: bool = False) -> None:
        """``finalize_unit()`` where the revision defers the unit's end to it."""
        finalize = getattr(self._duplex, "finalize_unit", None)
        if not callable(finalize) or not getattr(self._duplex, "needs_finalize", True):
            return
        try:
            finalize()
        except Exception as exc:
            if quiet:
                log.exception("finalize_unit after a failed step failed")
                return
            raise map_error(exc) from exc

    def _outcome(
        self,
        result: dict[str, Any],
        force_listen: bool,
        prefill_s: float,
        generate_s: float,
        vision: dict[str, int],
    ) -> DuplexStep:
        listen = bool(result.get("is_listen", True))
        wave = None
        if not listen and result.get("audio_waveform") is not None:
            wave = to_mono_float32(result.get("audio_waveform"))
            if wave.size == 0:
                wave = None
        kv_after = compat.kv_length(self._duplex) or 0
        metrics: dict[str, Any] = {
            "prefill_s": round(prefill_s, 4),
            "generate_s": round(generate_s, 4),
            "tts_s": round(
                sum(float(result.get(k) or 0.0) for k in ("cost_tts_prep", "cost_tts")), 4
            ),
            "token2wav_s": round(float(result.get("cost_token2wav") or 0.0), 4),
            "llm_s": round(float(result.get("cost_llm") or 0.0), 4),
            "n_tokens": int(result.get("n_tokens") or 0),
            "n_tts_tokens": int(result.get("n_tts_tokens") or 0),
            "force_listen": force_listen,
            **vision,
        }
        if kv_after >= self._backend.max_context_tokens:
            self._context_full = True
            metrics["context_full"] = True
        return DuplexStep(
            listen=listen,
            kv_cache_length=kv_after,
            text="" if listen else str(result.get("text") or ""),
            audio=wave,
            end_of_turn=bool(result.get("end_of_turn", False)) and not listen,
            metrics=metrics,
        )

    def interrupt(self) -> None:
        """The next unit is forced to listen, closing the model's speaking turn."""
        self._interrupt = True

    # ------------------------------------------------------------------ close

    def _teardown(self) -> None:
        duplex, model = self._duplex, self._model
        if duplex is not None:
            for name in ("set_session_stop", "_reset_streaming_state"):
                fn = getattr(duplex, name, None)
                if callable(fn):
                    try:
                        fn()
                    except Exception:
                        log.exception("duplex %s failed", name)
            decoder_reset = getattr(getattr(duplex, "decoder", None), "reset", None)
            if callable(decoder_reset):
                try:
                    decoder_reset()  # frees the session's KV cache
                except Exception:
                    log.exception("duplex decoder reset failed")
        tokenizer = getattr(getattr(model, "tts", None), "audio_tokenizer", None)
        for attr in _TOKENIZER_CACHES:
            if tokenizer is not None and getattr(tokenizer, attr, None) is not None:
                setattr(tokenizer, attr, None)
        if model is not None:
            reset_session(model)
            compat.apply_stream_constants(model, self._backend.loaded.chat_constants)
        self._duplex = None
        self._model = None  # a closed session must not keep the weights alive (close())
        self._settings = {}
        self._prompt_wav_path = None
        self._llm_voice = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        gc.collect()
        torch = torch_module() if str(self._backend.device).startswith("cuda") else None
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._teardown()
        finally:
            self._backend.session_closed(self)
            log.info("duplex session closed after %d steps", self._steps)
