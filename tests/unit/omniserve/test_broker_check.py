"""omniserve/broker_check.py: which brokers are checked at start, and what is said."""

from __future__ import annotations

import socket

from omnicore.settings import Settings
from omniserve.broker_check import broker_problem


def test_the_shared_redis_as_broker_is_not_checked() -> None:
    # nothing listens there: a part started before its Redis waits for it, as ever
    assert broker_problem(Settings(redis_url="redis://127.0.0.1:1/0", broker_url=None)) is None


def test_a_cluster_cannot_be_the_broker() -> None:
    problem = broker_problem(Settings(redis_url="redis+cluster://a:1,b:2/", broker_url=None))
    assert problem is not None and "OMNISERVE_REDIS_URL (the broker)" in problem
    assert "Redis Cluster" in problem


def test_a_broker_of_its_own_that_refuses_is_told_without_its_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = Settings(broker_url=f"amqp://omni:sesame-42@127.0.0.1:{port}/omni")
    problem = broker_problem(s)
    assert problem is not None
    assert problem.startswith(f"the broker at amqp://127.0.0.1:{port} does not answer")
    assert "sesame-42" not in problem and "OMNISERVE_BROKER_URL" in problem
