"""streaming/broker_url.py: what kombu is given for each broker spelling, what is shown of it,
and the start-up check against a real Redis and ports that refuse or stay silent."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from omnicore.settings import BROKER_SCHEMES
from streaming.broker_url import (
    KINDS,
    broker_target,
    gateway_transport_options,
    unreachable,
    where,
    worker_transport_options,
)
from streaming.redis_connection import TCP_OPTIONS


def test_every_spelling_the_settings_take_is_read() -> None:
    assert set(KINDS) == set(BROKER_SCHEMES)


def test_redis_and_amqp_go_to_kombu_as_given() -> None:
    for url, kind in [
        ("redis://:pw@broker:6379/2", "redis"),
        ("rediss://broker:6380/0", "redis"),
        ("amqp://omni:pw@mq:5672/omni", "amqp"),
        ("amqps://omni:pw@mq/omni", "amqp"),
    ]:
        target = broker_target(url)
        assert (target.kind, target.kombu_url, target.transport_options) == (kind, url, {})


def test_sentinel_goes_to_kombu_in_its_own_spelling() -> None:
    target = broker_target("redis+sentinel://:pw@s1,s2:26380/omni/4")
    assert target.kind == "sentinel"
    assert target.kombu_url == "sentinel://:pw@s1:26379/4;sentinel://:pw@s2:26380/4"
    assert target.transport_options["master_name"] == "omni"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://mq", "http:// is not a broker"),
        ("mq:5672", "is not a broker"),
        ("redis+cluster://a:1,b:2/", r"redis\+cluster:// is not a broker.*Redis Cluster"),
        ("amqp:///vhost", "without a host"),
        ("amqp://mq:notaport/", "not a broker URL"),
        ("redis+sentinel://s1/", "/SERVICE"),
    ],
)
def test_other_urls_are_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        broker_target(url)


def test_what_is_shown_has_no_credentials_path_or_options() -> None:
    assert where("amqp://omni:secret@mq:5672/omni?heartbeat=5") == "amqp://mq:5672"
    assert where("redis+sentinel://:secret@s1,s2:26380/omni/4") == "redis+sentinel://s1,s2:26380"
    assert where("redis://broker/0") == "redis://broker"


def test_transport_options_suit_each_kind() -> None:
    amqp = broker_target("amqp://mq//")
    assert gateway_transport_options(amqp) == {"confirm_publish": True}
    assert worker_transport_options(amqp) == {}  # no redis-py socket options for py-amqp
    redis_target = broker_target("redis://broker/0")
    assert gateway_transport_options(redis_target) == {"ack_emulation": False}
    assert worker_transport_options(redis_target) == {"ack_emulation": False, **TCP_OPTIONS}
    sentinel = worker_transport_options(broker_target("redis+sentinel://s1/omni"))
    assert sentinel["master_name"] == "omni" and sentinel["ack_emulation"] is False


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


def test_a_redis_that_answers_passes_the_check(redis_server: str) -> None:
    assert unreachable(redis_server) is None


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
def test_a_broker_that_refuses_or_stays_silent_fails_the_check(
    scheme: str, silent_port: int
) -> None:
    refused = unreachable(f"{scheme}://127.0.0.1:{refused_port()}/")
    assert refused is not None and "refused" in refused.lower(), refused
    silent = unreachable(f"{scheme}://127.0.0.1:{silent_port}/", timeout_s=0.5)
    assert silent is not None, silent
