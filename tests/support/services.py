"""A real service held for one block: started, handed over, stopped however the block ends; and
a ``Stack`` on a Redis and a broker of a test's choosing, its processes stopped after.

Why: every fixture of a RabbitMQ node, a Sentinel set, a Redis Cluster or a Stack on another
URL is the same start, yield and stop; a stop in ``finally`` also takes down what a start that
failed half way left running (a node's processes, its files).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

from tests.support.stack import Stack


class Service(Protocol):
    """What a test starts for real and must stop (``RabbitMQ``, ``SentinelSet``, a cluster)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


@contextmanager
def running(service: S) -> Iterator[S]:
    """``service`` started for the block and stopped after it, also when the start raised."""
    try:
        service.start()
        yield service
    finally:
        service.stop()


@contextmanager
def stack_on(redis_url: str, broker_url: str | None = None) -> Iterator[Stack]:
    """A ``Stack`` keeping its shared state at ``redis_url`` and, given ``broker_url``, Celery's
    messages and task events there (RabbitMQ, another Redis, a Redis behind Sentinel); every
    gateway and worker it started is stopped after the block."""
    stack = Stack(redis_url, broker_url=broker_url)
    try:
        yield stack
    finally:
        stack.stop()
