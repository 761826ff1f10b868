"""A broker of its own (``OMNISERVE_BROKER_URL``): RabbitMQ, another Redis or a Redis behind
Sentinel carries the task messages and task events while the shared Redis carries the sessions;
RabbitMQ's ack deadline never ends a session; a broker that does not answer, or refuses the
login, stops each part at start, saying so.

RabbitMQ is a real ``rabbitmq-server`` started by the test (``tests/support/rabbitmq.py``); the
gateway, the workers (a threads pool and a prefork one) and the clients are real processes and
WebSockets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from omniserve.redis_server import free_port
from streaming.jobs import CHAT_TASK, DUPLEX_TASK
from streaming.keys import worker_queue
from tests.support.carry_on import PacedSession
from tests.support.celery_events import TaskEvents
from tests.support.chat_turn import start_chat_turn
from tests.support.fault_harness import await_for, served_end_to_end
from tests.support.omniserve_process import omniserve_env, run_omniserve
from tests.support.rabbitmq import RabbitMQ
from tests.support.redis_sentinel import SentinelSet
from tests.support.services import running, stack_on
from tests.support.stack import ROOT, Stack

ANSWER_WORDS = 3


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[RabbitMQ]:
    with running(RabbitMQ()) as node:
        yield node


@pytest.fixture
def broker_stack(redis_server: str, rabbitmq: RabbitMQ) -> Iterator[Stack]:
    with stack_on(redis_server, rabbitmq.url) as stack:
        yield stack


def worker_queues(stack: Stack) -> list[str]:
    """The Celery queue of each worker node registered in this stack's shared Redis."""
    nodes = {worker_queue(wid.decode()) for wid in stack.redis().hkeys(stack.keys.workers)}
    return sorted(nodes)


async def serve_duplex_and_chat(stack: Stack) -> None:
    """A duplex session answered end to end, and a chat turn answered in full."""
    frames = await served_end_to_end(stack.url())
    assert any(f.get("kind") == "text" for f in frames if f["type"] == "response.output.delta")
    assert any(f["type"] == "session.closed" for f in frames)
    chat = await start_chat_turn(stack.url(), words=ANSWER_WORDS)
    try:
        done = await chat.until("response.done", timeout=30)
        assert str(done.get("text") or "").split() == ["word"] * ANSWER_WORDS, done
    finally:
        await chat.close()


async def test_rabbitmq_carries_the_tasks(broker_stack: Stack, rabbitmq: RabbitMQ) -> None:
    stack = broker_stack
    events = TaskEvents(rabbitmq.url)  # as Flower hears them, from RabbitMQ
    try:
        await tasks_served_over_rabbitmq(stack, rabbitmq, events)
    finally:
        events.stop()


async def tasks_served_over_rabbitmq(stack: Stack, rabbitmq: RabbitMQ, events: TaskEvents) -> None:
    stack.start_worker(slots=2)  # threads pool
    stack.start_worker()  # prefork pool
    port = stack.start_gateway()
    assert await asyncio.to_thread(events.heard_worker.wait, 30)
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["broker"] == f"amqp://127.0.0.1:{rabbitmq.port}"  # named, without the login
    assert rabbitmq.password not in orjson.dumps(health).decode()
    await serve_duplex_and_chat(stack)
    await serve_duplex_and_chat(stack)  # the slots came back for more
    # the tasks went through RabbitMQ: each worker consumes its queue there
    queues = worker_queues(stack)
    assert len(queues) == 2, queues
    with Connection(rabbitmq.url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in queues:
            # passive: raises if RabbitMQ has no such queue
            _, _, consumers = channel.queue_declare(queue, passive=True)
            assert consumers == 1, queue
    # and so did their task events (what Flower shows)
    for task in (DUPLEX_TASK, CHAT_TASK):
        await await_for(lambda t=task: events.of_type("task-succeeded", t), 30, f"{task}'s events")


async def test_another_redis_carries_the_tasks(redis_server: str) -> None:
    """A Redis broker that is not the shared Redis (here: another database of the same
    server): a task's keys go to the shared Redis, its message to the broker's list."""
    parts = urlsplit(redis_server)
    broker = parts._replace(path="/7").geturl()
    with stack_on(redis_server, broker) as stack:
        stack.start_worker(slots=2)
        port = stack.start_gateway()
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["broker"] == f"redis://{parts.netloc.rpartition('@')[2]}"
        await serve_duplex_and_chat(stack)
        # the worker's consumer waits on the broker's database, so the gateway pushed there
        waiting = [c for c in stack.redis().client_list() if c.get("cmd") == "brpop"]
        assert "7" in {c["db"] for c in waiting}, waiting
        assert redis.Redis.from_url(broker).exists("_kombu.binding.celery.pidbox")


def test_a_wrong_rabbitmq_login_stops_the_gateway_saying_so(
    rabbitmq: RabbitMQ, redis_server: str
) -> None:
    url = rabbitmq.url.replace(rabbitmq.password, "not-the-password")
    env = omniserve_env({"OMNISERVE_REDIS_URL": redis_server, "OMNISERVE_BROKER_URL": url})
    done = run_omniserve(env, "gateway", "--port", "0")
    assert done.returncode == 1, done.stderr
    assert "ACCESS_REFUSED" in done.stderr and "not-the-password" not in done.stderr


async def test_a_sentinel_broker_carries_the_tasks(redis_server: str) -> None:
    """The broker behind Redis Sentinel (a primary, a replica, a sentinel; the first sentinel
    named is down), the sessions on the run's Redis."""
    with running(SentinelSet()) as sentinels, stack_on(redis_server, sentinels.url) as stack:
        stack.start_worker(slots=2)
        port = stack.start_gateway()
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["broker"].startswith("redis+sentinel://127.0.0.1:")
        await serve_duplex_and_chat(stack)
        primary = redis.Redis(port=sentinels.ports[0], db=3)  # the URL's database
        assert primary.exists("_kombu.binding.celery.pidbox")  # the worker consumes there


# ------------------------------------------------------------------------ a broker that is mute


@pytest.fixture
def mute_port() -> Iterator[int]:
    """A TCP port that takes connections and never says a word (a broker that hangs)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
@pytest.mark.parametrize("part", ["gateway", "worker", "up"])
def test_a_broker_that_does_not_answer_stops_the_start(
    part: str, scheme: str, mute_port: int, redis_server: str, tmp_path: object
) -> None:
    url = f"{scheme}://omni:hush-pw-123@127.0.0.1:{mute_port}/"
    env = omniserve_env(
        {
            "OMNISERVE_REDIS_URL": redis_server,
            "OMNISERVE_BROKER_URL": url,
            "OMNISERVE_UP_LOG_DIR": str(tmp_path),
        }
    )
    args = {"gateway": ["gateway", "--port", "0"], "worker": ["worker"], "up": ["up"]}[part]
    args += ["--backend", "scripted"] if part != "gateway" else []
    # the timeout is a backstop for a hang, which is the failure this test is for
    done = run_omniserve(env, *args)
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = done.stderr
    assert f"the broker at {scheme}://127.0.0.1:{mute_port} does not answer" in said, said
    assert "OMNISERVE_BROKER_URL" in said
    assert "hush-pw-123" not in said + done.stdout


# ------------------------------------------------------------------------ omniserve up, Flower
def test_up_with_flower_on_rabbitmq(rabbitmq: RabbitMQ, tmp_path: Path) -> None:
    """``omniserve up --flower`` given RabbitMQ: the banner names it, a chat turn is answered,
    and Flower, asking the workers over RabbitMQ (``celery inspect``), lists the worker."""
    port, flower_port = free_port(), free_port()
    env = omniserve_env(
        {
            "OMNISERVE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # up embeds one
            "OMNISERVE_BROKER_URL": rabbitmq.url,
            "OMNISERVE_UP_LOG_DIR": str(tmp_path / "logs"),
            "OMNISERVE_RECORDINGS": "false",
            "OMNISERVE_FLOWER_BASIC_AUTH": "ops:flower-pw-rabbit",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("REDIS_URL", None)
    log = tmp_path / "up.log"
    argv = ["up", "--port", str(port), "--backend", "scripted", "--flower"]
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "omniserve", *argv, "--flower-port", str(flower_port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "try it" not in log.read_text():
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        banner = log.read_text()
        assert f"broker    amqp://127.0.0.1:{rabbitmq.port} (OMNISERVE_BROKER_URL)" in banner
        assert rabbitmq.password not in banner
        url = f"ws://127.0.0.1:{port}"
        probe = run_omniserve(env, "probe", "--url", url, "chat", "Hello", timeout=60)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        workers: dict[str, object] = {}
        api = f"http://127.0.0.1:{flower_port}/api/workers?refresh=1"
        while not workers:  # Flower starts beside the rest, then asks the workers
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                got = httpx.get(api, auth=("ops", "flower-pw-rabbit"), timeout=10)
                workers = got.json() if got.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        assert any(name.startswith("omni-") for name in workers), workers
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=40)


# ------------------------------------------------------------------- RabbitMQ's ack deadline
ACK_DEADLINE_MS = 2000  # RabbitMQ's consumer_timeout, made short; checked every half second
SHORT_DEADLINE = (
    f"consumer_timeout = {ACK_DEADLINE_MS}\n",
    "[{rabbit, [{channel_tick_interval, 500}]}].",
)


def held_unacked_past_the_deadline(url: str) -> str:
    """What RabbitMQ does to a consumer holding a delivery unacknowledged: its error."""
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        queue = Queue("deadline-probe", Exchange("deadline-probe"), "deadline-probe")
        queue(channel).declare()
        Producer(channel).publish({"x": 1}, exchange="deadline-probe", routing_key="deadline-probe")
        held: list[object] = []
        with conn.Consumer([queue], callbacks=[lambda body, message: held.append(message)]):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=1)
                except TimeoutError:
                    continue
                except Exception as exc:  # the channel closed under the consumer
                    return str(exc)
    return ""


@pytest.fixture(scope="module")
def short_deadline() -> Iterator[RabbitMQ]:
    """RabbitMQ whose ack deadline is ``ACK_DEADLINE_MS``."""
    conf, advanced = SHORT_DEADLINE
    with running(RabbitMQ(conf=conf, advanced=advanced)) as node:
        yield node


@pytest.mark.parametrize("pool_slots", [1, 2], ids=["prefork", "threads"])
async def test_a_session_outlives_rabbitmqs_ack_deadline(
    redis_server: str, short_deadline: RabbitMQ, pool_slots: int
) -> None:
    """A session runs many times longer than RabbitMQ's ``consumer_timeout`` and ends as it
    should, and its worker goes on consuming: the worker acknowledges each task as it takes it
    (the deadline, short here, is shown to bite a consumer that does not)."""
    node = short_deadline
    with stack_on(redis_server, node.url) as stack:
        assert "delivery acknowledgement" in held_unacked_past_the_deadline(node.url)
        probed = len(node.log.read_bytes())  # what the node logged of the probe
        stack.start_worker(slots=pool_slots)
        stack.start_gateway()
        session = await PacedSession.open(stack.url())
        try:
            t0 = time.monotonic()
            # four deadlines and more, answered all along
            await await_for(lambda: time.monotonic() - t0 > 4 * ACK_DEADLINE_MS / 1000, 30, "")
            assert session.carried_on(t0 + 3 * ACK_DEADLINE_MS / 1000), session.report(t0)
        finally:
            await session.close()
        (queue,) = worker_queues(stack)
        with Connection(node.url, connect_timeout=5) as conn:
            _, _, consumers = conn.channel().queue_declare(queue, passive=True)
        assert consumers == 1  # the worker's channel was never closed under it
        await serve_duplex_and_chat(stack)  # and it takes the next tasks
        assert b"timed out" not in node.log.read_bytes()[probed:]
