"""Looking at a ``Liveness``'s watches from a test."""

from __future__ import annotations

import asyncio
from typing import Any

from api.gateway.liveness import Liveness


async def watched(live: Liveness, kind: str, step_s: float = 0.005) -> list[tuple[str, Any]]:
    """The watches of ``kind`` (``leases``, ``workers``), looked at outside a tick's read
    (while one is in flight its list is empty: watches made meanwhile go on a new one; a loaded
    machine made that a flake). Empty if none shows within 200 looks."""
    for _ in range(200):
        found: list[tuple[str, Any]] = list(getattr(live, kind))
        if found:
            return found
        await asyncio.sleep(step_s)
    return []
