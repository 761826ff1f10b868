"""A strict stand-in for the MiniCPM-o 4.5 model object (no torch, no weights).

It has the names, signatures and return shapes of the model repository's ``MiniCPMO``
(``modeling_minicpmo.py``) and behaves as that code does where omniserve could get it wrong:

- ``init_tts`` loads the vocoder; a second call (the real one reloads Token2wav for seconds and
  replaces its settings) raises ``StandInFault``; without a TTS module (loaded with
  ``init_tts=False``) it fails as the real one does (AttributeError);
- ``as_duplex`` builds a wrapper through ``from_existing_model`` (tests/support/standins/
  fake_minicpmo_revisions.py), which calls ``init_tts`` itself and overwrites the streaming
  constants (``CNN_REDUNDANCY_MS`` 20): chat turns record the constants they run with;
- ``init_token2wav_cache`` writes the voice to a ``NamedTemporaryFile(delete=False)`` it never
  removes, exactly like the real one;
- chat: the answer is ``"echo: <last user text>"``; ``streaming_prefill`` takes one message with
  at most one audio chunk (1035 ms first, then 1000 ms), a short chunk only as the last.

Every call is recorded in ``model.calls``. Load it through configuration alone::

    create_backend("minicpmo", model_path="/anything",
                   model_loader="tests.support.standins.fake_minicpmo:load")

(or ``--backend-options '{"model_loader": "tests.support.standins.fake_minicpmo:load"}'``). The
loader option ``revision`` picks the duplex wrapper: ``published`` (default), ``legacy`` or
``demo``.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.support.standins.fake_minicpmo_decoder import QUERY_NUM, SPEECH, StandInFault, wave
from tests.support.standins.fake_minicpmo_revisions import REVISIONS

__all__ = ["INSTANCES", "SPEECH", "FakeMiniCPMO", "StandInFault", "load"]

#: every model created by ``load`` in this process (tests look at the last one)
INSTANCES: list[FakeMiniCPMO] = []
_lock = threading.Lock()


def _words(text: str) -> int:
    return max(1, len(text.split())) if text else 0


class FakeAudioTokenizer:
    """The Token2wav vocoder's live caches (what a session must not leak)."""

    def __init__(self, enable_float16: bool, n_timesteps: int) -> None:
        self.enable_float16 = enable_float16
        self.n_timesteps = n_timesteps
        self.cache: Any = None
        self.stream_cache: Any = None
        self.hift_cache_dict: Any = None

    def set_stream_cache(self, prompt_wav_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        with open(prompt_wav_path, "rb") as fh:
            if fh.read(4) != b"RIFF":
                raise ValueError("not a WAV file")
        self.cache = {"prompt": prompt_wav_path}
        self.stream_cache = {"flow": prompt_wav_path}
        return {"flow": prompt_wav_path}, {"hift": prompt_wav_path}


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(_words(text)))

    def decode(self, ids: list[int]) -> str:
        return " ".join("tok" for _ in ids)


class FakeImageProcessor:
    def get_sliced_grid(self, image_size: Any, max_slice_nums: int, nerver_split: bool = False):
        """No slicing at 1; else a 1 x N grid (the real one depends on the image size)."""
        return None if max_slice_nums <= 1 else [1, int(max_slice_nums)]


class FakeMiniCPMO:
    """Mirrors ``MiniCPMO`` (the AutoModel object)."""

    def __init__(self, model_path: str | None = None, **options: Any) -> None:
        self.model_path = model_path
        self.options = dict(options)
        self.revision = REVISIONS[options.get("revision", "published")]
        self.config = SimpleNamespace(_name_or_path=model_path, query_num=QUERY_NUM)
        self.processor = SimpleNamespace(
            tokenizer=FakeTokenizer(), image_processor=FakeImageProcessor()
        )
        if options.get("init_tts", True):
            self.tts = SimpleNamespace(audio_tokenizer=None)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.duplex_wrappers: list[Any] = []
        self.stream_configs: list[dict[str, Any]] = []
        self.token2wav_files: list[str] = []
        self.device = options.get("device", "cpu")
        self.SAMPLE_RATE = 16000
        self.CHUNK_MS = 1000
        self.FIRST_CHUNK_MS = 1035
        self.CNN_REDUNDANCY_MS = 0
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
        model_dir: str | None = None,
        enable_float16: bool = False,
        n_timesteps: int = 10,
        **kwargs: Any,
    ) -> FakeAudioTokenizer:
        self._log("init_tts", enable_float16=enable_float16, n_timesteps=n_timesteps)
        tts = self.tts  # AttributeError without a TTS module, as in the real code
        if tts.audio_tokenizer is not None:
            raise StandInFault("init_tts called again: the vocoder is reloaded, settings replaced")
        tts.audio_tokenizer = FakeAudioTokenizer(enable_float16, n_timesteps)
        return tts.audio_tokenizer

    def as_duplex(self, device: str | None = None, **kwargs: Any) -> Any:
        self._log("as_duplex", **kwargs)
        return self.revision.from_existing_model(model=self, device=device, **kwargs)

    def init_streaming_processor(self) -> None:
        self.stream_configs.append(
            {
                "chunk_ms": self.CHUNK_MS,
                "first_chunk_ms": self.FIRST_CHUNK_MS,
                "cnn_redundancy_ms": self.CNN_REDUNDANCY_MS,
            }
        )
        self.audio_chunk_idx = 0

    # --- session state
    def reset_session(self, reset_token2wav_cache: bool = True) -> None:
        self._log("reset_session", reset_token2wav_cache=reset_token2wav_cache)
        self.llm_past_key_values: int | None = None
        self.session_id: str | None = None
        if reset_token2wav_cache:
            self.token2wav_cache: dict[str, Any] | None = None

    def init_token2wav_cache(self, prompt_speech_16k: np.ndarray) -> None:
        from omnicore.audio import write_wav

        self._log("init_token2wav_cache", samples=len(prompt_speech_16k))
        tokenizer = self.tts.audio_tokenizer
        if tokenizer is None:
            raise AttributeError("'NoneType' object has no attribute 'set_stream_cache'")
        tokenizer.cache = None
        with tempfile.NamedTemporaryFile(suffix=".wav", delete=False) as tmp:  # never removed
            write_wav(tmp.name, prompt_speech_16k, 16000)
            self.token2wav_files.append(tmp.name)
            flow, hift = tokenizer.set_stream_cache(tmp.name)
        self.token2wav_cache = {"flow_cache_base": flow, "hift_cache_base": hift}

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
                "content": ["Clone the voice in the provided audio prompt.", ref_audio, "Help."],
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
        max_new_tokens: int = 4096,
        do_sample: bool = True,
        stream: bool = False,
        max_slice_nums: int | None = None,
        use_image_id: bool | None = None,
        enable_thinking: bool = False,
        use_tts_template: bool = False,
        generate_audio: bool = False,
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
            **kwargs,
        )
        answer = " ".join(self._answer(msgs).split()[:max_new_tokens])
        if return_prompt:
            return answer, "".join(f"<|im_start|>{m['role']}\n..<|im_end|>\n" for m in msgs)
        return answer

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
        if self.session_id != session_id:
            self.reset_session(reset_token2wav_cache=False)
            self.session_id = session_id
            self.init_streaming_processor()
            self._prefilled: list[dict[str, Any]] = []
            self._short_chunk_open = False
        self._log(
            "streaming_prefill",
            session_id=session_id,
            role=msg["role"],
            n_items=len(msg["content"]),
            omni_mode=omni_mode,
            is_last_chunk=is_last_chunk,
            cnn_redundancy_ms=self.stream_configs[-1]["cnn_redundancy_ms"],
        )
        if msg["role"] == "user" and audios:
            limit_ms = self.FIRST_CHUNK_MS if self.audio_chunk_idx == 0 else self.CHUNK_MS
            if len(audios[0]) > limit_ms * self.SAMPLE_RATE // 1000:
                raise RuntimeError("The expanded size of the tensor must match (audio too long)")
            if self._short_chunk_open:
                raise RuntimeError("Kernel size can't be greater than actual input size")
            full = self.CHUNK_MS * self.SAMPLE_RATE // 1000
            self._short_chunk_open = len(audios[0]) < full and not is_last_chunk
            self.audio_chunk_idx += 1
        self._prefilled.append(msg)
        media = sum(64 for c in msg["content"] if not isinstance(c, (str, np.ndarray)))
        self.llm_past_key_values = int(self.llm_past_key_values or 0) + 5 + 10 * len(audios) + media
        return "<prompt>"

    def streaming_generate(
        self,
        session_id: str,
        generate_audio: bool = True,
        max_new_tokens: int = 256,
        enable_thinking: bool = False,
        use_tts_template: bool = True,
        do_sample: bool = True,
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
        if hasattr(self, "_streaming_generated_token_ids"):
            del self._streaming_generated_token_ids  # kept only when speaking, like the real one
        for i, word in enumerate(words):
            delta = word if i == 0 else " " + word
            self.llm_past_key_values = int(self.llm_past_key_values or 0) + 1
            if generate_audio:
                ids = getattr(self, "_streaming_generated_token_ids", [])
                self._streaming_generated_token_ids = [*ids, i]
                yield wave(1.0), delta
            else:
                yield delta, i == len(words) - 1


def load(model_path: str | None, **options: Any) -> FakeMiniCPMO:
    """Loader hook for ``MiniCPMOBackend(model_loader=...)``."""
    model = FakeMiniCPMO(model_path, **options)
    with _lock:
        INSTANCES.append(model)
    return model
