"""What a garbage collection stalls, with and without the frozen heap: ``python -m bench.gc_pause``.

    python -m bench.gc_pause [--rounds 5] [--sessions 100 --seconds 20]

1. **A full collection of each process's heap** (a fresh interpreter per process kind, loaded as
   that process is once started): the gateway (``api.app`` and its app), the Celery parent
   (``tasks.celery_app``), a worker with the scripted backend and, when installed, with the
   pocket models. Printed: the objects the collector tracks and the median pause of
   ``gc.collect()`` before and after ``freeze_heap`` (``omnicore/gc_pauses.py``). Each full
   collection stalls every session the process serves for that long.
2. **A live run** (``--sessions``, 0 to skip): one gateway and scripted workers on the
   benchmark's private Redis, ``--sessions`` real-time duplex clients for ``--seconds``, once
   with ``OMNISERVE_GC_FREEZE=false`` and once with the default; the gateway's
   ``omniserve_gc_pause_seconds`` per generation over the run (count, total, and the bucket
   that holds the longest pause).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.duplex_load import run_load
from bench.stack import ROOT, Stack, install_cleanup, kill_all, shared_redis

HEAPS: dict[str, str] = {
    "gateway": "from api.app import create_app; app = create_app()",
    "celery parent": "import tasks.celery_app",
    "worker (scripted)": (
        "import tasks.celery_app; from inference.registry import create_backend; "
        "b = create_backend('scripted')"
    ),
    "worker (pocket)": (
        "import tasks.celery_app; from inference.registry import create_backend; "
        "b = create_backend('pocket')"
    ),
}

PROBE = """
import gc, json, statistics, time
{load}
from omnicore.gc_pauses import freeze_heap

def pause_ms():
    t0 = time.perf_counter(); gc.collect(); return (time.perf_counter() - t0) * 1e3

gc.collect()
tracked = len(gc.get_objects())
before = statistics.median(pause_ms() for _ in range({rounds}))
frozen = freeze_heap()
after = statistics.median(pause_ms() for _ in range({rounds}))
print(json.dumps({{"tracked": tracked, "before_ms": before, "frozen": frozen, "after_ms": after}}))
"""


def heap(kind: str, rounds: int) -> dict[str, Any] | None:
    """Full-collection pauses of one process kind's heap; None when it cannot load here."""
    code = textwrap.dedent(PROBE.format(load=HEAPS[kind], rounds=rounds))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        return None
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


Buckets = dict[str, dict[float, float]]  # generation -> bucket bound (s) -> cumulative count
Scrape = tuple[Buckets, dict[str, float]]  # and generation -> total pause (s)


def gc_scrape(url: str) -> Scrape:
    """The cumulative ``omniserve_gc_pause_seconds`` buckets and sums of a /metrics."""
    buckets: Buckets = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        if family.name != "omniserve_gc_pause_seconds":
            continue
        for s in family.samples:
            gen = s.labels["generation"]
            if s.name.endswith("_bucket"):
                le = float("inf") if s.labels["le"] == "+Inf" else float(s.labels["le"])
                buckets.setdefault(gen, {})[le] = s.value
            elif s.name.endswith("_sum"):
                sums[gen] = s.value
    return buckets, sums


def between(before: Scrape, after: Scrape) -> dict[str, dict[str, float]]:
    """Per generation, the collections between two scrapes: count, total pause (ms) and the
    smallest bucket bound (ms) that holds all of them (the longest one's)."""
    out = {}
    for gen, cum in sorted(after[0].items()):
        diff = {le: n - before[0].get(gen, {}).get(le, 0) for le, n in cum.items()}
        count = diff[float("inf")]
        longest = min(le for le, n in diff.items() if n >= count) if count else 0.0
        out[gen] = {
            "count": count,
            "total_ms": (after[1].get(gen, 0) - before[1].get(gen, 0)) * 1e3,
            "longest_le_ms": longest * 1e3,
        }
    return out


def live(sessions: int, seconds: float, freeze: bool) -> dict[str, Any]:
    """One stack, ``sessions`` duplex clients; the gateway's collections during the run."""
    stack = Stack(shared_redis(), env={"OMNISERVE_GC_FREEZE": "true" if freeze else "false"})
    try:
        stack.start_gateway()
        stack.start_workers(sessions)
        url = f"http://127.0.0.1:{stack.port}/metrics"
        before = gc_scrape(url)
        res = asyncio.run(run_load(stack.url, sessions, seconds, warmup=2))
        after = gc_scrape(url)
    finally:
        stack.stop()
    return {
        "freeze": freeze,
        "gc": between(before, after),
        "deltas": len(res.records),
        "errors": len(res.errors),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="full collections timed per heap")
    p.add_argument("--sessions", type=int, default=100, help="live run's sessions (0: skip)")
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    print("A full collection of each process's heap (median of", args.rounds, "collections)")
    print(f"{'process':20s} {'tracked':>9s} {'pause ms':>9s} {'frozen':>9s} {'after ms':>9s}")
    for kind in HEAPS:
        r = heap(kind, args.rounds)
        if r is None:
            print(f"{kind:20s} (cannot load here)")
            continue
        print(
            f"{kind:20s} {r['tracked']:9d} {r['before_ms']:9.2f} "
            f"{r['frozen']:9d} {r['after_ms']:9.2f}"
        )
    if args.sessions <= 0:
        return 0
    install_cleanup()
    try:
        runs = [live(args.sessions, args.seconds, freeze) for freeze in (False, True)]
    finally:
        kill_all()
    print(f"\nThe gateway's collections, {args.sessions} duplex sessions for {args.seconds:.0f} s")
    print(f"{'freeze':7s} {'gen':>3s} {'count':>6s} {'total ms':>9s} {'longest <= ms':>13s}")
    for run in runs:
        for gen, g in run["gc"].items():
            print(
                f"{str(run['freeze']).lower():7s} {gen:>3s} {g['count']:6.0f} "
                f"{g['total_ms']:9.1f} {g['longest_le_ms']:13.1f}"
            )
        print(f"        (the clients got {run['deltas']} deltas, {run['errors']} errors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
