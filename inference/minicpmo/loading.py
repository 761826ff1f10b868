"""Loading MiniCPM-o once per worker process: weights, the TTS vocoder and the one duplex wrapper.

The official demo builds its duplex wrapper once, when the model loads, and resets it between
sessions; building one per session re-runs ``init_tts`` (seconds of start-up, and the backend's
vocoder settings are replaced by the wrapper's defaults). So the wrapper is built here, with the
backend's TTS settings, and ``init_tts`` runs exactly once: inside ``as_duplex`` when the model
has it (the model repository's ``from_existing_model`` calls it), else directly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.base import INPUT_SAMPLE_RATE, BackendError
from inference.minicpmo import compat

log = logging.getLogger("omniserve.inference.minicpmo")


@dataclass(slots=True)
class LoadSpec:
    """What to load and how (the backend's options)."""

    model_path: str | None
    device: str = "cuda"
    dtype: str = "bfloat16"
    attn_implementation: str = "sdpa"
    init_vision: bool = True
    init_audio: bool = True
    init_tts: bool = True
    tts_streaming: bool = True
    tts_float16: bool = False
    tts_n_timesteps: int | None = None
    duplex_generate_audio: bool = True
    duplex_options: dict[str, Any] = field(default_factory=dict)
    loader: Callable[..., Any] | None = None
    loader_options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class LoadedModel:
    """The model and the state built around it once."""

    model: Any
    duplex: Any | None  # the one duplex wrapper (None: this remote code has no as_duplex)
    chat_constants: dict[str, Any]  # streaming constants chat turns run with
    duplex_constants: dict[str, Any]  # ... and those the wrapper set for duplex sessions
    unit_samples: int  # input samples one duplex step consumes
    info: dict[str, Any]


def torch_module() -> Any | None:
    """torch, when installed (the backend module itself never imports it)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def gpu_memory(device: str) -> dict[str, Any]:
    """Allocated and reserved CUDA memory, for logs and health checks."""
    torch = torch_module() if str(device).startswith("cuda") else None
    if torch is None or not torch.cuda.is_available():
        return {}
    return {
        # the configured device's, not the current one's ("cuda:1" on a multi-GPU host)
        "gpu_memory_allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "gpu_memory_reserved_bytes": int(torch.cuda.memory_reserved(device)),
    }


def default_loader(spec: LoadSpec) -> Any:
    """``AutoModel.from_pretrained`` on a local directory, offline, in the configured dtype."""
    path = Path(spec.model_path or "")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise BackendError(
            f"model_path {spec.model_path!r} is not a local model directory (config.json missing)"
        )
    # nothing is downloaded at run time, not even the token2wav assets the remote code would fetch
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise BackendError(
            "the minicpmo backend needs the [minicpmo] extra (torch, transformers ...)"
        ) from exc
    torch_dtype = getattr(torch, spec.dtype, None)
    if torch_dtype is None:
        raise ValueError(f"unknown dtype {spec.dtype!r}")
    model = AutoModel.from_pretrained(
        str(path),
        trust_remote_code=True,
        local_files_only=True,
        torch_dtype=torch_dtype,
        attn_implementation=spec.attn_implementation,
        init_vision=spec.init_vision,
        init_audio=spec.init_audio,
        init_tts=spec.init_tts,
        **spec.loader_options,
    )
    model = model.eval()
    moved = model.to(spec.device)
    return moved if moved is not None else model


def _tts_settings(model: Any, spec: LoadSpec) -> dict[str, Any]:
    settings: dict[str, Any] = {"enable_float16": spec.tts_float16}
    if spec.tts_n_timesteps is not None:
        settings["n_timesteps"] = spec.tts_n_timesteps
    if compat.explicit(model.init_tts, "streaming"):  # the demo's copy of the code
        settings["streaming"] = spec.tts_streaming
    return settings


def _has_vocoder(model: Any) -> bool:
    return getattr(getattr(model, "tts", None), "audio_tokenizer", None) is not None


def _build_duplex(model: Any, spec: LoadSpec) -> Any:
    """``as_duplex`` once, with the backend's TTS settings (it runs ``init_tts`` itself)."""
    kwargs: dict[str, Any] = dict(spec.duplex_options)
    kwargs["generate_audio"] = spec.duplex_generate_audio
    kwargs["enable_float16"] = spec.tts_float16
    if spec.tts_n_timesteps is not None:
        kwargs["n_timesteps"] = spec.tts_n_timesteps
    t0 = time.monotonic()
    if spec.init_tts:
        duplex = compat.call(model.as_duplex, device=spec.device, **kwargs)
    else:
        # no TTS module on this model: the wrapper's unconditional init_tts() would fail
        with compat.without_method(model, "init_tts"):
            duplex = compat.call(model.as_duplex, device=spec.device, **kwargs)
    log.info("duplex wrapper built in %.1f s", time.monotonic() - t0)
    return duplex


def _unit_samples(duplex: Any, model: Any) -> int:
    owner = duplex if duplex is not None else model
    rate = int(getattr(owner, "SAMPLE_RATE", INPUT_SAMPLE_RATE) or INPUT_SAMPLE_RATE)
    chunk_ms = int(getattr(owner, "CHUNK_MS", 1000) or 1000)
    if rate != INPUT_SAMPLE_RATE:
        raise BackendError(f"the model streams {rate} Hz audio; this service sends 16000 Hz")
    return chunk_ms * rate // 1000


def load(spec: LoadSpec) -> LoadedModel:
    """Load the weights, then the vocoder and the duplex wrapper, each exactly once."""
    t0 = time.monotonic()
    log.info(
        "loading MiniCPM-o from %s (device=%s dtype=%s attn=%s vision=%s audio=%s tts=%s)",
        spec.model_path,
        spec.device,
        spec.dtype,
        spec.attn_implementation,
        spec.init_vision,
        spec.init_audio,
        spec.init_tts,
    )
    before = gpu_memory(spec.device)
    try:
        if spec.loader is not None:
            model = spec.loader(
                spec.model_path,
                device=spec.device,
                dtype=spec.dtype,
                attn_implementation=spec.attn_implementation,
                init_vision=spec.init_vision,
                init_audio=spec.init_audio,
                init_tts=spec.init_tts,
                **spec.loader_options,
            )
        else:
            model = default_loader(spec)
    except (BackendError, ValueError):
        raise
    except Exception as exc:
        raise BackendError(f"loading MiniCPM-o failed: {exc}") from exc
    t_weights = time.monotonic() - t0
    log.info("weights loaded in %.1f s %s", t_weights, gpu_memory(spec.device))

    chat_constants = compat.stream_constants(model)
    duplex = None
    t1 = time.monotonic()
    try:
        if hasattr(model, "as_duplex"):
            duplex = _build_duplex(model, spec)
        # a wrapper with audio output ran init_tts; without a wrapper, or with a text-only one
        # (some revisions skip init_tts then), chat speech still needs the vocoder
        inited = duplex is not None and spec.duplex_generate_audio
        if spec.init_tts and hasattr(model, "init_tts") and not inited and not _has_vocoder(model):
            compat.call(model.init_tts, **_tts_settings(model, spec))
    except Exception as exc:
        raise BackendError(f"setting up TTS / the duplex wrapper failed: {exc}") from exc
    duplex_constants = compat.stream_constants(model)
    compat.apply_stream_constants(model, chat_constants)  # chat turns keep the model's own
    if duplex is None:
        log.warning(
            "this MiniCPM-o remote code has no as_duplex(): chat only; duplex sessions need the "
            "model repository's modeling_minicpmo.py"
        )
    after = gpu_memory(spec.device)
    info = {
        "load_seconds": round(time.monotonic() - t0, 3),
        "weights_seconds": round(t_weights, 3),
        "tts_and_duplex_seconds": round(time.monotonic() - t1, 3),
        "gpu_memory_before": before,
        "gpu_memory_after": after,
    }
    log.info("MiniCPM-o ready in %.1f s; %s", info["load_seconds"], after)
    return LoadedModel(
        model=model,
        duplex=duplex,
        chat_constants=chat_constants,
        duplex_constants=duplex_constants,
        unit_samples=_unit_samples(duplex, model),
        info=info,
    )
