"""The gateway's liveness checks of its sessions, batched: one Redis round trip per tick.

Every relayed session must notice, twice a second, when its worker stopped renewing the session
lease (``api/task_relay.py``) and, when resumable, when another connection took it over (the
``conn`` field of its resume record, ``api/resumable.py``). Asked one session at a time that
was two commands per session every 0.5 s, a few per cent of a busy gateway's time. Here the
sessions' questions wait for the gateway's next tick, and one script call (``lua.LIVENESS``)
answers all of them with one character each: Redis runs one command a tick where a pipeline
brought it two per session (the gateway's own CPU did not change measurably either way,
docs/BENCHMARKS.md).

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
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis

from streaming import lua
from streaming.keys import Keys

log = logging.getLogger("omniserve.gateway")

TICK_S = 0.5  # one round trip per this for all sessions; with lease_ttl_s (1.5 s) a dead
# worker's clients are told within ~2 s (a lapsed lease wakes its relay at once)
KEYS_PER_CALL = 500  # a script call reads at most this many keys: Redis serves other clients
# between the calls of a very large gateway's tick


Q = TypeVar("Q", bound=Hashable)


class _Questions(Generic[Q]):
    """The open questions of one kind, by what they ask (never a done future in here)."""

    def __init__(self) -> None:
        self.open: dict[Q, asyncio.Future[bool]] = {}
        self.taken: set[Q] = set()  # handed to an asker since opened

    def ask(self, question: Q) -> asyncio.Future[bool]:
        fut = self.open.get(question)
        if fut is None:
            fut = self.open[question] = asyncio.get_running_loop().create_future()
        self.taken.add(question)
        return fut

    def take_all(self) -> dict[Q, asyncio.Future[bool]]:
        """The questions to answer now; those an asker holds are opened again at once."""
        batch, taken = self.open, self.taken
        loop = asyncio.get_running_loop()
        self.open = {q: loop.create_future() for q in batch if q in taken}
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
        self._leases: _Questions[str] = _Questions()
        self._replaced: _Questions[tuple[str, str]] = _Questions()
        self._script = redis.register_script(lua.LIVENESS)
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
        self._replaced.cancel()

    def lease(self, session_id: str) -> asyncio.Future[bool]:
        """Whether the session's worker still renews its lease, as read at the next tick."""
        return self._leases.ask(session_id)

    def replaced(self, session_id: str, conn_id: str) -> asyncio.Future[bool]:
        """Whether a connection other than ``conn_id`` relays the session now (its resume
        record names another one; detached or no record: False), at the next tick."""
        return self._replaced.ask((session_id, conn_id))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.check()

    async def check(self) -> None:
        """Answer every open question with one read (none when none is open; a very large tick
        in several, ``KEYS_PER_CALL``)."""
        leases, replaced = self._leases.take_all(), self._replaced.take_all()
        if not leases and not replaced:
            return
        keys = [self.keys.session_lease(sid) for sid in leases]
        keys += [self.keys.session_resume(sid) for sid, _ in replaced]
        conns = [conn for _, conn in replaced]
        futures = [*leases.values(), *replaced.values()]
        try:
            flags = await self._read(keys, len(leases), conns)
            if len(flags) != len(futures):
                raise ValueError(f"{len(flags)} answers to {len(futures)} questions")
        except Exception as exc:  # noqa: BLE001 - each asker decides, as with its own command
            log.warning("liveness check failed: %s", exc)
            _fail(leases, exc)
            _fail(replaced, exc)
            return
        for fut, flag in zip(futures, flags, strict=True):
            if not fut.done():
                fut.set_result(flag == ord("1"))

    async def _read(self, keys: list[str], leases: int, conns: list[str]) -> bytes:
        """One character per key (``lua.LIVENESS``), in calls of at most KEYS_PER_CALL keys."""
        flags = b""
        for i in range(0, len(keys), KEYS_PER_CALL):
            part = keys[i : i + KEYS_PER_CALL]
            n = max(0, min(len(part), leases - i))  # of them leases, then resume records
            first = max(0, i - leases)
            args: list[str | int] = [n, *conns[first : first + len(part) - n]]
            flags += _flags(await self._script(keys=part, args=args))
        return flags


def _flags(reply: Any) -> bytes:
    """The script's reply (bytes, or str on a client that decodes responses)."""
    return reply.encode() if isinstance(reply, str) else bytes(reply)


def _fail(batch: dict[Any, asyncio.Future[bool]], exc: Exception) -> None:
    for fut in batch.values():
        if not fut.done():
            fut.set_exception(exc)
            fut.exception()  # (retrieved: an asker that left does not log it again)
