"""Recording every session off the relay path: cheap hooks, one background writer thread.

A connection calls its ``SessionRecording`` hooks: ``client_event`` for each decoded client
event, ``sent`` for each frame it sends, ``admitted`` when it gets a worker slot, ``finish`` once
at the end. Each hook only puts a reference to the (already built, never mutated) dict on a
queue: no copy, no decode, no I/O on the event loop. The ``Recorder`` thread does the rest (base64
decode, WAV and JPEG writes, ``spool.Spool``), then moves the finished recording into the store
and applies retention. docs/ARCHITECTURE.md, "Recordings", has the measured cost.

The queue is bounded: when the writer falls behind (a slow disk or object store), media items
are dropped and counted in the recording's ``meta.json`` (``dropped``); the relay never waits.
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from api.recordings.spool import Spool
from api.recordings.store import RECORDING_ID, RecordingStore
from omnicore.settings import Settings
from streaming.keys import slot_worker

log = logging.getLogger("omniserve.recordings")

ORPHAN_AGE_S = 6 * 3600  # a spool folder untouched this long belongs to a gateway that died


class SessionRecording:
    """The hooks of one connection's recording (a disabled recorder hands out ``OFF``)."""

    __slots__ = ("_put", "dropped", "id")

    def __init__(self, recording_id: str | None, put: Any = None) -> None:
        self.id = recording_id  # None: not recorded
        self._put = put
        self.dropped = 0

    def client_event(self, event: dict[str, Any]) -> None:
        """A decoded client event (before validation: it is recorded as sent)."""
        if self._put is not None and not self._put(self.id, "in", event):
            self.dropped += 1

    def sent(self, frame: dict[str, Any]) -> None:
        """A frame just sent to the client."""
        if self._put is not None and not self._put(self.id, "out", frame):
            self.dropped += 1

    def admitted(self, slot_id: str) -> None:
        """The connection got a worker slot."""
        if self._put is not None:
            self._put(self.id, "admitted", slot_id, control=True)

    def finish(self, **info: Any) -> None:
        """The connection ended: write the recording out (once)."""
        if self._put is not None:
            self._put(self.id, "finish", {**info, "dropped": self.dropped}, control=True)
            self._put = None


OFF = SessionRecording(None)


class Recorder:
    """The gateway's recordings: hands out ``SessionRecording``s and runs the writer thread."""

    def __init__(self, settings: Settings, gateway_id: str) -> None:
        self.enabled = settings.recordings
        self.gateway_id = gateway_id
        self.max_pending = settings.recordings_max_pending
        self.max_age_s = settings.recordings_max_age_s
        self.max_bytes = settings.recordings_max_bytes
        self.prune_interval_s = settings.recordings_prune_interval_s
        self.store = RecordingStore(settings.recordings_url) if self.enabled else None
        spool = settings.recordings_spool_dir or str(
            Path(tempfile.gettempdir()) / "omniserve-recordings"
        )
        self.spool_root = self.store.spool_root(spool) if self.store else Path(spool)
        self._queue: queue.SimpleQueue[tuple[str | None, str, float, Any]] = queue.SimpleQueue()
        self._pending = 0  # media items queued (approximate: read without the lock)
        self._lock = threading.Lock()
        self._spools: dict[str, Spool] = {}
        self._unstored: dict[str, Path] = {}  # finished, but the store refused them (retried)
        self._thread: threading.Thread | None = None
        self._last_prune = 0.0
        self.written = 0
        self.dropped = 0

    @property
    def unstored(self) -> int:
        """Finished recordings waiting for the store to accept them."""
        return len(self._unstored)

    # ------------------------------------------------------------------ event loop side
    def open(self, recording_id: str, mode: str, **info: Any) -> SessionRecording:
        """Start recording a connection (``OFF`` when recordings are disabled)."""
        if not self.enabled or self._thread is None:
            return OFF
        self._put(recording_id, "open", (mode, info), control=True)
        return SessionRecording(recording_id, self._put)

    def _put(self, rid: str | None, op: str, payload: Any, control: bool = False) -> bool:
        if not control:
            if self._pending >= self.max_pending:
                self.dropped += 1
                return False
            with self._lock:
                self._pending += 1
        self._queue.put((rid, op, time.time(), payload))
        return True

    def start(self) -> None:
        """Start the writer thread (a no-op when recordings are off)."""
        if self.enabled and self._thread is None:
            self.spool_root.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._run, name="recordings", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Write out everything queued (finished sessions are committed), then end the thread."""
        if self._thread is None:
            return
        self._queue.put((None, "stop", time.time(), None))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the recordings writer did not finish within %.0f s", timeout)
        self._thread = None

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        self._housekeeping(startup=True)
        while True:
            try:
                rid, op, t, payload = self._queue.get(timeout=self.prune_interval_s)
            except queue.Empty:
                self._housekeeping()
                continue
            if op == "stop":
                for spool_id in list(self._spools):  # sessions that never finished
                    self._finish(spool_id, time.time(), {"complete": False})
                return
            if op in ("in", "out"):
                with self._lock:
                    self._pending -= 1
            try:
                self._handle(rid, op, t, payload)
            except Exception:
                log.exception("recording %s: %s failed; the recording is dropped", rid, op)
                self._discard(rid)
            if time.time() - self._last_prune >= self.prune_interval_s:
                self._housekeeping()

    def _handle(self, rid: str | None, op: str, t: float, payload: Any) -> None:
        if rid is None:
            return
        if op == "open":
            mode, info = payload
            self._spools[rid] = Spool(self.spool_root / rid, rid, mode, t, info)
            return
        spool = self._spools.get(rid)
        if spool is None:
            return  # its recording failed earlier
        if op == "in":
            spool.client_event(t, payload)
        elif op == "out":
            spool.sent(t, payload)
        elif op == "admitted":
            spool.admitted(t, payload, slot_worker(payload))
        elif op == "finish":
            self._finish(rid, t, {"complete": True, **payload})

    def _finish(self, rid: str, t: float, info: dict[str, Any]) -> None:
        spool = self._spools.pop(rid)
        spool.finish(t, {"gateway_id": self.gateway_id, **info})
        self._commit(spool.folder, rid)

    def _commit(self, folder: Path, rid: str) -> None:
        """Move a finished spool into the store; when the store fails (an object store away),
        the spool stays and the next housekeeping pass tries again."""
        assert self.store is not None
        if not folder.is_dir():  # another gateway sharing the spool stored it first
            self._unstored.pop(rid, None)
            return
        try:
            stored = self.store.free_id(rid)
            if stored != rid:
                meta = folder / "meta.json"
                meta.write_bytes(orjson.dumps({**orjson.loads(meta.read_bytes()), "id": stored}))
                log.warning("recording %s exists already; this one is %s", rid, stored)
            self.store.commit(folder, stored)
        except Exception:
            log.warning("recording %s not stored yet; will retry", rid, exc_info=True)
            self._unstored[rid] = folder
            return
        self._unstored.pop(rid, None)
        self.written += 1
        log.info("recording %s written", rid)

    def _discard(self, rid: str | None) -> None:
        spool = self._spools.pop(rid, None) if rid else None
        if spool is not None:
            shutil.rmtree(spool.folder, ignore_errors=True)

    def _housekeeping(self, startup: bool = False) -> None:
        """Retention (age, total size); at startup also remove spools a dead gateway left."""
        self._last_prune = time.time()
        assert self.store is not None
        try:
            if startup:
                self._adopt_orphans()
            for rid, folder in list(self._unstored.items()):
                self._commit(folder, rid)
            pruned = self.store.prune(self.max_age_s, self.max_bytes)
            if pruned.by_age or pruned.by_size:
                log.info(
                    "recordings pruned: %d by age, %d by size",
                    len(pruned.by_age),
                    len(pruned.by_size),
                )
        except Exception:
            log.exception("pruning the recordings failed")

    def _adopt_orphans(self) -> None:
        """Spool folders nobody writes: a finished one (``meta.json``, its commit failed or the
        gateway died right before it) is stored; one untouched for ``ORPHAN_AGE_S`` is a session
        whose gateway died mid-way, and is removed."""
        now = time.time()
        for folder in self.spool_root.iterdir():
            if not folder.is_dir() or folder.name in self._spools:
                continue
            if (folder / "meta.json").is_file() and RECORDING_ID.match(folder.name):
                self._unstored[folder.name] = folder
                continue
            times = [p.stat().st_mtime for p in folder.iterdir()] or [folder.stat().st_mtime]
            if now - max(times) > ORPHAN_AGE_S:
                log.warning("removing the unfinished recording %s (its gateway died)", folder.name)
                shutil.rmtree(folder, ignore_errors=True)
