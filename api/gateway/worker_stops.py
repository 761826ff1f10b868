"""Telling a worker that the gateway ended a session, until Redis takes it.

A duplex session (or a chat turn) runs on its worker until the worker hears that it is over:
the close control in its input stream, or, once resumable, its resume record marked ended.
When Redis refuses that write (full: ``maxmemory`` with ``noeviction``; read-only; away for a
moment), the worker never hears: the session goes on there for its whole time, holding a slot
nobody is listening to (a 10 s Redis OOM left three of four slots held for the rest of their
sessions).

So a write that tells a worker to stop is tried again every ``RETRY_S`` in the background until
Redis takes it, or until the session's deadline, after which its worker ends it by itself. A
stopped gateway drops what is still pending: its lease goes with it, and a worker ends (or, when
resumable, detaches) the sessions of a gateway it finds gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from omnicore.aio import cancel_and_wait
from streaming.controls import CloseControl
from streaming.input import InputWriter
from streaming.resume import ResumeStore

log = logging.getLogger("omniserve.gateway")

RETRY_S = 1.0  # between two tries of the same write

Write = Callable[[], Awaitable[object]]


class WorkerStops:
    """Writes that stop a worker's session, retried until taken (see the module docstring)."""

    def __init__(
        self,
        inputs: InputWriter | None = None,
        resumes: ResumeStore | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self.inputs, self.resumes = inputs, resumes
        self.retry_s = retry_s
        self._pending: set[asyncio.Task[None]] = set()

    async def close(self, session_id: str, reason: str | None, until: float) -> bool:
        """The close control into the input stream of a session (or a chat turn's task)."""
        inputs = self.inputs
        assert inputs is not None, "WorkerStops without an InputWriter"
        control = CloseControl(reason=reason)
        return await self.write(
            f"stopping {session_id}", lambda: inputs.control(session_id, control), until
        )

    async def end_record(self, session_id: str, until: float) -> bool:
        """A resumable session's record marked ended (its worker, detached, gives up on it)."""
        resumes = self.resumes
        assert resumes is not None, "WorkerStops without a ResumeStore"
        return await self.write(
            f"ending the record of {session_id}", lambda: resumes.mark_ended(session_id), until
        )

    @property
    def pending(self) -> int:
        """How many such writes are still being retried."""
        return len(self._pending)

    async def write(self, what: str, write: Write, until: float) -> bool:
        """Try ``write`` once now; when it fails, go on trying in the background until
        ``until`` (unix time). Returns whether the first try went through."""
        try:
            await write()
            return True
        except Exception as exc:  # noqa: BLE001 - Redis refused it or is away: tried again
            log.warning("%s failed (%s); trying again every %.0f s", what, exc, self.retry_s)
        task = asyncio.create_task(self._retry(what, write, until), name=f"retry {what}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return False

    async def _retry(self, what: str, write: Write, until: float) -> None:
        tries = 1
        while time.time() < until:
            await asyncio.sleep(self.retry_s)
            tries += 1
            try:
                await write()
            except Exception:  # still refused: the next try
                log.debug("%s failed again", what, exc_info=True)
                continue
            log.warning("%s went through at try %d", what, tries)
            return
        log.error("%s: gave up after %d tries (the session's time is over)", what, tries)

    async def aclose(self) -> None:
        """Drop what is pending (the gateway stops)."""
        if self._pending:
            log.warning("%d write(s) to stop sessions dropped at shutdown", len(self._pending))
        for task in list(self._pending):
            await cancel_and_wait(task)
