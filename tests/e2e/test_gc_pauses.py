"""Garbage-collector pauses (omnicore/gc_pauses.py): real collections timed per generation, the
heap frozen without freezing garbage, and real gateway and worker processes that froze theirs
once started and report it on /metrics (or did not, with ``OMNISERVE_GC_FREEZE=false``)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from omnicore.gc_pauses import PAUSE_BUCKETS, GcPauseCollector, GcPauses
from tests.support.metrics_scrape import scrape, total, worker_metrics_url
from tests.support.stack import ROOT, Stack


def run_script(code: str) -> str:
    """Run ``code`` in a fresh interpreter (a freeze or a fork must not touch pytest's heap)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_each_real_collection_is_timed_under_its_generation() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        before = [pauses.count(g) for g in (0, 1, 2)]
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        assert pauses.count(0) >= before[0] + 1
        assert pauses.count(2) == before[2] + 2
        assert pauses.sums[2] > 0
    finally:
        gc.callbacks.remove(pauses._callback)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GcPauseCollector(pauses))
    full = {
        s.labels.get("le"): s.value
        for f in registry.collect()
        for s in f.samples
        if s.labels.get("generation") == "2" and s.name.endswith("_bucket")
    }
    assert len(full) == len(PAUSE_BUCKETS) + 1
    values = [full[le] for le in (*map(repr, PAUSE_BUCKETS), "+Inf")]
    assert values == sorted(values) and values[-1] == pauses.count(2)  # cumulative
    frozen = registry.get_sample_value("omniserve_gc_frozen_objects")
    assert frozen == gc.get_freeze_count()


def test_freeze_collects_the_garbage_first_and_leaves_later_objects_collectable() -> None:
    out = run_script(
        """
        import gc, weakref
        from omnicore.gc_pauses import freeze_heap

        class Node:
            pass

        garbage = Node(); garbage.me = garbage  # a cycle nothing refers to any more
        gone = weakref.ref(garbage); del garbage
        kept = Node()
        frozen = freeze_heap()
        assert gone() is None, "garbage was frozen"
        assert frozen == gc.get_freeze_count() > 1000
        assert all(o is not kept for o in gc.get_objects())  # out of the collector's walk
        later = Node(); later.me = later
        later_ref = weakref.ref(later); del later
        gc.collect()
        assert later_ref() is None, "an object made after the freeze was not collected"
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_a_forked_process_counts_only_its_own_collections() -> None:
    out = run_script(
        """
        import gc, os
        from omnicore.gc_pauses import gc_pauses

        p = gc_pauses()
        gc.collect(2); gc.collect(2)
        assert p.count(2) == 2
        pid = os.fork()
        if pid == 0:
            ok = p.count(2) == 0
            gc.collect(2)
            os._exit(0 if ok and p.count(2) == 1 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert p.count(2) == 2
        print("ok")
        """
    )
    assert out.strip() == "ok"


def frozen_and_full_collections(url: str) -> tuple[float, float]:
    samples = scrape(url)
    names = {f.name for f in text_string_to_metric_families(httpx.get(url, timeout=10).text)}
    assert {"omniserve_gc_pause_seconds", "omniserve_gc_frozen_objects"} <= names
    return (
        total(samples, "omniserve_gc_frozen_objects"),
        total(samples, "omniserve_gc_pause_seconds_count", generation="2"),
    )


def test_started_gateway_and_worker_froze_their_heaps(stack: Stack) -> None:
    worker_url = worker_metrics_url(stack)  # prefork: the pool process that loaded the backend
    frozen, full = frozen_and_full_collections(worker_url)
    assert frozen > 10_000, frozen  # its libraries and backend, out of every collection's walk
    port = stack.start_gateway()
    frozen, full = frozen_and_full_collections(f"http://127.0.0.1:{port}/metrics")
    assert frozen > 10_000, frozen
    assert full >= 1  # the freeze's own full collection, timed like any other
    off = stack.start_gateway(OMNISERVE_GC_FREEZE="false")
    frozen, _ = frozen_and_full_collections(f"http://127.0.0.1:{off}/metrics")
    assert frozen == 0
