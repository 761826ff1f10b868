"""Every Lua script call a test makes touches the keys of one Redis Cluster slot.

On a cluster a script runs on the shard of its keys' slot, and one whose keys hash to several
slots is refused (``CROSSSLOT``). Run on a single Redis, the tests would never see such a call;
``one_slot_scripts`` (an autouse fixture in tests/conftest.py) wraps redis-py's script objects so
that every call in every in-process test is checked where it is made, whatever server it goes
to. ``lua.LIVENESS`` alone is exempt: it reads many sessions' keys in one call on a single Redis
or Sentinel, and ``api/gateway/liveness.py`` sends plain commands in its place on a cluster.
Only the project's own calls are checked: kombu's Redis transport (the task events a test
listens to) has scripts of its own, on a broker that is never a cluster.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from redis.commands.core import AsyncScript, Script
from redis.crc import key_slot

from streaming import lua

CROSSING_ALLOWED = {hashlib.sha1(lua.LIVENESS.encode()).hexdigest()}
OURS = {"api", "bench", "inference", "omnicore", "omniserve", "streaming", "tasks", "tests"}


class CrossSlotScript(AssertionError):
    """A script call whose keys hash to more than one slot."""


def slots_of(keys: Sequence[Any]) -> set[int]:
    """The cluster slots of ``keys`` (str or bytes)."""
    return {key_slot(k.encode() if isinstance(k, str) else bytes(k)) for k in keys}


def check(script: Script | AsyncScript, keys: Sequence[Any] | None) -> None:
    """Raise ``CrossSlotScript`` when ``keys`` of a call of ``script`` span several slots."""
    if script.sha in CROSSING_ALLOWED or not keys:
        return
    if len(slots_of(keys)) > 1:
        first = str(script.script).strip().splitlines()[0]
        raise CrossSlotScript(f"script {first!r} called with keys on several slots: {list(keys)}")


def ours(module: str) -> bool:
    """Whether a call from ``module`` is the project's (a library's scripts are its own affair)."""
    return module.partition(".")[0] in OURS


@contextmanager
def one_slot_scripts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Check every script call made meanwhile (see the module docstring)."""
    sync_call, async_call = Script.__call__, AsyncScript.__call__

    def checked(self: Script, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if ours(sys._getframe(1).f_globals.get("__name__", "")):
            check(self, keys)
        return sync_call(self, keys, args, client)

    async def checked_async(
        self: AsyncScript, keys: Any = None, args: Any = None, client: Any = None
    ) -> Any:
        if ours(sys._getframe(1).f_globals.get("__name__", "")):
            check(self, keys)
        return await async_call(self, keys, args, client)

    monkeypatch.setattr(Script, "__call__", checked)
    monkeypatch.setattr(AsyncScript, "__call__", checked_async)
    yield
