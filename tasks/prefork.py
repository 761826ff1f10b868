"""Celery's prefork pool, with a dead pool process replaced as soon as it can be reaped.

Celery's ``AsynPool`` looks for exited pool processes when a process's sentinel pipe becomes
readable, and otherwise every 5 s. The pipe reads as closed when the dying process's files are
closed, which is before the kernel lets the parent reap it; when that look finds nothing to reap,
the replacement waits for the 5 s timer. On an H100 the gap (a CUDA context's teardown) made
every kill -9 of a pool process wait 1.9-4.6 s for its replacement (``deploy/gpu-check/``); on a
CPU it happens to about one kill in three. This pool looks every ``MAINTAIN_S`` as well, so the
replacement starts loading the backend within that of the reap becoming possible.

It also keeps the id of every process it starts (``started``), for the parent's supervisor
(``tasks/supervisor.py``): a process that registers its slots and dies between two of the
supervisor's looks would otherwise leave them in the pool, where they take clients that no
process serves.

``tasks/celery_app.py`` names this pool in ``worker_pool``: Celery's own CLI then runs it for
``--pool prefork``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from celery.concurrency import asynpool, prefork

MAINTAIN_S = 0.25  # a look is a waitpid(WNOHANG) per pool process


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

    @property
    def timers(self) -> dict[Callable[[], Any], float]:
        timers: dict[Callable[[], Any], float] = dict(super().timers)
        timers[self.maintain_pool] = MAINTAIN_S  # replaces Celery's 5 s entry for the same call
        return timers


class TaskPool(prefork.TaskPool):
    """The prefork pool, built on the ``AsynPool`` above."""

    Pool = AsynPool
