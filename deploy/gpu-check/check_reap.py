"""Part D: when a killed pool-like child holding CUDA can be reaped, against when its sentinel
pipe closes (what Celery's pool watches). The gap is why Celery's own pool replaced a killed
pool process only at its next 5 s look, and why ``tasks/prefork.py`` looks every 0.25 s.

Usage: python deploy/gpu-check/check_reap.py DEVICE
Prints one JSON object per child (0.5 GiB idle, 0.5 GiB busy, 20 GiB busy) and a check line.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.connection import Connection, wait

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"


def child(ready: Connection, gib: float, busy: bool) -> None:
    import torch  # after the fork: CUDA only in the child, as in the worker

    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=DEVICE)
    held.fill_(1)
    a = torch.randn(2048, 2048, device=DEVICE)
    (a @ a).sum().item()
    ready.send("ready")
    while True:
        (a @ a).sum().item() if busy else time.sleep(0.5)


def main() -> None:
    ctx = mp.get_context("fork")
    gaps = []
    for gib, busy in [(0.5, False), (0.5, True), (20.0 if DEVICE != "cpu" else 0.5, True)]:
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=child, args=(w, gib, busy))
        p.start()
        r.recv()
        time.sleep(0.5)
        t = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        sentinel = reaped = None
        while reaped is None and time.monotonic() - t < 20:
            if sentinel is None and wait([p.sentinel], timeout=0):
                sentinel = time.monotonic() - t
            if os.waitpid(p.pid, os.WNOHANG)[0]:
                reaped = time.monotonic() - t
            time.sleep(0.002)
        gaps.append((reaped or 99) - (sentinel or 0))
        times = {"sentinel_s": sentinel, "reaped_s": reaped}
        emit(
            {
                "tag": "reap",
                "gib": gib,
                "busy": busy,
                **{k: v and round(v, 3) for k, v in times.items()},
            }
        )
    gap_s = [round(g, 3) for g in gaps]
    emit({"tag": "check", "name": "reapable after the sentinel", "status": "INFO", "gap_s": gap_s})


def emit(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


if __name__ == "__main__":
    main()
