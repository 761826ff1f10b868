"""One recording being written, in the writer thread: client events and sent frames -> files.

Files of a recording (docs/ARCHITECTURE.md, "Recordings"):

- ``input.wav``: every audio chunk the client sent, 16 kHz 16-bit mono, back to back;
- ``output.wav``: every piece of speech the client was sent, 24 kHz 16-bit mono, back to back;
- ``frame_000001.jpg`` ...: video frames (and chat images) in the order they came;
- ``timeline.jsonl``: one line per event in either direction, ``t`` seconds after the connect,
  media replaced by where it went (``input.wav`` at sample N, ``frame_000003.jpg``);
- ``transcript.txt``: the text of each side, one line per turn or response (the user's speech:
  the words the backend heard, ``metrics.transcript`` of the reply to it; none when it reports
  none, nor in the older dialect, whose frames carry no metrics);
- ``meta.json``: mode, worker(s), durations, close reason, counts, file list (written last).

Everything here is decoded from what went over the socket, so a recording shows what the client
sent and heard, whatever the dialect.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import soundfile

from api.protocol.events import (
    ClientEvent,
    ContentType,
    DeltaKind,
    LegacyChatEvent,
    OfficialEvent,
    ServerEvent,
)
from omnicore.audio import INPUT_RATE, OUTPUT_RATE, AudioFormatError, b64_decode, resample

log = logging.getLogger("omniserve.recordings")

FORMAT_VERSION = 1
TIMELINE_FLUSH = 256  # lines kept before they are appended to timeline.jsonl
LONG_STRING = 200  # longer strings in a timeline line are replaced by their length
AUDIO_KEYS = ("audio", "audio_data")


class WavAppender:
    """A 16-bit mono WAV file that grows chunk by chunk (written by soundfile).

    Samples are buffered up to ``FLUSH_BYTES`` (about 2 s of input, 1.3 s of output): opening
    the file for every chunk was most of the writer's time, and keeping every session's files
    open would cost two descriptors per session. Each flush appends in soundfile's read-write
    mode, which also updates the header, so the file on disk is a valid WAV between flushes.
    """

    FLUSH_BYTES = 64 * 1024

    def __init__(self, path: Path, rate: int) -> None:
        self.path = path
        self.rate = rate
        self.samples = 0
        self._buf: list[np.ndarray] = []
        self._buffered = 0  # bytes in _buf
        with soundfile.SoundFile(
            path, "w", samplerate=rate, channels=1, format="WAV", subtype="PCM_16"
        ):
            pass  # the header of an empty file

    def append(self, pcm: np.ndarray) -> int:
        """Append float32 samples; returns the offset (in samples) they start at."""
        at = self.samples
        if pcm.size:
            # clipped and truncated here rather than by libsndfile, which does not clip
            self._buf.append((np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2"))
            self._buffered += int(pcm.size) * 2
            self.samples += int(pcm.size)
            if self._buffered >= self.FLUSH_BYTES:
                self.flush()
        return at

    def flush(self) -> None:
        if self._buf:
            with soundfile.SoundFile(self.path, "r+") as fh:
                fh.seek(0, soundfile.SEEK_END)
                fh.write(np.concatenate(self._buf))
            self._buf.clear()
            self._buffered = 0

    def close(self) -> None:
        self.flush()


def _pcm(b64: str) -> np.ndarray:
    raw = b64_decode(b64)
    if len(raw) % 4:
        raise AudioFormatError("float32 PCM byte length is not a multiple of 4")
    return np.frombuffer(raw, dtype="<f4")


def _image_suffix(b64: str) -> str:
    """The file suffix of an image chat attachment (the protocol allows any Pillow format)."""
    head = b64_decode(b64[:16])
    if head.startswith(b"\xff\xd8"):
        return "jpg"
    return "png" if head.startswith(b"\x89PNG") else "img"


def _summary(value: Any, depth: int = 0) -> Any:
    """A timeline copy of an event: long strings (media) become ``<N chars>``."""
    if isinstance(value, str):
        return value if len(value) <= LONG_STRING else f"<{len(value)} chars>"
    if isinstance(value, dict) and depth < 6:
        return {k: _summary(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list) and depth < 6:
        return [_summary(v, depth + 1) for v in value[:64]]
    return value


class Spool:
    """The files of one recording while its session runs (used by one thread only)."""

    def __init__(
        self, folder: Path, recording_id: str, mode: str, started_at: float, info: dict[str, Any]
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.id = recording_id
        self.mode = mode
        self.started_at = started_at
        self.info = info  # what the connection said of itself at the start (endpoint, ...)
        self.input = WavAppender(folder / "input.wav", INPUT_RATE)
        self.output = WavAppender(folder / "output.wav", OUTPUT_RATE)
        self.frames = 0
        self.timeline: list[bytes] = []
        self.transcript: list[tuple[float, str, str]] = []  # (t, who, text)
        self._reply: dict[str, Any] = {}  # key -> [t, text] of the response being spoken
        self._heard: set[str] = set()  # the inputs whose words are in the transcript
        self.workers: list[str] = []
        self.slots: list[str] = []
        self.admitted_at: float | None = None
        self.close_reason: str | None = None
        self.errors: list[str] = []
        self.counts = {"events_in": 0, "frames_out": 0, "unrecorded": 0}
        self.last_ending: str | None = None  # legacy: "done", or the error that ended the turn
        self.line(started_at, "gw", {"type": "recording.start", **info})

    # ------------------------------------------------------------------ entries
    def line(self, t: float, direction: str, body: dict[str, Any]) -> None:
        at = round(t - self.started_at, 3)
        self.timeline.append(orjson.dumps({"t": at, "dir": direction, **body}))
        if len(self.timeline) >= TIMELINE_FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.timeline:
            with (self.folder / "timeline.jsonl").open("ab") as fh:
                fh.write(b"\n".join(self.timeline) + b"\n")
            self.timeline.clear()

    def _frame_file(self, b64: str, suffix: str = "jpg") -> str:
        data = b64_decode(b64)
        if suffix == "jpg" and not data.startswith(b"\xff\xd8"):
            raise ValueError("a video frame that is not a JPEG image")
        self.frames += 1
        name = f"frame_{self.frames:06d}.{suffix}"
        (self.folder / name).write_bytes(data)
        return name

    def _frame_or_none(self, b64: object) -> str | None:
        """A video frame's file name; None (counted as unrecorded) for one that is no JPEG."""
        try:
            if isinstance(b64, str):
                return self._frame_file(b64)
        except (AudioFormatError, ValueError):
            pass
        self.counts["unrecorded"] += 1
        return None

    # ------------------------------------------------------------------ client -> gateway
    def client_event(self, t: float, event: dict[str, Any]) -> None:
        """One decoded client event (recorded as sent, valid or not)."""
        self.counts["events_in"] += 1
        extra: dict[str, Any] = {}
        try:
            extra = self._client_media(t, event)
        except (AudioFormatError, ValueError, TypeError, KeyError) as exc:
            self.counts["unrecorded"] += 1
            extra = {"unrecorded": str(exc)[:200]}
        self.line(t, "in", {**_summary(event), **extra})

    def _client_media(self, t: float, event: dict[str, Any]) -> dict[str, Any]:
        kind = event.get("type")
        body = event.get("input") if kind == ClientEvent.INPUT_APPEND else event
        if not isinstance(body, dict):
            return {}
        audio = body.get("audio", body.get("audio_base64"))  # (the official /ws/duplex's name)
        if isinstance(audio, str):  # duplex, every dialect
            out: dict[str, Any] = {"input_wav": self._input_audio(_pcm(audio))}
            frames = body.get("video_frames", body.get("frame_base64_list")) or []
            if isinstance(frames, list):
                out["frames"] = [self._frame_or_none(f) for f in frames]
            return out
        if isinstance(body.get("messages"), list):  # chat mode or /ws/chat
            return self._chat_request(t, body["messages"])
        return {}

    def _input_audio(self, pcm: np.ndarray) -> dict[str, int]:
        return {"at": self.input.append(pcm), "samples": int(pcm.size)}

    def _chat_request(self, t: float, messages: list[Any]) -> dict[str, Any]:
        """The last user message's text, audio and images (earlier ones are history)."""
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            return {}
        content = users[-1].get("content")
        text_only = [{"type": ContentType.TEXT, "text": content}]
        items = text_only if isinstance(content, str) else content
        texts: list[str] = []
        media: list[dict[str, Any]] = []
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == ContentType.TEXT and isinstance(item.get("text"), str):
                texts.append(item["text"])
            elif item.get("type") == ContentType.AUDIO and isinstance(item.get("data"), str):
                pcm = _pcm(item["data"])
                rate = int(item.get("sample_rate") or INPUT_RATE)
                media.append({"input_wav": self._input_audio(resample(pcm, rate, INPUT_RATE))})
            elif item.get("type") == ContentType.IMAGE and isinstance(item.get("data"), str):
                media.append({"frame": self._frame_file(item["data"], _image_suffix(item["data"]))})
        if texts:
            self.transcript.append((t, "user", " ".join(texts)))
        return {"media": media} if media else {}

    # ------------------------------------------------------------------ gateway -> client
    def sent(self, t: float, frame: dict[str, Any]) -> None:
        """One frame the client was sent."""
        self.counts["frames_out"] += 1
        extra: dict[str, Any] = {}
        try:
            extra = self._sent_media(t, frame)
        except (AudioFormatError, ValueError, TypeError) as exc:
            self.counts["unrecorded"] += 1
            extra = {"unrecorded": str(exc)[:200]}
        self.line(t, "out", {**_summary(frame), **extra})

    def _sent_media(self, t: float, frame: dict[str, Any]) -> dict[str, Any]:
        kind = frame.get("type")
        out: dict[str, Any] = {}
        for key in AUDIO_KEYS:
            value = frame.get(key)
            if isinstance(value, str) and value:
                pcm = _pcm(value)
                out["output_wav"] = {"at": self.output.append(pcm), "samples": int(pcm.size)}
        if kind in (ServerEvent.RESPONSE_OUTPUT_DELTA, ServerEvent.RESPONSE_DONE):
            self._heard_words(t, frame)
        if kind == ServerEvent.SESSION_CLOSED:
            self.close_reason = str(frame.get("reason"))
        elif kind == ServerEvent.ERROR:  # (every dialect's error is "error")
            err = frame.get("error")
            if isinstance(err, dict):  # /v1/realtime: the session may go on
                self.errors.append(str(err.get("code")))
            else:  # /ws/chat: a message string, and the connection ends
                self.errors.append(str(err))
                self.last_ending = f"error: {err}"
        elif kind == LegacyChatEvent.DONE:  # /ws/chat: the answer (its text is whole)
            self.last_ending = "done"
            self._say(t, "legacy", str(frame.get("text") or ""), whole=True)
        elif kind == ServerEvent.RESPONSE_DONE:
            self._say(t, str(frame.get("response_id")), str(frame.get("text") or ""), whole=True)
        elif kind == LegacyChatEvent.CHUNK:
            self._say(t, "legacy", str(frame.get("text_delta") or ""))
        elif kind == ServerEvent.RESPONSE_OUTPUT_DELTA and frame.get("kind") == DeltaKind.TEXT:
            self._say(t, str(frame.get("response_id")), str(frame.get("text") or ""))
        elif kind == OfficialEvent.RESULT and not frame.get("is_listen"):  # the official /ws/duplex
            self._say(t, "official", str(frame.get("text") or ""))
            if frame.get("end_of_turn"):
                self._end_reply("official")
        elif kind == OfficialEvent.RESULT:  # listening: a reply cut short ends there
            self._end_reply("official")
        elif kind == ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA:  # older dialect: a response ends
            # at its turn
            self._say(t, "older", str(frame.get("text") or ""))
            if frame.get("end_of_turn"):
                self._end_reply("older")
        return out

    def _heard_words(self, t: float, frame: dict[str, Any]) -> None:
        """The user's words that a reply carries (``metrics.transcript``: the utterance it
        answers, or a chat voice message): a user line once per input, where its reply begins
        (before the reply's own line)."""
        metrics = frame.get("metrics")
        words = metrics.get("transcript") if isinstance(metrics, dict) else None
        if not isinstance(words, str) or not words.strip():
            return
        key = str(frame.get("input_id") or frame.get("response_id"))
        if key in self._heard:  # (a step's text and audio deltas carry the same metrics)
            return
        self._heard.add(key)
        begun = self._reply.get(str(frame.get("response_id")))
        self.transcript.append((begun[0] if begun else t, "user", words))

    def _say(self, t: float, key: str, text: str, whole: bool = False) -> None:
        reply = self._reply.setdefault(key, [t, ""])
        reply[1] = text if whole else reply[1] + text
        if whole:
            self._end_reply(key)

    def _end_reply(self, key: str) -> None:
        reply = self._reply.pop(key, None)
        if reply and reply[1]:
            self.transcript.append((reply[0], "assistant", reply[1]))

    def admitted(self, t: float, slot_id: str, worker_id: str) -> None:
        """A worker slot was assigned (once per duplex session, once per chat turn)."""
        if self.admitted_at is None:
            self.admitted_at = t
        if worker_id not in self.workers:
            self.workers.append(worker_id)
        self.slots.append(slot_id)
        self.line(t, "gw", {"type": "admitted", "slot_id": slot_id, "worker_id": worker_id})

    # ------------------------------------------------------------------ the end
    def finish(self, t: float, info: dict[str, Any]) -> None:
        """Close the files and write ``transcript.txt`` and ``meta.json`` (last)."""
        for key in list(self._reply):
            self._end_reply(key)
        self.line(t, "gw", {"type": "recording.end"})
        self.flush()
        self.input.close()
        self.output.close()
        self.transcript.sort(key=lambda e: e[0])
        text = "".join(
            f"[{e[0] - self.started_at:8.2f}] {e[1]}: {e[2].strip()}\n" for e in self.transcript
        )
        (self.folder / "transcript.txt").write_text(text, encoding="utf-8")
        files = sorted(p for p in self.folder.iterdir() if p.is_file())
        sizes = {p.name: p.stat().st_size for p in files}
        meta = {
            "format": FORMAT_VERSION,
            "id": self.id,
            "mode": self.mode,
            **self.info,
            **info,
            "workers": self.workers,
            "slots": self.slots,
            "started_at": self.started_at,
            "admitted_at": self.admitted_at,
            "ended_at": t,
            "durations": {
                "total_s": round(t - self.started_at, 3),
                "queued_s": round((self.admitted_at or t) - self.started_at, 3),
                "active_s": round(t - self.admitted_at, 3) if self.admitted_at else 0.0,
            },
            # (the session's own reason: a client that closed right after its session.close
            # was never sent the session.closed that names it)
            "close_reason": (
                self.close_reason or info.get("close_reason") or self.last_ending or "client_closed"
            ),
            "errors": self.errors,
            "input": {
                "audio_samples": self.input.samples,
                "audio_s": round(self.input.samples / INPUT_RATE, 3),
                "sample_rate": INPUT_RATE,
                "frames": self.frames,
                "events": self.counts["events_in"],
            },
            "output": {
                "audio_samples": self.output.samples,
                "audio_s": round(self.output.samples / OUTPUT_RATE, 3),
                "sample_rate": OUTPUT_RATE,
                "frames": self.counts["frames_out"],
            },
            "unrecorded": self.counts["unrecorded"],
            "files": [{"name": n, "bytes": b} for n, b in sizes.items()],  # besides meta.json
            "bytes": sum(sizes.values()),
            "written_at": time.time(),
        }
        (self.folder / "meta.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
