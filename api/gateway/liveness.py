"""The gateway's liveness checks of its sessions, batched: one Redis round trip per tick.

Every relayed session must notice, twice a second, when its worker stopped renewing the session
lease (``api/relay/task.py``) and, when resumable, when another connection took it over (the
``conn`` field of its resume record, ``api/realtime/resume.py``); a task not started yet, when the
worker process of its slot is gone (it will never start). Asked one session at a time that
was two commands per session every 0.5 s, a few per cent of a busy gateway's time. Here one
script call (``lua.LIVENESS``) per tick answers all of them with one character each: Redis runs
one command a tick where a pipeline brought it two per session. On Redis Cluster, where one
tick's keys live on many slots and a script touches one, the same questions go as one pipeline,
a batch per shard (``Liveness._read_routed``).

A relay registers a watch once (``watch_lease``, ``watch_replaced``, ``watch_worker``); every
tick's read then calls it with the answer, or with the error of a failed read, until it returns
False. The callback runs in this module's task and only notes the answer; the relay's own loop
acts on it, woken only when there is something to do. (Questions asked anew each tick cost a
future and a callback per session per tick, ~4 of the ~14 callbacks a duplex session cost the
gateway's event loop per second: docs/BENCHMARKS.md.) A watch is first read at the tick after it
was made.

A lease or a presence key read as gone right after Redis itself stalled says nothing about its
worker (``streaming/stalls.py``): until Redis has answered this loop's reads on time for
``settle_s`` (the lease TTL), such a key reads as held, and a dead worker's clients are told
that much later. A read that timed out (Redis stalls still) reads as held too, and so does one
that finds Redis away (a refused or lost connection, no primary: a Sentinel failover, a restart;
``streaming/outage.py``) for up to ``outage_grace_s``: the gateway cannot tell a dead worker
then, and a failover's two seconds outlast every lease. Once Redis answers again the leases
settle as after a stall (a restarted Redis has none until the workers' next beats), and a lease
still gone then is believed. Past the grace, the failed read is the watches' error (the sessions
end). Redis's clock in each answer tells a stall from one of this gateway itself, after which
the leases are news as usual (a session that ended meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final, Literal

import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from omnicore.aio import cancel_and_wait
from streaming import lua
from streaming.keys import Keys
from streaming.outage import Outage, is_outage
from streaming.redis_url import is_cluster, pipe_time
from streaming.stalls import StallWatch

log = logging.getLogger("omniserve.gateway")

TICK_S = 0.5  # one round trip per this for all sessions; a dead worker's clients are told
# within lease_ttl_s + TICK_S (a lapsed lease wakes its relay at once)
KEYS_PER_CALL = 500  # a script call reads at most this many keys: Redis serves other clients
# between the calls of a very large gateway's tick

DETACHED: Final = "detached"  # a resume record nobody relays: its worker took the gateway for gone
MISSING: Final = "missing"  # no resume record (Redis restarted empty): its owner writes it again
# what a tick read for one watch, or why it failed
Answer = bool | Literal["detached", "missing"] | Exception
Watch = Callable[[Answer], bool]  # called with each tick's answer; False: stop watching


class Liveness:
    """Batched lease and resume-owner reads; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        tick_s: float = TICK_S,
        settle_s: float = 0.0,
        outage_grace_s: float = 0.0,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.tick_s = tick_s
        self.stalls = StallWatch(tick_s, settle_s)  # 0: every gone key is believed at once
        self.outage = Outage(outage_grace_s)  # Redis unreachable: how long, and whether to wait
        self._server_s: float | None = None  # Redis's clock at the last read (``lua.LIVENESS``)
        self.leases: list[tuple[str, Watch]] = []
        self.replaced: list[tuple[str, str, Watch]] = []
        self.workers: list[tuple[str, Watch]] = []
        self._script = redis.register_script(lua.LIVENESS)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start reading (one read per tick while anything is watched)."""
        self._task = asyncio.create_task(self._run(), name="gateway-liveness")

    async def stop(self) -> None:
        """Stop; the watches are dropped without a last call."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        self.leases.clear()
        self.replaced.clear()
        self.workers.clear()

    def watch_lease(self, session_id: str, watch: Watch) -> None:
        """From the next tick on, tell ``watch`` whether the session's worker still renews its
        lease."""
        self.leases.append((session_id, watch))

    def watch_worker(self, worker_id: str, watch: Watch) -> None:
        """From the next tick on, tell ``watch`` whether the worker process is alive (its
        presence key, which it renews and its Celery parent deletes when it dies, exists)."""
        self.workers.append((worker_id, watch))

    def watch_replaced(self, session_id: str, conn_id: str, watch: Watch) -> None:
        """From the next tick on, tell ``watch`` whether a connection other than ``conn_id``
        relays the session now (its resume record names another one; ``DETACHED``: nobody
        does; ``MISSING``: there is no record)."""
        self.replaced.append((session_id, conn_id, watch))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.check(timed=True)

    async def check(self, timed: bool = False) -> None:
        """Read every watched key once (nothing when nothing is watched; a very large tick in
        several calls, ``KEYS_PER_CALL``) and tell each watch its answer. ``timed``: the loop's
        read, timed for stalls (module docstring)."""
        leases, workers, replaced = self.leases, self.workers, self.replaced
        if not leases and not workers and not replaced:
            self.stalls.paused()
            return
        # (watches made during the read go on the new lists)
        self.leases, self.workers, self.replaced = [], [], []
        keys = [self.keys.session_lease(sid) for sid, _ in leases]
        keys += [self.keys.worker_alive(wid) for wid, _ in workers]
        keys += [self.keys.session_resume(sid) for sid, _, _ in replaced]
        conns = [conn for _, conn, _ in replaced]
        answers: list[Answer]
        n, m = len(leases), len(leases) + len(workers)
        began = time.monotonic()
        try:
            flags = await self._read(keys, m, conns)
            if len(flags) != len(keys):
                raise ValueError(f"{len(flags)} answers to {len(keys)} questions")
            answers = [flag == ord("1") for flag in flags[:m]]
            answers += [_owner(flag) for flag in flags[m:]]
            away = self.outage.answered()
            stalled = timed and self.stalls.answered(began, self._server_s)
            if stalled and self.stalls.settle_s > 0:
                log.warning(
                    "liveness: Redis answered after %s; leases settle for %.1f s",
                    "a stall" if away is None else f"{away:.1f} s away",
                    self.stalls.settle_s,
                )
        except Exception as exc:  # noqa: BLE001 - each watch decides, as with its own command
            answers = [exc] * len(keys)
            if isinstance(exc, RedisTimeoutError):  # Redis stalls: no news of any worker
                log.warning("liveness check failed: %s", exc)
                answers[:m] = [True] * m
            elif self._away(exc):  # no news of anyone: no lease lapsed, nobody replaced
                answers = [i < m for i in range(len(keys))]
            else:
                log.warning("liveness check failed: %s", exc)
            self.stalls.failed()
        if timed and not self.stalls.settled():  # a gone lease or presence reads as held
            answers[:m] = [True if a is False else a for a in answers[:m]]
        self.leases += [w for w, a in zip(leases, answers[:n], strict=True) if _tell(w[1], a)]
        self.workers += [w for w, a in zip(workers, answers[n:m], strict=True) if _tell(w[1], a)]
        self.replaced += [w for w, a in zip(replaced, answers[m:], strict=True) if _tell(w[2], a)]

    def _away(self, exc: Exception) -> bool:
        """Whether a failed read found Redis away within the outage grace (logged once)."""
        if not is_outage(exc):
            return False
        began = not self.outage.away
        waiting = self.outage.failed()
        if began and waiting:
            log.warning("liveness: Redis is away (%s); leases read as held meanwhile", exc)
        elif not waiting and self.outage.lasted() < self.outage.grace_s + self.tick_s:
            log.warning("liveness: Redis away past %.1f s; its sessions end", self.outage.grace_s)
        return waiting

    async def _read(self, keys: list[str], leases: int, conns: list[str]) -> bytes:
        """One character per key (``lua.LIVENESS``), in calls of at most KEYS_PER_CALL keys;
        the first ``leases`` keys are asked whether they exist (leases, worker presence)."""
        if is_cluster(self.redis):
            return await self._read_routed(keys, leases, conns)
        flags = b""
        for i in range(0, len(keys), KEYS_PER_CALL):
            part = keys[i : i + KEYS_PER_CALL]
            n = max(0, min(len(part), leases - i))  # of them leases, then resume records
            first = max(0, i - leases)
            args: list[str | int] = [n, *conns[first : first + len(part) - n]]
            reply = await self._script(keys=part, args=args)
            if i == 0:  # Redis's clock as it ran the first part
                self._server_s = int(reply[1]) + int(reply[2]) / 1e6
            flags += _flags(reply[0])
        return flags

    async def _read_routed(self, keys: list[str], leases: int, conns: list[str]) -> bytes:
        """``_read`` on Redis Cluster, where the keys of one tick live on many slots and a script
        may touch one: the same questions as plain commands in one pipeline, which the cluster
        client sends as one batch to each shard, answered as ``lua.LIVENESS`` answers."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys[:leases]:
                pipe.exists(key)
            for key in keys[leases:]:
                pipe.hget(key, "conn")
            pipe_time(pipe, self.keys.queue)
            replies = await pipe.execute()
        now = replies.pop()
        self._server_s = int(now[0]) + int(now[1]) / 1e6
        flags = [b"1" if n else b"0" for n in replies[:leases]]
        for conn, asker in zip(replies[leases:], conns, strict=True):
            owner = conn.decode() if isinstance(conn, bytes) else conn
            if owner is None:
                flags.append(b"3")
            else:
                flags.append(b"2" if owner == "" else b"1" if owner != asker else b"0")
        return b"".join(flags)


def _owner(flag: int) -> Answer:
    """A resume record's flag (``lua.LIVENESS``) as a watch's answer."""
    return DETACHED if flag == ord("2") else MISSING if flag == ord("3") else flag == ord("1")


def _flags(reply: Any) -> bytes:
    """The script's flags (bytes, or str on a client that decodes responses)."""
    return reply.encode() if isinstance(reply, str) else bytes(reply)


def _tell(watch: Watch, answer: Answer) -> bool:
    """Call a watch; one that fails is logged and dropped (the other sessions' reads go on)."""
    try:
        return watch(answer)
    except Exception:
        log.exception("a liveness watch failed")
        return False
