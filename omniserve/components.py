"""The processes ``omniserve up`` runs, each started again with a growing delay when it exits.

Why: ``up`` is the whole service on one machine. Were it to stop everything as soon as one part
exits on its own, an ordinary fault (the OOM killer taking the gateway, a worker whose
replacement pool process cannot load its model again, the embedded Redis killed) would take the
service down until a person starts it again. So a part that exits after the service was ready
is started again, as a process manager would (Kubernetes, compose's ``restart: unless-stopped``):
after ``restart_delay_s``, doubled for each restart in a row up to ``MAX_DELAY_S``. The rest keeps
running meanwhile; gateways and workers reconnect to a Redis that restarted empty by themselves.

A part that keeps failing is a configuration to fix, not a fault to hide: once it has exited
``restart_limit`` times in a row, each time within ``STABLE_S`` of its start, ``up`` stops the
rest and exits 1, as it does for any part that exits before the service is ready. A part that
ran ``STABLE_S`` or longer starts its count again.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MAX_DELAY_S = 30.0  # the longest wait before a start
STABLE_S = 60.0  # a part that ran this long was healthy: its next exit is the first in a row


@dataclass
class Component:
    """One part of the stack: how to start it, its current process, its restarts in a row."""

    name: str
    start: Callable[[], subprocess.Popen[bytes]]
    process: subprocess.Popen[bytes]
    started_at: float
    in_a_row: int = 0  # restarts since it last ran STABLE_S
    due_at: float | None = None  # when it is to be started again (None: running)
    log: Path | None = None  # where its output goes (None: the console)

    def see(self) -> str:
        """Where to read what it said."""
        return f"see {self.log}" if self.log is not None else "see its output above"

    def exit_line(self) -> str:
        """That it exited, how, and where to read why."""
        return f"the {self.name} exited (code {self.process.returncode}); {self.see()}"


@dataclass
class Components:
    """The parts ``up`` started, in start order, and the restart policy that keeps them up."""

    restart_limit: int  # restarts in a row allowed per part (0: none, any exit stops ``up``)
    restart_delay_s: float  # the wait before the first restart in a row
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = print
    parts: list[Component] = field(default_factory=list)
    given_up: Component | None = None  # the part over its restarts in a row, once ``tend`` says

    def add(
        self,
        name: str,
        start: Callable[[], subprocess.Popen[bytes]],
        running: subprocess.Popen[bytes] | None = None,
        log: Path | None = None,
    ) -> Component:
        """Keep a part: ``running``, its process started already, else started now."""
        part = Component(name, start, running or start(), self.clock(), log=log)
        self.parts.append(part)
        return part

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Each part's current process, in start order."""
        return [part.process for part in self.parts]

    def first_exited(self) -> Component | None:
        """The first part whose process has exited (None: all run)."""
        return next((part for part in self.parts if part.process.poll() is not None), None)

    def exited(self) -> str | None:
        """Which part has exited, and how (None: all run): before ``ready`` any exit ends ``up``."""
        part = self.first_exited()
        return None if part is None else part.exit_line()

    def delay(self, in_a_row: int) -> float:
        """The wait before the ``in_a_row``-th restart in a row (1, 2, ...)."""
        return float(min(MAX_DELAY_S, self.restart_delay_s * 2 ** (in_a_row - 1)))

    def tend(self) -> str | None:
        """Schedule a restart for each part that exited and start those that are due.

        Returns why ``up`` must stop instead (a part over its restarts in a row), else None.
        """
        now = self.clock()
        for part in self.parts:
            if part.due_at is None:
                code = part.process.poll()
                if code is None:
                    continue
                if now - part.started_at >= STABLE_S:
                    part.in_a_row = 0
                if part.in_a_row >= self.restart_limit:
                    self.given_up = part
                    if self.restart_limit == 0:
                        return f"the {part.name} exited (code {code}); {part.see()}"
                    return (
                        f"the {part.name} exited (code {code}), after {part.in_a_row}"
                        f" restart(s) in a row that each ended within {STABLE_S:.0f} s;"
                        f" {part.see()}"
                    )
                part.in_a_row += 1
                wait = self.delay(part.in_a_row)
                part.due_at = now + wait
                where = f"; {part.see()}" if part.log is not None else ""
                self.say(
                    f"the {part.name} exited (code {code}); starting it again in"
                    f" {wait:g} s (restart {part.in_a_row} of {self.restart_limit} in a row){where}"
                )
            if part.due_at is not None and now >= part.due_at:
                part.due_at = None
                try:
                    part.process = part.start()
                except (OSError, RuntimeError) as exc:  # counted as an exit (the old process stays)
                    self.say(f"the {part.name} could not be started again: {exc}")
                else:
                    self.say(f"restarted the {part.name} (pid {part.process.pid})")
                part.started_at = self.clock()
        return None
