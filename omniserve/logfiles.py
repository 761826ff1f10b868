"""The log file of each part of ``omniserve up``, and what of them reaches the console.

Why: in one terminal the parts' own output (the gateway's access log of ``up``'s readiness
polls, Celery's banner, Flower's periodic warnings) buried the banner and the one line that
mattered. Each part writes its stdout and stderr to its own file in ``up_log_dir``, and ``up``
follows those files; its console shows only its own lines and the problems. The rule:

- a log record at WARNING or above reaches the console, with the lines that belong to it (a
  traceback): the gateway's and the workers' records (Celery's and uvicorn's among them, in
  either ``log_format``), Celery's own ``[...: ERROR/...]`` lines and Flower's ``[W ...]``;
- so does a traceback that no record introduced (a process that crashed);
- except ``NOISE``, warnings known to say nothing is wrong;
- everything else stays in the files: INFO records (the access log among them), Celery's
  banner, what Python's ``warnings`` module prints (a library's advice, such as Celery's
  superuser warning), the embedded Redis's log.

A part that exits before ``up`` is ready ends ``up``, which then shows the last lines of that
part's file (``tail``) and its path.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

SHOWN = logging.WARNING  # records at this level or above reach the console
TAIL_LINES = 20  # shown from the log of a part that failed
FOLLOW_EVERY_S = 0.2

NOISE = (
    # Flower asks the workers for their state by broadcast and warns when one has not answered
    # within a second (a worker still starting, or busy loading its model); it asks again
    re.compile(r"Inspect method \w+ failed"),
)

_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
_LETTERS = {"D": 10, "I": 20, "W": 30, "E": 40, "C": 50}
# omnicore.logs.FORMAT: "<date> <time>,<ms> <pid> <logger> <LEVEL> <message>"
_TEXT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \d+ \S+ ([A-Z]+) ")
# Celery's own format, which its pool's messages keep: "[<date> <time>,<ms>: <LEVEL>/<process>]"
_CELERY = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}: ([A-Z]+)/")
# Flower (tornado): "[<letter> <yymmdd> <time> <module>:<line>]"
_TORNADO = re.compile(r"\[([DIWEC]) \d{6} \d\d:\d\d:\d\d \S+\] ")
# Python's warnings module: "<file>:<line>: <Category>: <message>"
_WARNINGS = re.compile(r"\S+:\d+: [A-Za-z]*Warning: ")


def level_of(line: str) -> int | None:
    """The level of the record ``line`` starts (logging's numbers), None when it continues the
    record before it (a traceback, a banner, a wrapped message)."""
    for pattern, names in ((_TEXT, _LEVELS), (_CELERY, _LEVELS), (_TORNADO, _LETTERS)):
        found = pattern.match(line)
        if found and found.group(1) in names:
            return names[found.group(1)]
    if line.startswith('{"ts":'):  # log_format json
        try:
            level = orjson.loads(line).get("level", "")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return _LEVELS.get(str(level).upper())
    if line.startswith("Traceback (most recent call last):"):
        return logging.ERROR
    if _WARNINGS.match(line):
        return logging.INFO  # advice, kept in the file
    return None


def is_noise(line: str) -> bool:
    return any(pattern.search(line) for pattern in NOISE)


def fresh_log(path: Path) -> Path:
    """``path``, emptied: each run of ``up`` starts its logs afresh (a part started again
    during the run adds to its log)."""
    path.write_bytes(b"")
    return path


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``path`` (none when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


@dataclass
class Followed:
    """One part's log file as far as it was read."""

    name: str
    path: Path
    offset: int = 0
    partial: bytes = b""  # a line not yet ended
    showing: bool = False  # the record being read reaches the console


class Console:
    """Follows the parts' log files from a thread and hands each problem line to ``say``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.files: list[Followed] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def follow(self, name: str, path: Path) -> None:
        """Read ``path`` (written by the part ``name``) from its current end."""
        try:
            offset = path.stat().st_size
        except OSError:
            offset = 0
        with self.lock:
            self.files.append(Followed(name, path, offset))

    def poll(self) -> None:
        """Read what each file gained since the last poll; say its problem lines."""
        with self.lock:
            for followed in self.files:
                self._read(followed)

    def _read(self, followed: Followed) -> None:
        try:
            with followed.path.open("rb") as fh:
                fh.seek(followed.offset)
                data = fh.read()
        except OSError:
            return
        followed.offset += len(data)
        *lines, followed.partial = (followed.partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            level = level_of(line)
            if level is not None:
                followed.showing = level >= SHOWN and not is_noise(line)
            if followed.showing and line.strip():
                self.say(f"{followed.name} | {line}")

    def start(self) -> None:
        """Follow the files until ``stop``."""

        def run() -> None:
            while not self.stopped.wait(FOLLOW_EVERY_S):
                self.poll()

        self.thread = threading.Thread(target=run, name="omniserve-up-logs", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop following, after a last read (what the parts wrote as they stopped)."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.poll()
