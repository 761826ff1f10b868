"""CPU and memory of the stack's processes (psutil), sampled in a background thread."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

import psutil


@dataclass
class Sampler:
    """Samples (wall time, cpu seconds, rss bytes) of named pids every ``interval`` seconds."""

    pids: dict[str, int]
    interval: float = 0.25
    samples: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        procs = {name: psutil.Process(pid) for name, pid in self.pids.items()}
        self.samples = {name: [] for name in procs}

        def loop() -> None:
            while not self._stop.is_set():
                t = time.time()
                for name, p in procs.items():
                    try:
                        ct = p.cpu_times()
                        self.samples[name].append((t, ct.user + ct.system, p.memory_info().rss))
                    except psutil.Error:
                        pass
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def window(self, name: str, a: float, b: float, digits: int = 1) -> dict[str, float]:
        """CPU % of one core and peak RSS (MiB) of ``name`` between wall times a and b."""
        s = self.samples.get(name) or []
        if len(s) < 2:
            return {"cpu_pct": 0.0, "rss_mib": 0.0}
        times = [x[0] for x in s]
        i = min(bisect_left(times, a), len(s) - 2)
        j = max(min(bisect_left(times, b), len(s) - 1), i + 1)
        dt = s[j][0] - s[i][0]
        cpu = (s[j][1] - s[i][1]) / dt * 100 if dt > 0 else 0.0
        rss = max(x[2] for x in s[i : j + 1]) / 2**20
        return {"cpu_pct": round(cpu, digits), "rss_mib": round(rss, 1)}


def rss_mib(pid: int) -> float:
    """Current RSS of a pid in MiB."""
    return psutil.Process(pid).memory_info().rss / 2**20
