"""Where omniserve's Redis is: one server, the primary that Redis Sentinel names, or a Redis
Cluster.

Why: a Redis primary with replicas is made highly available by Sentinel, which promotes a
replica when the primary fails, at another address. Every gateway and worker kept talking to the
old address, refused (``READONLY``) once it came back demoted, and never found the new primary
(docs/ARCHITECTURE.md, "Failure handling"). A ``redis+sentinel://`` URL names the sentinels and
the service instead; each pool asks the sentinels for the primary when it opens a connection,
and drops a connection that finds a replica (redis-py's ``SentinelManagedConnection``), so the
loops that already survive a Redis restart (they reconnect and rebuild what they own) follow a
failover the same way. Celery's consumer takes the same URL in kombu's form (``celery_broker``).

``redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]``:
the sentinels (port 26379 unless given), the service name their ``sentinel monitor`` line
gives, the database (0). USER and PASSWORD are the data nodes' (as in ``redis://``); the
sentinels' own, if they ask for one, go in ``sentinel_username`` / ``sentinel_password``.
Any other option is redis-py's, as in a ``redis://`` URL (``?socket_timeout=3``). TLS to the
nodes is not supported with Sentinel (``ValueError``).

``redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?OPTIONS]``: some nodes of
a Redis Cluster (port 6379 unless given; any one that answers tells the client the rest), whose
slots spread the sessions over its shards (``streaming/keys.py`` gives each session one slot).
Gateways and workers then use redis-py's cluster clients (``redis.cluster.RedisCluster``,
``redis.asyncio.cluster.RedisCluster``), and output goes over sharded pub/sub (``SPUBLISH``,
Redis 7 or later). The path may only name database 0 (``/`` or ``/0``: a cluster has no other).
Options are redis-py's, as in a ``redis://`` URL. TLS is not supported with a cluster URL
(``ValueError``). Celery's broker cannot be a cluster (kombu has no cluster transport), so a
cluster needs ``OMNISERVE_BROKER_URL`` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster as cluster
from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel, SentinelConnectionPool

SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
SENTINEL_TIMEOUT_S = 2.0  # a sentinel that does not answer this fast: the next one is asked
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
CLUSTER_SCHEME = "redis+cluster"
CLUSTER_PORT = 6379


@dataclass(frozen=True)
class SentinelTarget:
    """A ``redis+sentinel://`` URL, parsed."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    node_options: dict[str, Any]  # for the data nodes' connections (db, password, timeouts...)
    sentinel_options: dict[str, Any]  # for the sentinels' own (their password)


def sentinel_target(url: str) -> SentinelTarget | None:
    """The sentinels ``url`` names (None: ``url`` is one server's); ``ValueError`` if malformed."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        if parts.scheme.endswith("+sentinel"):
            raise ValueError(f"{parts.scheme}:// is not supported (only {SCHEME}://: no TLS)")
        return None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in hosts.split(","):
        where = urlsplit(f"//{item.strip()}")  # host, [IPv6] host, port as a URL reads them
        if not where.hostname:
            raise ValueError(f"{SCHEME}:// URL without a sentinel host: {item!r}")
        sentinels.append((where.hostname, where.port or SENTINEL_PORT))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"{SCHEME}:// URL needs /SERVICE or /SERVICE/DB as its path")
    query = dict(parse_qsl(parts.query))
    sentinel_options = {k: query.pop(k) for k in SENTINEL_OPTIONS if k in query}
    sentinel_options = {k.removeprefix("sentinel_"): v for k, v in sentinel_options.items()}
    db = path[1] if len(path) == 2 else "0"
    # the data nodes' options exactly as redis-py reads them from a redis:// URL
    auth = f"{userinfo}@" if userinfo else ""
    options = parse_url(f"redis://{auth}sentinel/{db}?{urlencode(query)}")  # type: ignore[no-untyped-call]
    options.pop("host", None)
    return SentinelTarget(tuple(sentinels), path[0], options, sentinel_options)


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names sentinels rather than one server."""
    return urlsplit(url).scheme == SCHEME


@dataclass(frozen=True)
class ClusterTarget:
    """A ``redis+cluster://`` URL, parsed."""

    nodes: tuple[tuple[str, int], ...]  # where to find the cluster (any one that answers)
    options: dict[str, Any]  # for every node's connections (password, timeouts...)


def cluster_target(url: str) -> ClusterTarget | None:
    """The cluster nodes ``url`` names (None: not a cluster URL); ``ValueError`` if malformed."""
    parts = urlsplit(url)
    if parts.scheme != CLUSTER_SCHEME:
        if parts.scheme.endswith("+cluster"):
            raise ValueError(
                f"{parts.scheme}:// is not supported (only {CLUSTER_SCHEME}://: no TLS)"
            )
        return None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        try:
            where = urlsplit(f"//{item.strip()}")
            host, port = where.hostname, where.port
        except ValueError as exc:  # a port that is not a number
            raise ValueError(f"{CLUSTER_SCHEME}:// URL with a bad node {item!r}: {exc}") from None
        if not host:
            raise ValueError(f"{CLUSTER_SCHEME}:// URL without a node host: {item!r}")
        nodes.append((host, port or CLUSTER_PORT))
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(
            f"{CLUSTER_SCHEME}:// URL names database {parts.path.strip('/')!r}: "
            "a cluster has only 0"
        )
    auth = f"{userinfo}@" if userinfo else ""
    options = parse_url(f"redis://{auth}cluster/0?{parts.query}")  # type: ignore[no-untyped-call]
    for gone in ("host", "port", "db"):
        options.pop(gone, None)
    return ClusterTarget(tuple(nodes), options)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme == CLUSTER_SCHEME


def topology(url: str) -> str:
    """What kind of Redis ``url`` names: ``standalone``, ``sentinel`` or ``cluster``."""
    return "cluster" if is_cluster_url(url) else "sentinel" if is_sentinel(url) else "standalone"


def is_cluster(client: object) -> bool:
    """Whether ``client`` is one of redis-py's cluster clients (or their pipelines): its keys
    live on many shards, its output goes over sharded pub/sub."""
    kinds = (
        cluster.RedisCluster,
        cluster.ClusterPipeline,
        aiocluster.RedisCluster,
        aiocluster.ClusterPipeline,
    )
    return isinstance(client, kinds)


def pipe_time(pipe: Any, key: str) -> None:
    """Queue Redis's clock (``TIME``: seconds, microseconds) on ``pipe``; on a cluster pipeline,
    which refuses a command without a key, read on the shard of ``key`` by a one-line script
    (its reply's two numbers as bytes: read them with ``int``)."""
    if is_cluster(pipe):
        pipe.eval("return redis.call('TIME')", 1, key)
    else:
        pipe.time()


def pipe_evalsha(pipe: Any, sha: str, keys: list[str], args: list[Any]) -> None:
    """Queue a call of the loaded script ``sha`` on ``pipe`` as a plain ``EVALSHA`` command
    (redis-py's cluster pipelines refuse their ``evalsha`` method, not the command, which they
    route by its keys). A reply of ``NoScriptError`` means the shard has not loaded it."""
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


def _cluster_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as the cluster clients take them: their pools are per node, opened by the
    client (no pool class to choose, no wait for a free connection)."""
    return {k: v for k, v in options.items() if k not in ("timeout", "connection_class")}


_COMMAND_KEYS = cluster.RedisCluster._get_command_keys
_ASYNC_GET_KEYS = AsyncCommandsParser.get_keys
_SCRIPT_CALLS = ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO")
_STREAM_READS = ("XREAD", "XREADGROUP")
_ASK_REDIS = object()  # ``_keys_in_call``: the call alone does not tell


def _keys_in_call(args: tuple[Any, ...]) -> Any:
    """The keys of a script call or a stream read, read from the call itself (``_ASK_REDIS``
    for any other command). redis-py asks a node of its own choosing (``COMMAND GETKEYS``, a
    round trip) for every command of movable keys, and once that node is gone (its shard
    failed over) every such command fails, on every shard, until the client happens to pick
    another node: a worker's heartbeat renewed no lease, and its sessions' input reads failed,
    for as long."""
    name = _word(args[0]) if args else ""
    if len(args) >= 3 and name in _SCRIPT_CALLS:
        count = int(args[2])
        return list(args[3 : 3 + count]) or None
    if name in _STREAM_READS:  # ... STREAMS key [key ...] id [id ...]
        for i, arg in enumerate(args):
            if _word(arg) == "STREAMS":
                rest = list(args[i + 1 :])
                return rest[: len(rest) // 2] or None
    return _ASK_REDIS


def _word(arg: Any) -> str:
    """A command's word, upper case, as a str (redis-py writes some as bytes: ``b"STREAMS"``);
    "" for anything longer than a word (an audio payload is never decoded)."""
    if isinstance(arg, bytes):
        return arg.decode(errors="replace").upper() if len(arg) <= 16 else ""
    return arg.upper() if isinstance(arg, str) and len(arg) <= 16 else ""


def _command_keys(self: Any, *args: Any) -> Any:
    """redis-py's synchronous cluster client's key lookup, with ``_keys_in_call`` first."""
    keys = _keys_in_call(args)
    return _COMMAND_KEYS(self, *args) if keys is _ASK_REDIS else keys  # type: ignore[no-untyped-call]


async def _async_command_keys(self: Any, *args: Any) -> Any:
    """redis-py's asyncio cluster client's key lookup (its commands parser asks the node it
    started from), with ``_keys_in_call`` first."""
    keys = _keys_in_call(args)
    return await _ASYNC_GET_KEYS(self, *args) if keys is _ASK_REDIS else keys


cluster.RedisCluster._get_command_keys = _command_keys  # type: ignore[method-assign]
AsyncCommandsParser.get_keys = _async_command_keys  # type: ignore[method-assign]


def sync_cluster(target: ClusterTarget, **options: Any) -> cluster.RedisCluster:
    """A synchronous cluster client (it reads the slot map from the first node that answers,
    raising ``RedisClusterException`` when none does)."""
    nodes = [cluster.ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call]
    return cluster.RedisCluster(
        startup_nodes=nodes, **{**_cluster_options(options), **target.options}
    )


def async_cluster(target: ClusterTarget, **options: Any) -> aiocluster.RedisCluster:
    """An asyncio cluster client (it reads the slot map at its first command)."""
    nodes = [aiocluster.ClusterNode(host, port) for host, port in target.nodes]
    return aiocluster.RedisCluster(
        startup_nodes=nodes, **{**_cluster_options(options), **target.options}
    )


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A sentinel pool whose callers wait for a free connection (redis-py has none)."""


class _AsyncBlockingSentinelPool(AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """The asyncio ``_BlockingSentinelPool``."""


def _manager_options(
    target: SentinelTarget, options: dict[str, Any], retry: Any = None
) -> dict[str, Any]:
    """The sentinels' connections: their own credentials, short timeouts, the caller's TCP
    options (a dead sentinel is found like a dead server), and no retries: the next sentinel
    is the retry. redis-py's default retries a sentinel ten times with a growing back-off, so
    with the first sentinel of the list down, every connection opened during a failover waited
    seconds before the next one was asked (a new session served 21 s after the promotion
    instead of 1 s: tests/faults/test_redis_sentinel.py)."""
    keep = ("socket_keepalive", "socket_keepalive_options")
    return {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "retry": retry if retry is not None else SyncRetry(NoBackoff(), 0),
        **{k: options[k] for k in keep if k in options},
        **target.sentinel_options,
    }


def sync_pool(url: str, blocking: bool, **options: Any) -> redis.ConnectionPool:
    """A synchronous pool for ``url``; ``options`` are redis-py's (the URL's own win)."""
    target = sentinel_target(url)
    if target is None:
        cls = redis.BlockingConnectionPool if blocking else redis.ConnectionPool
        return cls.from_url(url, **options)
    if not blocking:
        options.pop("timeout", None)  # (a BlockingConnectionPool option)
    # (redis-py's sentinel module has no type hints)
    manager = Sentinel(target.sentinels, sentinel_kwargs=_manager_options(target, options))  # type: ignore[no-untyped-call]
    cls_ = _BlockingSentinelPool if blocking else SentinelConnectionPool
    return cls_(target.service, manager, **{**options, **target.node_options})  # type: ignore[no-untyped-call]


def async_pool(url: str, **options: Any) -> aioredis.ConnectionPool:
    """An asyncio blocking pool for ``url`` (callers wait for a connection)."""
    target = sentinel_target(url)
    if target is None:
        return aioredis.BlockingConnectionPool.from_url(url, **options)
    sentinels = _manager_options(target, options, AsyncRetry(NoBackoff(), 0))
    manager = AsyncSentinel(target.sentinels, sentinel_kwargs=sentinels)  # type: ignore[no-untyped-call]
    pool = _AsyncBlockingSentinelPool(target.service, manager, **{**options, **target.node_options})  # type: ignore[no-untyped-call]
    return pool


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A plain synchronous client for ``url`` (one-off commands: CLI, start-up, shutdown); on a
    cluster, redis-py's cluster client, which answers the same commands."""
    target = cluster_target(url)
    if target is not None:
        return cast("redis.Redis", sync_cluster(target, **options))
    return redis.Redis(connection_pool=sync_pool(url, blocking=False, **options))


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """A plain asyncio client for ``url`` (the CLI's); on a cluster, the cluster client."""
    target = cluster_target(url)
    if target is not None:
        return cast("aioredis.Redis", async_cluster(target, **options))
    client = aioredis.Redis(connection_pool=async_pool(url, **options))
    client.auto_close_connection_pool = True
    return client


def celery_broker(url: str) -> tuple[str, dict[str, Any]]:
    """The broker URL kombu takes for ``url``, and the transport options it needs with it.

    kombu names sentinels as ``sentinel://[:PASSWORD@]HOST:PORT/DB;sentinel://...`` and
    the service as the ``master_name`` transport option; the sentinels' own connection options
    (credentials, timeouts, no retries) go in ``sentinel_kwargs``.
    """
    if is_cluster_url(url):
        raise ValueError("Celery's broker cannot be a Redis Cluster: set OMNISERVE_BROKER_URL")
    target = sentinel_target(url)
    if target is None:
        return url, {}
    node = target.node_options
    auth = ""
    if node.get("password"):
        auth = f"{quote(node.get('username') or '', safe='')}:{quote(node['password'], safe='')}@"
    db = node.get("db", 0)  # on each: kombu takes the one it connects with as the whole URL
    hosts = [f"sentinel://{auth}{host}:{port}/{db}" for host, port in target.sentinels]
    options: dict[str, Any] = {
        "master_name": target.service,
        "sentinel_kwargs": _manager_options(target, {}),
    }
    return ";".join(hosts), options
