"""Fixtures of the fault tests: stacks that may own their Redis server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fault_harness import RestartableRedis
from tests.support.stack import Stack


@pytest.fixture
def own_redis() -> Iterator[RestartableRedis]:
    """A Redis server this test alone uses, and may kill and start again."""
    server = RestartableRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_stack(own_redis: RestartableRedis) -> Iterator[Stack]:
    """A stack on the test's own Redis (start gateways and workers in the test)."""
    s = Stack(own_redis.url)
    try:
        yield s
    finally:
        s.stop()
