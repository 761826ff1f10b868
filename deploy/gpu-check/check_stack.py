"""Part C: the real stack (embedded redis-server, one prefork minicpmo worker, one gateway) with
the stand-in model on DEVICE; which process holds CUDA; the worker's GPU gauges; kill -9 of the
pool child mid-session and its replacement.

Usage: python deploy/gpu-check/check_stack.py DEVICE LOGDIR
Prints one JSON object per line (tag "check" lines carry PASS/FAIL); the last is the summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
LOGDIR = sys.argv[2] if len(sys.argv) > 2 else "/tmp/gpucheck-logs"
os.environ["OMNISERVE_TEST_LOGS"] = LOGDIR  # read by tests.support.stack at import

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from api.protocol.events import ClientEvent, DeltaKind, ServerEvent  # noqa: E402
from omniserve.redis_server import free_port, start_embedded  # noqa: E402
from tests.support.client import Client, pcm_b64, silence, speech  # noqa: E402
from tests.support.stack import ROOT, Stack  # noqa: E402

results: dict[str, str] = {}
T0 = time.monotonic()


def emit(tag: str, **kw: Any) -> None:
    print(
        json.dumps({"tag": tag, "t": round(time.monotonic() - T0, 2), **kw}, default=str),
        flush=True,
    )


def check(name: str, ok: bool, **kw: Any) -> None:
    results[name] = "PASS" if ok else "FAIL"
    emit("check", name=name, status=results[name], **kw)


def smi() -> list[dict[str, Any]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run(
        [exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append({"pid": int(parts[0]), "used_memory": parts[1], "line": line.strip()})
    emit("nvidia-smi", rc=out.returncode, raw=out.stdout.strip(), err=out.stderr.strip()[-300:])
    return rows


def proc_gpu_evidence(pid: int) -> dict[str, Any]:
    """What /proc says about a process: torch / libcuda mapped, /dev/nvidia* descriptors."""
    ev: dict[str, Any] = {"pid": pid}
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
        ev["libtorch_mapped"] = "libtorch" in maps
        ev["libcuda_mapped"] = "libcuda.so" in maps
        ev["libtorch_cuda_mapped"] = "libtorch_cuda" in maps
    except OSError as exc:
        ev["maps_error"] = str(exc)
    nv = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                nv.append(target)
    except OSError as exc:
        ev["fd_error"] = str(exc)
    ev["dev_nvidia_fds"] = sorted(set(nv))
    ev["n_dev_nvidia_fds"] = len(nv)
    try:
        ev["cmdline"] = " ".join(psutil.Process(pid).cmdline())[:160]
    except psutil.Error:
        pass
    return ev


def children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def scrape(port: int, label: str) -> dict[str, Any]:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError as exc:
        emit("scrape", label=label, error=str(exc))
        return {}
    lines = [
        ln
        for ln in text.splitlines()
        if ln.startswith(
            (
                "omniserve_gpu_memory_bytes",
                "omniserve_worker_slots",
                "omniserve_backend_load_seconds",
            )
        )
    ]
    gpu = {}
    for ln in lines:
        if ln.startswith("omniserve_gpu_memory_bytes{"):
            labels, value = ln.rsplit(" ", 1)
            kind = labels.split('kind="')[1].split('"')[0]
            gpu[kind] = float(value)
    emit("scrape", label=label, lines=lines)
    return gpu


def ownership(parent: int, label: str) -> dict[str, Any]:
    kids = children(parent)
    rows = smi()
    smi_pids = None if rows is None else {r["pid"] for r in rows}
    state = {
        "label": label,
        "parent": proc_gpu_evidence(parent),
        "children": [proc_gpu_evidence(k) for k in kids],
        "nvidia_smi_pids": None if smi_pids is None else sorted(smi_pids),
        "nvidia_smi_rows": rows,
    }
    emit("ownership", **state)
    return state


def voice_b64() -> str:
    t = np.arange(16000) / 16000
    return pcm_b64((0.1 * np.sin(2 * np.pi * 180 * t)).astype(np.float32))


async def duplex_session(
    url: str, port: int, steps: list[str], label: str, close: bool = True
) -> tuple[Client, list[dict[str, Any]], dict[str, Any]]:
    c = await Client.connect(url, query="?mode=audio")
    created = await c.init(
        {
            "system_prompt": "You are a helpful assistant.",
            "voice": {"ref_audio_base64": voice_b64()},
        }
    )
    out = []
    for audio in steps:
        frames = await c.step(audio, timeout=30)
        out.append(
            [
                {k: f.get(k) for k in ("type", "kind", "text")}
                for f in frames
                if f["type"]
                in (
                    ServerEvent.RESPONSE_OUTPUT_DELTA,
                    ServerEvent.ERROR,
                    ServerEvent.SESSION_CLOSED,
                )
            ]
        )
    gpu_mid = scrape(port, f"{label}: mid-session")
    emit("duplex", label=label, session_id=created.get("session_id"), steps=out)
    if close:
        await c.send({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"})
        closed = await c.until(ServerEvent.SESSION_CLOSED, timeout=30)
        emit("duplex_closed", label=label, reason=closed.get("reason"))
        await c.close()
    return c, out, gpu_mid


async def chat_turn(url: str) -> dict[str, Any]:
    c = await Client.connect(url, query="?mode=chat")
    await c.init()
    await c.send(
        {
            "type": ClientEvent.INPUT_APPEND,
            "input": {
                "messages": [{"role": "user", "content": "the quick brown fox"}],
                "streaming": True,
            },
        }
    )
    frames = await c.collect_until(ServerEvent.RESPONSE_DONE, ServerEvent.ERROR, timeout=30)
    done = frames[-1]
    await c.send({"type": ClientEvent.SESSION_CLOSE, "reason": "turn_done"})
    await c.until(ServerEvent.SESSION_CLOSED, timeout=30)
    await c.close()
    emit("chat", last=done)
    return done


def time_fork(parent: int, old: int, t_kill: float, into: dict[str, float]) -> None:
    """The replacement's pid, and seconds from the kill to its fork (Celery: its 5 s look)."""
    while time.monotonic() - t_kill < 120:
        kids = [k for k in children(parent) if k != old]
        if kids:
            into.update(seconds=time.monotonic() - t_kill, pid=kids[0])
            return
        time.sleep(0.01)


async def main() -> None:
    server = start_embedded()
    emit("redis", url=server.url, pid=server.process.pid)
    s = Stack(server.url)
    port = free_port()
    pypath = os.pathsep.join(
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        + [str(ROOT), str(ROOT / "deploy" / "gpu-check")]
    )
    s.env["PYTHONPATH"] = pypath  # gateway and worker: the carried packages and the wrapper
    opts = json.dumps({"model_loader": "gpu_standin:load", "device": DEVICE})
    try:
        t = time.monotonic()
        worker = s.start_worker(
            "minicpmo",
            OMNISERVE_MODEL_PATH="/tmp/none",
            OMNISERVE_DEVICE=DEVICE,
            OMNISERVE_BACKEND_OPTIONS=opts,
            OMNISERVE_WORKER_METRICS_PORT=str(port),
            OMNISERVE_WORKER_METRICS_HOST="127.0.0.1",
        )
        emit("worker_ready", seconds=round(time.monotonic() - t, 2), parent_pid=worker.popen.pid)
        gw = s.start_gateway()
        emit("gateway_ready", port=gw)
        parent = worker.popen.pid
        url = s.url()
        r = s.redis()
        for wid, raw in r.hgetall(s.keys.workers).items():
            info = orjson.loads(raw)
            emit(
                "registry",
                worker_id=wid.decode(),
                pid=info.get("pid"),
                state=info.get("state"),
                gpu_memory=(info.get("backend") or {}).get("gpu_memory"),
            )

        own0 = ownership(parent, "idle after load")
        kids0 = [c["pid"] for c in own0["children"]]
        child = kids0[0] if kids0 else None
        gpu_idle = scrape(port, "idle after load")

        # one duplex session (3 quiet, 1 loud, 3 quiet) and one chat turn
        steps = [silence(), silence(), silence(), speech(), silence(), silence(), silence()]
        _c, out, gpu_mid = await duplex_session(url, port, steps, "session 1")
        s.wait_free(1, timeout=20)
        gpu_after = scrape(port, "after session 1")
        own1 = ownership(parent, "during/after session 1")
        done = await chat_turn(url)
        s.wait_free(1, timeout=20)
        gpu_chat = scrape(port, "after chat turn")

        spoken = "".join(
            f.get("text") or "" for fr in out for f in fr if f.get("kind") == DeltaKind.TEXT
        )
        check(
            "duplex session over WebSocket", spoken == "Hello there, how can I help?", text=spoken
        )
        check(
            "chat turn over WebSocket",
            done.get("type") == ServerEvent.RESPONSE_DONE
            and done.get("text") == "echo: the quick brown fox",
            text=done.get("text"),
        )
        if DEVICE.startswith("cuda"):
            check(
                "worker GPU gauges",
                bool(gpu_idle)
                and gpu_idle.get("allocated", 0) >= 512 * 2**20
                and gpu_idle.get("total", 0) > 0
                and gpu_mid.get("allocated", 0) > gpu_idle.get("allocated", 0)
                and gpu_mid.get("reserved", 0) > gpu_idle.get("reserved", 0)
                and gpu_mid.get("allocated", 0) - gpu_after.get("allocated", 0) >= 7 * 2 * 2**20
                and gpu_after.get("reserved", 0) < gpu_mid.get("reserved", 0),
                idle=gpu_idle,
                mid_session=gpu_mid,
                after_session=gpu_after,
                after_chat=gpu_chat,
            )
            smi_pids = set(own1["nvidia_smi_pids"] or [])
            p_ev = own1["parent"]
            c_ev = next((c for c in own1["children"] if c["pid"] == child), {})
            check(
                "only the pool child holds CUDA",
                child is not None
                and child in smi_pids
                and parent not in smi_pids
                and not p_ev.get("libcuda_mapped")
                and p_ev.get("n_dev_nvidia_fds") == 0
                and bool(c_ev.get("libcuda_mapped"))
                and c_ev.get("n_dev_nvidia_fds", 0) > 0,
                parent=parent,
                child=child,
                nvidia_smi=own1["nvidia_smi_rows"],
                parent_evidence=p_ev,
                child_evidence=c_ev,
            )
        else:
            check(
                "worker GPU gauges absent on cpu", gpu_idle == {} and gpu_mid == {}, idle=gpu_idle
            )

        # kill -9 of the pool child mid-session
        c = await Client.connect(url, query="?mode=audio")
        await c.init(
            {
                "system_prompt": "You are a helpful assistant.",
                "voice": {"ref_audio_base64": voice_b64()},
            }
        )
        for a in (silence(), silence()):
            await c.step(a, timeout=30)
        old = children(parent)
        emit("kill", child=old, parent=parent)
        t_kill = time.monotonic()
        os.kill(old[0], signal.SIGKILL)
        forked: dict[str, float] = {}
        timer = threading.Thread(target=time_fork, args=(parent, old[0], t_kill, forked))
        timer.start()
        seen = []
        try:
            while True:
                ev = await c.recv(timeout=60)
                seen.append(
                    {
                        "at_s": round(time.monotonic() - t_kill, 2),
                        **{k: ev.get(k) for k in ("type", "reason", "code", "message") if k in ev},
                    }
                )
                if ev["type"] == ServerEvent.SESSION_RECOVERED:  # failed over: end it ourselves
                    await c.send({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"})
                if ev["type"] in (ServerEvent.SESSION_CLOSED,):
                    break
        except Exception as exc:  # noqa: BLE001
            seen.append({"exception": type(exc).__name__, "detail": str(exc)[:200]})
        emit("client_after_kill", seconds=round(time.monotonic() - t_kill, 2), frames=seen)
        await c.close()
        timer.join()
        emit("replacement_forked", seconds=round(forked.get("seconds", -1), 3))
        check(
            "replacement forked within 1 s of the kill",
            0 <= forked.get("seconds", -1) <= 1.0,
            seconds=forked.get("seconds"),
        )
        new = int(forked["pid"]) if "pid" in forked else None
        emit("new_child", pid=new, seconds=round(time.monotonic() - t_kill, 2))
        s.wait_slots(1, worker, timeout=180)
        emit("new_child_ready", seconds=round(time.monotonic() - t_kill, 2))
        own2 = ownership(parent, "after restart")
        gpu_new = scrape(port, "new child idle")
        _c2, out2, gpu_mid2 = await duplex_session(url, port, steps, "session after restart")
        s.wait_free(1, timeout=20)
        spoken2 = "".join(
            f.get("text") or "" for fr in out2 for f in fr if f.get("kind") == DeltaKind.TEXT
        )
        closed_reason = next(
            (f.get("reason") for f in seen if f.get("type") == ServerEvent.SESSION_CLOSED), None
        )
        check("client told when the child was killed", closed_reason is not None, frames=seen)
        check(
            "new child serves after kill -9",
            new is not None and new != old[0] and spoken2 == "Hello there, how can I help?",
            old_child=old[0],
            new_child=new,
            text=spoken2,
        )
        if DEVICE.startswith("cuda"):
            smi2 = set(own2["nvidia_smi_pids"] or [])
            n_ev = next((x for x in own2["children"] if x["pid"] == new), {})
            check(
                "new child initialised CUDA; parent still has none",
                new in smi2
                and old[0] not in smi2
                and parent not in smi2
                and not own2["parent"].get("libcuda_mapped")
                and bool(n_ev.get("libcuda_mapped"))
                and gpu_new.get("allocated", 0) >= 512 * 2**20
                and gpu_mid2.get("allocated", 0) > gpu_new.get("allocated", 0),
                nvidia_smi=own2["nvidia_smi_rows"],
                parent_evidence=own2["parent"],
                child_evidence=n_ev,
                gauges_new_child=gpu_new,
                gauges_mid_session=gpu_mid2,
            )
    finally:
        s.stop()
        server.stop()
        emit("summary", results=results)


asyncio.run(main())
