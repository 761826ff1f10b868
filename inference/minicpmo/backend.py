"""The MiniCPM-o 4.5 backend: one model, one duplex wrapper, chat turns and duplex sessions.

The model object is whatever ``AutoModel.from_pretrained(path, trust_remote_code=True)`` returns
for the MiniCPM-o 4.5 weights (its ``modeling_minicpmo.py``), or what a ``model_loader`` hook
returns. Only the public surface of that code is used (see ``compat`` for where revisions
differ): ``chat`` / ``streaming_prefill`` / ``streaming_generate`` for chat turns, and the
duplex wrapper from ``as_duplex`` for duplex sessions, built once when the model loads.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    MAX_CONTEXT_TOKENS,
    Backend,
    BackendError,
    ChatEvent,
    ChatRequest,
    InferenceError,
    UnsupportedInput,
)
from inference.minicpmo import compat, loading
from inference.minicpmo.chat import (
    chat_once,
    chat_streaming,
    count_tokens,
    map_error,
    reset_session,
)
from inference.minicpmo.duplex import MiniCPMODuplexSession
from inference.minicpmo.messages import as_float_audio, convert_messages
from inference.minicpmo.options import DUPLEX_SETTING_DEFAULTS, validate_settings
from omnicore.audio import load_voice

log = logging.getLogger("omniserve.inference.minicpmo")

PROMPT_FORMATS = ("auto", "raw", "wrapped")
#: settings the demo passes when it builds its wrapper (``init_unified(duplex_config=...)``)
WRAPPER_DEFAULTS = (
    "force_listen_count",
    "max_new_speak_tokens_per_chunk",
    "temperature",
    "top_k",
    "top_p",
)


class MiniCPMOBackend(Backend):
    """MiniCPM-o 4.5 loaded once per worker process (bf16, one GPU)."""

    name = "minicpmo"
    max_concurrency = 1

    def __init__(
        self,
        model_path: str | None = None,
        device: str = "cuda",
        dtype: str = "bfloat16",
        attn_implementation: str = "sdpa",
        init_vision: bool = True,
        init_audio: bool = True,
        init_tts: bool = True,
        ref_audio_path: str | None = None,
        model_loader: Callable[..., Any] | str | None = None,
        tts_streaming: bool = True,
        tts_float16: bool = False,
        tts_n_timesteps: int | None = None,
        duplex_generate_audio: bool | None = None,
        duplex_options: dict[str, Any] | None = None,
        duplex_defaults: dict[str, Any] | None = None,
        duplex_system_prompt: str = "Streaming Omni Conversation.",
        duplex_prompt_format: str = "auto",
        tts_language: str = "en",
        max_context_tokens: int = MAX_CONTEXT_TOKENS,
        step_token_reserve: int = 48,
        vision_tokens_per_slice: int = 66,
        loader_options: dict[str, Any] | None = None,
    ) -> None:
        if not model_path and model_loader is None:
            raise ValueError("minicpmo backend needs model_path (a local model directory)")
        if duplex_prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"duplex_prompt_format must be one of {PROMPT_FORMATS}")
        self.model_path = str(model_path) if model_path else None
        self.device = device
        self.init_tts = bool(init_tts)
        self.ref_audio_path = ref_audio_path
        self.duplex_generate_audio = self.init_tts and (
            duplex_generate_audio is None or bool(duplex_generate_audio)
        )
        self.duplex_system_prompt = duplex_system_prompt
        self.duplex_prompt_format = duplex_prompt_format
        self.tts_language = tts_language
        self.max_context_tokens = int(max_context_tokens)
        self.step_token_reserve = int(step_token_reserve)
        self.vision_tokens_per_slice = int(vision_tokens_per_slice)
        self.duplex_defaults = dict(DUPLEX_SETTING_DEFAULTS)
        if duplex_defaults:
            self.duplex_defaults.update(validate_settings(duplex_defaults, strict=True))
        self._spec = loading.LoadSpec(
            model_path=self.model_path,
            device=device,
            dtype=dtype,
            attn_implementation=attn_implementation,
            init_vision=bool(init_vision),
            init_audio=bool(init_audio),
            init_tts=self.init_tts,
            tts_streaming=bool(tts_streaming),
            tts_float16=bool(tts_float16),
            tts_n_timesteps=tts_n_timesteps,
            duplex_generate_audio=self.duplex_generate_audio,
            # the wrapper's own defaults become the demo's, as its worker builds it
            duplex_options={
                **{k: self.duplex_defaults[k] for k in WRAPPER_DEFAULTS},
                **(duplex_options or {}),
            },
            loader=compat.resolve_loader(model_loader),
            loader_options=dict(loader_options or {}),
        )
        self._lock = threading.RLock()
        self._active_duplex: MiniCPMODuplexSession | None = None
        self._closed = False
        self.default_voice: np.ndarray | None = None
        if ref_audio_path:
            self.default_voice = load_voice(ref_audio_path, INPUT_SAMPLE_RATE)
            log.info(
                "default voice %s: %.1f s",
                ref_audio_path,
                self.default_voice.size / INPUT_SAMPLE_RATE,
            )
        self.loaded = loading.load(self._spec)
        self.model: Any = self.loaded.model
        self.duplex_wrapper: Any = self.loaded.duplex
        #: a duplex step consumes exactly one second of input (inference.base.Backend)
        self.unit_samples = self.loaded.unit_samples
        config = getattr(self.model, "config", None)
        self.vision_query_tokens = int(getattr(config, "query_num", 64) or 64)

    # ------------------------------------------------------------------ lifecycle

    def info(self) -> dict[str, Any]:
        s = self._spec
        return {
            "backend": self.name,
            "model_path": self.model_path,
            "device": self.device,
            "dtype": s.dtype,
            "attn_implementation": s.attn_implementation,
            "init_vision": s.init_vision,
            "init_audio": s.init_audio,
            "init_tts": self.init_tts,
            "default_voice": self.ref_audio_path,
            "max_context_tokens": self.max_context_tokens,
            "unit_samples": self.unit_samples,
            "duplex": self.duplex_wrapper is not None,
            "duplex_active": self._active_duplex is not None,
            **self.loaded.info,
            "gpu_memory": loading.gpu_memory(self.device),
        }

    def text_tokens(self, text: str) -> int:
        """The model's tokenizer's count (what a rollover's prime is budgeted with)."""
        return count_tokens(self.model, text)

    def close(self) -> None:
        with self._lock:
            if self._active_duplex is not None:
                self._active_duplex.close()
            self._closed = True
            # every reference to the weights goes, ``loaded``'s too: otherwise empty_cache()
            # below frees only the cache and the weights stay on the GPU (seen on an H100)
            self.model = None
            self.duplex_wrapper = None
            self.loaded.model = None
            self.loaded.duplex = None
        gc.collect()
        torch = loading.torch_module() if str(self.device).startswith("cuda") else None
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _require_model(self) -> Any:
        if self._closed or self.model is None:
            raise BackendError("the minicpmo backend is closed")
        return self.model

    # ------------------------------------------------------------------ chat

    def _tts_voice(self, request: ChatRequest) -> np.ndarray | None:
        tts = request.tts
        if tts.ref_audio is not None and np.asarray(tts.ref_audio).size:
            return as_float_audio(tts.ref_audio, "tts.ref_audio_data")
        if tts.ref_audio_path:
            try:
                return load_voice(tts.ref_audio_path, INPUT_SAMPLE_RATE)
            except (OSError, ValueError) as exc:
                raise UnsupportedInput(
                    f"cannot read tts.ref_audio_path: {exc}", "tts.ref_audio_path"
                ) from exc
        return self.default_voice

    def _sys_prompt_fn(self, request: ChatRequest) -> Callable[..., Any] | None:
        get_sys_prompt = getattr(self.model, "get_sys_prompt", None)
        if get_sys_prompt is None:
            return None
        language = request.tts.language or self.tts_language
        return lambda voice, mode: get_sys_prompt(ref_audio=voice, mode=mode, language=language)

    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        with self._lock:
            model = self._require_model()
            if self._active_duplex is not None:
                raise InferenceError("the model is serving a duplex session")
            if request.tts.enabled and not self.init_tts:
                raise UnsupportedInput(
                    "speech output is disabled on this worker (init_tts=False)", "tts.enabled"
                )
            tts_on = bool(request.tts.enabled)
            voice = self._tts_voice(request) if tts_on else None
            msgs, has_video = convert_messages(request, voice, tts_on, self._sys_prompt_fn(request))
            try:
                if request.streaming or tts_on:
                    yield from chat_streaming(model, request, msgs, has_video, tts_on, voice)
                else:
                    yield from chat_once(model, request, msgs, has_video)
            except (UnsupportedInput, InferenceError, BackendError):
                raise
            except Exception as exc:
                raise map_error(exc) from exc
            finally:
                reset_session(model)

    # ------------------------------------------------------------------ duplex

    def open_duplex(self) -> MiniCPMODuplexSession:
        with self._lock:
            self._require_model()
            if self._active_duplex is not None:
                log.warning("a duplex session was left open; closing it before opening a new one")
                self._active_duplex.close()
            session = MiniCPMODuplexSession(self)
            self._active_duplex = session
            return session

    def session_closed(self, session: MiniCPMODuplexSession) -> None:
        """A duplex session ended: the model serves the next session or chat turn."""
        with self._lock:
            if self._active_duplex is session:
                self._active_duplex = None
