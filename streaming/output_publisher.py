"""Worker side of a session's output: its events, numbered and stamped, handed to the slot's
writer thread, which publishes them on the session's channel and appends them to its replay log
in one script (``streaming/output.py`` has the gateway side and the format).

The replay log is bounded in bytes and seconds (``LogBound``): a resumed client or a gateway
that missed an event needs the last few seconds of output, not the last so many events, and an
event of speech is a thousand times the size of one of text.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from redis.exceptions import ResponseError
from redis.typing import EncodableT

from streaming.events import Event, encode_event
from streaming.keys import Keys
from streaming.lua import OUTPUT_WRITE, OUTPUT_WRITE_SHARDED
from streaming.outage import REDIS_ERRORS, Outage, is_outage, refuses_writes
from streaming.output_writer import OutputWriter
from streaming.redis_url import is_cluster

log = logging.getLogger(__name__)

OUTAGE_RETRY_S = 0.1  # while Redis is away, a batch is tried again this often
# XADD's answer to an entry id at or below the stream's last one (this event is logged already)
LOGGED_ALREADY = "equal or smaller"
UNBOUNDED_BYTES = 2**62  # a log bounded by its number of events only


@dataclass(slots=True)
class LogBound:
    """Which of a session's logged events its replay log keeps: the newest ones, as many as
    fit in ``max_bytes`` (encoded), are at most ``max_s`` old and number at most
    ``max_events``; the newest event always stays.

    Kept by the publisher from the events it wrote itself (the session's only writer while it
    runs), so the trim costs Redis no read: ``minid`` is the ``MINID`` of the next ``XADD``
    ('' until an event of its own has to go; a failover's worker leaves the earlier worker's
    entries until then)."""

    max_bytes: int
    max_s: float
    max_events: int
    _kept: deque[tuple[int, int, float]] = field(default_factory=deque)  # seq, bytes, written
    _bytes: int = 0
    _last: int = 0
    minid: str = ""

    def add(self, seq: int, size: int, now: float) -> None:
        """An event about to be written (again, after a lost reply: counted once)."""
        if seq <= self._last:
            return
        self._last = seq
        self._kept.append((seq, size, now))
        self._bytes += size
        kept = self._kept
        while len(kept) > 1 and (
            self._bytes > self.max_bytes
            or len(kept) > self.max_events
            or now - kept[0][2] > self.max_s
        ):
            _, gone, _ = kept.popleft()
            self._bytes -= gone
            self.minid = f"{kept[0][0]}-1"


class OutputPublisher:
    """Worker side: emits a session's events in order (synchronous client).

    ``emit`` only numbers and queues an event; a background thread (``writer``: the slot's, or
    one of its own) writes them to Redis in order, several per round trip when they come faster
    than Redis answers, so a model generating tokens never waits on the network. Events emitted
    ``together`` go in one round trip. ``finish`` flushes everything.

    While Redis is away (a failover, a restart; ``streaming/outage.py``) or refuses writes
    (full, a failed save: a script's first events published, the rest not) for up to
    ``outage_grace_s``, a batch is tried again and what is emitted meanwhile waits behind it, in
    order: once Redis answers, the session's output goes on from where it was, nothing lost.
    A batch that could not be written in time is dropped with a warning; the gateway finds its
    sequence numbers missing and tells its client the gap.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        session_id: str,
        log_maxlen: int,
        ttl_s: float,
        start_seq: int = 0,
        writer: OutputWriter | None = None,
        outage_grace_s: float = 0.0,
        log_max_bytes: int = UNBOUNDED_BYTES,
        log_max_s: float = float("inf"),
        write: str = "script",
    ) -> None:
        self.client = client
        self.sharded = is_cluster(client)  # SPUBLISH: the channel lives on its slot's shard
        self.session_id = session_id
        self.channel = keys.output_channel(session_id)
        self.log_key = keys.output_log(session_id)
        self.log_bound = LogBound(log_max_bytes, log_max_s, log_maxlen)
        script = OUTPUT_WRITE_SHARDED if self.sharded else OUTPUT_WRITE
        self._script = client.register_script(script) if write == "script" else None
        self.ttl_s = max(1, int(ttl_s))
        self.seq = start_seq  # a failover's worker continues the session's sequence
        self._first = start_seq + 1
        self._own_writer = writer is None
        self.writer = writer or OutputWriter(f"out-{session_id}")
        self.writer.start()
        self._held: list[tuple[int, bytes]] | None = None  # inside ``together``
        self.outage = Outage(outage_grace_s)
        self._expire_again = False  # after an outage: Redis may have restarted empty

    def emit(self, event: Event) -> int:
        """Number, stamp and queue one event for publication; returns its sequence number."""
        self.seq += 1
        event.seq = self.seq
        event.emitted_at = time.time()
        item = (self.seq, encode_event(event))
        if self._held is not None:
            self._held.append(item)
        else:
            self.writer.put(self, [item])
        return self.seq

    @contextmanager
    def together(self, now: bool = False) -> Iterator[None]:
        """Queue the events emitted inside as one batch: one duplex step's text and audio.

        Queued one by one, the writer would wake for the text and write it alone, and the
        audio, emitted microseconds later, would wait for that round trip before it follows the
        text (docs/BENCHMARKS.md). Nested uses join the outer batch.
        ``now``: when the writer has nothing queued, this thread writes the batch itself before
        it goes on (``OutputWriter.write_now``): for a caller with nothing else to do meanwhile.
        """
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held and not (now and self.writer.write_now(self, held)):
                self.writer.put(self, held)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event emitted so far is in Redis."""
        return self.writer.flush(timeout)

    def finish(self, linger_s: float = 60.0) -> None:
        """Flush (and stop a writer of its own), and keep the replay log only briefly."""
        self.flush()
        if self._own_writer:
            self.writer.stop()
        try:
            self.client.expire(self.log_key, int(linger_s))
        except REDIS_ERRORS:
            log.warning("could not set the expiry of %s", self.log_key)

    def write(self, batch: list[tuple[int, bytes]]) -> None:
        """(The writer thread) publish and log ``batch`` in one round trip: retried twice, and
        while Redis is away for up to the outage grace (see the class docstring)."""
        attempt = 0
        while True:
            try:
                self._write_once(batch)
            except REDIS_ERRORS as exc:
                self._expire_again = True  # (the log's TTL, should Redis have lost it)
                if (is_outage(exc) or refuses_writes(exc)) and self.outage.failed():
                    if self.outage.lasted() < OUTAGE_RETRY_S:
                        log.warning(
                            "publishing %s: Redis is away or refuses writes (%s); output held",
                            self.session_id,
                            exc,
                        )
                    time.sleep(OUTAGE_RETRY_S)
                    continue
                attempt += 1
                log.warning(
                    "publishing %d event(s) of %s failed (try %d)",
                    len(batch),
                    self.session_id,
                    attempt,
                    exc_info=attempt == 3,
                )
                if attempt == 3:
                    return
                time.sleep(0.1 * attempt)
                continue
            lasted = self.outage.answered()
            if lasted is not None:
                log.warning(
                    "publishing %s: Redis answers again after %.1f s; held output sent",
                    self.session_id,
                    lasted,
                )
            return

    def _write_once(self, batch: list[tuple[int, bytes]]) -> None:
        """Each event's ``PUBLISH`` (``SPUBLISH`` on a cluster), then its ``XADD`` to the replay
        log trimmed to ``log_bound``, and the log's expiry with the session's first event (the
        channel and the log share the session's slot): in one script (``lua.OUTPUT_WRITE``: each
        event's bytes cross the socket once, for both), or in one pipeline (``output_write`` =
        ``pipeline``: twice, but on Redis 7 at about half the CPU).

        An entry id already logged (a batch retried after a lost reply) is not logged again,
        but published again (the gateway skips a seq it has); any other error is raised, so
        the writer retries and warns as for a lost connection.
        """
        now = time.monotonic()
        bound = self.log_bound
        ttl = 0
        for seq, data in batch:
            bound.add(seq, len(data), now)
            if seq == self._first or self._expire_again:
                ttl = self.ttl_s
        if self._script is not None:
            args: list[EncodableT] = [ttl, bound.minid]
            for seq, data in batch:
                args += [seq, data]
            self._script(keys=[self.log_key, self.channel], args=args)
        else:
            self._pipelined(batch, ttl, bound.minid)
        self._expire_again = False

    def _pipelined(self, batch: list[tuple[int, bytes]], ttl: int, minid: str) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for seq, data in batch:
                if self.sharded:
                    pipe.spublish(self.channel, data)
                else:
                    pipe.publish(self.channel, data)
                pipe.xadd(
                    self.log_key, {"e": data}, id=f"{seq}-1", minid=minid or None, approximate=False
                )
            if ttl:
                pipe.expire(self.log_key, ttl)
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, ResponseError) and LOGGED_ALREADY in str(reply):
                continue
            if isinstance(reply, Exception):
                raise reply
