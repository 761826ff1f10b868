"""A small harness for fault tests: real processes, faults caused for real.

- ``RestartableRedis``: a private redis-server the test may stop and start again (empty) on
  the same port;
- process helpers: the Celery parent and pool process ids of a worker, kill -9;
- ``DuplexProbe``: a real WebSocket client that keeps streaming audio to a duplex session and
  records every frame with the time it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from omniserve.redis_server import EmbeddedRedis, free_port, start_embedded
from tasks.supervisor import process_alive
from tests.support.client import Client, silence, speech
from tests.support.stack import Proc, Stack


class RestartableRedis:
    """A redis-server on a fixed loopback port, without persistence: a restart starts empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server: EmbeddedRedis | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.server = start_embedded(self.port, die_with_parent=True)

    def kill(self) -> None:
        """SIGKILL the server (its data is gone with it)."""
        assert self.server is not None
        self.server.process.kill()
        self.server.process.wait(timeout=10)
        self.server.stop()
        self.server = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll ``predicate`` until true; returns the seconds it took. Fails after ``timeout``."""
    t0 = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - t0
        except redis.RedisError:
            pass
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


async def await_for(predicate: Any, timeout: float, what: str) -> float:
    """``wait_for`` for the event loop (the probes keep running meanwhile)."""
    t0 = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - t0
        except redis.RedisError:
            pass
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


def all_slots_back(stack: Stack, slots: int, timeout: float = 15) -> None:
    """Every one of ``slots`` is registered by a live worker and idle in the pool again."""
    wait_for(lambda: stack.live_slots() == slots, timeout, f"all {slots} slots registered")
    stack.wait_free(slots, timeout=timeout)


def registry(stack: Stack) -> dict[str, dict[str, Any]]:
    """The worker registry as stored in Redis (worker id -> entry)."""
    raw = stack.redis().hgetall(stack.keys.workers)
    return {k.decode(): orjson.loads(v) for k, v in raw.items()}


def pool_pids(stack: Stack, worker: Proc) -> list[int]:
    """Process ids of a worker's registered pool processes (its prefork children)."""
    return sorted(
        int(e["pid"])
        for e in registry(stack).values()
        if _parent_of(int(e["pid"])) == worker.popen.pid
    )


def forked_children(worker: Proc) -> list[int]:
    """Live processes the worker's Celery parent has forked (loading or not, registered or not)."""
    return sorted(k for k in _children(worker.popen.pid) if process_alive(k))


def held_at_fork(worker: Proc) -> int:
    """Stop the worker's Celery parent (SIGSTOP) as soon as it has forked its pool process, which
    is well before its consumer starts; returns that process (alive, or exited and not reaped).
    A child that is a program of its own (``uname -p``, run while Celery starts) is let go."""
    parent = worker.popen.pid
    program = _comm(parent)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and worker.alive():
        if not any(_comm(k) == program for k in _children(parent)):
            time.sleep(0.001)
            continue
        os.kill(parent, signal.SIGSTOP)
        time.sleep(0.05)  # a subprocess has exec'd its program by now
        forks = [k for k in _children(parent) if _comm(k) == program]
        if forks:
            return forks[0]
        os.kill(parent, signal.SIGCONT)
    raise AssertionError("the worker forked no pool process")


def _children(pid: int) -> list[int]:
    """Every child of ``pid``, exited ones not yet reaped included."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(k) for k in fh.read().split()]
    except OSError:
        return []


def _comm(pid: int) -> bytes:
    """The program name of ``pid`` (a fork keeps its parent's until it runs another)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b"(", 1)[1].rsplit(b")", 1)[0]
    except (OSError, IndexError):
        return b""


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def kill9(pid: int) -> float:
    """SIGKILL one process; returns the monotonic time of the kill."""
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    return t


def kill9_group(proc: Proc) -> float:
    """SIGKILL a whole worker (its Celery parent and pool processes)."""
    t = time.monotonic()
    os.killpg(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait(timeout=10)
    return t


def log_text(proc: Proc) -> str:
    return proc.log.read_text(errors="replace")


@dataclass
class DuplexProbe:
    """A duplex client streaming audio (speech then silence, so the scripted backend answers)."""

    client: Client
    frames: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    close_code: int | None = None
    closed_at: float | None = None
    chunks_sent: int = 0
    max_chunks: int | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def open(
        cls, url: str, mode: str = "audio", max_chunks: int | None = None, init: bool = True
    ) -> DuplexProbe:
        client = await Client.connect(url, query=f"?mode={mode}")
        probe = cls(client, max_chunks=max_chunks)
        if init:
            await client.init()
            probe.frames.extend((time.monotonic(), f) for f in client.received)
            probe.start()
        return probe

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._read()),
            asyncio.create_task(self._pump()),
        ]

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                raw = await self.client.ws.recv()
                self.frames.append((time.monotonic(), orjson.loads(raw)))
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
            self.closed_at = time.monotonic()

    async def _pump(self) -> None:
        from websockets.exceptions import ConnectionClosed

        n = 0
        with contextlib.suppress(ConnectionClosed):
            while self.closed_at is None:
                if self.max_chunks is not None and n >= self.max_chunks:
                    return
                audio = speech() if n % 4 == 0 else silence()
                await self.client.send({"type": "input.append", "input": {"audio": audio}})
                n += 1
                self.chunks_sent = n
                await asyncio.sleep(0.3)

    def first(self, kind: str, since: float = 0.0, code: str | None = None) -> float | None:
        """Arrival time of the first frame of ``kind`` (and error ``code``) after ``since``."""
        for t, f in self.frames:
            if t < since or f.get("type") != kind:
                continue
            if code is None or f.get("error", {}).get("code") == code:
                return t
        return None

    def deltas_after(self, since: float) -> int:
        return sum(1 for t, f in self.frames if t > since and f["type"] == "response.output.delta")

    def closed_reason(self) -> str | None:
        for _, f in self.frames:
            if f["type"] == "session.closed":
                return f.get("reason")
        return None

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await self.client.close()


async def open_with_one_link_apart(
    stack: Stack, cut: str, redis_url: str
) -> tuple[list[DuplexProbe], Proc | None]:
    """Start a gateway and workers where ``cut`` (``gateway`` or ``worker``) alone reaches Redis
    at ``redis_url`` (a link the test can cut), and two duplex probes streaming to them. A cut
    worker's sessions run on it, with a spare worker started afterwards to fail over to (returned,
    else None)."""
    if cut == "gateway":
        stack.start_worker(slots=4)
        stack.start_gateway(OMNISERVE_REDIS_URL=redis_url)
    else:
        stack.start_worker(slots=2, OMNISERVE_REDIS_URL=redis_url)  # the sessions run here
        stack.start_gateway()
    probes = [await DuplexProbe.open(stack.url()) for _ in range(2)]
    spare = None
    if cut == "worker":
        spare = stack.start_worker(slots=2, wait=False)
        await await_for(lambda: stack.live_slots() == 4, 60, "the spare worker's slots")
    return probes, spare


async def admitted_to_a_dying_worker(
    stack: Stack, claimed: bool = False, **gateway_env: str
) -> tuple[Client, Proc, int]:
    """A duplex client admitted to the one slot of a worker whose pool process then dies before
    it starts the session: the worker's Celery parent is frozen (SIGSTOP) while the client is
    admitted and sends ``session.init`` (the task waits in the node's queue), the pool process is
    killed (SIGKILL) and the parent thawed (it hands the task to the replacement, which does not
    own that slot). Returns the client, the worker and the killed process's pid.

    ``claimed``: the process dies after it claimed the session and before its ``Started`` went
    out. That window is microseconds wide, so the claim and the lease, two of the keys the
    worker's claim step writes at once, are written here as it writes them (the one stand-in)."""
    worker = stack.start_worker(slots=1)
    stack.start_gateway(OMNISERVE_TASK_START_TIMEOUT_S="60", **gateway_env)
    stack.wait_free(1)
    [child] = forked_children(worker)
    os.kill(worker.popen.pid, signal.SIGSTOP)
    try:
        client = await Client.connect(stack.url(), query="?mode=audio")
        # the task is in the node's queue
        sid = (await client.until("session.queue_done", timeout=10))["session_id"]
        if claimed:
            with stack.redis().pipeline(transaction=True) as pipe:  # as session_claim.py does
                pipe.set(stack.keys.session_claim(sid), f"omni@test#{child}", ex=60)
                pipe.set(stack.keys.session_lease(sid), f"omni@test#{child}", px=1500)
                pipe.execute()
        await client.send({"type": "session.init", "payload": {}})
        kill9(child)
    finally:
        os.kill(worker.popen.pid, signal.SIGCONT)
    return client, worker, child


async def served_end_to_end(url: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """A new audio session: init, speech, silence, until the scripted answer's first text."""
    client = await Client.connect(url, query="?mode=audio")
    try:
        await client.until("session.queue_done", timeout=timeout)
        await client.send({"type": "session.init", "payload": {}})
        await client.until("session.created", timeout=timeout)
        for audio in (speech(), silence()):
            await client.send({"type": "input.append", "input": {"audio": audio}})
        frames = await client.collect_until("response.output.delta", timeout=timeout)
        while not any(f.get("kind") == "text" for f in frames):
            frames += await client.collect_until("response.output.delta", timeout=timeout)
        await client.send({"type": "session.close"})
        await client.until("session.closed", timeout=timeout)
        return client.received
    finally:
        await client.close()


async def queue_two(urls: list[str]) -> list[Client]:
    """Two audio clients waiting in the queue (every slot busy), the first of ``urls`` first;
    each told its place."""
    waiting: list[Client] = []
    for i, url in enumerate(urls):
        waiting.append(await Client.connect(url, query="?mode=audio"))
        queued = await waiting[-1].until("session.queued", timeout=15)
        assert queued["position"] == i + 1, queued
    return waiting


async def served_in_their_order(waiting: list[Client]) -> None:
    """``queue_two``'s clients are served in their order: the first in the next slot freed, the
    second once the first leaves; both closed after."""
    first, second = waiting
    await first.until("session.queue_done", timeout=30)
    assert not any(f["type"] == "session.queue_done" for f in second.received)
    await first.close()
    await second.until("session.queue_done", timeout=30)
    await second.close()
