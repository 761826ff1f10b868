"""Whether Redis is away for a while, and whether a session may still wait for it.

A Sentinel failover leaves no primary for a second or two; a restarted Redis refuses
connections until it listens again. Neither says anything about the workers or the gateways,
and the sessions they hold can carry on once Redis answers: the worker keeps its model session
and the gateway its client. So each reader and writer of a session keeps one ``Outage``: a lost
or refused connection starts it, each failure after that asks whether the session may still
wait (``redis_outage_grace_s`` from the first one), and an answer ends it. Past the grace the
failure is the caller's to report as before (the session ends).

An error that is an answer (a script error, a wrong type) is no outage; ``MISCONF`` and
``READONLY`` refusals are (Redis cannot take writes now, a replica promoted soon), and so is a
blocked read ended by a role change (``UNBLOCKED``).

On a Redis Cluster a shard being failed over is an outage of that shard's keys: redis-py's
cluster clients raise ``ClusterDownError`` (no primary for the slot yet), ``TryAgainError``,
redirections past their retries (``MovedError``, ``AskError``), ``ClusterError`` (its retries
spent) and ``RedisClusterException``s that say no node could be reached or no node serves the
slot (``SlotNotCoveredError``). ``RedisClusterException`` is not a ``RedisError``: code that
waits Redis out catches ``REDIS_ERRORS``.
"""

from __future__ import annotations

import threading
import time

import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)

REFUSALS = ("READONLY", "MISCONF", "UNBLOCKED", "LOADING", "MASTERDOWN")  # error replies' codes
WRITE_REFUSALS = ("OOM", "MISCONF", "READONLY")  # the codes of a write refused for a while
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a Redis command may raise, a cluster client's own errors included."""
REDIS_OR_OS_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)
_CLUSTER_AWAY = (ClusterDownError, TryAgainError, AskError, ClusterError)  # (MovedError: AskError)
_CLUSTER_MISUSE = (CrossSlotTransactionError, InvalidPipelineStack)  # the caller's own mistakes


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is away (unreachable, starting, or not a primary now) rather
    than that a command was wrong. (redis-py raises ``READONLY`` as ``ReadOnlyError`` without
    its code, ``LOADING`` as a connection error.)"""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | ReadOnlyError | OSError):
        return True
    if isinstance(exc, _CLUSTER_AWAY):
        return True
    if isinstance(exc, RedisClusterException):
        return not isinstance(exc, _CLUSTER_MISUSE)
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(REFUSALS)


def refuses_writes(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write it takes again later: full (``OOM``: maxmemory
    reached with noeviction), a failed save (``MISCONF``) or a replica (``READONLY``). Inside a
    script the reply carries the script's position first (``@user_script: 13: -OOM ...``).
    A writer that may wait out an outage waits this out the same way."""
    if isinstance(exc, ReadOnlyError | OutOfMemoryError):  # (redis-py drops their codes)
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    message = str(exc)
    if message.startswith("@user_script"):
        message = message.split(" -", 1)[-1]
    return message.startswith(WRITE_REFUSALS)


class Outage:
    """One reader's (or writer's) view of a Redis outage; thread-safe (the clock is read and
    written under a lock)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: float | None = None  # monotonic time of the first failure, None: no outage
        self._lock = threading.Lock()
        self.outages = 0  # how many began (for logs and tests)
        self.began_at: float | None = None  # monotonic: when the latest one began

    def failed(self) -> bool:
        """Redis could not be reached: True while the caller may wait and try again, False
        once the outage has lasted longer than the grace."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since = self.began_at = now
                self.outages += 1
            return self.grace_s > 0 and now - self._since <= self.grace_s

    def answered(self) -> float | None:
        """Redis answered: the outage (if any) is over; returns how long it lasted."""
        with self._lock:
            since, self._since = self._since, None
        return None if since is None else time.monotonic() - since

    @property
    def away(self) -> bool:
        """Whether an outage is going on (the last attempt failed)."""
        return self._since is not None

    def lasted(self) -> float:
        """Seconds since the outage began (0 when none is going on)."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since
