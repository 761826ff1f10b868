"""Worker side of a session's output: its events, numbered and stamped, handed to the slot's
writer thread, which publishes them on the session's channel and appends them to its replay log
(``streaming/output.py`` has the gateway side and the format).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import ResponseError

from streaming.events import Event, encode_event
from streaming.keys import Keys
from streaming.outage import REDIS_ERRORS, Outage, is_outage
from streaming.output_writer import OutputWriter
from streaming.redis_url import is_cluster

log = logging.getLogger(__name__)

# XADD's answer to an entry id at or below the stream's last one (this event is logged already)
LOGGED_ALREADY = "equal or smaller"
OUTAGE_RETRY_S = 0.1  # while Redis is away, a batch is tried again this often


class OutputPublisher:
    """Worker side: emits a session's events in order (synchronous client).

    ``emit`` only numbers and queues an event; a background thread (``writer``: the slot's, or
    one of its own) writes them to Redis in order, several per round trip when they come faster
    than Redis answers, so a model generating tokens never waits on the network. Events emitted
    ``together`` go in one round trip. ``finish`` flushes everything.

    While Redis is away (a failover, a restart; ``streaming/outage.py``) for up to
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
    ) -> None:
        self.client = client
        self.sharded = is_cluster(client)  # SPUBLISH: the channel lives on its slot's shard
        self.session_id = session_id
        self.channel = keys.output_channel(session_id)
        self.log_key = keys.output_log(session_id)
        self.log_maxlen = log_maxlen
        self.ttl_s = int(ttl_s)
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
                if is_outage(exc) and self.outage.failed():
                    if self.outage.lasted() < OUTAGE_RETRY_S:
                        log.warning(
                            "publishing %s: Redis is away (%s); holding its output",
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
        """One pipeline: each event's ``PUBLISH`` (``SPUBLISH`` on a cluster), then its ``XADD``
        to the replay log (the channel and the log share the session's slot).

        Two plain commands, though a 128 KB audio event crosses the socket twice: one script
        doing both costs Redis more CPU and each audio delta more time, its arguments copied
        into Lua strings and back (``python -m bench.publish_path`` measures both ways,
        docs/BENCHMARKS.md).
        An entry id already logged (a batch retried after a lost reply) is not logged again,
        but published again (the gateway skips a seq it has); any other error is raised, so
        the writer retries and warns as for a lost connection.
        """
        with self.client.pipeline(transaction=False) as pipe:
            for seq, data in batch:
                if self.sharded:
                    pipe.spublish(self.channel, data)
                else:
                    pipe.publish(self.channel, data)
                pipe.xadd(
                    self.log_key,
                    {"e": data},
                    id=f"{seq}-1",
                    maxlen=self.log_maxlen,
                    approximate=True,
                )
                if seq == self._first or self._expire_again:
                    pipe.expire(self.log_key, self.ttl_s)
                    self._expire_again = False
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, ResponseError) and LOGGED_ALREADY in str(reply):
                continue
            if isinstance(reply, Exception):
                raise reply
