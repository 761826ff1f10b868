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

Two shortcuts keep the message the same but build it with a fraction of the CPU, since it is on
the path of every session's start: the ``argsrepr``/``kwargsrepr`` headers are given as
``repr`` of the job's few short fields, which is what Celery's ``saferepr`` makes of them, and
the envelope is written by orjson.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import orjson
import redis.asyncio as aioredis
from celery import Celery
from kombu.serialization import dumps as serialize
from kombu.utils.uuid import uuid

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
    broker: aioredis.Redis | None = None,
) -> None:
    """Put ``job`` on the worker queue ``queue`` (a Redis list of priority 0's messages).

    ``with_values``: keys the task reads (key -> value, TTL in s), written in the same
    ``MULTI`` before the push: one round trip, and the task never starts without them.
    ``broker``: the broker's Redis when it is not ``redis_client`` (``broker_url``): the values
    are written first, then the task pushed, so it still never starts without them.
    """
    message = task_message(app, job, queue)
    if broker is not None and broker is not redis_client:
        if with_values:
            async with redis_client.pipeline(transaction=False) as values:
                for key, (value, ttl_s) in with_values.items():
                    values.set(key, value, ex=ttl_s)
                await values.execute()
        await broker.lpush(queue, message)
        return
    if not with_values:
        await redis_client.lpush(queue, message)
        return
    async with redis_client.pipeline(transaction=True) as pipe:
        for key, (value, ttl_s) in with_values.items():
            pipe.set(key, value, ex=ttl_s)
        pipe.lpush(queue, message)
        await pipe.execute()
