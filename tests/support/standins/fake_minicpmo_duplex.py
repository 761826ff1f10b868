"""The strict stand-in's duplex wrapper: ``MiniCPMODuplex`` as the model's code behaves.

(This module: the state and behaviour all revisions share; fake_minicpmo_revisions.py: the
three revisions' public methods; fake_minicpmo_decoder.py: the KV cache and its grammar.)

Built from the model repository's ``modeling_minicpmo.py`` (``MiniCPMODuplex``,
``from_existing_model``) and the MiniCPM-o-Demo's ``DuplexCapability`` (deferred
``finalize_unit``); names, signatures, defaults and return shapes are theirs. Three revisions:

- ``PublishedDuplex``: ``prepare`` wraps the raw system text itself; ``streaming_generate(...,
  length_penalty, force_listen_override)`` leaves the unit open until ``finalize_unit()``, and
  ``streaming_prefill`` refuses to run before it; a forced listen closes a speaking turn;
- ``LegacyDuplex``: the older repository code: no ``finalize_unit``, no override (a forced listen
  only through ``force_listen_count``), the unit finished inside ``streaming_generate``;
- ``DemoDuplex``: the demo's copy, whose ``prepare`` takes the chat markup from its caller.

Where the real code would silently corrupt its state, this raises ``StandInFault``: a second
``<unit>`` inside an open one (a short prefill answered "audio not enough" after feeding it), a
system prompt wrapped twice (or not at all, for the demo's copy), a new turn on stale TTS state,
audio lagging a full second behind. Where the real code refuses, it refuses the same way.
Deterministic behaviour: it listens until it has heard a loud unit (RMS > 0.05) then a quiet one,
then speaks ``SPEECH`` over consecutive units, the last one with ``end_of_turn``.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import numpy as np

from tests.support.standins.fake_minicpmo_decoder import (
    AUDIO_TOKENS_PER_UNIT,
    QUERY_NUM,
    SPEECH,
    VOCAB,
    Embedding,
    StandInFault,
    StreamDecoder,
    wave,
)

# the model's marker of earlier content (``prepare``'s ``context_previous_marker`` default)
PREVIOUS_MARKER = "\n\nprevious: "
AUDIO_START = "\n<|audio_start|>"


class DuplexCore:
    """State and behaviour shared by the revisions (``from_existing_model`` and friends)."""

    reports_vision_images = False

    _default_duplex_params: ClassVar[dict[str, Any]] = {
        "generate_audio": True,
        "ls_mode": "explicit",
        "max_new_speak_tokens_per_chunk": 20,
        "text_repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_k": 100,
        "top_p": 0.8,
        "text_repetition_window_size": 512,
        "listen_prob_scale": 1.0,
        "force_listen_count": 0,
        "tts_temperature": 0.8,
        "enable_float16": False,
        "n_timesteps": 10,
        "chunk_ms": 1000,
        "first_chunk_ms": 1035,
        "cnn_redundancy_ms": 20,
        "sample_rate": 16000,
    }

    @classmethod
    def from_existing_model(cls, model: Any, device: str | None = None, **kwargs: Any) -> Any:
        def param(name: str) -> Any:
            return kwargs[name] if name in kwargs else cls._default_duplex_params.get(name)

        self = cls.__new__(cls)
        self.model = model
        self.device = device or "cuda"
        self.init_kwargs = dict(kwargs)
        self.generate_audio = param("generate_audio")
        self.processor = model.processor
        self.tokenizer = model.processor.tokenizer
        # like the repository code: the vocoder is (re)loaded here, whatever generate_audio says
        model.init_tts(enable_float16=param("enable_float16"), n_timesteps=param("n_timesteps"))
        self.break_event = threading.Event()
        self.session_stop_event = threading.Event()
        for name in (
            "max_new_speak_tokens_per_chunk",
            "text_repetition_penalty",
            "temperature",
            "top_k",
            "top_p",
            "text_repetition_window_size",
            "listen_prob_scale",
            "force_listen_count",
            "tts_temperature",
        ):
            setattr(self, name, param(name))
        self.CHUNK_MS = param("chunk_ms")
        self.FIRST_CHUNK_MS = param("first_chunk_ms")
        self.CNN_REDUNDANCY_MS = param("cnn_redundancy_ms")
        self.SAMPLE_RATE = param("sample_rate")
        for name in ("CHUNK_MS", "FIRST_CHUNK_MS", "CNN_REDUNDANCY_MS", "SAMPLE_RATE"):
            setattr(model, name, getattr(self, name))
        self.unit_token_id = VOCAB["<unit>"]
        self.listen_token_id = VOCAB["<|listen|>"]
        self.turn_eos_token_id = VOCAB["<|turn_eos|>"]
        self.chunk_eos_token_id = VOCAB["<|chunk_eos|>"]
        self.decoder = StreamDecoder()
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.max_backlog = 0
        self.refused_prefills = 0
        self._reset_streaming_state()
        model.duplex_wrappers.append(self)
        return self

    # -- events
    def set_break_event(self) -> None:
        self.break_event.set()

    def clear_break_event(self) -> None:
        self.break_event.clear()

    def set_session_stop(self) -> None:
        self.session_stop_event.set()
        self.break_event.set()
        self.primed_with = None  # the session is over: the next prepare starts another

    def clear_session_stop(self) -> None:
        self.session_stop_event.clear()

    def is_break_set(self) -> bool:
        return self.break_event.is_set()

    def is_session_stop_set(self) -> bool:
        return self.session_stop_event.is_set()

    # -- state
    def _reset_streaming_state(self) -> None:
        self.audio_chunk_idx = 0
        self.current_turn_ended = True
        self.tts_text_start_pos = 0
        self.tts_past_key_values: Any = None
        self.tts_current_turn_start_time: Any = None
        self.token2wav_initialized = False
        self.token2wav_buffer: list[int] = []
        self.audio_buffer = np.zeros(0, dtype=np.float32)
        self.pending_logits: Any = None
        self._streaming_generate_count = 0
        self._pending_finalize: Any = None
        self.speech_index = -1
        self.heard_voice = False
        self.last_rms = 0.0

    def _init_token2wav_cache(self, prompt_wav_path: str) -> None:
        tokenizer = self.model.tts.audio_tokenizer
        tokenizer.cache = None
        flow, hift = tokenizer.set_stream_cache(prompt_wav_path)
        self.flow_cache_base, self.hift_cache_base = dict(flow), dict(hift)
        self.token2wav_initialized = True

    def _reset_token2wav_for_new_turn(self) -> None:
        if self.token2wav_initialized:
            tokenizer = self.model.tts.audio_tokenizer
            tokenizer.stream_cache = dict(self.flow_cache_base)
            tokenizer.hift_cache_dict = dict(self.hift_cache_base)
            self.token2wav_buffer = [4218] * 3

    def _record(self, name: str, **kwargs: Any) -> None:
        self.log.append((name, kwargs))
        self.model.calls.append((f"duplex.{name}", kwargs))

    # -- prepare
    def _check_prime(self, prefix: str, ref_audio: Any, prompt_wav_path: Any) -> None:
        """The layout of earlier content, and a prepare again within a live session (a
        rollover): the same system prompt, LLM voice and TTS voice file contents as the
        session's first prepare, the conversation behind the model's own marker inside the
        system text, before the voice."""
        if prefix.count(PREVIOUS_MARKER) > 1:
            raise StandInFault("earlier content marked twice in one system prompt")
        system, _, previous = prefix.partition(PREVIOUS_MARKER)
        if PREVIOUS_MARKER in prefix:
            if not previous.strip() or previous.startswith(AUDIO_START):
                raise StandInFault("the previous-content marker with nothing behind it")
            if ref_audio is not None and not previous.endswith(AUDIO_START):
                raise StandInFault("earlier content placed after the reference voice")
        if ref_audio is not None:
            voice = np.asarray(ref_audio)
            if voice.dtype != np.float32 or voice.ndim != 1:
                raise StandInFault(
                    f"ref_audio must be 1-D float32, got {voice.dtype} {voice.shape}"
                )
        wav = None
        if prompt_wav_path:
            with open(prompt_wav_path, "rb") as fh:
                wav = fh.read()
        own = (system.removesuffix(AUDIO_START), ref_audio, wav)
        before = getattr(self, "primed_with", None)
        if before is not None:  # a prepare again while the session is live
            if own[0] != before[0]:
                raise StandInFault(f"a re-prime changed the system prompt: {own[0][:60]!r}")
            same_voice = (own[1] is None) == (before[1] is None) and (
                own[1] is None or np.array_equal(own[1], before[1])
            )
            if not same_voice:
                raise StandInFault("a re-prime changed the LLM reference voice")
            if own[2] != before[2]:
                raise StandInFault("a re-prime changed the TTS voice file")
        self.primed_with = own
        self.primes = getattr(self, "primes", 0) + 1

    def _prepare(self, prefix: str, suffix: str, ref_audio: Any, prompt_wav_path: Any) -> str:
        self._check_prime(prefix, ref_audio, prompt_wav_path)
        self.clear_break_event()
        self.clear_session_stop()
        self._reset_streaming_state()
        self.decoder.reset()
        self.model.init_streaming_processor()
        if prompt_wav_path and self.generate_audio:
            with open(prompt_wav_path, "rb") as fh:  # the vocoder reads the file
                if fh.read(4) != b"RIFF":
                    raise ValueError("prompt_wav_path is not a WAV file")
            self._init_token2wav_cache(prompt_wav_path)
            self._reset_token2wav_for_new_turn()
        words = prefix.replace("\n", " ").split()
        self.decoder.feed(Embedding(words))
        if ref_audio is not None:
            self.decoder.feed(Embedding(["<ref_audio>"], max(1, len(ref_audio) // 1600)))
        self.decoder.feed(Embedding(suffix.split() if suffix else []))
        self.decoder.prompt_done = True
        self.system_prompt = (
            prefix + ("[audio embedding]" if ref_audio is not None else "") + suffix
        )
        return self.system_prompt

    # -- prefill
    def _prefill(self, audio_waveform: Any, frame_list: Any, max_slice_nums: Any) -> dict:
        def result(success: bool, reason: str = "") -> dict[str, Any]:
            return {"success": success, "reason": reason, "cost_audio_process": 0.0, "cost_all": 0}

        if self.is_session_stop_set() or self.is_break_set():
            return result(False)
        has_frames = frame_list is not None and len(frame_list) > 0
        has_audio = audio_waveform is not None and len(audio_waveform) > 0
        if not has_frames and not has_audio:
            return result(False)
        self.pending_logits = None
        self.decoder.feed(self.decoder.embed_token(self.unit_token_id))
        slices = 0
        if has_frames:
            from PIL import Image

            if not all(isinstance(f, Image.Image) for f in frame_list):
                raise TypeError("frame_list must hold PIL images")
            for frame in frame_list:
                grid = self.processor.image_processor.get_sliced_grid(
                    frame.size, max_slice_nums, nerver_split=False
                )
                slices += 1 + (grid[0] * grid[1] if grid else 0)
            self.decoder.feed(Embedding(["<image>", "img", "</image>"], slices * (QUERY_NUM + 2)))
        if has_audio:
            audio = np.asarray(audio_waveform, dtype=np.float32)
            self.audio_buffer = np.concatenate([self.audio_buffer, audio])
            if self.audio_chunk_idx == 0:
                required = self.FIRST_CHUNK_MS * self.SAMPLE_RATE // 1000
                if self.audio_buffer.size < required:
                    pad = np.zeros(required - self.audio_buffer.size, dtype=np.float32)
                    self.audio_buffer = np.concatenate([pad, self.audio_buffer])
                need = (required // 160) * 160  # aligned to the mel hop, as the processor does
            else:
                need = self.CHUNK_MS * self.SAMPLE_RATE // 1000
            if self.audio_buffer.size < need:
                self.refused_prefills += 1
                return result(
                    False, f"audio not enough: need {need} samples, only {self.audio_buffer.size}"
                )
            chunk = self.audio_buffer[:need]
            self.last_rms = float(np.sqrt(np.mean(chunk**2)))
            self.heard_voice = self.heard_voice or self.last_rms > 0.05
            self.decoder.feed(Embedding(["<audio>"], AUDIO_TOKENS_PER_UNIT), return_logits=True)
            self.audio_buffer = self.audio_buffer[need:]
            backlog = int(self.audio_buffer.size)
            self.max_backlog = max(self.max_backlog, backlog)
            if backlog > 160:  # more than the first unit's alignment remainder (80 samples)
                raise StandInFault(f"the model lags the input by {backlog} samples")
            self.audio_chunk_idx += 1
        self.pending_logits = object()
        if self.reports_vision_images:  # the demo's copy counts the images it encoded
            return {**result(True), "n_vision_images": slices}
        return result(True)

    # -- generate
    def _decide(self, forced: bool) -> tuple[bool, str, bool]:
        """(listen, text, end_of_turn) for this unit; moves the scripted conversation on."""
        if forced:
            return True, "", False
        if self.current_turn_ended:
            if self.heard_voice and self.last_rms <= 0.05:
                if self.tts_text_start_pos or self.tts_past_key_values is not None:
                    raise StandInFault("a new speaking turn on the previous turn's TTS state")
                self.heard_voice = False
                self.speech_index = 0
            else:
                return True, "", False
        # the current turn is not over: the model may not listen (it says <|tts_bos|> instead)
        if self.speech_index < 0 or self.speech_index >= len(SPEECH):
            self.speech_index = 0
        text = SPEECH[self.speech_index]
        self.speech_index += 1
        end = self.speech_index >= len(SPEECH)
        return False, text, end

    def _speak_tokens(self, text: str, end: bool) -> list[str]:
        return ["<|speak|>", *[f"w:{w}" for w in text.split()], *(["<|turn_eos|>"] if end else [])]

    def _generate(self, max_tokens: int, forced: bool) -> tuple[dict[str, Any], str | None]:
        """The unit's decision, fed up to (not including) its terminator and ``</unit>``."""
        listen, text, end = self._decide(forced)
        base = {
            "current_time": self.audio_chunk_idx,
            "cost_llm": 0.001,
            "cost_tts_prep": 0.0,
            "cost_tts": 0.0,
            "cost_token2wav": 0.0,
            "cost_all": 0.001,
            "n_tts_tokens": 0,
        }
        if listen:
            return {
                **base,
                "is_listen": True,
                "text": "",
                "audio_waveform": wave(1.0) * 0,
                "end_of_turn": False,
                "n_tokens": 0,
            }, "<|listen|>"
        tokens = self._speak_tokens(text, end)[: max(1, max_tokens - 1)]
        self.decoder.feed(Embedding(tokens))
        self.current_turn_ended = end
        audio = None
        if self.generate_audio:
            if self.token2wav_initialized:  # else the real one warns and returns None
                audio = wave(0.6 if end else 1.0)
            self.tts_text_start_pos = 0 if end else self.tts_text_start_pos + len(tokens)
            self.tts_past_key_values = None if end else ("tts-kv", self.tts_text_start_pos)
            if end:
                self._reset_token2wav_for_new_turn()
        return {
            **base,
            "is_listen": False,
            "text": text,
            "audio_waveform": audio,
            "end_of_turn": end,
            "n_tokens": len(tokens),
            "n_tts_tokens": 25 if audio is not None else 0,
        }, "<|chunk_eos|>"

    def _close_turn_for_listen(self) -> None:
        """What the deferred-finish revision does before a forced listen while speaking."""
        if not self.current_turn_ended:
            self.decoder.feed(self.decoder.embed_token(self.turn_eos_token_id))
            self.current_turn_ended = True
            self.tts_text_start_pos = 0
            self.tts_past_key_values = None
            self.tts_current_turn_start_time = None
            self._reset_token2wav_for_new_turn()

    @staticmethod
    def _silent_result(end_of_turn: bool) -> dict[str, Any]:
        return {
            "is_listen": True,
            "text": "",
            "audio_waveform": wave(1.0) * 0,
            "end_of_turn": end_of_turn,
            "current_time": 0,
            "n_tokens": 0,
            "n_tts_tokens": 0,
        }
