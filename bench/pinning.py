"""CPU pinning: the gateway (or the baseline server) alone on one core, everything else elsewhere.

Pinned so, the gateway's CPU figure is its own work and not the load generator's, Redis's or the
workers' competing for the same core; its utilisation reads directly as a share of one core.
``os.sched_setaffinity`` is the system call ``taskset`` makes. Children inherit the affinity of
the process that starts them, so the benchmark pins itself to the other cores first and starts the
gateway and the baseline server with the gateway core only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from omniserve.redis_server import EmbeddedRedis, start_embedded


@dataclass(frozen=True)
class Pinning:
    """Which cores the server under test gets, and which the rest of the run gets."""

    server: frozenset[int]
    rest: frozenset[int]

    def describe(self) -> str:
        return f"server on cpu {sorted(self.server)}, everything else on cpu {sorted(self.rest)}"

    def pin_self(self) -> None:
        """Pin this process (the load generator), and so everything it starts later, to rest."""
        os.sched_setaffinity(0, self.rest)

    def server_preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` that moves the child onto the server core before it runs."""
        cores = self.server
        return lambda: os.sched_setaffinity(0, cores)


def plan(enabled: bool) -> Pinning | None:
    """The first allowed core for the server and the others for the rest; None when off or
    when fewer than two cores are allowed (then nothing is pinned and the figures say so)."""
    if not enabled or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    return Pinning(frozenset(cores[:1]), frozenset(cores[1:]))


_ACTIVE: list[Pinning] = []


def activate(p: Pinning | None) -> None:
    """Make ``p`` the run's pinning (bench.stack reads it when it starts a server)."""
    _ACTIVE.clear()
    if p is not None:
        p.pin_self()
        _ACTIVE.append(p)


def server_preexec() -> Callable[[], None] | None:
    """The pinning ``preexec_fn`` for a server process, or None when the run is not pinned."""
    return _ACTIVE[0].server_preexec() if _ACTIVE else None


def redis_beside(binary: str | None = None) -> tuple[EmbeddedRedis, Pinning | None]:
    """Start a private redis-server on the other core(s) and move this process onto the server
    core: the layout of a microbenchmark that stands in for the gateway (``bench.publish_path``,
    ``bench.input_path``). Returns the server and the plan (None: fewer than two cores)."""
    p = plan(True)
    if p:
        p.pin_self()  # Redis starts on the other core(s)...
    server = start_embedded(binary=binary)
    if p:
        os.sched_setaffinity(0, p.server)  # ...and this process on the gateway's
    return server, p
