"""Worker bootstrap through Celery's own signals: one backend per worker process.

- prefork pool (the default for GPU backends, concurrency 1): the backend loads in the child
  (``worker_process_init``), never in the parent that forks. The parent waits for a (re)started
  child as long as a model may take to load (``worker_proc_alive_timeout``) and watches its
  children (``tasks/supervisor.py``): a child that dies has its sessions ended for their clients
  and its slots withdrawn at once, and its replacement loads the backend again;
- threads/solo pool (``--slots N`` for the scripted backend): it loads in the worker process once
  the consumer is ready (``worker_ready``).
Either way the process registers as ``loading`` before the model loads (clients queue for it)
and offers its slots once it is ready; just before, what it loaded is frozen out of the garbage
collector's reach (``omnicore/gc_pauses.py``), as is the prefork parent's before it forks.
On a warm shutdown (``worker_shutting_down``) a drain flag starts the drain: no new sessions,
running ones may go on for ``drain_grace_s`` and then end with ``server_shutdown``; idle slots
leave the registry at once, busy ones when their session ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, TypedDict

import orjson
import redis
from celery import signals
from redis.exceptions import RedisClusterException

from omnicore.gc_pauses import freeze_heap
from omnicore.settings import get_settings
from streaming.keys import Keys
from streaming.outage import REDIS_ERRORS
from streaming.redis_url import sync_client
from streaming.slots import forget_worker, withdraw_idle_of_node
from tasks.prefork import EXIT_LOAD_FAILED
from tasks.runtime import WorkerRuntime, get_runtime, set_runtime
from tasks.supervisor import PoolSupervisor

log = logging.getLogger("omniserve.worker")


class _BootState(TypedDict):
    node: str | None
    pool: str
    slots: int


_state: _BootState = {"node": None, "pool": "prefork", "slots": 1}
_sigterms: list[float] = []  # SIGTERMs this pool process received (the second one exits)
_supervisor: dict[str, PoolSupervisor] = {}  # "pool": the prefork parent's child watcher


@signals.celeryd_init.connect
def _on_celeryd_init(
    sender: str | None = None, instance: Any = None, conf: Any = None, **_: object
) -> None:
    node = sender or f"omni@{os.uname().nodename}"
    _state["node"] = node
    # `omniserve worker` runs prefork with one child for one slot, a threads pool for several.
    slots = max(1, get_settings().worker_slots)
    _state["pool"] = "threads" if slots > 1 else "prefork"
    _state["slots"] = slots
    queue = "omni.w." + node
    instance.app.amqp.queues.select_add(queue)
    settings = get_settings()
    try:  # a previous run of this node may have left its drain and stop flags behind
        keys = Keys(settings.key_prefix)
        sync_client(settings.redis_url).delete(keys.drain(node), keys.node_stopping(node))
    except REDIS_ERRORS as exc:  # Redis not up yet: the message says it all
        log.warning("could not clear drain flag (%s)", exc)
    log.info(
        "node %s consumes %s (pool=%s, slots=%s)", node, queue, _state["pool"], _state["slots"]
    )


def _boot(slots: int) -> None:
    node = _state["node"] or f"omni@{os.uname().nodename}"
    rt = WorkerRuntime(node, slots)
    rt.restart_on_hang = _state["pool"] == "prefork"
    set_runtime(rt)
    rt.announce()
    # Prefork: Celery may replace a pool process that died as the worker began to stop (a
    # SIGTERM to the process group reaches a loading child too); loading a model now would hold
    # the stop for as long as the load takes. Checked after the announcement: the stopping
    # parent sets the flag, then ends the processes its registry shows loading, so a process
    # announced too late for that look sees the flag here.
    if _state["pool"] == "prefork" and _node_stopping(node):
        log.info("worker %s is stopping: this pool process does not load the backend", node)
        rt.leave_now()
        logging.shutdown()
        os._exit(0)
    try:
        rt.load_backend()
    except Exception as exc:  # noqa: BLE001 - report and refuse to serve
        log.critical("backend %r failed to load: %s", rt.backend_name, exc)
        print(
            f"omniserve worker: backend {rt.backend_name!r} failed to load: {exc}",
            file=sys.stderr,
            flush=True,
        )
        rt.leave_now()
        os._exit(EXIT_LOAD_FAILED)
    cap = rt.backend.max_concurrency if rt.backend else 1
    if len(rt.slot_ids) > cap:
        print(
            f"omniserve worker: backend {rt.settings.backend!r} serves at most {cap} session(s) "
            f"per process; asked for {len(rt.slot_ids)} slots (use one worker per GPU)",
            file=sys.stderr,
            flush=True,
        )
        rt.leave_now()
        os._exit(EXIT_LOAD_FAILED)
    if rt.settings.gc_freeze:  # the model and its libraries live as long as the process
        log.info("froze %d objects of the loaded worker", freeze_heap())
    rt.start()


@signals.worker_init.connect
def _on_worker_init(**_: object) -> None:
    """A prefork parent's heap is frozen before it forks its pool: it picks up every task of
    the node, and its children share those pages (``gc.freeze``'s own use), which they would
    not if it were frozen later, at ``worker_ready``. (That later collection also widened the
    window in which Celery's start-up look at the pool, ``did_start_ok``, took a killed child
    for a pool that cannot start; ``tasks/prefork.py`` now replaces such a child.)"""
    if _state["pool"] == "prefork" and get_settings().gc_freeze:
        log.info("froze %d objects of the pool's parent", freeze_heap())


@signals.worker_process_init.connect
def _on_process_init(**_: object) -> None:
    _boot(1)


def _node_stopping(node: str) -> bool:
    s = get_settings()
    try:
        client = sync_client(s.redis_url)
        return bool(client.exists(Keys(s.key_prefix).node_stopping(node)))
    except REDIS_ERRORS:
        return False  # Redis away: load as usual (the stop, if any, waits for the load)


def _stop_loading(client: redis.Redis, keys: Keys, node: str, pids: set[int]) -> None:
    """The parent is stopping: its pool processes still loading the backend (no session can be
    on them) are ended now, not waited for as long as a load takes, and leave the registry. One
    not registered at all is left alone: Redis may have lost a serving one's entry."""
    for pid in pids:
        worker_id = f"{node}#{pid}"
        raw = client.hget(keys.workers, worker_id)
        if raw is None or orjson.loads(raw).get("state") != "loading":
            continue
        log.info("worker %s is stopping: ending pool process %d, still loading", node, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        forget_worker(client, keys, worker_id, [])


def install_child_sigterm() -> None:
    """In a prefork child (main thread): SIGTERM drains instead of killing the session.

    A SIGTERM sent to the whole process group (a terminal, a process manager) reaches the child
    too: the first one drains (sessions end with server_shutdown), a second one exits. billiard
    resets signal handlers after ``worker_process_init``, so this is installed when a session
    starts.
    """
    if (
        _state["pool"] == "prefork"
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is not _child_sigterm
    ):
        signal.signal(signal.SIGTERM, _child_sigterm)


def _child_sigterm(signum: int, _frame: object) -> None:
    try:
        rt = get_runtime()
    except RuntimeError:
        os._exit(0)
    _sigterms.append(time.monotonic())
    if rt.shutting_down.is_set() and not rt.active:
        os._exit(0)
    if len(_sigterms) > 1:  # a drain seen in Redis first is no reason to exit on the first
        log.warning("second SIGTERM with sessions running: exiting")
        os._exit(1)
    rt.start_drain(time.time() + rt.settings.drain_grace_s, "SIGTERM")


@signals.worker_ready.connect
def _on_ready(sender: object = None, **_: object) -> None:
    if _state["pool"] != "prefork":
        _boot(_state["slots"])
        return
    pool = getattr(sender, "pool", None)
    if pool is not None:
        sup = PoolSupervisor(str(_state["node"]), pool, get_settings())
        sup.known = sup.pids()
        sup.start()
        _supervisor["pool"] = sup


@signals.task_received.connect
def _on_task_received(request: object = None, **_: object) -> None:
    sup = _supervisor.get("pool")
    if sup is not None:
        sup.track(request)


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: object) -> None:
    sup = _supervisor.pop("pool", None)
    if sup is not None:
        sup.stop()  # pool processes now end on purpose
    s = get_settings()
    node = str(_state["node"])
    deadline = time.time() + s.drain_grace_s
    try:  # the pool process learns it from its heartbeat (a prefork child gets no signal)
        client = sync_client(s.redis_url)
        keys = Keys(s.key_prefix)
        client.set(keys.drain(node), repr(deadline), ex=int(s.drain_grace_s) + 60)
        if sup is not None:  # prefork: a replaced pool process must not load, a loading one
            client.set(keys.node_stopping(node), "1", ex=int(s.drain_grace_s) + 3600)
            _stop_loading(client, keys, node, sup.pids())
        withdraw_idle_of_node(client, keys, node)  # at once, not at the child's next beat
    except REDIS_ERRORS as exc:
        log.warning("could not set drain flag (%s)", exc)
    try:
        rt = get_runtime()
        if not rt.ready.is_set():  # threads pool, still loading the backend: nothing to drain
            log.info("worker %s is stopping while the backend loads: exiting now", rt.worker_id)
            rt.leave_now()
            logging.shutdown()
            os._exit(0)
        rt.process_stopping = True  # the watchdog lets it exit if only hung steps hold it
        rt.start_drain(deadline, "warm shutdown")
        with rt.lock:
            idle = [s for s in rt.slot_ids if s not in rt.active]
        rt.registry.withdraw(idle)
    except (RuntimeError, redis.RedisError, RedisClusterException):
        pass


@signals.worker_process_shutdown.connect
def _on_process_shutdown(**_: object) -> None:
    try:
        get_runtime().stop()
    except RuntimeError:
        pass


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    try:
        get_runtime().stop()
    except RuntimeError:
        pass
