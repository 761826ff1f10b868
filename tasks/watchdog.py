"""The per-step watchdog: a backend step that never returns must not hold its slot silently.

Each backend call of a session (duplex ``prepare``/``step``, each event of a chat turn) runs
inside ``StepWatchdog.guard``. A thread checks the running calls; one that has run longer than
``step_timeout_s`` ends its session at once (``backend_error``; a chat turn gets
``inference_error``), is logged with the reason, counted (``backend_step_timeouts_total``), and
its slot is quarantined: never offered again until the backend is known healthy. In a prefork
pool process (one model per process) that means restarting the process, which reloads the
model; in a threads pool the slot comes back when the stuck call finally returns.

A worker that is stopping cannot wait that long: once its drain is over, a call still running
``SHUTDOWN_STEP_S`` later (or its step limit, if shorter) is hung, and is ended the same way. A
threads-pool worker whose warm shutdown then waits only on such calls exits
(``EXIT_HUNG_STEP``): Celery would wait for those threads for ever, and the process, its port
and its registry entry with it, would never go (a prefork pool process exits as it does on any
hang, and the stopping parent does not replace it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from streaming.events import Event
from tasks.endings import final_events

log = logging.getLogger("omniserve.worker")

T = TypeVar("T")
EXIT_HUNG_STEP = 75  # exit status of a process the watchdog ends (restart, or a stuck stop)
SHUTDOWN_STEP_S = 5.0  # after the drain's end: how long a call may still run before it is hung
COUNTER = "backend_step_timeouts_total"


class StepTimedOut(Exception):
    """Raised when a call the watchdog already gave up on returns: the session is over."""


class Flushable(Protocol):
    """A session's output publisher, as far as the watchdog uses it."""

    def flush(self, timeout: float = ...) -> bool:
        """Wait until every event emitted so far is in Redis."""
        ...


class WatchedSession(Protocol):
    """What the watchdog uses of a running session (``tasks.session.SessionContext`` is one)."""

    @property
    def session_id(self) -> str: ...
    @property
    def slot_id(self) -> str: ...
    @property
    def out(self) -> Flushable: ...

    def emit(self, event: Event) -> None:
        """Send one event to the gateway."""
        ...

    def silence(self) -> None:
        """Drop every later event."""
        ...


class Host(Protocol):
    """What the watchdog uses of its worker process (``tasks.runtime.WorkerRuntime`` is one;
    naming the needs here keeps this module below runtime.py, which imports it)."""

    stopped: bool
    restart_on_hang: bool

    def count(self, name: str) -> None:
        """Add one to a worker counter."""
        ...

    def quarantine(self, slot_id: str, session_id: str) -> None:
        """Stop renewing the session's lease and never offer its slot meanwhile."""
        ...

    def leave_now(self) -> None:
        """Take this process's slots out of the pool at once."""
        ...

    def overdue_s(self) -> float:
        """How long ago the drain's deadline passed (0: not draining, or not yet)."""
        ...

    def only_hung_left(self) -> bool:
        """The process is stopping, and every session it still runs is one whose call hung."""
        ...


@dataclass
class _Running:
    since: float
    ctx: WatchedSession
    kind: str
    what: str
    expired: bool = False


class StepWatchdog:
    """Watches the backend calls of every session of one worker process."""

    def __init__(self, runtime: Host, timeout_s: float) -> None:
        self.runtime = runtime
        self.timeout_s = timeout_s
        self._running: dict[str, _Running] = {}  # slot id -> the call running on it
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the checking thread (no-op when the watchdog is off)."""
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="omni-watchdog", daemon=True)
            self._thread.start()

    @contextmanager
    def guard(self, ctx: WatchedSession, kind: str, what: str = "step") -> Iterator[None]:
        """Run one backend call of ``ctx``'s session under the watchdog.

        Raises StepTimedOut when the call returns after the watchdog ended the session.
        """
        running = _Running(time.monotonic(), ctx, kind, what)
        with self._lock:
            self._running[ctx.slot_id] = running
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(ctx.slot_id, None)
        if running.expired:
            raise StepTimedOut(f"backend {what} returned after the watchdog ended the session")

    def guarded(self, ctx: WatchedSession, kind: str, events: Iterable[T]) -> Iterator[T]:
        """Iterate over a backend's event stream, each ``next()`` under the watchdog."""
        it = iter(events)
        while True:
            with self.guard(ctx, kind, "event"):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def _run(self) -> None:
        interval = min(1.0, max(0.05, self.timeout_s / 10))
        while not self.runtime.stopped:
            time.sleep(interval)
            try:
                self.check()
                if self.runtime.only_hung_left():
                    self._exit_stuck()
            except Exception:  # the watchdog must outlive any error
                log.exception("step watchdog check failed")

    def _exit_stuck(self) -> None:
        """The warm shutdown waits only on hung calls (threads that never return): leave."""
        with self._lock:
            stuck = sorted(slot for slot, r in self._running.items() if r.expired)
        log.error(
            "worker stopping, its only sessions left hung in the backend (slots %s): exiting "
            "without waiting for them",
            ", ".join(stuck) or "?",
        )
        self.runtime.leave_now()
        logging.shutdown()
        os._exit(EXIT_HUNG_STEP)

    def check(self, now: float | None = None) -> list[str]:
        """End every session whose current call exceeded the limit; returns their slot ids."""
        now = time.monotonic() if now is None else now
        overdue = self.runtime.overdue_s()  # stopping: the drain is over, the sessions must end
        stop_limit = min(self.timeout_s, SHUTDOWN_STEP_S)
        with self._lock:
            late = [
                (slot, r)
                for slot, r in self._running.items()
                if not r.expired
                and (now - r.since > self.timeout_s or min(now - r.since, overdue) > stop_limit)
            ]
            for _slot, r in late:
                r.expired = True
        for slot, r in late:
            elapsed = now - r.since
            self._expire(slot, r, elapsed, self.timeout_s if elapsed > self.timeout_s else None)
        return [slot for slot, _ in late]

    def _expire(self, slot: str, r: _Running, elapsed: float, limit: float | None) -> None:
        """``limit``: the step limit it passed; None when the drain's end made it late."""
        rt, ctx = self.runtime, r.ctx
        action = (
            "restarting this worker process to reload the backend"
            if rt.restart_on_hang
            else "its slot is withheld until the call returns"
        )
        why = (
            f"step_timeout_s={limit:.0f}"
            if limit is not None
            else f"the worker is stopping: {SHUTDOWN_STEP_S:.0f} s after its drain ended"
        )
        log.error(
            "backend %s of session %s on slot %s has not returned after %.1f s "
            "(%s): ending the session; %s",
            r.what,
            ctx.session_id,
            slot,
            elapsed,
            why,
            action,
        )
        rt.count(COUNTER)
        message = (
            f"the backend did not answer within {limit:.0f} s"
            if limit is not None
            else "the worker is stopping and the backend did not answer"
        )
        for event in final_events(r.kind, message):
            ctx.emit(event)
        ctx.silence()
        ctx.out.flush(timeout=5.0)
        rt.quarantine(slot, ctx.session_id)
        if rt.restart_on_hang:
            rt.leave_now()
            logging.shutdown()
            os._exit(EXIT_HUNG_STEP)
