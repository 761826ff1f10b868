"""``streaming/redis_url.py``: Sentinel URLs read, and handed to redis-py and kombu as they take
them (the failover itself, with real servers: tests/faults/test_redis_sentinel.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.commands.core import StreamCommands
from redis.sentinel import SentinelConnectionPool

from streaming.redis_url import (
    CLUSTER_PORT,
    SENTINEL_PORT,
    ClusterTarget,
    async_client,
    async_pool,
    celery_broker,
    cluster_target,
    is_cluster,
    is_cluster_url,
    is_sentinel,
    sentinel_target,
    sync_pool,
    topology,
)


def test_one_server_urls_are_left_to_redis_py() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///tmp/r.sock"):
        assert sentinel_target(url) is None and not is_sentinel(url)
        assert celery_broker(url) == (url, {})
    pool = sync_pool("redis://127.0.0.1:1/3?socket_timeout=4", blocking=True, max_connections=7)
    assert isinstance(pool, redis.BlockingConnectionPool)
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["socket_timeout"] == 4


def test_a_sentinel_url_is_read() -> None:
    url = (
        "redis+sentinel://app:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/primary-a/2"
        "?socket_timeout=3&sentinel_password=watch"
    )
    target = sentinel_target(url)
    assert target is not None and is_sentinel(url)
    assert target.sentinels == (("10.0.0.1", 26380), ("sentinel-b", SENTINEL_PORT), ("::1", 26381))
    assert target.service == "primary-a"
    node = target.node_options
    assert (node["username"], node["password"], node["db"]) == ("app", "s@cret", 2)
    assert node["socket_timeout"] == 3.0  # typed as in a redis:// URL
    assert target.sentinel_options == {"password": "watch"}
    assert sentinel_target("redis+sentinel://h/svc").node_options["db"] == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h:26379",  # no service
        "redis+sentinel://h:26379/svc/0/extra",
        "redis+sentinel:///svc",  # no sentinel
        "rediss+sentinel://h/svc",  # TLS: not supported, said so
    ],
)
def test_a_malformed_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        sentinel_target(url)


def test_sentinel_pools_block_and_carry_the_options() -> None:
    url = "redis+sentinel://:pw@127.0.0.1:1/svc/4?sentinel_password=watch"
    pool = sync_pool(url, blocking=True, max_connections=5, timeout=20, socket_timeout=10)
    assert isinstance(pool, SentinelConnectionPool)
    assert isinstance(pool, redis.BlockingConnectionPool)  # callers wait, never MaxConnections
    assert pool.max_connections == 5 and pool.service_name == "svc"
    assert pool.connection_kwargs["password"] == "pw" and pool.connection_kwargs["db"] == 4
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (sentinel["host"], sentinel["port"], sentinel["password"]) == ("127.0.0.1", 1, "watch")
    assert sentinel["retry"].get_retries() == 0
    plain = sync_pool(url, blocking=False, timeout=20)
    assert not isinstance(plain, redis.BlockingConnectionPool)
    apool = async_pool(url, max_connections=9, timeout=20)
    assert isinstance(apool, aioredis.BlockingConnectionPool) and apool.max_connections == 9


def test_celery_gets_kombus_form() -> None:
    broker, options = celery_broker(
        "redis+sentinel://:p%3Aw@s1:26379,s2:26380/svc/1?sentinel_password=watch"
    )
    assert broker == "sentinel://:p%3Aw@s1:26379/1;sentinel://:p%3Aw@s2:26380/1"
    assert options["master_name"] == "svc" and options["sentinel_kwargs"]["password"] == "watch"
    assert options["sentinel_kwargs"]["retry"].get_retries() == 0  # the next sentinel is the retry
    from kombu import Connection

    conn = Connection(broker, transport_options=options)
    assert conn.transport_cls == "sentinel" and conn.transport_options["master_name"] == "svc"
    # each alternate is a whole URL to kombu: the database and password are on every one
    for alternate in conn.alt:
        other = Connection(alternate)
        assert (other.virtual_host, other.password) == ("1", "p:w")


def test_a_cluster_url_is_read() -> None:
    url = "redis+cluster://:s3cret@10.0.0.1:7000,node-b,[::1]:7002/?socket_timeout=3"
    target = cluster_target(url)
    assert target is not None and is_cluster_url(url) and topology(url) == "cluster"
    assert target.nodes == (("10.0.0.1", 7000), ("node-b", CLUSTER_PORT), ("::1", 7002))
    assert target.options == {"password": "s3cret", "socket_timeout": 3.0}
    assert cluster_target("redis+cluster://h:7000/0") == ClusterTarget((("h", 7000),), {})
    assert cluster_target("redis+cluster://h:7000") == ClusterTarget((("h", 7000),), {})
    for other in ("redis://h:6379/0", "redis+sentinel://h/omni"):
        assert cluster_target(other) is None and not is_cluster_url(other)
    assert topology("redis://h:6379/0") == "standalone"
    assert topology("redis+sentinel://h/omni") == "sentinel"


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://h:7000/1",  # a cluster has database 0 only
        "redis+cluster://h:7000/0/x",
        "redis+cluster://h:7000,,h2:7001/",  # a node without a host
        "redis+cluster://h:port/",
        "rediss+cluster://h:7000/",  # no TLS
    ],
)
def test_a_malformed_cluster_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="cluster"):
        cluster_target(url)


def test_celery_refuses_a_cluster() -> None:
    with pytest.raises(ValueError, match="OMNISERVE_BROKER_URL"):
        celery_broker("redis+cluster://h:7000/")


async def test_cluster_clients_carry_the_urls_options() -> None:
    """Built without a server: the asyncio client reads the slot map at its first command."""
    client = async_client("redis+cluster://127.0.0.1:1,127.0.0.1:2/?socket_timeout=3")
    assert is_cluster(client) and not is_cluster(aioredis.Redis())
    nodes = list(client.nodes_manager.startup_nodes.values())  # (until the slot map is read)
    assert {(n.host, n.port) for n in nodes} == {("127.0.0.1", 1), ("127.0.0.1", 2)}
    assert all(n.connection_kwargs["socket_timeout"] == 3 for n in nodes)
    await client.aclose()


class Built(StreamCommands):
    """The words of a command as redis-py's own methods write them (some as bytes)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return args


def test_a_cluster_pipeline_reads_the_keys_of_scripts_and_stream_reads_from_the_call() -> None:
    """No ``COMMAND GETKEYS`` round trip to a default node that may be gone (a failed-over
    shard's): the keys of a script call and of a stream read are in the call itself."""
    from redis import cluster

    get_keys = cluster.RedisCluster._get_command_keys
    assert get_keys(None, "EVALSHA", "abc", 2, "k1", "k2", "a") == ["k1", "k2"]
    assert get_keys(None, "XREAD", "BLOCK", 1000, "STREAMS", "s1", "s2", "0-0", "$") == ["s1", "s2"]
    group = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "STREAMS", "s1", ">")
    assert get_keys(None, *group) == ["s1"]
    built = Built()
    read = built.xread({"in:ctl": "0-0", "in:audio": "5-0"}, block=1000)
    assert get_keys(None, *read) == ["in:ctl", "in:audio"]
    grouped = built.xreadgroup("g", "c", {"s1": ">"}, count=5, block=10)
    assert get_keys(None, *grouped) == ["s1"]


async def test_an_asyncio_cluster_reads_the_keys_of_stream_reads_from_the_call() -> None:
    """The asyncio cluster client's commands parser asks the node it started from for a stream
    read's keys; they are read from the call instead (the parser here has no node at all)."""
    from redis._parsers.commands import AsyncCommandsParser

    read = Built().xread({"chat:frames": "4-1"}, block=250)
    assert await AsyncCommandsParser().get_keys(*read) == ["chat:frames"]
