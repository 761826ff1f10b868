"""MiniCPM-o 4.5 backend.

The model object is whatever ``AutoModel.from_pretrained(path, trust_remote_code=True)`` returns for
the MiniCPM-o 4.5 weights (its ``modeling_minicpmo.py``). This adapter uses only the public surface
of that class:

- chat turns: ``chat(msgs=..., ...)`` (non-streaming, text only), or ``reset_session`` +
  ``init_token2wav_cache`` + ``streaming_prefill(session_id, msgs=[one message], ...)`` per
  message/segment + ``streaming_generate(session_id, generate_audio=..., ...)`` which yields
  ``(waveform, text)`` pairs with audio or ``(text, finished)`` pairs without;
- duplex sessions: ``as_duplex(**options)`` returns the duplex wrapper, then ``prepare(...)``, per
  chunk ``streaming_prefill(audio_waveform, frame_list, max_slice_nums)`` and
  ``streaming_generate(...) -> dict(is_listen, text, audio_waveform, end_of_turn, cost_*)``; on close
  ``as_simplex()`` and a full reset.

Keyword arguments are matched against the real signatures (``inspect``) so that the two published
revisions of the remote code (with or without ``force_listen_override``, ``length_penalty`` ...)
both work; an option a revision cannot take is logged, never silently mis-sent.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import io
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    MAX_CONTEXT_TOKENS,
    OUTPUT_SAMPLE_RATE,
    AudioPart,
    Backend,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatEvent,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    ImagePart,
    InferenceError,
    TextPart,
    UnsupportedInput,
    VideoPart,
)
from omnicore.audio import load_voice, to_mono_float32, write_wav

log = logging.getLogger("omniserve.inference.minicpmo")

# Sampling / behaviour settings a duplex session may set through ``DuplexConfig.config``, with
# their defaults (the model card's defaults). Every session starts from a fresh copy of these
# plus the backend's own ``duplex_defaults``: nothing one session sets reaches the next one.
DUPLEX_SETTING_DEFAULTS: dict[str, Any] = {
    "length_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "listen_prob_scale": 1.0,
    "listen_top_k": None,
    "text_repetition_penalty": 1.05,
    "text_repetition_window_size": 512,
    "max_new_speak_tokens_per_chunk": 20,
    "decode_mode": "sampling",
    "force_listen_count": 0,
    "tts_temperature": 0.8,
}
_FLOAT_SETTINGS = {
    "length_penalty",
    "temperature",
    "top_p",
    "listen_prob_scale",
    "text_repetition_penalty",
    "tts_temperature",
}
_INT_SETTINGS = {
    "top_k",
    "listen_top_k",
    "text_repetition_window_size",
    "max_new_speak_tokens_per_chunk",
    "force_listen_count",
}
# settings that belong to the duplex wrapper's construction (as_duplex kwargs) rather than to a call
_DUPLEX_INIT_SETTINGS = {"force_listen_count", "tts_temperature"}
# wrapper attributes reset at the start of every session (in case as_duplex hands back a cached
# object): the reference demo keeps these on a long-lived object and leaks them across sessions
_DUPLEX_ATTR_SETTINGS = (
    "temperature",
    "top_k",
    "top_p",
    "listen_prob_scale",
    "text_repetition_penalty",
    "text_repetition_window_size",
    "max_new_speak_tokens_per_chunk",
    "force_listen_count",
)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    if name in params:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _explicit(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts; log the ones dropped."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(**kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    accepted = {k: v for k, v in kwargs.items() if k in params}
    dropped = sorted(set(kwargs) - set(accepted))
    if dropped:
        log.debug("%s does not take %s; not passed", getattr(fn, "__qualname__", fn), dropped)
    return fn(**accepted)


def _resolve_loader(loader: Callable[..., Any] | str | None) -> Callable[..., Any] | None:
    if loader is None or callable(loader):
        return loader
    if isinstance(loader, str):
        module_name, sep, attr = loader.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"model_loader must be 'package.module:function', got {loader!r}")
        module = importlib.import_module(module_name)
        fn = getattr(module, attr)
        if not callable(fn):
            raise ValueError(f"model_loader {loader!r} is not callable")
        return fn
    raise TypeError("model_loader must be a callable or a 'module:function' string")


def _decode_image(data: bytes) -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is a base dependency
        raise BackendError("Pillow is required for image input") from exc
    try:
        img = Image.open(io.BytesIO(data))
        return img.convert("RGB")
    except Exception as exc:
        raise UnsupportedInput(f"cannot decode image: {exc}", "image") from exc


def _as_float_audio(samples: np.ndarray, field_name: str) -> np.ndarray:
    audio = to_mono_float32(samples)
    if not np.all(np.isfinite(audio)):
        raise UnsupportedInput("audio contains non-finite samples", field_name)
    return audio


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
        duplex_prompt_format: str = "wrapped",
        tts_language: str = "en",
        max_context_tokens: int = MAX_CONTEXT_TOKENS,
        step_token_reserve: int = 48,
        vision_tokens_per_slice: int = 66,
        loader_options: dict[str, Any] | None = None,
    ) -> None:
        if not model_path and model_loader is None:
            raise ValueError("minicpmo backend needs model_path (a local model directory)")
        if duplex_prompt_format not in ("wrapped", "raw"):
            raise ValueError("duplex_prompt_format must be 'wrapped' or 'raw'")
        self.model_path = str(model_path) if model_path else None
        self.device = device
        self.dtype = dtype
        self.attn_implementation = attn_implementation
        self.init_vision = bool(init_vision)
        self.init_audio = bool(init_audio)
        self.init_tts = bool(init_tts)
        self.ref_audio_path = ref_audio_path
        self.tts_streaming = bool(tts_streaming)
        self.tts_float16 = bool(tts_float16)
        self.tts_n_timesteps = tts_n_timesteps
        self.duplex_generate_audio = (
            self.init_tts
            if duplex_generate_audio is None
            else bool(duplex_generate_audio) and self.init_tts
        )
        self.duplex_options = dict(duplex_options or {})
        self.duplex_system_prompt = duplex_system_prompt
        self.duplex_prompt_format = duplex_prompt_format
        self.tts_language = tts_language
        self.max_context_tokens = int(max_context_tokens)
        self.step_token_reserve = int(step_token_reserve)
        self.vision_tokens_per_slice = int(vision_tokens_per_slice)
        self._duplex_defaults = dict(DUPLEX_SETTING_DEFAULTS)
        if duplex_defaults:
            self._duplex_defaults.update(self._validate_settings(duplex_defaults, strict=True))
        self._loader = _resolve_loader(model_loader)
        self._loader_options = dict(loader_options or {})
        self._lock = threading.RLock()
        self._active_duplex: MiniCPMODuplexSession | None = None
        self._closed = False
        self._load_info: dict[str, Any] = {}
        self.default_voice: np.ndarray | None = None
        if ref_audio_path:
            self.default_voice = load_voice(ref_audio_path, INPUT_SAMPLE_RATE)
            log.info(
                "default voice %s: %.1f s",
                ref_audio_path,
                self.default_voice.size / INPUT_SAMPLE_RATE,
            )
        self.model = self._load()

    # ------------------------------------------------------------------ loading

    def _torch(self) -> Any | None:
        try:
            import torch
        except ImportError:
            return None
        return torch

    def _gpu_memory(self) -> dict[str, Any]:
        if not str(self.device).startswith("cuda"):
            return {}
        torch = self._torch()
        if torch is None or not torch.cuda.is_available():
            return {}
        return {
            "gpu_memory_allocated_bytes": int(torch.cuda.memory_allocated()),
            "gpu_memory_reserved_bytes": int(torch.cuda.memory_reserved()),
        }

    def _default_loader(self, model_path: str, **opts: Any) -> Any:
        path = Path(model_path)
        if not path.is_dir() or not (path / "config.json").is_file():
            raise BackendError(
                f"model_path {model_path!r} is not a local model directory (config.json missing)"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
            from transformers import AutoModel
        except ImportError as exc:
            raise BackendError(
                "the minicpmo backend needs the [minicpmo] extra (torch, transformers ...)"
            ) from exc
        torch_dtype = getattr(torch, self.dtype, None)
        if torch_dtype is None:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        model = AutoModel.from_pretrained(
            str(path),
            trust_remote_code=True,
            local_files_only=True,
            torch_dtype=torch_dtype,
            attn_implementation=self.attn_implementation,
            init_vision=self.init_vision,
            init_audio=self.init_audio,
            init_tts=self.init_tts,
            **opts,
        )
        model = model.eval()
        moved = model.to(self.device)
        return moved if moved is not None else model

    def _load(self) -> Any:
        t0 = time.monotonic()
        log.info(
            "loading MiniCPM-o from %s (device=%s dtype=%s attn=%s vision=%s audio=%s tts=%s)",
            self.model_path,
            self.device,
            self.dtype,
            self.attn_implementation,
            self.init_vision,
            self.init_audio,
            self.init_tts,
        )
        before = self._gpu_memory()
        try:
            if self._loader is not None:
                model = self._loader(
                    self.model_path,
                    device=self.device,
                    dtype=self.dtype,
                    attn_implementation=self.attn_implementation,
                    init_vision=self.init_vision,
                    init_audio=self.init_audio,
                    init_tts=self.init_tts,
                    **self._loader_options,
                )
            else:
                model = self._default_loader(self.model_path, **self._loader_options)  # type: ignore[arg-type]
        except (BackendError, ValueError):
            raise
        except Exception as exc:
            raise BackendError(f"loading MiniCPM-o failed: {exc}") from exc
        t_weights = time.monotonic() - t0
        log.info("weights loaded in %.1f s %s", t_weights, self._gpu_memory())

        if self.init_tts and hasattr(model, "init_tts"):
            t1 = time.monotonic()
            tts_kwargs: dict[str, Any] = {"enable_float16": self.tts_float16}
            if self.tts_n_timesteps is not None:
                tts_kwargs["n_timesteps"] = self.tts_n_timesteps
            if _explicit(model.init_tts, "streaming"):
                tts_kwargs["streaming"] = self.tts_streaming
            try:
                _call(model.init_tts, **tts_kwargs)
            except Exception as exc:
                raise BackendError(f"init_tts failed: {exc}") from exc
            log.info("TTS vocoder ready in %.1f s", time.monotonic() - t1)
        after = self._gpu_memory()
        self._load_info = {
            "load_seconds": round(time.monotonic() - t0, 3),
            "weights_seconds": round(t_weights, 3),
            "gpu_memory_before": before,
            "gpu_memory_after": after,
        }
        log.info("MiniCPM-o ready in %.1f s; %s", self._load_info["load_seconds"], after)
        return model

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model_path": self.model_path,
            "device": self.device,
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "init_vision": self.init_vision,
            "init_audio": self.init_audio,
            "init_tts": self.init_tts,
            "default_voice": self.ref_audio_path,
            "max_context_tokens": self.max_context_tokens,
            "duplex_active": self._active_duplex is not None,
            **self._load_info,
            "gpu_memory": self._gpu_memory(),
        }

    def close(self) -> None:
        with self._lock:
            if self._active_duplex is not None:
                self._active_duplex.close()
            self._closed = True
            self.model = None
        gc.collect()
        torch = self._torch()
        if torch is not None and str(self.device).startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ helpers

    def _require_model(self) -> Any:
        if self._closed or self.model is None:
            raise BackendError("the minicpmo backend is closed")
        return self.model

    def _validate_settings(self, values: dict[str, Any], strict: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in values.items():
            if key not in DUPLEX_SETTING_DEFAULTS:
                if strict:
                    raise ValueError(f"unknown duplex setting {key!r}")
                log.info("duplex config key %r is not a MiniCPM-o setting; ignored", key)
                continue
            if value is None:
                if key == "listen_top_k":
                    out[key] = None
                    continue
                raise UnsupportedInput(f"config.{key} must not be null", f"config.{key}")
            try:
                if key in _FLOAT_SETTINGS:
                    if isinstance(value, bool):
                        raise TypeError
                    v: Any = float(value)
                    if not np.isfinite(v) or v < 0:
                        raise ValueError
                elif key in _INT_SETTINGS:
                    if isinstance(value, bool) or (
                        isinstance(value, float) and not value.is_integer()
                    ):
                        raise TypeError
                    v = int(value)
                    if v < 0:
                        raise ValueError
                else:  # decode_mode
                    v = str(value)
                    if v not in ("sampling", "greedy"):
                        raise ValueError
            except (TypeError, ValueError):
                raise UnsupportedInput(
                    f"config.{key} has an invalid value {value!r}", f"config.{key}"
                ) from None
            out[key] = v
        return out

    def _tts_voice(self, request: ChatRequest) -> np.ndarray | None:
        tts = request.tts
        if tts.ref_audio is not None and np.asarray(tts.ref_audio).size:
            return _as_float_audio(tts.ref_audio, "tts.ref_audio_data")
        if tts.ref_audio_path:
            try:
                return load_voice(tts.ref_audio_path, INPUT_SAMPLE_RATE)
            except (OSError, ValueError) as exc:
                raise UnsupportedInput(
                    f"cannot read tts.ref_audio_path: {exc}", "tts.ref_audio_path"
                ) from exc
        return self.default_voice

    def _convert_messages(
        self, request: ChatRequest, voice: np.ndarray | None, tts_on: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        """Messages in the model's format; returns (msgs, has_video)."""
        if not request.messages:
            raise UnsupportedInput("messages must not be empty", "messages")
        msgs: list[dict[str, Any]] = []
        has_system = any(m.role == "system" for m in request.messages)
        if (
            tts_on
            and request.tts.mode != "default"
            and not has_system
            and hasattr(self.model, "get_sys_prompt")
        ):
            sys_msg = self.model.get_sys_prompt(
                ref_audio=voice,
                mode=request.tts.mode,
                language=request.tts.language or self.tts_language,
            )
            if isinstance(sys_msg, dict):
                msgs.append(sys_msg)
        has_video = False
        for i, message in enumerate(request.messages):
            if message.role not in ("system", "user", "assistant"):
                raise UnsupportedInput(f"unknown role {message.role!r}", f"messages[{i}].role")
            content: list[Any] = []
            for part in message.content:
                if isinstance(part, TextPart):
                    content.append(part.text)
                elif isinstance(part, ImagePart):
                    content.append(_decode_image(part.data))
                elif isinstance(part, AudioPart):
                    audio = _as_float_audio(part.samples, f"messages[{i}].content")
                    if audio.size == 0:
                        raise UnsupportedInput("empty audio", f"messages[{i}].content")
                    content.append(audio)
                elif isinstance(part, VideoPart):
                    has_video = True
                    content.extend(self._video_contents(part, i))
                else:
                    raise UnsupportedInput(
                        f"unsupported content part {type(part).__name__}", f"messages[{i}].content"
                    )
            if not content:
                raise UnsupportedInput("message has no content", f"messages[{i}].content")
            msgs.append({"role": message.role, "content": content})
        if msgs[0]["role"] not in ("system", "user"):
            raise UnsupportedInput("the first message must be system or user", "messages[0].role")
        if not any(m["role"] == "user" for m in msgs):
            raise UnsupportedInput("messages need at least one user message", "messages")
        return msgs, has_video

    def _video_contents(self, part: VideoPart, index: int) -> list[Any]:
        segments = [_as_float_audio(s, f"messages[{index}].content") for s in part.audio_segments]
        frames = [_decode_image(f) for f in part.frames]
        if not frames and not segments:
            raise UnsupportedInput("empty video", f"messages[{index}].content")
        out: list[Any] = []
        n_units = max(len(segments), 1)
        per_unit = max(1, len(frames) // n_units) if frames else 0
        for unit in range(n_units):
            out.extend(frames[unit * per_unit : (unit + 1) * per_unit])
            if unit < len(segments):
                out.append(segments[unit])
        out.extend(frames[n_units * per_unit :])
        return out

    def _kv_length(self) -> int:
        fn = getattr(self.model, "_get_kv_cache_length", None)
        if fn is None:
            return 0
        try:
            return int(fn())
        except Exception:  # noqa: BLE001 - a statistic, never fatal
            return 0

    # ------------------------------------------------------------------ chat

    def chat(self, request: ChatRequest) -> Iterator[ChatEvent]:
        with self._lock:
            model = self._require_model()
            if self._active_duplex is not None:
                raise InferenceError("the model is serving a duplex session")
            tts_on = bool(request.tts.enabled) and self.init_tts
            if request.tts.enabled and not self.init_tts:
                raise UnsupportedInput(
                    "speech output is disabled on this worker (init_tts=False)", "tts.enabled"
                )
            voice = self._tts_voice(request) if tts_on else None
            msgs, has_video = self._convert_messages(request, voice, tts_on)
            try:
                if request.streaming or tts_on:
                    yield from self._chat_streaming(model, request, msgs, has_video, tts_on, voice)
                else:
                    yield from self._chat_once(model, request, msgs, has_video)
            except (UnsupportedInput, InferenceError, BackendError):
                raise
            except Exception as exc:
                raise self._map_error(exc) from exc
            finally:
                self._reset_model_session()

    def _map_error(self, exc: Exception) -> Exception:
        text = str(exc)
        if (
            "device-side assert" in text
            or "illegal memory access" in text
            or ("CUDA error" in text and "out of memory" not in text)
        ):
            return BackendError(f"GPU failure: {exc}")
        return InferenceError(f"{type(exc).__name__}: {exc}")

    def _reset_model_session(self) -> None:
        model = self.model
        if model is None:
            return
        reset = getattr(model, "reset_session", None)
        if reset is not None:
            try:
                _call(reset, reset_token2wav_cache=True)
            except Exception:
                log.exception("reset_session failed")

    def _chat_once(
        self, model: Any, request: ChatRequest, msgs: list[dict[str, Any]], has_video: bool
    ) -> Iterator[ChatEvent]:
        self._reset_model_session()
        gen = request.generation
        t0 = time.monotonic()
        want_prompt = _explicit(model.chat, "return_prompt")
        result = _call(
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
        # chat() keeps no token statistics; the prompt it returns (return_prompt=True) gives the
        # input length, approximately: image/audio placeholders count as their markup, not as the
        # embeddings they expand to
        stats = getattr(model, "_last_chat_token_stats", None) or {}
        input_tokens = int(stats.get("input_tokens", 0) or 0)
        if not input_tokens and isinstance(prompt, str):
            input_tokens = self._count_tokens(prompt)
        generated = int(stats.get("generated_tokens", 0) or 0) or self._count_tokens(text)
        yield ChatPrefilled(input_tokens=input_tokens)
        yield ChatDone(
            text=text,
            input_tokens=input_tokens,
            generated_tokens=generated,
            audio=None,
            metrics={"total_s": round(time.monotonic() - t0, 4)},
        )

    def _count_tokens(self, text: str) -> int:
        tokenizer = getattr(getattr(self.model, "processor", None), "tokenizer", None)
        if tokenizer is not None and text:
            try:
                return len(tokenizer.encode(text, add_special_tokens=False))
            except Exception:  # noqa: BLE001
                pass
        return len(text.split()) if text else 0

    def _audio_chunk_samples(self) -> tuple[int, int]:
        """(first, later) chunk sizes in samples that one user ``streaming_prefill`` call may carry.

        The model's streaming audio path encodes exactly one chunk per call (``FIRST_CHUNK_MS``,
        1035 ms, for the first chunk of a session, then ``CHUNK_MS``, 1000 ms); a longer waveform
        in one call fails inside ``get_omni_embedding`` (placeholder count != embedding count).
        """
        model = self.model
        rate = int(getattr(model, "SAMPLE_RATE", INPUT_SAMPLE_RATE) or INPUT_SAMPLE_RATE)
        first_ms = int(getattr(model, "FIRST_CHUNK_MS", 1035) or 1035)
        chunk_ms = int(getattr(model, "CHUNK_MS", 1000) or 1000)
        return max(1, first_ms * rate // 1000), max(1, chunk_ms * rate // 1000)

    def _segments(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Split user messages so that each streaming_prefill call carries at most one audio chunk.

        User audio is cut into the model's streaming chunks (the first chunk of the turn's session
        ``FIRST_CHUNK_MS``, then ``CHUNK_MS``; a short chunk that is not the last one is padded with
        silence); system/assistant messages go in whole (the model encodes their audio, e.g. a
        voice-clone prompt, in one piece).
        """
        first, later = self._audio_chunk_samples()
        out: list[dict[str, Any]] = []
        chunk_sizes: list[tuple[int, int, int]] = []  # (segment index, item index, full chunk size)
        n_user_chunks = 0
        for msg in msgs:
            if msg["role"] != "user":
                out.append(msg)
                continue
            current: list[Any] = []
            for item in msg["content"]:
                if not isinstance(item, np.ndarray):
                    current.append(item)
                    continue
                pos = 0
                while pos < item.size:
                    size = first if n_user_chunks == 0 else later
                    current.append(item[pos : pos + size])
                    chunk_sizes.append((len(out), len(current) - 1, size))
                    pos += size
                    n_user_chunks += 1
                    out.append({"role": "user", "content": current})
                    current = []
            if current:
                out.append({"role": "user", "content": current})
        # every chunk but the last must be a full chunk: a short chunk in the middle of the stream
        # (the tail of one audio part followed by another) is padded with silence, else the
        # streaming mel/CNN front end gets too few frames and fails
        for seg_i, item_i, size in chunk_sizes[:-1]:
            chunk = out[seg_i]["content"][item_i]
            if chunk.size < size:
                out[seg_i]["content"][item_i] = np.concatenate(
                    [chunk, np.zeros(size - chunk.size, dtype=chunk.dtype)]
                )
        return out

    @staticmethod
    def _last_chunk_index(segments: list[dict[str, Any]]) -> int:
        """The segment that gets ``is_last_chunk=True``: the one with the last user audio chunk
        (it flushes the model's streaming mel buffer, as in the model card), else the last one."""
        for i in range(len(segments) - 1, -1, -1):
            seg = segments[i]
            if seg["role"] == "user" and any(isinstance(c, np.ndarray) for c in seg["content"]):
                return i
        return len(segments) - 1

    def _chat_streaming(
        self,
        model: Any,
        request: ChatRequest,
        msgs: list[dict[str, Any]],
        has_video: bool,
        tts_on: bool,
        voice: np.ndarray | None,
    ) -> Iterator[ChatEvent]:
        gen = request.generation
        session_id = f"chat-{uuid.uuid4().hex}"
        use_tts_template = bool(request.use_tts_template or tts_on)
        omni_mode = bool(request.omni_mode or has_video)
        t0 = time.monotonic()
        self._reset_model_session()
        if tts_on:
            if voice is None:
                raise UnsupportedInput(
                    "speech output needs a reference voice (tts.ref_audio_data) and this worker has no default voice",
                    "tts.ref_audio_data",
                )
            model.init_token2wav_cache(prompt_speech_16k=voice)
        segments = self._segments(msgs)
        last_chunk = self._last_chunk_index(segments)
        for i, segment in enumerate(segments):
            _call(
                model.streaming_prefill,
                session_id=session_id,
                msgs=[segment],
                omni_mode=omni_mode,
                max_slice_nums=request.max_slice_nums,
                use_tts_template=use_tts_template,
                enable_thinking=request.enable_thinking,
                is_last_chunk=i == last_chunk,
            )
        input_tokens = self._kv_length()
        prefill_s = time.monotonic() - t0
        yield ChatPrefilled(input_tokens=input_tokens)

        t1 = time.monotonic()
        texts: list[str] = []
        audio: list[np.ndarray] = []
        first_delta_s: float | None = None
        stream = _call(
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
        # the model keeps the generated ids only when it generates audio; a text-only turn counts its
        # text (the KV cache also holds the assistant prefix, so its growth overcounts)
        generated_ids = getattr(model, "_streaming_generated_token_ids", None) if tts_on else None
        generated = len(generated_ids) if generated_ids else self._count_tokens(full_text)
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

    def _session_closed(self, session: MiniCPMODuplexSession) -> None:
        with self._lock:
            if self._active_duplex is session:
                self._active_duplex = None


class MiniCPMODuplexSession(DuplexSession):
    """One full-duplex conversation on the shared model."""

    def __init__(self, backend: MiniCPMOBackend) -> None:
        self._backend = backend
        self._model = backend.model
        self._duplex: Any = None
        self._settings: dict[str, Any] = {}
        self._prompt_wav_path: str | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._interrupt = False
        self._closed = False
        self._context_full = False
        self._steps = 0
        self.prompt_length = 0

    # -- helpers

    def _kv(self) -> int:
        duplex = self._duplex
        decoder = getattr(duplex, "decoder", None)
        for fn in (
            getattr(decoder, "get_cache_length", None),
            getattr(duplex, "get_kv_cache_length", None),
        ):
            if fn is not None:
                try:
                    return int(fn())
                except Exception:  # noqa: BLE001
                    continue
        return self._backend._kv_length()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("duplex session is closed")
        if self._duplex is None:
            raise BackendError("duplex session is not prepared")

    # -- DuplexSession

    def prepare(self, config: DuplexConfig) -> int:
        if self._closed:
            raise BackendError("duplex session is closed")
        if self._duplex is not None:
            raise BackendError("duplex session is already prepared")
        b = self._backend
        settings = dict(b._duplex_defaults)
        settings.update(b._validate_settings(dict(config.config or {})))
        self._settings = settings
        llm_voice = (
            config.ref_audio
            if config.ref_audio is not None and np.asarray(config.ref_audio).size
            else None
        )
        tts_voice = (
            config.tts_ref_audio
            if config.tts_ref_audio is not None and np.asarray(config.tts_ref_audio).size
            else None
        )
        llm_voice = (
            _as_float_audio(llm_voice, "voice.ref_audio_base64")
            if llm_voice is not None
            else b.default_voice
        )
        tts_voice = (
            _as_float_audio(tts_voice, "voice.tts_ref_audio_base64")
            if tts_voice is not None
            else llm_voice
        )
        generate_audio = b.duplex_generate_audio
        if generate_audio and tts_voice is None:
            self._abort_prepare()
            raise UnsupportedInput(
                "speech output needs a reference voice and this worker has no default voice (ref_audio_path)",
                "voice.tts_ref_audio_base64",
            )

        init_kwargs = dict(b.duplex_options)
        init_kwargs["generate_audio"] = generate_audio
        for key in _DUPLEX_INIT_SETTINGS:
            init_kwargs[key] = settings[key]
        as_duplex = getattr(self._model, "as_duplex", None)
        if as_duplex is None:
            # e.g. the MiniCPM-o-Demo copy of the remote code, whose duplex class
            # (MiniCPMODuplex) loads a second copy of the weights instead
            self._abort_prepare()
            raise BackendError(
                "this MiniCPM-o remote code has no as_duplex(); duplex sessions need the model "
                "repository's modeling_minicpmo.py revision that provides it"
            )
        try:
            self._duplex = _call(as_duplex, **init_kwargs)
        except Exception as exc:
            self._abort_prepare()
            raise BackendError(f"as_duplex failed: {exc}") from exc
        # a cached wrapper may come back: make every setting this session's own
        for key in _DUPLEX_ATTR_SETTINGS:
            if hasattr(self._duplex, key):
                try:
                    setattr(self._duplex, key, settings[key])
                except Exception:  # noqa: BLE001
                    pass
        for name in ("clear_break_event", "clear_session_stop"):
            fn = getattr(self._duplex, name, None)
            if fn is not None:
                fn()

        if generate_audio:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="omniserve-voice-")
            self._prompt_wav_path = str(Path(self._tmpdir.name) / "tts_ref.wav")
            write_wav(self._prompt_wav_path, tts_voice, INPUT_SAMPLE_RATE)

        text = config.system_prompt or b.duplex_system_prompt
        if b.duplex_prompt_format == "raw":
            prefix, suffix = (
                text,
                ("<|audio_end|><|im_end|>" if llm_voice is not None else "<|im_end|>"),
            )
        elif llm_voice is not None:
            prefix, suffix = (
                f"<|im_start|>system\n{text}\n<|audio_start|>",
                "<|audio_end|><|im_end|>",
            )
        else:
            prefix, suffix = f"<|im_start|>system\n{text}", "<|im_end|>"
        t0 = time.monotonic()
        try:
            _call(
                self._duplex.prepare,
                prefix_system_prompt=prefix,
                suffix_system_prompt=suffix,
                ref_audio=llm_voice,
                prompt_wav_path=self._prompt_wav_path,
            )
        except (UnsupportedInput, BackendError):
            self._abort_prepare()
            raise
        except Exception as exc:
            self._abort_prepare()
            raise BackendError(f"duplex prepare failed: {exc}") from exc
        self.prompt_length = self._kv()
        log.info(
            "duplex session prepared in %.2f s; prompt %d tokens",
            time.monotonic() - t0,
            self.prompt_length,
        )
        return self.prompt_length

    def _abort_prepare(self) -> None:
        try:
            self._teardown()
        finally:
            self._closed = True
            self._backend._session_closed(self)

    def _step_reserve(self, chunk: DuplexInput) -> int:
        b = self._backend
        slices = max(1, int(chunk.max_slice_nums or 1))
        vision = len(chunk.frames) * (slices + 1) * b.vision_tokens_per_slice
        return (
            b.step_token_reserve
            + int(self._settings.get("max_new_speak_tokens_per_chunk", 20))
            + vision
        )

    def step(self, chunk: DuplexInput) -> DuplexStep:
        self._check_open()
        b = self._backend
        kv = self._kv()
        limit = b.max_context_tokens
        if self._context_full or kv + self._step_reserve(chunk) > limit:
            # never run a step that could cross the window: report it full, the worker closes
            self._context_full = True
            return DuplexStep(
                listen=True,
                kv_cache_length=max(kv, limit),
                metrics={"context_full": True, "kv_cache_length_actual": kv, "skipped": True},
            )
        audio = _as_float_audio(chunk.audio, "audio")
        frames = [_decode_image(f) for f in chunk.frames]
        force_listen = bool(chunk.force_listen or self._interrupt)
        self._interrupt = False
        duplex = self._duplex
        t0 = time.monotonic()
        try:
            prefill = _call(
                duplex.streaming_prefill,
                audio_waveform=audio,
                frame_list=frames or None,
                max_slice_nums=max(1, int(chunk.max_slice_nums or 1)),
            )
        except Exception as exc:
            raise b._map_error(exc) from exc
        prefill_s = time.monotonic() - t0
        self._steps += 1
        if isinstance(prefill, dict) and prefill.get("success") is False:
            # not enough audio buffered for a unit yet: the model keeps listening
            return DuplexStep(
                listen=True,
                kv_cache_length=self._kv(),
                metrics={
                    "prefill_s": round(prefill_s, 4),
                    "generate_s": 0.0,
                    "tts_s": 0.0,
                    "waiting_for_audio": True,
                },
            )
        result = self._generate(force_listen)
        generate_s = time.monotonic() - t0 - prefill_s
        finalize = getattr(duplex, "finalize", None)
        if callable(finalize):
            try:
                finalize()
            except Exception as exc:
                raise b._map_error(exc) from exc
        if not isinstance(result, dict):
            raise InferenceError(
                f"streaming_generate returned {type(result).__name__}, expected dict"
            )
        listen = bool(result.get("is_listen", True))
        text = "" if listen else str(result.get("text") or "")
        wave = None
        if not listen and result.get("audio_waveform") is not None:
            wave = to_mono_float32(result.get("audio_waveform"))
            if wave.size == 0:
                wave = None
        tts_s = sum(
            float(result.get(k) or 0.0) for k in ("cost_tts_prep", "cost_tts", "cost_token2wav")
        )
        kv_after = self._kv()
        metrics = {
            "prefill_s": round(prefill_s, 4),
            "generate_s": round(generate_s, 4),
            "tts_s": round(tts_s, 4),
            "llm_s": round(float(result.get("cost_llm") or 0.0), 4),
            "n_tokens": int(result.get("n_tokens") or 0),
            "n_tts_tokens": int(result.get("n_tts_tokens") or 0),
            "force_listen": force_listen,
            "vision_frames": len(frames),
        }
        if kv_after >= limit:
            self._context_full = True
            metrics["context_full"] = True
        return DuplexStep(
            listen=listen,
            kv_cache_length=kv_after,
            text=text,
            audio=wave,
            end_of_turn=bool(result.get("end_of_turn", False)),
            metrics=metrics,
        )

    def _generate(self, force_listen: bool) -> Any:
        duplex = self._duplex
        s = self._settings
        kwargs: dict[str, Any] = {
            "prompt_wav_path": self._prompt_wav_path,
            "max_new_speak_tokens_per_chunk": s["max_new_speak_tokens_per_chunk"],
            "decode_mode": s["decode_mode"],
            "temperature": s["temperature"],
            "top_k": s["top_k"],
            "top_p": s["top_p"],
            "listen_prob_scale": s["listen_prob_scale"],
            "listen_top_k": s["listen_top_k"],
            "text_repetition_penalty": s["text_repetition_penalty"],
            "text_repetition_window_size": s["text_repetition_window_size"],
        }
        fn = duplex.streaming_generate
        if _accepts(fn, "length_penalty"):
            kwargs["length_penalty"] = s["length_penalty"]
        bumped = False
        saved_count = None
        if force_listen:
            if _explicit(fn, "force_listen_override"):
                kwargs["force_listen_override"] = True
            elif _explicit(fn, "force_listen"):
                kwargs["force_listen"] = True
            elif hasattr(duplex, "force_listen_count") and hasattr(
                duplex, "_streaming_generate_count"
            ):
                # this revision forces only the first N calls: make this call one of them
                saved_count = duplex.force_listen_count
                duplex.force_listen_count = int(duplex._streaming_generate_count) + 1
                bumped = True
            else:
                log.warning("this model revision cannot force a listen step; generating normally")
        try:
            return _call(fn, **kwargs)
        except Exception as exc:
            raise self._backend._map_error(exc) from exc
        finally:
            if bumped:
                duplex.force_listen_count = saved_count

    def interrupt(self) -> None:
        self._interrupt = True

    def _teardown(self) -> None:
        duplex, model = self._duplex, self._model
        if duplex is not None:
            for name in ("set_session_stop",):
                fn = getattr(duplex, name, None)
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        log.exception("%s failed", name)
            as_simplex = getattr(duplex, "as_simplex", None)
            if as_simplex is not None:
                try:
                    _call(as_simplex, reset_session=True)
                except Exception:
                    log.exception("as_simplex failed")
            for name in ("_reset_streaming_state", "clear_break_event", "clear_session_stop"):
                fn = getattr(duplex, name, None)
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        log.exception("%s failed", name)
            decoder_reset = getattr(getattr(duplex, "decoder", None), "reset", None)
            if decoder_reset is not None:
                try:
                    decoder_reset()
                except Exception:
                    log.exception("decoder reset failed")
        tokenizer = getattr(getattr(model, "tts", None), "audio_tokenizer", None)
        if tokenizer is not None:
            for attr in ("stream_cache", "hift_cache_dict", "cache"):
                if getattr(tokenizer, attr, None) is not None:
                    try:
                        setattr(tokenizer, attr, None)
                    except Exception:  # noqa: BLE001
                        pass
        self._backend._reset_model_session()
        self._duplex = None
        self._settings = {}
        self._prompt_wav_path = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        gc.collect()
        torch = self._backend._torch() if str(self._backend.device).startswith("cuda") else None
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._teardown()
        finally:
            self._backend._session_closed(self)
            log.info("duplex session closed after %d steps", self._steps)
