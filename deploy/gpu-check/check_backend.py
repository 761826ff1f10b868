"""Part A: the minicpmo backend's CUDA code paths in one process, against real torch.cuda.

- loading.gpu_memory() before any CUDA use, after load (info()), during and after a duplex
  session, after a chat turn, after backend.close();
- tasks.metrics.gpu_memory() (the worker's allocated/reserved/total gauges) at the same points;
- that the torch.cuda.empty_cache() calls in duplex.py (session teardown) and backend.py (close)
  are reached (counted through a wrapper) and what they release (reserved before/after).

Usage: python deploy/gpu-check/check_backend.py DEVICE   (cuda, or cpu for the local dry run)
Prints one JSON object per line; the last line is the summary with PASS/FAIL per check.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import weakref

import numpy as np

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
MiB = 2**20
results: dict[str, dict] = {}


def emit(tag: str, **kw) -> None:
    print(json.dumps({"tag": tag, **kw}, default=str), flush=True)


def check(name: str, ok: bool, **kw) -> None:
    results[name] = {"status": "PASS" if ok else "FAIL", **kw}
    emit("check", name=name, status=results[name]["status"], **kw)


import torch  # noqa: E402

from inference import (  # noqa: E402
    ChatDone,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    GenerationConfig,
    Message,
    TextPart,
    TTSConfig,
    create_backend,
)
from inference.minicpmo import loading  # noqa: E402
from tasks import metrics  # noqa: E402

cuda = DEVICE.startswith("cuda")
empty_cache_calls: list[str] = []
_real_empty_cache = torch.cuda.empty_cache


def counting_empty_cache() -> None:
    before = torch.cuda.memory_reserved() if cuda else 0
    _real_empty_cache()
    after = torch.cuda.memory_reserved() if cuda else 0
    caller = sys._getframe(1).f_code
    empty_cache_calls.append(f"{caller.co_filename.split('/')[-1]}:{caller.co_name}")
    emit("empty_cache", caller=empty_cache_calls[-1], reserved_before=before, reserved_after=after)


torch.cuda.empty_cache = counting_empty_cache  # the code looks it up at call time


def snap(label: str) -> dict:
    direct = {}
    if cuda and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        direct = {
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "mem_get_info_free": free,
            "mem_get_info_total": total,
        }
    s = {
        "label": label,
        "cuda_initialized": bool(torch.cuda.is_initialized()) if cuda else None,
        "loading.gpu_memory": loading.gpu_memory(DEVICE),
        "metrics.gpu_memory": [list(t) for t in metrics.gpu_memory()],
        "torch_direct": direct,
    }
    emit("snapshot", **s)
    return s


def metric(s: dict, kind: str) -> float | None:
    for dev, k, v in s["metrics.gpu_memory"]:
        if dev == "cuda:0" and k == kind:
            return v
    return None


emit(
    "env",
    device=DEVICE,
    torch=torch.__version__,
    cuda_available=torch.cuda.is_available(),  # (get_device_name would initialise CUDA)
)

# 1. before any CUDA use: no figures, and asking must not initialise CUDA
s0 = snap("before load")
if cuda:
    check(
        "gpu_memory before CUDA init",
        s0["loading.gpu_memory"]
        == {"gpu_memory_allocated_bytes": 0, "gpu_memory_reserved_bytes": 0}
        and s0["metrics.gpu_memory"] == []
        and not torch.cuda.is_initialized(),
        loading=s0["loading.gpu_memory"],
        metrics=s0["metrics.gpu_memory"],
        initialized_after=torch.cuda.is_initialized(),
    )

# 2. load
t0 = time.monotonic()
backend = create_backend(
    "minicpmo", model_path="/tmp/none", device=DEVICE, model_loader="gpu_standin:load"
)
load_s = time.monotonic() - t0
info = backend.info()
emit(
    "info",
    load_s=load_s,
    gpu_memory=info.get("gpu_memory"),
    gpu_memory_before=info.get("gpu_memory_before"),
    gpu_memory_after=info.get("gpu_memory_after"),
)
s1 = snap("after load")
model_ref = weakref.ref(backend.model)
if cuda:
    alloc = info["gpu_memory"]["gpu_memory_allocated_bytes"]
    expected = 512 * MiB + 4096 * 4096 * 2
    check(
        "info() gpu_memory after load",
        alloc >= expected
        and alloc == torch.cuda.memory_allocated()
        and info["gpu_memory_after"]["gpu_memory_allocated_bytes"] == alloc
        and info["gpu_memory_before"]
        == {"gpu_memory_allocated_bytes": 0, "gpu_memory_reserved_bytes": 0},
        allocated=alloc,
        expected_at_least=expected,
        reserved=info["gpu_memory"]["gpu_memory_reserved_bytes"],
        before=info["gpu_memory_before"],
    )
    props = torch.cuda.get_device_properties(0)
    check(
        "metrics gauges after load",
        metric(s1, "allocated") == float(torch.cuda.memory_allocated(0))
        and metric(s1, "reserved") == float(torch.cuda.memory_reserved(0))
        and metric(s1, "total") == float(props.total_memory)
        and metric(s1, "total") == float(s1["torch_direct"]["mem_get_info_total"]),
        allocated=metric(s1, "allocated"),
        reserved=metric(s1, "reserved"),
        total=metric(s1, "total"),
        mem_get_info_total=s1["torch_direct"]["mem_get_info_total"],
    )

# 3. a duplex session: 3 quiet, 1 loud, 3 quiet units (the stand-in speaks on units 5-7)
UNIT = 16000
quiet = np.zeros(UNIT, dtype=np.float32)
t = np.arange(UNIT, dtype=np.float32) / UNIT
loud = (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
ref = (0.1 * np.sin(np.arange(2 * UNIT) / 10)).astype(np.float32)
session = backend.open_duplex()
prompt = session.prepare(DuplexConfig(system_prompt="Be brief.", ref_audio=ref))
outs = []
for u in [quiet, quiet, quiet, loud, quiet, quiet, quiet]:
    st = session.step(DuplexInput(audio=u))
    outs.append(
        {
            "listen": st.listen,
            "text": st.text,
            "audio": None if st.audio is None else int(st.audio.size),
            "kv": st.kv_cache_length,
        }
    )
emit("duplex_steps", prompt_length=prompt, steps=outs)
s2 = snap("duplex session open, after 7 steps")
n_calls = len(empty_cache_calls)
session.close()
s3 = snap("after duplex session close")
teardown_calls = empty_cache_calls[n_calls:]
spoken = "".join(o["text"] for o in outs)
check("duplex session ran", bool(spoken) and any(o["audio"] for o in outs), text=spoken)
if cuda:
    check(
        "duplex teardown empty_cache",
        teardown_calls == ["duplex.py:_teardown"]
        # the 7 x 2 MiB "KV cache" freed (cuBLAS may keep a workspace from the first matmul)
        and metric(s2, "allocated") - metric(s3, "allocated") >= 7 * 2 * MiB
        and metric(s2, "reserved") > metric(s1, "reserved")  # transient work was cached ...
        and metric(s3, "reserved") < metric(s2, "reserved"),  # ... and released by empty_cache
        calls=teardown_calls,
        allocated_load=metric(s1, "allocated"),
        allocated_in_session=metric(s2, "allocated"),
        allocated_after_close=metric(s3, "allocated"),
        reserved_load=metric(s1, "reserved"),
        reserved_in_session=metric(s2, "reserved"),
        reserved_after_close=metric(s3, "reserved"),
    )
else:
    check(
        "duplex teardown empty_cache",
        teardown_calls == [],
        calls=teardown_calls,
        note="device is not cuda: the path is skipped, as designed",
    )

# 4. a streaming chat turn
req = ChatRequest(
    messages=[Message(role="user", content=[TextPart("the quick brown fox")])],
    generation=GenerationConfig(max_new_tokens=32),
    tts=TTSConfig(enabled=False),
)
done = None
for ev in backend.chat(req):
    if isinstance(ev, ChatDone):
        done = ev
s4 = snap("after chat turn")
check(
    "chat turn ran",
    done is not None and done.text == "echo: the quick brown fox",
    text=None if done is None else done.text,
)

# 5. backend.close(): its empty_cache, and whether the weights are freed
import gpu_standin  # noqa: E402

emit("standin_stats", **gpu_standin.STATS)
del session, st
n_calls = len(empty_cache_calls)
backend.close()
gc.collect()
s5 = snap("after backend.close()")
close_calls = empty_cache_calls[n_calls:]
emit(
    "after_close",
    model_alive=model_ref() is not None,
    loaded_still_holds_model=getattr(getattr(backend, "loaded", None), "model", None) is not None,
)
if cuda:
    check(
        "backend.close empty_cache reached", close_calls == ["backend.py:close"], calls=close_calls
    )
    check(
        "backend.close frees the weights",
        metric(s5, "allocated") is not None and metric(s5, "allocated") < 64 * MiB,
        allocated_after_close=metric(s5, "allocated"),
        reserved_after_close=metric(s5, "reserved"),
        model_alive=model_ref() is not None,
    )
else:
    check(
        "backend.close empty_cache reached",
        close_calls == [],
        calls=close_calls,
        note="device is not cuda: skipped, as designed",
    )
    check("backend.close frees the model", model_ref() is None, model_alive=model_ref() is not None)

# counterfactual for the previous check: drop the reference backend.loaded keeps
backend.loaded = None
gc.collect()
if cuda:
    _real_empty_cache()
s6 = snap("after also dropping backend.loaded (counterfactual)")
emit(
    "counterfactual",
    model_alive=model_ref() is not None,
    allocated=metric(s6, "allocated"),
    reserved=metric(s6, "reserved"),
)
if cuda:
    emit(
        "device", name=torch.cuda.get_device_name(0), capability=torch.cuda.get_device_capability(0)
    )
emit("summary", results={k: v["status"] for k, v in results.items()})
