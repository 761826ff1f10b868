"""Celery's prefork pool, with a dead pool process replaced as soon as it can be reaped.

Celery's ``AsynPool`` looks for exited pool processes when a process's sentinel pipe becomes
readable, and otherwise every 5 s. The pipe reads as closed when the dying process's files are
closed, which is before the kernel lets the parent reap it; when that look finds nothing to reap,
the replacement waits for the 5 s timer. On an H100 the gap (a CUDA context's teardown) made
every kill -9 of a pool process wait 1.9-4.6 s for its replacement (``deploy/gpu-check/``); on a
CPU it happens to about one kill in three. This pool looks every ``MAINTAIN_S`` as well, so the
replacement starts loading the backend within that of the reap becoming possible.

Celery looks at the pool once more as its consumer starts (``did_start_ok``) and ends the whole
worker ("Could not start worker processes") if any pool process has exited by then. A model takes
long to load, so a process killed while it loads (the OOM killer, an operator's kill -9) could
fall in that window and take the worker with it, where the same kill a moment later is replaced.
Here a process ended by a signal is replaced whenever it dies; one that exited by itself with an
error means the pool cannot start, unless it is a failed load (below).

A pool process whose backend failed to load (``EXIT_LOAD_FAILED``) stops the worker with that
exit status, whenever it happens: Celery would replace it with one that fails the same way, a
fork and a load after another (nine a second when the failure is quick), while clients queued for
the capacity that each one registered as loading. The worker's process manager (or ``omniserve
up``) sees the exit instead.

It also keeps the id of every process it starts (``started``), for the parent's supervisor
(``tasks/supervisor.py``): a process that registers its slots and dies between two of the
supervisor's looks would otherwise leave them in the pool, where they take clients that no
process serves.

``tasks/celery_app.py`` names this pool in ``worker_pool``: Celery's own CLI then runs it for
``--pool prefork``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from celery.concurrency import asynpool, prefork
from celery.worker import state as worker_state

log = logging.getLogger("omniserve.worker")

MAINTAIN_S = 0.25  # a look is a waitpid(WNOHANG) per pool process
EXIT_LOAD_FAILED = 3  # exit status of a pool process whose backend failed to load


class AsynPool(asynpool.AsynPool):
    """``AsynPool`` whose regular look for exited pool processes runs every ``MAINTAIN_S``, and
    which records the process ids it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before the base class starts the first processes; the supervisor thread pops them
        self.started: deque[int] = deque(maxlen=4096)
        super().__init__(*args, **kwargs)

    def _create_worker_process(self, i: int) -> Any:
        process = super()._create_worker_process(i)  # type: ignore[misc]  # billiard
        self.started.append(process.pid)
        return process

    def did_start_ok(self) -> bool:
        """Whether the pool started: no process exited by itself with an error (a signal's exit
        code is negative). The exited are reaped here; ``maintain_pool`` replaces them. A failed
        load is no failed start: the worker stops on it with its own status (below), where
        Celery's "Could not start worker processes" would end it with 1."""
        exitcodes = self._join_exited_workers()
        return not any(c is not None and c > 0 and c != EXIT_LOAD_FAILED for c in exitcodes)

    def _join_exited_workers(self, shutdown: bool = False) -> list[int | None]:
        """billiard's reaping of exited processes; one whose backend failed to load stops the
        worker (Celery's loop reads ``should_stop`` on its next turn)."""
        exitcodes: list[int | None] = super()._join_exited_workers(shutdown)  # type: ignore[misc]
        if EXIT_LOAD_FAILED in exitcodes and not shutdown and not _stopping_for_load():
            log.critical(
                "the backend failed to load in a pool process (see its error above): the worker "
                "stops with exit status %d instead of loading it again",
                EXIT_LOAD_FAILED,
            )
            worker_state.should_stop = EXIT_LOAD_FAILED  # type: ignore[assignment]  # stubs: None
        return exitcodes

    def _repopulate_pool(self, exitcodes: list[int | None]) -> None:
        if _stopping_for_load():  # a new process would only fail the same way
            return
        super()._repopulate_pool(exitcodes)  # type: ignore[misc]

    @property
    def timers(self) -> dict[Callable[[], Any], float]:
        timers: dict[Callable[[], Any], float] = dict(super().timers)
        timers[self.maintain_pool] = MAINTAIN_S  # replaces Celery's 5 s entry for the same call
        return timers


def _stopping_for_load() -> bool:
    return bool(worker_state.should_stop == EXIT_LOAD_FAILED)


class TaskPool(prefork.TaskPool):
    """The prefork pool, built on the ``AsynPool`` above."""

    Pool = AsynPool
