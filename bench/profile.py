"""Profile the gateway (and worker) under duplex load with py-spy; print the hottest frames.

    python -m bench.profile [--sessions 50] [--seconds 10] [--deflate]

Starts the stack, runs N real-time sessions, samples the gateway and worker with
``py-spy record --format raw`` (needs ``py-spy``; on Linux, ptrace permission) and prints the
functions with the most samples (self and inclusive). The worker is sampled only where a thread
holds the GIL (``--gil``: its CPU time); sampled whole, its session threads waiting on Redis
filled ~86 % of the profile. Everything it starts is killed at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from bench.duplex_load import run_load
from bench.stack import Stack, install_cleanup, kill_all, shared_redis

OUT = Path("/tmp/omniserve-bench-profile")


def top(raw: Path, n: int = 15) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """(self, inclusive) sample counts per function from a py-spy raw (collapsed) file."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        total += c
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].split("/")[-1] + ")"
            for f in stack.split(";")
        ]
        own[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    return own.most_common(n), incl.most_common(n), total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--deflate", action="store_true", help="gateway with permessage-deflate")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    install_cleanup()
    OUT.mkdir(parents=True, exist_ok=True)
    stack = Stack(shared_redis(), deflate=args.deflate)
    try:
        stack.start_gateway()
        stack.start_workers(args.sessions)
        assert stack.gateway is not None
        targets = {"gateway": stack.gateway.pid, "worker": stack.workers[0].pid}
        procs: dict[str, subprocess.Popen[bytes]] = {}

        def record() -> None:
            import time

            time.sleep(4)  # sessions connected and streaming
            for name, pid in targets.items():
                procs[name] = subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(args.seconds),
                        "--rate",
                        "200",
                        "--format",
                        "raw",
                        "--nonblocking",
                        *(["--gil"] if name == "worker" else []),
                        "-o",
                        str(OUT / f"{name}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

        threading.Thread(target=record, daemon=True).start()
        res = asyncio.run(run_load(stack.url, args.sessions, args.seconds + 4, warmup=2))
        for proc in procs.values():
            proc.wait(timeout=30)
        print(f"{args.sessions} sessions, {len(res.records)} deltas, errors {len(res.errors)}")
        for name in targets:
            raw = OUT / f"{name}.txt"
            if not raw.exists():
                print(f"{name}: no profile (py-spy missing or not permitted)")
                continue
            own, incl, total = top(raw)
            print(f"\n== {name}: {total} samples; self time")
            for fn, c in own:
                print(f"  {100 * c / total:5.1f}%  {fn}")
            print(f"-- {name}: inclusive")
            for fn, c in incl:
                print(f"  {100 * c / total:5.1f}%  {fn}")
    finally:
        stack.stop()
        kill_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
