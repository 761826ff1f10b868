"""What the gateway's event loop runs, per session and second of duplex load.

    python -m bench.loop_census [--sessions 100] [--seconds 20] [--top 25] [--tree DIR]

The gateway's CPU follows the number of callbacks its event loop runs (task steps, socket
reads, timers), each of which runs Python through several layers; the payloads themselves cost
a few per cent (docs/BENCHMARKS.md). This counts them: the gateway runs on asyncio's own loop
(uvloop's callbacks are out of Python's reach) with ``Handle._run`` wrapped by a
``sitecustomize`` of this module's making, and the count covers the load's measured window only.
Each callback is named by what it runs: a task's step by the coroutine the task was created
with, a bound method by its class and name. Figures are relative (the plain loop costs more
than uvloop): compare two runs of it, not its CPU with other benchmarks'.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.duplex_load import run_load
from bench.stack import ROOT, Stack, install_cleanup, shared_redis

SITECUSTOMIZE = '''
"""bench.loop_census: count the gateway's event loop callbacks (the gateway process only)."""
import os, sys

def _install():
    with open("/proc/self/cmdline", "rb") as fh:
        argv = fh.read().split(b"\\0")
    if b"gateway" not in argv:
        return
    sys.modules["uvloop"] = None  # uvicorn's "auto" loop falls back to asyncio's own
    import asyncio.events, collections, signal, orjson
    counts = collections.Counter()
    on = [False]
    run = asyncio.events.Handle._run

    def name(cb):
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return "task " + getattr(coro, "__qualname__", repr(coro))
        if owner is not None:
            return type(owner).__qualname__ + "." + getattr(cb, "__name__", "?")
        inner = getattr(cb, "func", None)  # functools.partial
        if inner is not None:
            return name(inner)
        return getattr(cb, "__qualname__", type(cb).__qualname__)

    def counted(self):
        if on[0]:
            counts[name(self._callback)] += 1
        return run(self)

    asyncio.events.Handle._run = counted

    def start(*_):
        counts.clear()
        on[0] = True

    def dump(*_):
        on[0] = False
        with open(os.environ["OMNISERVE_CENSUS_OUT"], "wb") as fh:
            fh.write(orjson.dumps(dict(counts)))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)

_install()
'''


def census(sessions: int, seconds: float, tree: Path = ROOT, warmup: float = 3.0) -> dict[str, int]:
    """The gateway's callbacks by name over ``seconds`` of ``sessions`` duplex sessions."""
    with tempfile.TemporaryDirectory(prefix="omniserve-census-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        out = Path(tmp) / "counts.json"
        st = Stack(shared_redis(), root=tree)
        st.env = {
            "PYTHONPATH": f"{site}{os.pathsep}{st.root}",
            "OMNISERVE_CENSUS_OUT": str(out),
        }
        try:
            st.start_gateway()
            st.start_workers(sessions)
            assert st.gateway is not None
            pid = st.gateway.pid

            async def load() -> None:
                started = asyncio.Event()
                task = asyncio.create_task(run_load(st.url, sessions, seconds, warmup, started))
                await asyncio.wait(
                    [task, asyncio.ensure_future(started.wait())],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not started.is_set():
                    raise RuntimeError(f"load failed: {(await task).errors[:3]}")
                await asyncio.sleep(warmup)
                os.kill(pid, signal.SIGUSR1)
                await asyncio.sleep(seconds)
                os.kill(pid, signal.SIGUSR2)
                res = await task
                if res.errors:
                    raise RuntimeError(f"load failed: {res.errors[:3]}")

            asyncio.run(load())
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            return {str(k): int(v) for k, v in orjson.loads(out.read_bytes()).items()}
        finally:
            st.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--tree", type=Path, default=ROOT, help="the source tree to run (git archive)")
    args = p.parse_args(argv)
    install_cleanup()
    counts = census(args.sessions, args.seconds, args.tree.resolve())
    per = args.sessions * args.seconds
    total = sum(counts.values())
    print(f"{args.sessions} sessions, {args.seconds:g} s: {total / per:.1f} callbacks/session-s")
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{n / per:8.2f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
