"""Sending a Celery task from the event loop: Celery builds the message, asyncio pushes it.

Why: Celery's ``send_task`` is synchronous. Run in ``asyncio.to_thread``, each of its socket calls
has to win the GIL back from a busy event loop (up to ``sys.getswitchinterval()`` every time),
so on a loaded gateway one submission would be most of the admission handoff (slot free ->
``session.queue_done``) and of a chat turn's extra first-delta latency.

What stays Celery's: the task message itself (protocol 2: headers, properties and body built by
``app.amqp.as_task_v2`` and serialised by kombu with the app's serializer), so workers, Flower
(task id = session id) and the broker's task events see no difference. What is done here is only
the last step of kombu's Redis transport for a queue bound to the default exchange: the JSON
envelope (base64 body, ``delivery_info``, ``delivery_tag``) pushed with one ``LPUSH`` onto the
queue's list. ``tests/unit/api/gateway/test_task_submit.py`` checks it against what
``send_task`` pushes.

With a broker of its own (``OMNISERVE_BROKER_URL``, ``streaming/broker_url.py``) the keys a task
reads are written to the shared Redis first, then its message goes to the broker: the same
envelope pushed onto a separate Redis's list, or Celery's own ``send_task`` to RabbitMQ, run in
a few threads of its own (py-amqp is synchronous) with publisher confirms, so a task the broker
did not take is an error here, as a failed push is (``TaskSender``).

Two shortcuts keep the message the same but build it with a fraction of the CPU, since it is on
the path of every session's start: the ``argsrepr``/``kwargsrepr`` headers are given as
``repr`` of the job's few short fields, which is what Celery's ``saferepr`` makes of them, and
the envelope is written by orjson.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import orjson
import redis.asyncio as aioredis
from celery import Celery
from kombu.serialization import dumps as serialize
from kombu.utils.uuid import uuid

from streaming.broker_url import BrokerTarget
from streaming.jobs import Job

PERSISTENT = 2  # kombu's delivery_mode for a durable message (what send_task sends)
REPR_MAX = 1024  # Celery's kwargsrepr_maxsize: a longer repr is left to its saferepr


def task_message(app: Celery, job: Job, queue: str) -> bytes:
    """The broker message ``app.send_task(job.task, kwargs=..., queue=queue)`` would push."""
    kwargs = job.kwargs()
    shown = repr(kwargs)  # what Celery's saferepr makes of a job's few short fields, in C
    msg = app.amqp.as_task_v2(
        job.task_id,
        job.task,
        args=(),
        kwargs=kwargs,
        reply_to=app.thread_oid,
        ignore_result=None,  # type: ignore[arg-type]  # as send_task passes it: the task decides
        argsrepr="()",
        kwargsrepr=shown if len(shown) <= REPR_MAX else None,
    )
    content_type, content_encoding, body = serialize(msg.body, app.conf.task_serializer)
    raw = body.encode() if isinstance(body, str) else body
    envelope = {
        "body": base64.b64encode(raw).decode(),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": msg.headers,
        "properties": {
            **msg.properties,
            "delivery_mode": PERSISTENT,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": uuid(),
        },
    }
    return orjson.dumps(envelope)


async def submit(
    redis_client: aioredis.Redis,
    app: Celery,
    job: Job,
    queue: str,
    with_values: Mapping[str, tuple[bytes, int]] | None = None,
) -> None:
    """Put ``job`` on the worker queue ``queue`` (a Redis list of priority 0's messages).

    ``with_values``: keys the task reads (key -> value, TTL in s), written in the same
    ``MULTI`` before the push: one round trip, and the task never starts without them.
    """
    message = task_message(app, job, queue)
    if not with_values:
        await redis_client.lpush(queue, message)
        return
    async with redis_client.pipeline(transaction=True) as pipe:
        for key, (value, ttl_s) in with_values.items():
            pipe.set(key, value, ex=ttl_s)
        pipe.lpush(queue, message)
        await pipe.execute()


SEND_THREADS = 4  # concurrent publishes to RabbitMQ (each on a connection of Celery's pool)
SEND_TIMEOUT_S = 10.0  # a publish, and RabbitMQ's confirm of it: a silent broker fails the submit


class TaskSender:
    """Submits the gateway's tasks by the path its broker allows (see the module docstring)."""

    def __init__(
        self,
        data: aioredis.Redis,
        app: Celery,
        target: BrokerTarget,
        broker_redis: aioredis.Redis | None = None,
    ) -> None:
        """``broker_redis``: the broker's own Redis client, for a broker that is a Redis but not
        ``data``; None when the broker is ``data`` itself or RabbitMQ."""
        self.data = data
        self.app = app
        self.target = target
        self.broker_redis = broker_redis
        self._threads = (
            ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="task-send")
            if target.kind == "amqp"
            else None
        )

    async def submit(
        self, job: Job, queue: str, with_values: Mapping[str, tuple[bytes, int]] | None = None
    ) -> None:
        """Put ``job`` on the worker queue ``queue``, the keys it reads written before it."""
        if self._threads is None and self.broker_redis is None:  # the shared Redis: one MULTI
            await submit(self.data, self.app, job, queue, with_values)
            return
        if with_values:  # a plain pipeline: a Redis Cluster routes each key to its shard
            async with self.data.pipeline(transaction=False) as pipe:
                for key, (value, ttl_s) in with_values.items():
                    pipe.set(key, value, ex=ttl_s)
                await pipe.execute()
        if self.broker_redis is not None:
            await self.broker_redis.lpush(queue, task_message(self.app, job, queue))
            return
        assert self._threads is not None
        await asyncio.get_running_loop().run_in_executor(self._threads, self._send_task, job, queue)

    def _send_task(self, job: Job, queue: str) -> None:
        self.app.send_task(
            job.task,
            kwargs=job.kwargs(),
            queue=queue,
            routing_key=queue,
            task_id=job.task_id,
            timeout=SEND_TIMEOUT_S,
            confirm_timeout=SEND_TIMEOUT_S,
            # once more on a fresh connection (a pooled one may be a restarted broker's), then
            # the submit fails: the client is told, its slot freed
            retry_policy={"max_retries": 1},
        )

    async def aclose(self) -> None:
        """Let the publishes under way end, then close the broker's connections."""
        if self._threads is not None:
            await asyncio.to_thread(self._threads.shutdown, True)
        if self.broker_redis is not None:
            await self.broker_redis.aclose()
