"""api/gateway/task_submit.py: the message pushed from the event loop is the one Celery's send_task
pushes.

Both go to a real Redis; the envelopes are compared field by field, except what is new for every
message (``delivery_tag``) or names the sending process (``origin``). That the worker runs such
a message is what every end-to-end test (tests/e2e/test_service.py, ...) exercises.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import Celery

from api.gateway.task_submit import TaskSender, submit, task_message
from omniserve.redis_server import start_embedded
from streaming.broker_url import broker_target
from streaming.jobs import ChatJob, DuplexJob


def _app(url: str) -> Celery:
    app = Celery("omniserve-gateway", broker=url)  # as api/gateway/state.py configures it
    app.conf.update(
        broker_transport_options={"ack_emulation": False},
        task_serializer="json",
        broker_connection_retry_on_startup=True,
    )
    return app


def _comparable(raw: bytes) -> dict[str, Any]:
    msg = json.loads(raw)
    msg["properties"].pop("delivery_tag")
    msg["headers"].pop("origin")
    msg["body"] = json.loads(base64.b64decode(msg["body"]))
    return dict(msg)


def test_same_message_as_send_task(redis_server: str) -> None:
    app = _app(redis_server)
    queue = f"omni.w.test-{uuid.uuid4().hex[:8]}"
    sync = redis.Redis.from_url(redis_server)
    job = DuplexJob(
        session_id="rt_1_abc", slot_id="n#1|0", gateway_id="g", public_mode="audio", deadline_ts=2.5
    )
    try:
        app.send_task(
            job.task, kwargs=job.kwargs(), queue=queue, routing_key=queue, task_id=job.task_id
        )
        sent = sync.rpop(queue)
        assert isinstance(sent, bytes)
        ours = task_message(app, job, queue)
        assert _comparable(ours) == _comparable(sent)
        assert json.loads(ours)["headers"]["id"] == "rt_1_abc"  # Flower's task id: the session
    finally:
        sync.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        app.close()


async def test_submit_pushes_onto_the_worker_queue(redis_server: str) -> None:
    app = _app(redis_server)
    queue = f"omni.w.test-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_server)
    job = ChatJob(turn_id="chat_1", slot_id="n#1|0", gateway_id="g", deadline_ts=3.0)
    try:
        await submit(client, app, job, queue)
        raw = await client.rpop(queue)
        assert isinstance(raw, bytes)
        msg = json.loads(raw)
        assert msg["headers"]["task"] == "omniserve.chat_turn"
        assert msg["headers"]["id"] == "chat_1"
        assert msg["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}
        args, kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
        assert args == [] and kwargs == job.kwargs()
    finally:
        await client.delete(queue)
        await client.aclose()
        app.close()


async def test_values_go_with_the_task(redis_server: str) -> None:
    """A chat turn's request is written in the transaction that pushes its task."""
    app = _app(redis_server)
    queue = f"omni.w.test-{uuid.uuid4().hex[:8]}"
    key = f"test:req:{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_server)
    job = ChatJob(turn_id="chat_2", slot_id="n#1|0", gateway_id="g", deadline_ts=3.0)
    try:
        await submit(client, app, job, queue, {key: (b"request", 30)})
        assert await client.get(key) == b"request"
        assert 0 < await client.ttl(key) <= 30
        raw = await client.rpop(queue)
        assert isinstance(raw, bytes)
        assert json.loads(raw)["headers"]["id"] == "chat_2"
    finally:
        await client.delete(queue, key)
        await client.aclose()
        app.close()


async def test_a_broker_of_its_own_gets_the_task_and_the_data_plane_the_values(
    redis_server: str,
) -> None:
    """``OMNISERVE_BROKER_URL``: the values go to the shared Redis first, the task to the
    broker's queue after (so it never starts without them)."""
    broker_server = start_embedded(die_with_parent=True)
    app = _app(broker_server.url)
    queue = f"omni.w.test-{uuid.uuid4().hex[:8]}"
    key = f"test:req:{uuid.uuid4().hex[:8]}"
    data = aioredis.Redis.from_url(redis_server)
    broker = aioredis.Redis.from_url(broker_server.url)
    job = ChatJob(turn_id="chat_3", slot_id="n#1|0", gateway_id="g", deadline_ts=3.0)
    try:
        sender = TaskSender(data, app, broker_target(broker_server.url), broker)
        await sender.submit(job, queue, {key: (b"request", 30)})
        assert await data.get(key) == b"request" and not await data.exists(queue)
        assert not await broker.exists(key)
        raw = await broker.rpop(queue)
        assert isinstance(raw, bytes) and json.loads(raw)["headers"]["id"] == "chat_3"
    finally:
        await data.delete(key)
        await data.aclose()
        await broker.aclose()
        app.close()
        broker_server.stop()
