"""The watched event stream of one submitted task (a duplex session or a chat turn).

Every relay needs the same three guarantees, so they live here once:
- the task must start within ``task_start_timeout_s``, else it is abandoned (the claim key makes
  sure it never starts later) and its slot is freed: ``TaskNotStarted``; the same at once when a
  liveness tick finds the slot's worker process gone before the task started (one that died
  after the slot was handed out: nothing else would ever start it);
- once it started (or, when abandoning it finds it claimed, once claimed: a worker that died
  between its claim and its ``Started`` would otherwise leave the client waiting), its worker
  must keep renewing the session lease (watched at every tick of the gateway's
  batched liveness read, ``api/gateway/liveness.py``, without holding up the events: only a lapsed
  lease wakes the reader, through ``SessionOutput.wake``); at the first read that finds it gone
  (its TTL is the grace period) the rest of the replay log is read and returned, and unless it
  ends the task, ``WorkerLost`` follows; a claimed task whose log holds nothing, not even its
  ``Started``, never ran: ``TaskNotStarted`` (``worker_gone``), as for an unclaimed one;
- events come in sequence order, with lost ones filled from the replay log or reported as a
  ``Gap`` (``streaming/output.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from redis.exceptions import ResponseError

from api.gateway.liveness import Answer
from api.gateway.state import Gateway
from streaming.events import FINAL_EVENTS, Created, Event, Started
from streaming.jobs import Job
from streaming.keys import slot_worker
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

LEASE_MISSES = 1  # the lease TTL is the grace period; one miss means the worker stopped renewing


class TaskNotStarted(Exception):
    """No worker started the task in time (or it could not be sent); its slot was freed.

    ``detail`` says which, for the client's message; ``worker_gone``: the slot's worker process
    died before it started the task (it may start on another slot), not a start deadline. (A
    task a worker claimed before dying keeps its slot taken: that worker's slots leave the pool
    with its presence.)
    """

    def __init__(self, detail: str, worker_gone: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.worker_gone = worker_gone


class WorkerLost(Exception):
    """The worker running the task stopped renewing its lease."""


class TaskRelay:
    """Submit a task and read its events; see the module docstring."""

    def __init__(
        self,
        gateway: Gateway,
        out: SessionOutput,
        task_id: str,
        slot_id: str,
        what: str,
        claim_id: str | None = None,
    ) -> None:
        self.gateway = gateway
        self.claim_id = claim_id or task_id  # a failover's attempt claims its own id
        self.what = what  # "session" or "turn", for messages
        self.out = out
        self.task_id = task_id
        self.job: Job | None = None  # what was submitted (a next attempt is made from it)
        self.moves = 0  # earlier attempts whose worker died before starting them (task_retry)
        self.slot_id = slot_id
        self.started = False
        self._start_by = time.monotonic() + gateway.settings.task_start_timeout_s
        self._watching = False  # the lease is watched (once the task started)
        self._lease_news: Answer | None = None  # a lapsed lease or a failed read, for ``next``
        self._lease_misses = 0
        self._lost = False
        self._worker_watched = False  # the slot's worker is watched until the task starts
        self._claimed = False  # not started, but a worker claimed it: its lease is watched
        self._worker_gone = False

    async def submit(
        self, job: Job, with_values: Mapping[str, tuple[bytes, int]] | None = None
    ) -> None:
        """Send the task to the slot's worker (``with_values``: see ``Gateway.submit``);
        TaskNotStarted (slot freed) when that fails."""
        self.job = job
        try:
            await self.gateway.submit(job, with_values)
        except Exception as exc:
            await self.gateway.abandon(self.claim_id, self.slot_id)
            raise TaskNotStarted(str(exc)) from exc
        self._start_by = time.monotonic() + self.gateway.settings.task_start_timeout_s

    async def next(self, timeout: float) -> list[Event]:  # noqa: ASYNC109 - see SessionOutput.get
        """The events that arrived within ``timeout`` seconds, in order (``Started`` is consumed).

        Raises TaskNotStarted, or WorkerLost on the call after the one that returned what the
        replay log still held of a lost worker's output.
        """
        if self._lost:
            raise WorkerLost()
        events = self._consume_started(await self.out.get(timeout=timeout))
        now = time.monotonic()
        if not self.started and not self._claimed:
            if not (self._worker_gone or now > self._start_by):
                self._watch_worker()
                return events
            if await self.gateway.abandon(self.claim_id, self.slot_id):
                raise TaskNotStarted(
                    f"the worker process of its slot is gone; the {self.what} did not start"
                    if self._worker_gone
                    else f"the {self.what} did not start",
                    worker_gone=self._worker_gone,
                )
            # a worker claimed it first: it runs (its Started is on the way) or it died before
            # its Started went out; the lease, written with the claim, tells which
            self._claimed = True
        if self._lease_lapsed():
            self._lease_misses += 1
            if self._lease_misses >= LEASE_MISSES:
                events += self._consume_started(await self.out.catch_up())
                if not self.started and not events:
                    # claimed, and gone before its Started reached the log: nothing of the
                    # task ran, so it may start elsewhere as one that was never taken
                    raise TaskNotStarted(
                        f"the worker process that took the {self.what} died before starting it",
                        worker_gone=True,
                    )
                self._lost = not any(isinstance(ev, FINAL_EVENTS) for ev in events)
        return events

    def _watch_worker(self) -> None:
        """Until the task starts, a tick that finds its slot's worker process gone wakes the
        reader (its ``Created``/``Started`` ends the watch)."""
        if not self._worker_watched:
            self._worker_watched = True
            self.gateway.liveness.watch_worker(slot_worker(self.slot_id), self._worker_read)

    def _worker_read(self, answer: Answer) -> bool:
        """A tick's read of the worker's presence: gone wakes the reader (and ends the watch);
        alive or a failed read changes nothing (the start deadline still holds)."""
        if self.started or self.out.closed:
            return False
        if answer is False:
            self._worker_gone = True
            self.out.wake()
            return False
        return True

    def _lease_lapsed(self) -> bool:
        """Whether a tick read the lease gone since the last call (a failed read raises, as the
        single command did); the first call starts the watch (the lease exists once the task
        started)."""
        if not self._watching:
            self._watching = True
            self.gateway.liveness.watch_lease(self.task_id, self._lease_read)
        news, self._lease_news = self._lease_news, None
        if isinstance(news, Exception):
            raise news
        return news is False

    def _lease_read(self, answer: Answer) -> bool:
        """A tick's read of the lease: a live one changes nothing; any other answer wakes the
        reader, whose ``next`` takes it. False (stop watching) once the relay is over."""
        if self._lost or self.out.closed:
            return False
        if answer is True:
            self._lease_misses = 0
        else:
            self._lease_news = answer
            self.out.wake()
        return True

    def wait_left(self, now: float) -> float:
        """Seconds until ``next`` must look at the start deadline (inf once started or
        claimed)."""
        return float("inf") if self.started or self._claimed else self._start_by - now

    async def stop(self, reason: str | None) -> None:
        """Ask the worker to end the task, until Redis takes it (``api/gateway/worker_stops.py``);
        one that has not started is abandoned (never runs)."""
        gateway, task_id = self.gateway, self.task_id
        until = self.job.deadline_ts if self.job else time.time() + gateway.settings.session_ttl_s
        await gateway.stops.close(task_id, reason, until)
        if not self.started:
            try:
                await self.gateway.abandon(self.claim_id, self.slot_id)
            except ResponseError as exc:  # the close above reaches the task when it starts
                log.warning("%s %s not abandoned: %s", self.what, task_id, exc)

    def _consume_started(self, events: list[Event]) -> list[Event]:
        if not self.started and any(isinstance(ev, Created) and ev.recovered for ev in events):
            self.started = True  # a failover's worker sends no Started (its Created tells)
        if any(isinstance(ev, Started) for ev in events):
            self.started = True
            return [ev for ev in events if not isinstance(ev, Started)]
        return events
