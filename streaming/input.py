"""Per-session input: a capped audio stream (oldest chunks dropped) and a control stream.

Audio chunks go to a Redis Stream trimmed to ``max_pending`` seconds of audio, so a client that
sends faster than its worker consumes loses its oldest pending chunks and the newest is processed
next (the protocol's "silent drop"). The bound is counted in chunks of the size being appended:
``max_pending`` one-second chunks, or as many shorter ones as make that many seconds (a client
may send chunks of any length; counting them alone would drop most of a 100 ms stream). The
worker deletes the chunks it has read with its next read (one round trip), so a session that
keeps up holds no audio in Redis between its chunks. Control events (init, close, force_listen)
go to a separate stream that is never trimmed by that policy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.typing import EncodableT, KeyT, StreamIdT

from streaming.controls import (
    BadControl,
    Control,
    ForceListenControl,
    decode_control,
    encode_control,
)
from streaming.input_link import Command, InputLink
from streaming.keys import Keys
from streaming.outage import REDIS_ERRORS, Outage, is_outage
from streaming.redis_connection import unblocked
from streaming.redis_url import is_cluster

log = logging.getLogger(__name__)

CONTROL_MAXLEN = 100_000  # a memory bound only; a 10-minute session sends far fewer controls
SAMPLES_PER_SECOND = 16_000  # input audio: 16 kHz float32
MAX_PENDING_CHUNKS = 256  # however tiny the chunks, no longer a stream than this
OUTAGE_RETRY_MS = 100  # while Redis is away, a read is tried again this often


@dataclass(slots=True)
class AudioChunk:
    """One input.append as the worker receives it."""

    seq: int
    input_id: str
    audio: bytes  # little-endian float32 PCM, 16 kHz
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False
    max_slice_nums: int = 1


class InputWriter:
    """Gateway side: a session's chunks and controls, in order, over the gateway's input link
    (``streaming/input_link.py``)."""

    def __init__(
        self,
        redis_client: aioredis.Redis,
        keys: Keys,
        max_pending: int,
        ttl_s: float,
        name: str = "omniserve-input",
        outage_grace_s: float = 0.0,
    ) -> None:
        self.redis = redis_client
        self.name = name
        self.outage_grace_s = outage_grace_s
        # on a Redis Cluster: one link per shard (a session's keys share a slot, so its input
        # keeps its order on its shard's link)
        self.sharded = is_cluster(redis_client)
        self.links: dict[str, InputLink] = {}
        if not self.sharded:
            self.link = InputLink(redis_client.connection_pool, name, outage_grace_s=outage_grace_s)
        self.keys = keys
        self.max_pending = max_pending
        self.ttl_s = int(ttl_s)

    def pending_bound(self, samples: int) -> int:
        """How many chunks of ``samples`` samples make ``max_pending`` seconds (at least
        ``max_pending``: one-second and longer chunks are counted as they are)."""
        per_second = -(-SAMPLES_PER_SECOND // max(1, samples))  # ceil
        return max(self.max_pending, min(MAX_PENDING_CHUNKS, self.max_pending * per_second))

    def append(self, session_id: str, chunk: AudioChunk) -> asyncio.Future[None]:
        """Queue one chunk for the worker (dropping the oldest beyond ``pending_bound``).

        Never waits: the future says whether Redis took the chunk. The caller need not wait for
        it (the next chunk can go meanwhile), but must look at it.
        """
        key = self.keys.input_audio(session_id)
        maxlen = self.pending_bound(len(chunk.audio) // 4)
        xadd: list[EncodableT] = ["XADD", key, "MAXLEN", maxlen, "*"]
        xadd += ["seq", chunk.seq, "input_id", chunk.input_id, "audio", chunk.audio]
        xadd += ["force_listen", int(chunk.force_listen), "max_slice_nums", chunk.max_slice_nums]
        xadd += ["frames", len(chunk.frames)]
        for i, frame in enumerate(chunk.frames):
            xadd += [f"f{i}", frame]
        commands: list[Command] = []
        if chunk.force_listen:
            control = encode_control(ForceListenControl(input_id=chunk.input_id))
            commands.append(self._control_xadd(session_id, control))
        commands.append(xadd)
        if chunk.seq == 1:
            commands.append(["EXPIRE", key, self.ttl_s])
        return self._link(key).send(*commands)

    def link_of(self, session_id: str) -> InputLink:
        """The link that carries ``session_id``'s input now (its outage: ``Outage``)."""
        return self._link(self.keys.input_audio(session_id))

    def _link(self, key: str) -> InputLink:
        """The link that carries ``key``'s commands: the one link, or its shard's."""
        if not self.sharded:
            return self.link
        shards: Any = self.redis
        node = shards.get_node_from_key(key)
        link = self.links.get(node.name)
        if link is None:
            name = f"{self.name}-{node.port}"
            link = InputLink(_NodeConnections(node), name, outage_grace_s=self.outage_grace_s)  # type: ignore[arg-type]
            self.links[node.name] = link
        return link

    async def control(self, session_id: str, control: Control) -> None:
        """Send a control event (never dropped); returns once Redis has it."""
        key = self.keys.input_control(session_id)
        await self._link(key).send(
            self._control_xadd(session_id, encode_control(control)),
            ["EXPIRE", key, self.ttl_s],
        )

    async def discard(self, session_id: str) -> None:
        """Delete both input streams (a failover starts the next worker on what comes next);
        on the link, so that no chunk written before lands after the delete."""
        keys = (self.keys.input_audio(session_id), self.keys.input_control(session_id))
        await self._link(keys[0]).send(["DEL", *keys])

    def _control_xadd(self, session_id: str, encoded: bytes) -> Command:
        key = self.keys.input_control(session_id)
        return ["XADD", key, "MAXLEN", "~", CONTROL_MAXLEN, "*", "e", encoded]

    async def aclose(self) -> None:
        """Close the input link (the gateway stops)."""
        if not self.sharded:
            await self.link.aclose()
        for link in self.links.values():
            await link.aclose()


class _NodeConnections:
    """What ``InputLink`` takes of a pool, for one cluster node: a new connection of the node's
    own class and options (its TCP options, timeouts, credentials)."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def make_connection(self) -> Any:
        return self.node.connection_class(**self.node.connection_kwargs)


@dataclass(slots=True)
class InputBatch:
    """What one read returned: control events first, then audio chunks in order."""

    controls: list[Control]
    chunks: list[AudioChunk]
    dropped: int  # chunks that were trimmed before the worker could read them


class InputReader:
    """Worker side (synchronous client). ``outage_grace_s``: how long a read may find Redis
    away (a failover, a restart) and read as no input before it raises (``streaming/outage.py``).
    """

    def __init__(
        self, client: redis.Redis, keys: Keys, session_id: str, outage_grace_s: float = 0.0
    ) -> None:
        self.client = client
        self.outage = Outage(outage_grace_s)
        self.audio_key = keys.input_audio(session_id)
        self.control_key = keys.input_control(session_id)
        self.last_audio = "0-0"
        self.last_control = "0-0"
        self.last_seq = 0
        self._trimmed = "0-0"  # the chunks up to this id are gone from the stream
        self.unanswered = False  # the last read found Redis stalled

    def read(self, block_ms: int) -> InputBatch:
        """Wait up to ``block_ms`` for input; return everything pending.

        A Redis that holds the connection but does not answer (a stall past the client's
        retries) reads as no input: the session waits for it, as its gateway does (a 15 s
        stall failed every session); its deadline and other checks still run. A refused or
        closed connection, or a node that is no primary now, reads the same while the outage
        lasts no longer than ``outage_grace_s`` (a Sentinel failover, a restart: the gateway
        keeps the client meanwhile and writes its input to whichever Redis answers next);
        past it the error is raised and the session ends.
        """
        streams: dict[KeyT, StreamIdT] = {
            self.control_key: self.last_control,
            self.audio_key: self.last_audio,
        }
        try:
            if self.last_audio != self._trimmed:
                # the chunks read so far leave Redis in the same round trip as the next read; a
                # Redis refusing writes (read-only, a failed save) still gives the read
                with self.client.pipeline(transaction=False) as pipe:
                    pipe.xtrim(self.audio_key, minid=_after(self.last_audio), approximate=False)
                    pipe.xread(streams, block=block_ms)
                    trimmed, reply = pipe.execute(raise_on_error=False)
                if isinstance(reply, Exception):
                    raise reply
                if not isinstance(trimmed, Exception):
                    self._trimmed = str(streams[self.audio_key])
            else:
                reply = self.client.xread(streams, block=block_ms)
        except redis.TimeoutError as exc:
            self._stalled(exc)
            return InputBatch(controls=[], chunks=[], dropped=0)
        except redis.ResponseError as exc:
            if not unblocked(exc):
                self._away(exc, block_ms)
            return InputBatch(controls=[], chunks=[], dropped=0)  # read again at the next step
        except REDIS_ERRORS as exc:
            self._away(exc, block_ms)
            return InputBatch(controls=[], chunks=[], dropped=0)
        self._answered()
        got = _stream_reply(reply)
        controls: list[Control] = []
        chunks: list[AudioChunk] = []
        dropped = 0
        for stream, entries in got:
            name = _text(stream)
            for entry_id, fields in entries:
                eid = _text(entry_id)
                if name == self.control_key:
                    self.last_control = eid
                    control = _control(fields)
                    if control is not None:
                        controls.append(control)
                else:
                    self.last_audio = eid
                    chunk = _chunk(fields)
                    if chunk.seq > self.last_seq + 1:
                        dropped += chunk.seq - self.last_seq - 1
                    self.last_seq = max(self.last_seq, chunk.seq)
                    chunks.append(chunk)
        return InputBatch(controls=controls, chunks=chunks, dropped=dropped)

    def poll_controls(self) -> list[Control]:
        """Control events that arrived since the last read, without waiting (chat turns); none
        while Redis stalls, as ``read``."""
        try:
            reply = self.client.xread({self.control_key: self.last_control}, count=10)
        except redis.TimeoutError as exc:
            self._stalled(exc)
            return []
        except REDIS_ERRORS as exc:
            self._away(exc, 0)
            return []
        self._answered()
        got = _stream_reply(reply)
        controls: list[Control] = []
        for _stream, entries in got:
            for entry_id, fields in entries:
                self.last_control = _text(entry_id)
                control = _control(fields)
                if control is not None:
                    controls.append(control)
        return controls

    def _stalled(self, exc: redis.TimeoutError) -> None:
        if not self.unanswered:
            log.warning("input read: Redis does not answer (%s); waiting for it", exc)
        self.unanswered = True

    def _away(self, exc: Exception, block_ms: int) -> None:
        """A read failed: raise unless Redis is away and the grace is not over yet (then wait
        a little, as the blocking read would have, and read again)."""
        if not is_outage(exc) or not self.outage.failed():
            raise exc
        if not self.unanswered:
            log.warning("input read: Redis is away (%s); waiting for it", exc)
        self.unanswered = True
        time.sleep(min(block_ms, OUTAGE_RETRY_MS) / 1000)

    def _answered(self) -> None:
        lasted = self.outage.answered()
        if self.unanswered:
            log.info("input read: Redis answers again (after %.1f s)", lasted or 0.0)
            self.unanswered = False

    def discard(self) -> None:
        """Delete the input streams (the session is over)."""
        self.client.delete(self.audio_key, self.control_key)


StreamEntries = list[tuple[bytes, dict[bytes, bytes]]]


def _stream_reply(reply: object) -> list[tuple[bytes, StreamEntries]]:
    """XREAD's reply as redis-py returns it without decoding (its stubs say ``Any``)."""
    return cast("list[tuple[bytes, StreamEntries]]", reply or [])


def _after(entry_id: str) -> str:
    """The smallest stream entry id after ``entry_id``."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _control(fields: dict[bytes, bytes]) -> Control | None:
    try:
        return decode_control(fields[b"e"])
    except (KeyError, BadControl):
        log.warning("ignoring a malformed control event: %r", fields)
        return None


def _chunk(fields: dict[bytes, bytes]) -> AudioChunk:
    nframes = int(fields.get(b"frames", b"0"))
    return AudioChunk(
        seq=int(fields[b"seq"]),
        input_id=fields[b"input_id"].decode(),
        audio=fields[b"audio"],
        frames=[fields[f"f{i}".encode()] for i in range(nframes)],
        force_listen=fields.get(b"force_listen", b"0") == b"1",
        max_slice_nums=int(fields.get(b"max_slice_nums", b"1")),
    )
