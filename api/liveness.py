"""The gateway's liveness checks of its sessions, batched: one Redis round trip per tick.

Every relayed session must notice, twice a second, when its worker stopped renewing the session
lease (``api/task_relay.py``) and, when resumable, when another connection took it over (the
``conn`` field of its resume record, ``api/resumable.py``). Asked one session at a time that
was two commands per session every 0.5 s, a few per cent of a busy gateway's time. Here the
sessions' questions wait for the gateway's next tick, and one pipeline answers all of them.

A question is answered by a read made after it was asked (at the first tick after it), so an
answer is never older than the question. A session asked about in one tick gets a question
opened for it at once, read at the next tick whether or not its relay has come back for it yet:
a relay that asks again as soon as it has its answer sees a fresh read every tick, the cadence
of the single commands (a session nobody asks about any more is read once more, then dropped).
A failed read fails every question of that tick with the error, as the single command did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis

from streaming.keys import Keys

log = logging.getLogger("omniserve.gateway")

TICK_S = 0.5  # one round trip per this for all sessions; with lease_ttl_s (1.5 s) a dead
# worker's clients are told within ~2.5 s


T = TypeVar("T")


class _Questions(Generic[T]):
    """The open questions of one kind, by session id (never a done future in here)."""

    def __init__(self) -> None:
        self.open: dict[str, asyncio.Future[T]] = {}
        self.taken: set[str] = set()  # handed to an asker since opened

    def ask(self, session_id: str) -> asyncio.Future[T]:
        fut = self.open.get(session_id)
        if fut is None:
            fut = self.open[session_id] = asyncio.get_running_loop().create_future()
        self.taken.add(session_id)
        return fut

    def take_all(self) -> dict[str, asyncio.Future[T]]:
        """The questions to answer now; those an asker holds are opened again at once."""
        batch, taken = self.open, self.taken
        loop = asyncio.get_running_loop()
        self.open = {sid: loop.create_future() for sid in batch if sid in taken}
        self.taken = set()
        return batch

    def cancel(self) -> None:
        for fut in self.open.values():
            fut.cancel()
        self.open.clear()


class Liveness:
    """Batched lease and resume-owner reads; see the module docstring."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, tick_s: float = TICK_S) -> None:
        self.redis = redis
        self.keys = keys
        self.tick_s = tick_s
        self._leases: _Questions[bool] = _Questions()
        self._owners: _Questions[str | None] = _Questions()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start answering questions (one read per tick while any is open)."""
        self._task = asyncio.create_task(self._run(), name="gateway-liveness")

    async def stop(self) -> None:
        """Stop; open questions are cancelled."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._leases.cancel()
        self._owners.cancel()

    def lease(self, session_id: str) -> asyncio.Future[bool]:
        """Whether the session's worker still renews its lease, as read at the next tick."""
        return self._leases.ask(session_id)

    def owner(self, session_id: str) -> asyncio.Future[str | None]:
        """The connection that relays the session ("" detached; None: no record), at the next
        tick."""
        return self._owners.ask(session_id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.check()

    async def check(self) -> None:
        """Answer every open question with one pipelined read (none when none is open)."""
        leases, owners = self._leases.take_all(), self._owners.take_all()
        if not leases and not owners:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for sid in leases:
                    pipe.exists(self.keys.session_lease(sid))
                for sid in owners:
                    pipe.hget(self.keys.session_resume(sid), "conn")
                got = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - each asker decides, as with its own command
            log.warning("liveness check failed: %s", exc)
            _fail(leases, exc)
            _fail(owners, exc)
            return
        for fut, alive in zip(leases.values(), got, strict=False):
            if not fut.done():
                fut.set_result(bool(alive))
        for owner, conn in zip(owners.values(), got[len(leases) :], strict=False):
            if not owner.done():
                owner.set_result(None if conn is None else _text(conn))


def _fail(batch: dict[str, asyncio.Future[Any]], exc: Exception) -> None:
    for fut in batch.values():
        if not fut.done():
            fut.set_exception(exc)
            fut.exception()  # (retrieved: an asker that left does not log it again)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
