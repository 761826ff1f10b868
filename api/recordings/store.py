"""Finished recordings: one folder per recording in a local directory or any fsspec URL.

A recording is ``<root>/<id>/`` holding ``meta.json`` (written last, so a folder without it is
incomplete) and its media files. Ids and file names are checked against strict patterns before
any path is built from them, so no request can name anything outside the store.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import orjson
from fsspec.implementations.local import LocalFileSystem

from omnicore.redact import redact_url
from omnicore.settings import InvalidSettings, variable

log = logging.getLogger("omniserve.recordings")

RECORDING_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.[a-z0-9]{1,8}$")
META = "meta.json"
INCOMING = ".incoming"  # spool folders of a local store (hidden from listings)


SUMMARY_FIELDS = (
    "id",
    "mode",
    "endpoint",
    "started_at",
    "ended_at",
    "durations",
    "close_reason",
    "workers",
    "bytes",
    "complete",
)


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """What listings show of a recording (and retention needs: ``ended_at``, ``bytes``)."""
    return {k: meta.get(k) for k in SUMMARY_FIELDS}


class BadName(ValueError):
    """An id or file name that does not match its pattern (it could escape the store)."""


def check_id(recording_id: str) -> str:
    """The id, or BadName when it is not ``[A-Za-z0-9][A-Za-z0-9_-]*`` (no dots, no slashes)."""
    if not RECORDING_ID.match(recording_id):
        raise BadName(f"{recording_id!r} is not a recording id")
    return recording_id


def check_file_name(name: str) -> str:
    """A file name inside a recording (``input.wav``, ``frame_000001.jpg``), else BadName."""
    if not FILE_NAME.match(name):
        raise BadName(f"{name!r} is not a recording file name")
    return name


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one retention pass removed."""

    by_age: list[str]
    by_size: list[str]


class RecordingStore:
    """Recordings under one fsspec URL (a plain path is a local directory)."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:  # s3:// without s3fs, an unknown protocol
            raise InvalidSettings(f"{variable('recordings_url')} {redact_url(url)}: {exc}") from exc
        self.root = root.rstrip("/") or "/"
        self.local = isinstance(self.fs, LocalFileSystem)
        self._summaries: dict[str, dict[str, Any]] = {}  # id -> summary (see metas)
        self._lock = threading.Lock()  # the writer thread and request threads share the cache

    def _path(self, recording_id: str, name: str | None = None) -> str:
        base = f"{self.root}/{check_id(recording_id)}"
        return base if name is None else f"{base}/{check_file_name(name)}"

    # ------------------------------------------------------------------ writing
    def spool_root(self, fallback: str) -> Path:
        """Where recordings are written while their sessions run: inside a local store (so the
        commit is a rename), else ``fallback`` (a local directory; the commit uploads)."""
        return Path(self.root) / INCOMING if self.local else Path(fallback)

    def free_id(self, recording_id: str) -> str:
        """``recording_id``, or ``<id>-2``, ``-3`` ... when a finished recording of that id is
        stored already (a session id used by a second connection): nothing is overwritten. A
        folder without ``meta.json`` (an upload that failed half-way) does not count."""
        candidate, n = check_id(recording_id), 1
        while self.fs.exists(self._path(candidate, META)):
            n += 1
            candidate = check_id(f"{recording_id}-{n}")
        return candidate

    def commit(self, spool: Path, recording_id: str) -> None:
        """Move a finished spool folder into the store (``meta.json`` last), then delete it."""
        check_id(recording_id)
        files = sorted((p for p in spool.iterdir() if p.is_file()), key=lambda p: p.name == META)
        if self.local:
            target = Path(self._path(recording_id))
            if target.is_dir() and not (target / META).exists():
                shutil.rmtree(target)  # not a finished recording (see free_id)
            os.replace(spool, target)
            return
        dest = self._path(recording_id)
        self.fs.makedirs(dest, exist_ok=True)
        for f in files:
            self.fs.put_file(str(f), f"{dest}/{check_file_name(f.name)}")
        shutil.rmtree(spool, ignore_errors=True)

    # ------------------------------------------------------------------ reading
    def ids(self) -> list[str]:
        """Every recording folder's id (incomplete ones included): one listing of the root."""
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" and RECORDING_ID.match(name):
                out.append(name)
        return out

    def meta(self, recording_id: str) -> dict[str, Any] | None:
        """The metadata of a finished recording, or None when there is none."""
        try:
            data = self.fs.cat_file(self._path(recording_id, META))
        except FileNotFoundError:
            return None
        value = orjson.loads(data)
        return value if isinstance(value, dict) else None

    def metas(self) -> list[dict[str, Any]]:
        """The summary (``SUMMARY_FIELDS``) of every finished recording, newest first.

        Metadata never changes once written, so each ``meta.json`` is read once per process:
        a call costs one listing of the store plus the recordings new since the last call (the
        listing API and every retention pass call it; a store holds many thousands).
        """
        ids = set(self.ids())
        with self._lock:
            for gone in set(self._summaries) - ids:
                del self._summaries[gone]
            new = [i for i in ids if i not in self._summaries]
        if new:
            found = self.fs.cat([self._path(i, META) for i in new], on_error="omit")
            parsed = {}
            for path, data in found.items():
                try:
                    value = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(value, dict):
                    parsed[str(path).rstrip("/").rsplit("/", 2)[-2]] = summary(value)
            with self._lock:
                self._summaries.update(parsed)
        with self._lock:
            out = list(self._summaries.values())
        out.sort(key=lambda m: float(m.get("started_at") or 0), reverse=True)
        return out

    def read(self, recording_id: str, name: str) -> bytes:
        """One file of a recording (FileNotFoundError when there is no such file)."""
        data: bytes = self.fs.cat_file(self._path(recording_id, name))
        return data

    def file_names(self, recording_id: str) -> list[str]:
        """The files a recording folder holds."""
        try:
            entries = self.fs.ls(self._path(recording_id), detail=False)
        except FileNotFoundError:
            return []
        names = (str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return sorted(n for n in names if FILE_NAME.match(n))

    def write_zip(self, recording_id: str, out: BinaryIO) -> None:
        """Every file of a recording into a zip archive under the folder ``<id>/``."""
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name in self.file_names(recording_id):
                info = zipfile.ZipInfo(f"{recording_id}/{name}", time.localtime()[:6])
                # JPEG does not shrink further; WAV and JSON do
                jpeg = name.endswith(".jpg")
                info.compress_type = zipfile.ZIP_STORED if jpeg else zipfile.ZIP_DEFLATED
                with (
                    self.fs.open(self._path(recording_id, name), "rb") as src,
                    zf.open(info, "w") as dst,
                ):
                    shutil.copyfileobj(src, dst, 1 << 20)

    def zip_bytes(self, recording_id: str) -> bytes:
        """The zip archive of a recording in memory (for the CLI and small recordings)."""
        buf = io.BytesIO()
        self.write_zip(recording_id, buf)
        return buf.getvalue()

    # ------------------------------------------------------------------ removing
    def remove(self, recording_id: str) -> bool:
        """Delete a recording; False when there was none."""
        path = self._path(recording_id)
        if not self.fs.exists(path):
            return False
        self.fs.rm(path, recursive=True)
        with self._lock:
            self._summaries.pop(recording_id, None)
        return True

    def prune(self, max_age_s: float, max_bytes: int, now: float | None = None) -> Pruned:
        """Retention: delete recordings that ended more than ``max_age_s`` ago, then the oldest
        until the rest hold at most ``max_bytes`` (0 turns either rule off).

        Only finished recordings (with ``meta.json``) count; a folder another gateway is
        committing right now has no metadata yet and is left alone.
        """
        now = time.time() if now is None else now
        metas = sorted(self.metas(), key=lambda m: float(m.get("ended_at") or 0))
        by_age: list[str] = []
        kept: list[dict[str, Any]] = []
        for m in metas:
            if max_age_s > 0 and now - float(m.get("ended_at") or 0) > max_age_s:
                by_age.append(str(m["id"]))
            else:
                kept.append(m)
        by_size: list[str] = []
        if max_bytes > 0:
            total = sum(int(m.get("bytes") or 0) for m in kept)
            for m in kept:  # oldest first
                if total <= max_bytes:
                    break
                by_size.append(str(m["id"]))
                total -= int(m.get("bytes") or 0)
        for rid in (*by_age, *by_size):
            try:
                self.remove(rid)
            except (FileNotFoundError, BadName):
                pass  # another gateway pruned it first
        return Pruned(by_age, by_size)
