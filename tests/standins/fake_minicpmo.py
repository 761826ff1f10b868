"""A stand-in for the MiniCPM-o 4.5 model object (no torch, no weights).

It has the method names, signatures and return shapes of the model's remote code
(``modeling_minicpmo.py``: ``MiniCPMO`` and its duplex wrapper) and records every call, so tests
can assert the call sequence a real session makes. It produces deterministic output:

- chat: the answer is ``"echo: <last user text>"``;
- duplex: the model listens until it has heard a loud chunk (RMS > 0.05) followed by a quiet one,
  then speaks ``SPEECH`` over consecutive chunks (one second of 24 kHz audio each), the last one
  with ``end_of_turn``.

Load it through configuration alone::

    create_backend(
        "minicpmo", model_path="/anything", model_loader="tests.standins.fake_minicpmo:load"
    )

(``omniserve worker --backend minicpmo --model /anything`` plus the backend option
``model_loader=tests.standins.fake_minicpmo:load``). ``load`` takes the same keyword options the
backend gives a loader.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

SPEECH = ["Hello", " there,", " how can I help?"]
OUT_RATE = 24_000

#: every model created by ``load`` in this process (tests look at the last one)
INSTANCES: list[FakeMiniCPMO] = []
_lock = threading.Lock()


def _tokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


class FakeAudioTokenizer:
    """The Token2wav vocoder's live caches (what a session must not leak)."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.stream_cache: Any = None
        self.hift_cache_dict: Any = None

    def set_stream_cache(self, prompt_wav_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        self.cache = {"prompt": prompt_wav_path}
        return {"flow": prompt_wav_path}, {"hift": prompt_wav_path}


class FakeTTS:
    def __init__(self) -> None:
        self.audio_tokenizer: FakeAudioTokenizer | None = None


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(_tokens(text)))

    def decode(self, ids: list[int]) -> str:
        return " ".join("tok" for _ in ids)


class FakeProcessor:
    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()


class FakeStreamDecoder:
    def __init__(self) -> None:
        self.cache_length = 0

    def get_cache_length(self) -> int:
        return self.cache_length

    def reset(self) -> None:
        self.cache_length = 0


def _wave(seconds: float, freq: float = 220.0) -> np.ndarray:
    n = int(OUT_RATE * seconds)
    t = np.arange(n, dtype=np.float32) / OUT_RATE
    return (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


class FakeDuplex:
    """Mirrors ``MiniCPMODuplex``: prepare / streaming_prefill / streaming_generate / as_simplex."""

    def __init__(
        self,
        model: FakeMiniCPMO,
        generate_audio: bool = True,
        force_listen_count: int = 0,
        tts_temperature: float = 0.8,
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.generate_audio = generate_audio
        self.force_listen_count = force_listen_count
        self.tts_temperature = tts_temperature
        self.init_kwargs = dict(kwargs)
        self.decoder = FakeStreamDecoder()
        # sampling attributes the reference wrapper keeps (and the demo leaks across sessions)
        self.temperature = 0.7
        self.top_k = 20
        self.top_p = 0.8
        self.listen_prob_scale = 1.0
        self.max_new_speak_tokens_per_chunk = 20
        self.text_repetition_penalty = 1.05
        self.text_repetition_window_size = 512
        self.break_set = False
        self.session_stopped = False
        self._reset_streaming_state()

    def _log(self, name: str, **kwargs: Any) -> None:
        self.model.calls.append((f"duplex.{name}", kwargs))

    def _reset_streaming_state(self) -> None:
        self._streaming_generate_count = 0
        self.pending = False
        self.heard_voice = False
        self.last_rms = 0.0
        self.speech_index = -1
        self.prompt_wav_path: str | None = None
        self.token2wav_initialized = False

    def clear_break_event(self) -> None:
        self.break_set = False

    def clear_session_stop(self) -> None:
        self.session_stopped = False

    def set_break_event(self) -> None:
        self.break_set = True

    def set_session_stop(self) -> None:
        self._log("set_session_stop")
        self.session_stopped = True
        self.break_set = True

    def prepare(
        self,
        prefix_system_prompt: str | None = None,
        suffix_system_prompt: str | None = None,
        ref_audio: np.ndarray | None = None,
        prompt_wav_path: str | None = None,
        context_previous_marker: str = "\n\nprevious: ",
    ) -> str:
        self._log(
            "prepare",
            prefix_system_prompt=prefix_system_prompt,
            suffix_system_prompt=suffix_system_prompt,
            ref_audio=None if ref_audio is None else len(ref_audio),
            prompt_wav_path=prompt_wav_path,
        )
        self.clear_break_event()
        self.clear_session_stop()
        self._reset_streaming_state()
        self.decoder.reset()
        if prompt_wav_path and self.generate_audio:
            with open(prompt_wav_path, "rb") as fh:  # the real wrapper reads it into the vocoder
                if fh.read(4) != b"RIFF":
                    raise ValueError("prompt_wav_path is not a WAV file")
            assert self.model.tts.audio_tokenizer is not None, "init_tts was not called"
            self.model.tts.audio_tokenizer.set_stream_cache(prompt_wav_path)
            self.model.tts.audio_tokenizer.stream_cache = {"flow": prompt_wav_path}
            self.prompt_wav_path = prompt_wav_path
            self.token2wav_initialized = True
        self.decoder.cache_length += _tokens(prefix_system_prompt or "") + _tokens(
            suffix_system_prompt or ""
        )
        if ref_audio is not None:
            self.decoder.cache_length += max(1, len(ref_audio) // 1600)
        return (prefix_system_prompt or "") + (suffix_system_prompt or "")

    def streaming_prefill(
        self,
        audio_waveform: np.ndarray | None = None,
        frame_list: list | None = None,
        text_list: list | None = None,
        max_slice_nums: int | list[int] = 1,
        batch_vision_feed: bool = False,
    ) -> dict[str, Any]:
        n_frames = len(frame_list or [])
        self._log(
            "streaming_prefill",
            audio=None if audio_waveform is None else len(audio_waveform),
            frames=n_frames,
            max_slice_nums=max_slice_nums,
        )
        if self.session_stopped:
            raise RuntimeError("streaming_prefill after session stop")
        if self.pending:
            raise RuntimeError("streaming_prefill called twice without streaming_generate")
        if frame_list:
            from PIL import Image  # frames must arrive decoded, as PIL images

            assert all(isinstance(f, Image.Image) for f in frame_list)
        audio = np.asarray(audio_waveform if audio_waveform is not None else [], dtype=np.float32)
        self.last_rms = float(np.sqrt(np.mean(audio**2))) if audio.size else 0.0
        slices = max_slice_nums if isinstance(max_slice_nums, int) else max(max_slice_nums)
        self.decoder.cache_length += 1 + 10 + n_frames * (slices + 1) * 66
        self.pending = True
        return {"success": True, "cost_vision_process": 0.0, "cost_audio_process": 0.0}

    def streaming_generate(
        self,
        prompt_wav_path: str | None = None,
        max_new_speak_tokens_per_chunk: int = 20,
        decode_mode: str = "sampling",
        temperature: float = 0.7,
        top_k: int = 20,
        top_p: float = 0.8,
        listen_prob_scale: float = 1.0,
        listen_top_k: int | None = None,
        text_repetition_penalty: float = 1.05,
        text_repetition_window_size: int = 512,
        length_penalty: float = 1.0,
        force_listen_override: bool = False,
    ) -> dict[str, Any]:
        self._log(
            "streaming_generate",
            prompt_wav_path=prompt_wav_path,
            max_new_speak_tokens_per_chunk=max_new_speak_tokens_per_chunk,
            decode_mode=decode_mode,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            listen_prob_scale=listen_prob_scale,
            length_penalty=length_penalty,
            force_listen_override=force_listen_override,
        )
        if not self.pending:
            raise RuntimeError("streaming_generate without streaming_prefill")
        self.pending = False
        forced = self._streaming_generate_count < self.force_listen_count or force_listen_override
        self._streaming_generate_count += 1
        base = {
            "current_time": self._streaming_generate_count,
            "cost_llm": 0.001,
            "cost_tts_prep": 0.0,
            "cost_tts": 0.0,
            "cost_token2wav": 0.0,
            "cost_all": 0.001,
            "n_tts_tokens": 0,
        }
        if forced or self.break_set:
            self.speech_index = -1
            self.decoder.cache_length += 1
            return {
                **base,
                "is_listen": True,
                "text": "",
                "audio_waveform": _wave(1.0, 0.0) * 0,
                "end_of_turn": self.break_set,
                "n_tokens": 1,
            }
        loud = self.last_rms > 0.05
        if self.speech_index < 0:
            if loud:
                self.heard_voice = True
            elif self.heard_voice:
                self.heard_voice = False
                self.speech_index = 0
        if self.speech_index < 0:
            self.decoder.cache_length += 1
            return {
                **base,
                "is_listen": True,
                "text": "",
                "audio_waveform": _wave(1.0, 0.0) * 0,
                "end_of_turn": False,
                "n_tokens": 1,
            }
        text = SPEECH[self.speech_index]
        self.speech_index += 1
        end = self.speech_index >= len(SPEECH)
        if end:
            self.speech_index = -1
        n_tokens = min(max_new_speak_tokens_per_chunk, _tokens(text) + 2)
        self.decoder.cache_length += n_tokens
        audio = None
        if self.generate_audio:
            if prompt_wav_path is None or not self.token2wav_initialized:
                raise RuntimeError("speech requested without a prompt_wav_path")
            audio = _wave(0.6 if end else 1.0)
        return {
            **base,
            "is_listen": False,
            "text": text,
            "audio_waveform": audio,
            "end_of_turn": end,
            "n_tokens": n_tokens,
            "n_tts_tokens": 25 if audio is not None else 0,
            "cost_tts": 0.002 if audio is not None else 0.0,
        }

    def as_simplex(self, reset_session: bool = True) -> FakeMiniCPMO:
        self._log("as_simplex", reset_session=reset_session)
        self.model.duplex_open = False
        if reset_session:
            self.model.reset_session(reset_token2wav_cache=True)
        return self.model


class FakeMiniCPMO:
    """Mirrors ``MiniCPMO`` (the AutoModel object)."""

    #: streaming audio chunking of the real class: one user streaming_prefill call carries at most
    #: one chunk, FIRST_CHUNK_MS for the first of a session, then CHUNK_MS
    SAMPLE_RATE = 16_000
    CHUNK_MS = 1000
    FIRST_CHUNK_MS = 1035

    def __init__(self, model_path: str | None = None, **options: Any) -> None:
        self.model_path = model_path
        self.options = dict(options)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.tts = FakeTTS()
        self.processor = FakeProcessor()
        self.device = options.get("device", "cpu")
        self.duplex_open = False
        self.duplex_wrappers: list[FakeDuplex] = []
        self.reset_session(reset_token2wav_cache=True)
        self.calls.clear()

    def _log(self, name: str, **kwargs: Any) -> None:
        self.calls.append((name, kwargs))

    def call_names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # --- loading
    def eval(self) -> FakeMiniCPMO:
        return self

    def to(self, device: str) -> FakeMiniCPMO:
        self.device = device
        return self

    def init_tts(
        self,
        streaming: bool = False,
        model_dir: str | None = None,
        enable_float16: bool = False,
        n_timesteps: int = 10,
    ) -> FakeAudioTokenizer:
        self._log(
            "init_tts", streaming=streaming, enable_float16=enable_float16, n_timesteps=n_timesteps
        )
        self.tts.audio_tokenizer = FakeAudioTokenizer()
        return self.tts.audio_tokenizer

    # --- session state
    def reset_session(self, reset_token2wav_cache: bool = True) -> None:
        self._log("reset_session", reset_token2wav_cache=reset_token2wav_cache)
        self.llm_past_key_values: int | None = None
        self.session_id: str | None = None
        self.new_user_msg = True
        if reset_token2wav_cache:
            self.token2wav_cache: dict[str, Any] | None = None

    def init_token2wav_cache(self, prompt_speech_16k: np.ndarray) -> None:
        self._log("init_token2wav_cache", samples=len(prompt_speech_16k))
        assert self.tts.audio_tokenizer is not None, "init_tts was not called"
        self.token2wav_cache = {"flow_cache_base": len(prompt_speech_16k)}

    def _get_kv_cache_length(self, cache: Any = None) -> int:
        return int(self.llm_past_key_values or 0)

    @staticmethod
    def get_sys_prompt(
        ref_audio: np.ndarray | None = None,
        mode: str = "default",
        language: str = "en",
        ref_audio_max_ms: int | None = None,
    ) -> dict[str, Any]:
        if ref_audio is not None:
            return {
                "role": "system",
                "content": ["Use the voice in the audio prompt.", ref_audio, "You are helpful."],
            }
        return {"role": "system", "content": ["You are a helpful assistant."]}

    # --- chat
    @staticmethod
    def _answer(msgs: list[dict[str, Any]]) -> str:
        last = ""
        for msg in msgs:
            if msg["role"] == "user":
                content = msg["content"] if isinstance(msg["content"], list) else [msg["content"]]
                texts = [c for c in content if isinstance(c, str)]
                if texts:
                    last = " ".join(texts)
        return f"echo: {last}".strip()

    def chat(
        self,
        image: Any = None,
        msgs: list[dict[str, Any]] | None = None,
        vision_hidden_states: Any = None,
        max_new_tokens: int = 4096,
        min_new_tokens: int = 0,
        do_sample: bool = True,
        max_inp_length: int = 8192,
        stream: bool = False,
        stream_input: bool = False,
        max_slice_nums: int | None = None,
        use_image_id: bool | None = None,
        enable_thinking: bool = False,
        use_tts_template: bool = False,
        generate_audio: bool = False,
        output_audio_path: str | None = None,
        omni_mode: bool = False,
        return_prompt: bool = False,
        **kwargs: Any,
    ) -> str | tuple[str, str]:
        assert msgs, "msgs is empty"
        self._log(
            "chat",
            n_msgs=len(msgs),
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            generate_audio=generate_audio,
            omni_mode=omni_mode,
            max_slice_nums=max_slice_nums,
            **kwargs,
        )
        answer = self._answer(msgs)
        words = answer.split()[:max_new_tokens]
        answer = " ".join(words)
        if return_prompt:  # the real chat() keeps no token statistics; it can return its prompt
            prompt = "".join(
                f"<|im_start|>{m['role']}\n{FakeMiniCPMO._text(m)}<|im_end|>\n" for m in msgs
            )
            return answer, prompt + "<|im_start|>assistant\n"
        return answer

    @staticmethod
    def _text(msg: dict[str, Any]) -> str:
        content = msg["content"] if isinstance(msg["content"], list) else [msg["content"]]
        return " ".join(c if isinstance(c, str) else "<media>" for c in content)

    def streaming_prefill(
        self,
        session_id: str,
        msgs: list[dict[str, Any]],
        omni_mode: bool = True,
        max_slice_nums: int | None = None,
        use_tts_template: bool = True,
        enable_thinking: bool = False,
        is_last_chunk: bool = False,
        **kwargs: Any,
    ) -> str:
        assert session_id is not None, "session_id cannot be None"
        assert len(msgs) == 1, "streaming_prefill takes one message"
        msg = msgs[0]
        audios = [c for c in msg["content"] if isinstance(c, np.ndarray)]
        assert len(audios) <= 1, "streaming mode only supports single audio"
        self._log(
            "streaming_prefill",
            session_id=session_id,
            role=msg["role"],
            n_items=len(msg["content"]),
            omni_mode=omni_mode,
            is_last_chunk=is_last_chunk,
            use_tts_template=use_tts_template,
        )
        if self.session_id != session_id:
            self.reset_session(reset_token2wav_cache=False)
            self.session_id = session_id
            self._prefilled: list[dict[str, Any]] = []
            self.audio_chunk_idx = 0
            self._short_chunk_open = False
        if msg["role"] == "user" and audios:
            # the real streaming path encodes exactly one chunk per call: a longer waveform fails in
            # get_omni_embedding, a short chunk that is not flushed with is_last_chunk starves the
            # next one (conv1d "kernel size can't be greater than actual input size")
            limit_ms = self.FIRST_CHUNK_MS if self.audio_chunk_idx == 0 else self.CHUNK_MS
            limit = limit_ms * self.SAMPLE_RATE // 1000
            if len(audios[0]) > limit:
                raise RuntimeError(
                    "The expanded size of the tensor must match: audio chunk of "
                    f"{len(audios[0])} samples > {limit}"
                )
            if self._short_chunk_open:
                raise RuntimeError(
                    "Kernel size can't be greater than actual input size "
                    "(short audio chunk mid-stream)"
                )
            full = self.CHUNK_MS * self.SAMPLE_RATE // 1000
            self._short_chunk_open = len(audios[0]) < full and not is_last_chunk
            self.audio_chunk_idx += 1
        self._prefilled.append(msg)
        self.llm_past_key_values = (
            int(self.llm_past_key_values or 0)
            + 5
            + 10 * len(audios)
            + sum(64 for c in msg["content"] if not isinstance(c, (str, np.ndarray)))
        )
        return "<prompt>"

    def streaming_generate(
        self,
        session_id: str,
        bos_input: Any = None,
        generate_audio: bool = True,
        audio_token_chunk_size: int = 25,
        tts_sampling_params: Any = None,
        max_new_tokens: int = 256,
        enable_thinking: bool = False,
        use_tts_template: bool = True,
        do_sample: bool = True,
        enable_speculative_snapshot: bool = False,
        **kwargs: Any,
    ) -> Iterator[tuple[Any, Any]]:
        self._log(
            "streaming_generate",
            session_id=session_id,
            generate_audio=generate_audio,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            **kwargs,
        )
        assert session_id == self.session_id, "generate for a session that was not prefilled"
        if generate_audio:
            assert self.token2wav_cache is not None, "generate_audio without init_token2wav_cache"
        words = self._answer(self._prefilled).split()[:max_new_tokens]
        # like the real class: the id list is dropped at the start and kept only with audio output
        if hasattr(self, "_streaming_generated_token_ids"):
            del self._streaming_generated_token_ids
        for i, word in enumerate(words):
            delta = word if i == 0 else " " + word
            if generate_audio:
                self._streaming_generated_token_ids = getattr(
                    self, "_streaming_generated_token_ids", []
                )
                self._streaming_generated_token_ids.append(i)
            self.llm_past_key_values = int(self.llm_past_key_values or 0) + 1
            if generate_audio:
                yield _wave(1.0), delta
            else:
                yield delta, i == len(words) - 1

    # --- duplex (as_duplex is in the model repository's remote code; the MiniCPM-o-Demo copy of
    # modeling_minicpmo.py has none: there MiniCPMODuplex loads its own copy of the weights)
    def as_duplex(self, device: str | None = None, **kwargs: Any) -> FakeDuplex:
        self._log("as_duplex", **kwargs)
        assert not self.duplex_open, "as_duplex while another duplex wrapper is live"
        self.duplex_open = True
        wrapper = FakeDuplex(self, **kwargs)
        self.duplex_wrappers.append(wrapper)
        return wrapper


def load(model_path: str | None, **options: Any) -> FakeMiniCPMO:
    """Loader hook for ``MiniCPMOBackend(model_loader=...)``."""
    model = FakeMiniCPMO(model_path, **options)
    with _lock:
        INSTANCES.append(model)
    return model
