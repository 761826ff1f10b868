"""Redis, two gateways and a worker as separate hosts, each in a network namespace with its own
address (``tests/support/netns.py``), the test's clients on the root namespace's: nothing goes
over 127.0.0.1. A duplex session and a chat turn are served through each gateway; then Redis is
cut off from one gateway only (packets between the two dropped silently, both ways).

What a client must see: the sessions on the gateway still reaching Redis never notice (their
answers keep coming through the cut, no error, no recovery); each session on the cut gateway is
told (an ``error`` such as ``inference_error`` for input its gateway could not queue, a
``session.recovering``) and goes on answering once the link is back, or is ended with a
``session.closed``. Every slot comes back, and both gateways serve new sessions afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from redis.crc import key_slot

from tests.support.fault_harness import DuplexProbe, all_slots_back, await_for, served_end_to_end
from tests.support.host_redis import CLUSTER_SLOTS, shard_of, start_cluster, start_redis
from tests.support.netns import Host, NetnsUnavailable, Network, check_available, network
from tests.support.redis_cluster import cluster_binaries
from tests.support.stack import Stack

SLOTS_ON_HOSTS = 10  # the cluster test's worker
CUT_S = 12.0  # past the gateway's lease (6 s): its workers hear nothing from it meanwhile


@pytest.fixture
def hosts() -> Iterator[Network]:
    try:
        check_available()
    except NetnsUnavailable as exc:
        pytest.skip(f"separate hosts need network namespaces: {exc}")
    with network() as net:
        yield net


def redis_peers(stack: Stack) -> set[str]:
    """The addresses Redis's clients connect from."""
    return {c["addr"].rsplit(":", 1)[0] for c in stack.redis().client_list()}


async def chat_turn(url: str) -> list[str]:
    """One short chat turn, start to ``response.done``; the kinds of frames it got."""
    from tests.support.client import Client

    chat = await Client.connect(url, query="?mode=chat")
    try:
        await chat.init()
        content = "Reply with exactly: hello from another host"
        await chat.send(
            {"type": "input.append", "input": {"messages": [{"role": "user", "content": content}]}}
        )
        await chat.until("response.done", timeout=30)
        return [f["type"] for f in chat.received]
    finally:
        await chat.close()


def outcome(p: DuplexProbe, began: float, healed: float) -> str | None:
    """How a session on the cut gateway came through: ``told, went on`` (an error or a
    recovery event, then answers again after the heal), ``told, ended`` (its close), else None
    (not yet, or never told)."""
    after = [f for t, f in p.frames if t > began]
    told = any(f["type"] in ("error", "session.recovering", "session.closed") for f in after)
    if p.closed_at is not None or any(f["type"] == "session.closed" for f in after):
        return "told, ended"
    return "told, went on" if told and p.deltas_after(healed) > 0 else None


def timeline(p: DuplexProbe, since: float) -> list[tuple[float, str]]:
    """What a probe heard after ``since``, without its deltas (seconds, type or error code)."""
    return [
        (round(t - since, 1), f["error"]["code"] if f["type"] == "error" else f["type"])
        for t, f in p.frames
        if t > since and "delta" not in f["type"]
    ]


def assert_never_noticed(p: DuplexProbe, began: float, healed: float, where: str = "") -> None:
    """A session the cut did not touch: open, told nothing, answered through the cut (more in
    its first half than after the heal: answers kept coming) and after it; ``where``, when given,
    names it in a line of what it heard."""
    seen = [(round(t - began, 2), f["type"]) for t, f in p.frames if t > began]
    kinds = [k for _, k in seen if "delta" not in k]
    if where:
        print(f"{where}: {len(kinds)} events, {kinds[:6]}")
    assert p.closed_at is None, seen
    assert not {"error", "session.closed", "session.recovering"} & set(kinds), seen
    assert p.deltas_after(began + CUT_S / 2) > p.deltas_after(healed), seen
    assert p.deltas_after(healed) > 0, seen


async def cut_for_a_while(
    net: Network, a: Host, b: Host, hit: list[DuplexProbe]
) -> tuple[float, float]:
    """``a`` and ``b`` apart for ``CUT_S``; once each session of ``hit`` came through it
    (``outcome``) and 3 s more for the others' answers to show, when it began and was healed."""
    began = time.monotonic()
    with net.apart(a, b):
        await asyncio.sleep(CUT_S)
    healed = time.monotonic()
    await await_for(
        lambda: all(outcome(p, began, healed) for p in hit), 60, "each cut session told"
    )
    await asyncio.sleep(3.0)
    return began, healed


async def served_again(stack: Stack, slots: int) -> None:
    """After a cut: the worker's ``slots`` all back, both gateways serving a new session, and
    every process still running."""
    all_slots_back(stack, slots, timeout=60)
    for i in (0, 1):
        frames = await served_end_to_end(stack.url(i), timeout=60)
        assert any(f["type"] == "response.output.delta" for f in frames)
    assert all(p.alive() for p, _ in stack.gateways) and stack.workers[0].alive()


@pytest.mark.slow
async def test_a_gateway_cut_from_redis_on_a_network_of_hosts(hosts: Network) -> None:
    net = hosts
    redis_host, gw_cut, gw_kept, worker = (
        net.host(n) for n in ("redis", "gw-cut", "gw-kept", "worker")
    )
    server = start_redis(redis_host)
    stack = Stack(server.url)
    try:
        stack.start_worker(
            slots=6,
            wrap=worker.argv([]),
            OMNISERVE_WORKER_METRICS_HOST=worker.address,
            OMNISERVE_WORKER_METRICS_PORT="9108",
        )
        for gw in (gw_cut, gw_kept):
            stack.start_gateway(host=gw.address, wrap=gw.argv([]))
        # every process reaches Redis from its own host's address, the worker serves its
        # metrics on its own, and each gateway is reached at its own
        assert redis_peers(stack) <= {h.address for h in (gw_cut, gw_kept, worker, net.root)}
        assert {gw_cut.address, gw_kept.address, worker.address} <= redis_peers(stack)
        metrics = httpx.get(f"http://{worker.address}:9108/metrics", timeout=5)
        assert metrics.status_code == 200 and "omniserve" in metrics.text
        for i in (0, 1):
            assert stack.url(i).startswith(f"ws://{(gw_cut, gw_kept)[i].address}:")
            assert "response.output.delta" in await chat_turn(stack.url(i))

        cut = [await DuplexProbe.open(stack.url(0)) for _ in range(2)]
        kept = [await DuplexProbe.open(stack.url(1)) for _ in range(2)]
        probes = cut + kept
        try:
            await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "deltas")
            began, healed = await cut_for_a_while(net, redis_host, gw_cut, cut)
            for p in kept:
                assert_never_noticed(p, began, healed)
            for p in cut:
                print("on the cut gateway:", outcome(p, began, healed), timeline(p, began))
        finally:
            for p in probes:
                await p.close()
        await served_again(stack, 6)
    finally:
        stack.stop()
        server.stop()


def session_id(p: DuplexProbe) -> str:
    return next(str(f["session_id"]) for _, f in p.frames if f["type"] == "session.created")


@pytest.mark.slow
async def test_a_shard_cut_off_from_one_gateway_on_a_cluster_of_hosts(hosts: Network) -> None:
    """The data plane a Redis Cluster of three primaries, each a host of its own, the broker a
    redis-server on another, two gateways and a worker on theirs: one shard is cut off from one
    gateway only. Only that shard's sessions on that gateway are touched, each told (an error, a
    recovery, or its close); that gateway's sessions on the other shards and every session of
    the other gateway never notice."""
    net = hosts
    shards = [net.host(f"shard{i}") for i in range(3)]
    broker_host, gw_cut, gw_kept, worker = (
        net.host(n) for n in ("broker", "gw-cut", "gw-kept", "worker")
    )
    server, _ = cluster_binaries()
    cluster = start_cluster(shards, binary=server, args=("--cluster-require-full-coverage", "no"))
    broker = start_redis(broker_host)
    stack = Stack("", broker_url=broker.url)
    # the shard cut off: not the admission one, nor one the URL names (docs/OPERATIONS.md,
    # "Redis Cluster": a named node cut off from a gateway holds up its slot-map refreshes)
    admission = shard_of(key_slot(stack.keys.queue.encode()), 3)
    victim = next(i for i in (2, 1, 0) if i != admission)
    named = [n for i, n in enumerate(cluster) if i != victim]
    stack.redis_url = "redis+cluster://" + ",".join(f"{n.host.address}:{n.port}" for n in named)
    try:
        stack.start_worker(slots=SLOTS_ON_HOSTS, wrap=worker.argv([]))
        for gw in (gw_cut, gw_kept):
            stack.start_gateway(host=gw.address, wrap=gw.argv([]))

        def shard(p: DuplexProbe) -> int:
            return shard_of(key_slot(stack.keys.session_lease(session_id(p)).encode()), 3)

        on_cut: list[DuplexProbe] = []
        while len(on_cut) < SLOTS_ON_HOSTS - 2 and (
            len({shard(p) == victim for p in on_cut}) < 2
        ):  # sessions on the cut gateway until some are on the cut shard and some are not
            on_cut.append(await DuplexProbe.open(stack.url(0)))
        on_kept = [await DuplexProbe.open(stack.url(1)) for _ in range(2)]
        probes = on_cut + on_kept
        try:
            await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 60, "deltas")
            hit = [p for p in on_cut if shard(p) == victim]
            assert hit and len(hit) < len(on_cut), [shard(p) for p in on_cut]
            spared = [p for p in probes if p not in hit]
            print(f"shard {victim} cut from one gateway: {len(hit)} of its sessions there")
            began, healed = await cut_for_a_while(net, shards[victim], gw_cut, hit)
            for p in spared:
                where = "cut gateway" if p in on_cut else "other gateway"
                assert_never_noticed(p, began, healed, f"{where}, shard {shard(p)}")
            for p in hit:
                print("cut off:", outcome(p, began, healed), timeline(p, began))
        finally:
            for p in probes:
                await p.close()
        await served_again(stack, SLOTS_ON_HOSTS)
    finally:
        stack.stop()
        broker.stop()
        for node in cluster:
            node.stop()


def test_a_cut_drops_only_what_passes_between_its_two_hosts(hosts: Network) -> None:
    """Three hosts: a cut between two leaves each reaching the third; a restore heals it."""
    a, b, c = (hosts.host(n) for n in "abc")
    server = start_redis(b)
    try:
        probe = [sys.executable, "-c", _PING.format(url=server.url)]

        def answers(h: Host) -> bool:
            return h.run(probe, check=False).returncode == 0

        assert answers(a) and answers(c) and answers(hosts.root)
        with hosts.apart(a, b):
            assert not answers(a)
            assert answers(c) and answers(hosts.root)
        assert answers(a)
        hosts.unplug(c)
        assert not answers(c) and answers(a)
        hosts.plug(c)
        assert answers(c)
        assert subprocess.run(["ip", "netns", "pids", b.ns or ""], capture_output=True).stdout
    finally:
        server.stop()


def test_a_shard_cut_off_from_one_host_and_no_other(hosts: Network) -> None:
    """A Redis Cluster of three primaries, each a host of its own: a cluster client on a fourth
    host finds every node at its own address; with one shard cut off from that host, only the
    keys of that shard fail there, while the root namespace still reaches all three."""
    nodes = [hosts.host(f"shard{i}") for i in range(3)]
    client = hosts.host("client")
    cluster = start_cluster(nodes)
    try:
        probe = [sys.executable, "-c", _SHARDS.format(host=nodes[0].address, slots=CLUSTER_SLOTS)]

        def reached(h: Host) -> list[bool]:
            return [bool(x) for x in json.loads(h.run(probe).stdout.strip().splitlines()[-1])]

        assert reached(client) == [True, True, True]
        with hosts.apart(client, nodes[2]):
            assert reached(client) == [True, True, False]
            assert reached(hosts.root) == [True, True, True]
        assert reached(client) == [True, True, True]
    finally:
        for node in cluster:
            node.stop()


# each shard's key written through a cluster client that starts from the first node; the
# shards that took it, in slot order
_SHARDS = """
import json, redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
rc = RedisCluster(host="{host}", port=6379, socket_timeout=1, socket_connect_timeout=1)
third = {slots} // 3
keys = {{}}
for n in range(10000):
    keys.setdefault(min(2, key_slot(f"k{{n}}".encode()) // third), f"k{{n}}")
    if len(keys) == 3:
        break
took = []
for shard in range(3):
    node = rc.get_node_from_key(keys[shard])
    try:
        took.append(bool(rc.get_redis_connection(node).set(keys[shard], shard)))
    except (redis.ConnectionError, redis.TimeoutError):
        took.append(False)
print(json.dumps(took))
"""

_PING = (
    "import redis, sys; "
    "r = redis.Redis.from_url('{url}', socket_connect_timeout=1, socket_timeout=1); "
    "sys.exit(0 if r.ping() else 1)"
)


def test_what_a_killed_test_process_left_is_removed_by_the_next(hosts: Network) -> None:
    """A namespace and a bridge named for a test process that is gone are removed when the next
    network is made; those of a live process are left."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left_ns = f"omni-{gone.pid}-dead00-x"
    subprocess.run(["ip", "netns", "add", left_ns], check=True)
    subprocess.run(["ip", "link", "add", "osbdead00", "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "set", "osbdead00", "alias", f"omni-{gone.pid}"], check=True)
    try:
        with network() as other:
            listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
            assert left_ns not in listed.stdout
            bridges = subprocess.run(["ip", "link", "show"], capture_output=True, text=True)
            assert "osbdead00" not in bridges.stdout
            assert hosts.bridge in bridges.stdout and other.bridge in bridges.stdout
    finally:
        subprocess.run(["ip", "netns", "del", left_ns], capture_output=True)
        subprocess.run(["ip", "link", "del", "osbdead00"], capture_output=True)
