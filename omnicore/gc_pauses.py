"""The garbage collector's pauses: the long-lived heap frozen once a process is up, and every
collection's pause counted for ``/metrics``.

Why: CPython's full (generation 2) collection walks every object the collector tracks while the
whole process waits, so each one stalls every session a process serves at once, for longer the
larger the heap: a gateway's after startup (FastAPI, pydantic, redis-py), and more so a pocket
worker's after its models loaded (``python -m bench.gc_pause`` measures them,
docs/BENCHMARKS.md). Almost all of those objects (modules, classes, the
app, the model) live as long as the process; ``freeze_heap`` moves them to the permanent
generation once startup is over (``gc.freeze``), so a later full collection walks only what was
allocated since. Nothing that is garbage at that moment is frozen: a full collection runs first.

``GcPauses`` times every collection (``gc.callbacks``) into plain per-generation counters, read at
scrape time as the histogram ``omniserve_gc_pause_seconds`` (with ``omniserve_gc_frozen_objects``).
The callback runs inside the collector, in whatever thread allocated: it takes no lock (a lock
held by the same thread when the collection started would deadlock it) and allocates nothing
that could outlive it.
"""

from __future__ import annotations

import bisect
import gc
import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Seconds: a young collection is tens of microseconds, a full one of a large heap 100+ ms.
PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = (0, 1, 2)


def freeze_heap() -> int:
    """Collect what is garbage now, then freeze every surviving object (``gc.freeze``).

    Call it once a process has finished starting (the gateway's startup, a worker's backend
    loaded). Returns the number of objects frozen by now.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Per-generation pause counts of this process's collections (see the module docstring).

    One per process (``gc_pauses()``): the callback is process-wide.
    """

    def __init__(self) -> None:
        self.buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in GENERATIONS]
        self.sums = [0.0 for _ in GENERATIONS]
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start timing collections (once; later calls do nothing)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        gen = info["generation"]
        self.buckets[gen][bisect.bisect_left(PAUSE_BUCKETS, pause)] += 1
        self.sums[gen] += pause

    def count(self, generation: int) -> int:
        """Collections of ``generation`` timed so far."""
        return sum(self.buckets[generation])

    def families(self) -> Iterator[Metric]:
        """The pause histogram (cumulative buckets per generation) and the frozen objects."""
        hist = HistogramMetricFamily(
            "omniserve_gc_pause_seconds",
            "Pause of one garbage collection of this process, by generation (2: a full one).",
            labels=["generation"],
        )
        for gen in GENERATIONS:
            counts = list(self.buckets[gen])  # a collection may land while this reads
            cumulative, buckets = 0, []
            for le, n in zip((*PAUSE_BUCKETS, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if le == float("inf") else repr(le), cumulative))
            hist.add_metric([str(gen)], buckets, sum_value=self.sums[gen])
        yield hist
        yield GaugeMetricFamily(
            "omniserve_gc_frozen_objects",
            "Objects this process froze once it had started (never walked by a collection).",
            value=gc.get_freeze_count(),
        )


class GcPauseCollector(Collector):
    """Registers this process's ``GcPauses`` on a ``prometheus_client`` registry."""

    def __init__(self, pauses: GcPauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[Metric]:
        return self.pauses.families()


_PAUSES = GcPauses()


def _forget_parents_collections() -> None:
    """A forked pool process counts its own collections, not its parent's."""
    fresh = GcPauses()
    _PAUSES.buckets, _PAUSES.sums = fresh.buckets, fresh.sums


os.register_at_fork(after_in_child=_forget_parents_collections)


def gc_pauses() -> GcPauses:
    """This process's pause counters, timing from now on."""
    _PAUSES.install()
    return _PAUSES
