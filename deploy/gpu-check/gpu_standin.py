"""Loader wrapper for the GPU check: the strict stand-in model, plus real CUDA memory and work.

Use with ``deploy/gpu-check`` on PYTHONPATH:
    --backend-options '{"model_loader": "gpu_standin:load", "device": "cuda"}'

What it adds to ``tests.support.standins.fake_minicpmo:load`` (which holds no tensors at all):
- "weights": one bf16 tensor of GPUCHECK_WEIGHT_MB MiB (default 512) and one 4096x4096 bf16
  matrix, kept on the model object (so they live exactly as long as the model);
- per duplex ``streaming_prefill``: a transient activation (GPUCHECK_ACT_MB MiB, default 256) and
  one bf16 matmul with the matrix, and a 2 MiB slice kept as a per-session "KV cache" that the
  wrapper's ``decoder.reset()`` frees (as the real ``decoder.reset()`` frees the KV cache); the
  transient tensors stay *reserved* by the caching allocator until ``torch.cuda.empty_cache()``;
- per chat ``streaming_prefill`` / ``chat``: one bf16 matmul.
On a device that is not CUDA (local dry run) the same code runs with tiny float32 tensors.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from tests.support.standins import fake_minicpmo

STATS: dict[str, int] = {"duplex_prefills": 0, "chat_calls": 0, "kv_resets": 0}


def _sizes(device: str) -> tuple[int, int, int]:
    """(weight elements, matrix side, activation rows)."""
    if str(device).startswith("cuda"):
        weight_mb = int(os.environ.get("GPUCHECK_WEIGHT_MB", "512"))
        act_mb = int(os.environ.get("GPUCHECK_ACT_MB", "256"))
        side = 4096
        return weight_mb * 2**20 // 2, side, act_mb * 2**20 // (2 * side)
    return 4096, 64, 64


def load(model_path: str | None, **options: Any) -> Any:
    import torch

    device = str(options.get("device", "cpu"))
    model = fake_minicpmo.load(model_path, **options)
    with fake_minicpmo._lock:  # the stand-in's test bookkeeping would keep the model alive
        if model in fake_minicpmo.INSTANCES:
            fake_minicpmo.INSTANCES.remove(model)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    n_weight, side, rows = _sizes(device)
    model._gpu_weights = torch.empty(n_weight, dtype=dtype, device=device).normal_()
    model._gpu_matrix = torch.randn(side, side, dtype=dtype, device=device) / side**0.5
    if device.startswith("cuda"):
        torch.cuda.synchronize()

    def work(keep: list[Any] | None = None) -> None:
        act = torch.randn(rows, side, dtype=dtype, device=device)
        out = act @ model._gpu_matrix
        if keep is not None:
            keep.append(out[: max(1, 2 * 2**20 // (2 * side))].clone())
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if not torch.isfinite(out).all():
            raise RuntimeError("matmul produced non-finite values")
        del act, out

    # chat turns: a matmul per streaming_prefill / chat call
    for name in ("streaming_prefill", "chat"):
        orig = getattr(model, name)

        def wrapped(*args: Any, _orig: Any = orig, **kwargs: Any) -> Any:
            STATS["chat_calls"] += 1
            work()
            return _orig(*args, **kwargs)

        setattr(model, name, functools.wraps(orig)(wrapped))

    # duplex: the wrapper built once by as_duplex (the backend calls it at load time)
    orig_as_duplex = model.as_duplex

    @functools.wraps(orig_as_duplex)
    def as_duplex(*args: Any, **kwargs: Any) -> Any:
        duplex = orig_as_duplex(*args, **kwargs)
        duplex._gpu_kv = []
        orig_prefill = duplex.streaming_prefill

        @functools.wraps(orig_prefill)
        def streaming_prefill(*a: Any, **kw: Any) -> Any:
            STATS["duplex_prefills"] += 1
            work(duplex._gpu_kv)
            return orig_prefill(*a, **kw)

        duplex.streaming_prefill = streaming_prefill
        decoder = duplex.decoder
        orig_reset = decoder.reset

        @functools.wraps(orig_reset)
        def reset() -> None:
            STATS["kv_resets"] += 1
            duplex._gpu_kv.clear()  # frees the session's "KV cache" tensors
            orig_reset()

        decoder.reset = reset
        return duplex

    model.as_duplex = as_duplex
    return model
