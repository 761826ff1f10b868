"""``api.gateway.client_watch.ClientWatch``: one task looks at every connection; what it does to
each.

The connections here are small stand-ins with the attributes the watch reads (its ``Watched``
protocol); the end-to-end behaviour with real clients, frozen with SIGSTOP or never reading, is
in ``tests/faults/test_dead_clients.py``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from api.gateway import client_watch
from api.gateway.client_watch import ClientWatch
from api.metrics.registry import GatewayMetrics
from omnicore.settings import Settings
from streaming.events import CloseReason


@dataclass(eq=False)
class _Conn:
    gateway: Any
    silent_for: float = 0.0
    output_overflowed: bool = False
    evict_reason: CloseReason | None = None
    evicted: list[CloseReason] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    ws: Any = None
    log_id: str = "conn"

    def idle_seconds(self) -> float:
        return self.silent_for

    async def on_evict(self, reason: CloseReason) -> None:
        self.evicted.append(reason)
        self.gone.set()  # the session then ends the ordinary way


def _host() -> Any:
    return SimpleNamespace(settings=Settings(client_idle_timeout_s=5), metrics=GatewayMetrics())


async def test_one_sweep_evicts_a_silent_client_and_spares_the_others() -> None:
    watch, host = ClientWatch(), _host()
    quiet, talking = _Conn(host, silent_for=6.0), _Conn(host, silent_for=0.2)
    watch.add(quiet)
    watch.add(talking)
    await asyncio.wait_for(quiet.gone.wait(), 3 * client_watch.CHECK_S)
    assert (
        quiet.evicted == [CloseReason.CLIENT_IDLE] and quiet.evict_reason is CloseReason.CLIENT_IDLE
    )
    assert talking.evicted == []
    await watch.forget(quiet)
    await watch.forget(talking)
    assert len(watch) == 0
    await asyncio.sleep(client_watch.CHECK_S * 1.5)
    assert watch._task is not None and watch._task.done()  # no connection: no sweep


async def test_an_overflow_is_looked_at_at_once() -> None:
    watch, host = ClientWatch(), _host()
    conn = _Conn(host)
    watch.add(conn)
    conn.output_overflowed = True
    started = time.monotonic()
    watch.look_now(conn)
    await asyncio.wait_for(conn.gone.wait(), 1.0)
    assert time.monotonic() - started < client_watch.CHECK_S  # not at the next sweep
    assert conn.evicted == [CloseReason.OUTPUT_BACKPRESSURE]
    await watch.forget(conn)
    await watch.stop()


async def test_a_dropped_connection_is_not_looked_at_again() -> None:
    watch, host = ClientWatch(), _host()
    conn = _Conn(host)
    watch.add(conn)
    watch.drop(conn)
    conn.silent_for = 60.0
    await asyncio.sleep(client_watch.CHECK_S * 2.5)
    assert conn.evicted == [] and len(watch) == 0
    await watch.stop()
