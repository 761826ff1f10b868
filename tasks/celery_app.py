"""The Celery application shared by every worker."""

from __future__ import annotations

from celery import Celery

from omnicore.settings import get_settings
from streaming.broker_url import AMQP_HEARTBEAT_S, broker_target, worker_transport_options
from streaming.jobs import CHAT_TASK, DUPLEX_TASK

__all__ = ["CHAT_TASK", "DUPLEX_TASK", "app", "make_app"]


def make_app() -> Celery:
    """A Celery app configured for long pinned sessions (see docs/ARCHITECTURE.md)."""
    s = get_settings()
    # the shared Redis, another Redis, Sentinel or RabbitMQ (streaming/broker_url.py)
    broker = broker_target(s.broker)
    app = Celery(
        "omniserve",
        broker=broker.kombu_url,
        include=["tasks.duplex", "tasks.chat"],
        amqp="tasks.broker:WorkerAMQP",  # reconnect every 0.5-2 s after a Redis restart
    )
    app.conf.update(
        task_ignore_result=True,
        result_backend=None,
        # A session must never run twice: ack on receipt, never re-deliver. (On RabbitMQ this
        # also keeps an hour-long session clear of consumer_timeout: no delivery stays unacked
        # while it runs.)
        task_acks_late=False,
        task_reject_on_worker_lost=False,
        # Admission puts at most one task per slot in a worker's queue; reserve nothing more.
        worker_prefetch_multiplier=1,
        # No unacked bookkeeping: kombu's ack emulation costs two Redis transactions per task
        # (a large share of a chat turn's pickup) to re-deliver a message whose worker died
        # between taking and acking it, which a session must never be anyway (the gateway's
        # task_start_timeout_s reports a task that did not start).
        # The consumer's connection finds a dead peer as every other one does: otherwise its
        # BRPOP, cut off by a network dropping packets, stays silent long after the heal, and
        # meanwhile every session handed to this worker's free slots fails to start
        # (tests/faults/test_dropped_packets.py, streaming/redis_connection.py).
        # (on RabbitMQ, heartbeats find a dead peer instead: broker_heartbeat)
        broker_transport_options=worker_transport_options(broker),
        broker_heartbeat=AMQP_HEARTBEAT_S,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives any Redis outage
        # ... and any error reply to the consumer's own commands: kombu counts Redis's
        # ResponseError (MISCONF: a failed save, the disk of Redis's host full; READONLY) as a
        # channel error, which Celery took for fatal: the worker exited, taking its sessions
        # with it. It reconnects every 0.5-2 s instead until Redis takes its BRPOP again.
        broker_channel_error_retry=True,
        task_default_queue="omni.default",
        task_serializer="json",
        accept_content=["json"],
        worker_send_task_events=True,  # Flower
        # ... published just after a task starts, not while it starts (tasks/task_events.py)
        worker_consumer="tasks.task_events:DeferredEventsConsumer",
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # A pool process sends "up" only after its backend loaded (worker_process_init); Celery
        # kills one that is silent for longer (default 4 s), so a respawned child loading a big
        # model was killed forever. Wait as long as a model may take to load.
        worker_proc_alive_timeout=s.model_load_timeout_s,
        # `--pool prefork` runs this subclass: a dead pool process is replaced within 0.25 s
        # of its reap becoming possible, not at Celery's next 5 s look (tasks/prefork.py)
        worker_pool="tasks.prefork:TaskPool",
    )
    return app


app = make_app()
