"""The thread that writes a worker's session events to Redis (see ``OutputPublisher``).

A worker keeps one writer per slot and hands it from session to session: a thread started for
every session would delay each chat turn's first event, since the new thread must win the GIL
from Celery's consumer, which is busy at that moment with the task's own events. Sessions on one
writer stay in order, each as its own ``Target``.

A batch whose emitter has nothing else to do meanwhile (a duplex step's output, at the step's
end; a chat turn's first delta, which the client waits for) may be written by the emitting
thread itself when the writer has nothing queued (``write_now``): handing it to the writer costs
a thread wake-up, which in a worker of many sessions on a busy core is a large part of the relay's
time (docs/BENCHMARKS.md, "the worker's side of the relay").
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol


class Target(Protocol):
    """What a writer writes for: one session's publisher."""

    def write(self, batch: list[tuple[int, bytes]]) -> None:
        """Write these (seq, encoded event) pairs to Redis, in order."""


Item = tuple[Target, list[tuple[int, bytes]]] | threading.Event | None


class OutputWriter:
    """One background thread writing events in the order they were queued; several events
    of a session go in one round trip when they come faster than Redis answers."""

    BATCH = 64

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # ``_pending``: batches queued and not yet written; ``_order`` is held while one is
        # counted in, and by a caller's own write (``write_now``): a batch queued meanwhile
        # waits for that write, so batches reach Redis in the order they were handed over
        self._order = threading.Lock()
        self._pending = 0

    def start(self) -> None:
        """Start the thread (once; ``put`` starts it too)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def put(self, target: Target, events: list[tuple[int, bytes]]) -> None:
        """Queue encoded ``(seq, event)`` pairs of ``target``, to be written in one batch."""
        if self._thread is None:
            self.start()
        with self._order:
            self._pending += 1
            self._queue.put((target, events))

    def write_now(self, target: Target, events: list[tuple[int, bytes]]) -> bool:
        """Write ``events`` on the calling thread if nothing is queued or being written (True);
        otherwise do nothing (False: ``put`` them, behind what is queued)."""
        with self._order:
            if self._pending:
                return False
            target.write(events)
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then end the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[tuple[int, bytes]] = []
            target: Target | None = None
            markers: list[threading.Event] = []
            stop = False
            taken = 0  # batches taken off the queue
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    markers.append(item)
                else:
                    owner, events = item
                    taken += 1
                    if owner is not target and batch:
                        assert target is not None
                        target.write(batch)  # another session's events: one batch each
                        batch = []
                    target = owner
                    batch.extend(events)
                if stop or len(batch) >= self.BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch and target is not None:
                target.write(batch)
            with self._order:
                self._pending -= taken
            for marker in markers:
                marker.set()
            if stop:
                return
