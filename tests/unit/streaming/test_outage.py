"""streaming/outage.py: which errors mean Redis is away, and the grace of one outage."""

from __future__ import annotations

import time

import redis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from streaming.outage import REDIS_ERRORS, REDIS_OR_OS_ERRORS, Outage, is_outage


def test_errors_that_say_redis_is_away_and_those_that_do_not() -> None:
    assert is_outage(redis.ConnectionError("Error 111 connecting"))
    assert is_outage(redis.TimeoutError("Timeout reading"))
    assert is_outage(BusyLoadingError("Redis is loading the dataset in memory"))
    assert is_outage(ReadOnlyError("You can't write against a read only replica."))
    assert is_outage(redis.ResponseError("MISCONF Redis is configured to save RDB snapshots"))
    assert is_outage(redis.ResponseError("UNBLOCKED force unblock from blocking operation"))
    assert not is_outage(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_outage(ValueError("not Redis"))


def test_an_outage_may_be_waited_for_until_its_grace_is_over() -> None:
    outage = Outage(0.3)
    assert outage.answered() is None and not outage.away
    assert outage.failed() and outage.away  # the first failure starts it
    began = outage.began_at
    time.sleep(0.1)
    assert outage.failed() and outage.began_at == began  # the same outage
    time.sleep(0.3)
    assert not outage.failed()  # past the grace
    lasted = outage.answered()
    assert lasted is not None and lasted >= 0.4 and not outage.away
    assert outage.failed() and outage.outages == 2  # a new one, a new grace


def test_without_a_grace_nothing_is_waited_for() -> None:
    assert not Outage(0.0).failed()


def test_a_cluster_shard_away_is_an_outage_and_a_misuse_is_not() -> None:
    """redis-py's cluster errors while a shard fails over are outages, caught as Redis errors
    (``RedisClusterException`` is not a ``RedisError``); a transaction across slots is not."""
    away = [
        ClusterDownError("The cluster is down"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        MovedError("3999 127.0.0.1:6381"),
        AskError("3999 127.0.0.1:6381"),
        ClusterError("TTL exhausted."),
        SlotNotCoveredError("Slot 3999 is not covered by the cluster."),
        RedisClusterException("Redis Cluster cannot be connected."),
    ]
    for exc in away:
        assert is_outage(exc), exc
        assert isinstance(exc, REDIS_ERRORS)
    assert not is_outage(CrossSlotTransactionError("keys in several slots"))
    assert isinstance(OSError(), REDIS_OR_OS_ERRORS)
