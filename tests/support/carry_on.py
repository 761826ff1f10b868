"""Live duplex sessions driven across a fault, each counted: carried on or ended, output lost
(told as a gap or not) and duplicated.

Each ``PacedSession`` is a real WebSocket client that sends one input chunk at a time and waits
for the worker's answer to it (``Client.step``), so its output does not depend on how loaded
the machine is. ``carried_on`` holds for a session still streaming after the fault with no
``error`` and no ``session.closed``; its ``seq`` numbers are checked for holes (an ``output_gap``
error must tell each one) and for copies, and so is its audio (``audio_report``): the scripted
backend speaks ``step_audio_s`` (1 s) for each speaking step, each with a ``text`` delta, and the
gateway cuts a response's audio into deltas without dropping any (an interruption flushes the
rest), so a response that ended owes ``text deltas x 1 s`` of audio; what it got less is lost,
what it got more (or an audio delta whose ``seq`` came twice) is duplicated. A step lost whole
(its text delta too) shows in the ``seq`` count, as a hole an ``output_gap`` must tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.client import Client, decode_audio, silence, speech
from tests.support.fault_harness import await_for

OUTPUT_RATE = 24_000  # the output audio's sample rate (docs/PROTOCOL.md)
STEP_AUDIO_MS = 1000  # the scripted backend's audio per speaking step (``step_audio_s``)
GAP_TOLD = re.compile(r"output events (\d+)\.\.(\d+)")  # an ``output_gap`` error's message
STEP_TIMEOUT_S = 4.0  # an answer not come by then: its chunk was lost (sent as Redis went
# away), and the next one goes (before the gateway's client_idle_s)


@dataclass
class PacedSession:
    """One duplex session paced by its answers; see the module docstring."""

    client: Client
    steps: int = 0  # chunks answered
    unanswered: int = 0  # chunks whose answer never came (lost input)
    ended: str | None = None  # why it ended, when it did: the close reason or an error code
    answered_at: list[float] = field(default_factory=list)  # monotonic time of each answer
    stopping: bool = False  # ``close`` was called: no more steps
    _task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str) -> PacedSession:
        client = await Client.connect(url, query="?mode=audio")
        await client.init()
        session = cls(client)
        session._task = asyncio.create_task(session._run())
        return session

    async def _run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while self.ended is None and not self.stopping:
                audio = speech() if self.steps % 4 == 0 else silence(0.5)
                try:
                    got = await self.client.step(audio, timeout=STEP_TIMEOUT_S)
                except TimeoutError:
                    self.unanswered += 1
                    continue
                for frame in got:
                    if frame["type"] == "session.closed":
                        self.ended = str(frame.get("reason"))
                    elif frame["type"] == "error" and frame["error"]["code"] != "output_gap":
                        self.ended = self.ended or str(frame["error"]["code"])
                if self.ended is None:
                    self.steps += 1
                    self.answered_at.append(time.monotonic())
        except ConnectionClosed:
            self.ended = self.ended or "connection closed"

    def answers_after(self, since: float) -> int:
        return sum(1 for t in self.answered_at if t > since)

    @property
    def frames(self) -> list[dict[str, Any]]:
        return self.client.received

    def errors(self) -> list[str]:
        return [f["error"]["code"] for f in self.frames if f["type"] == "error"]

    def count(self, kind: str) -> int:
        return sum(1 for f in self.frames if f["type"] == kind)

    def seq_report(self) -> tuple[int, int, int]:
        """(events missing, events the ``output_gap`` errors told lost, events duplicated) in
        the session's ``seq`` numbers (each error says "output events A..B were lost")."""
        seqs = [int(f["seq"]) for f in self.frames if isinstance(f.get("seq"), int)]
        duplicated = len(seqs) - len(set(seqs))
        missing = sum(b - a - 1 for a, b in itertools.pairwise(seqs) if b > a + 1)
        told = 0
        for f in self.frames:
            if f["type"] == "error" and f["error"]["code"] == "output_gap":
                told += sum(
                    int(b) - int(a) + 1 for a, b in GAP_TOLD.findall(f["error"].get("message", ""))
                )
        return missing, told, duplicated

    def audio_report(self) -> AudioCount:
        """The session's audio, counted per response (module docstring)."""
        seen: set[int] = set()
        owed: dict[str, int] = {}  # response_id -> ms its speaking steps produced
        got: dict[str, float] = {}  # response_id -> ms received
        ended: set[str] = set()
        order: list[str] = []
        dup_ms = 0.0
        for f in self.frames:
            if f["type"] != "response.output.delta" or not f.get("response_id"):
                continue
            rid = str(f["response_id"])
            if rid not in owed:
                owed[rid], got[rid] = 0, 0.0
                order.append(rid)
            seq = f.get("seq")
            again = isinstance(seq, int) and seq in seen
            if isinstance(seq, int):
                seen.add(seq)
            if (f.get("metrics") or {}).get("end_of_turn"):
                ended.add(rid)
            if f.get("kind") == "text" and not again:
                owed[rid] += STEP_AUDIO_MS
            elif f.get("kind") == "audio":
                ms = decode_audio(f["audio"]).size * 1000 / OUTPUT_RATE
                if again:
                    dup_ms += ms
                else:
                    got[rid] += ms
        count = AudioCount(duplicated_ms=dup_ms)
        for rid in order:
            if rid not in ended and rid == order[-1]:
                continue  # still speaking: its last step's audio may be on its way
            count.responses += 1
            count.received_ms += got[rid]
            count.lost_ms += max(0.0, owed[rid] - got[rid])
            count.duplicated_ms += max(0.0, got[rid] - owed[rid])
        return count

    def carried_on(self, since: float) -> bool:
        """Still streaming after ``since``, never ended, no error but a told gap."""
        others = [e for e in self.errors() if e != "output_gap"]
        return self.ended is None and not others and self.answers_after(since) > 0

    def report(self, since: float) -> str:
        missing, told, duplicated = self.seq_report()
        audio = self.audio_report()
        state = "carried on" if self.carried_on(since) else f"ended ({self.ended})"
        return (
            f"{state}: {self.steps} steps ({self.answers_after(since)} after), "
            f"{self.unanswered} unanswered, recovering={self.count('session.recovering')} "
            f"errors={self.errors()} seq missing={missing} told={told} duplicated={duplicated}; "
            f"audio {audio}"
        )

    async def close(self) -> None:
        """Stop stepping and close the connection (a cancel alone can be lost in a receive that
        completes as it comes, on Python 3.11)."""
        self.stopping = True
        with contextlib.suppress(Exception):
            await self.client.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 15)


@dataclass
class AudioCount:
    """A session's audio over the responses that ended (``PacedSession.audio_report``)."""

    responses: int = 0
    received_ms: float = 0.0
    lost_ms: float = 0.0
    duplicated_ms: float = 0.0

    def __str__(self) -> str:
        return (
            f"{self.responses} responses, {self.received_ms:.0f} ms received, "
            f"{self.lost_ms:.0f} ms lost, {self.duplicated_ms:.0f} ms duplicated"
        )


def tally(sessions: list[PacedSession], since: float) -> tuple[int, int]:
    """(carried on, ended) over ``sessions``."""
    on = sum(1 for s in sessions if s.carried_on(since))
    return on, len(sessions) - on


async def all_carry_on(sessions: list[PacedSession], since: float, fault: str) -> None:
    """Wait until each session is answered again after ``since`` (or ended), print the tally,
    and check that every one carried on: at most one recovering/recovered pair, no output seq
    duplicated, every missing one told as a gap."""
    await await_for(
        lambda: all(p.answers_after(since) >= 3 or p.ended for p in sessions),
        60,
        "each live session to go on or end",
    )
    on, ended = tally(sessions, since)
    for p in sessions:
        print("in flight:", p.report(since))
    print(f"{fault}: {on} carried on, {ended} ended (of {len(sessions)})")
    for p in sessions:
        assert p.carried_on(since), p.report(since)
        assert p.count("session.recovering") <= 1 and p.count("session.recovered") <= 1
        missing, told, duplicated = p.seq_report()
        assert duplicated == 0 and told >= missing, p.report(since)  # each hole told
        audio = p.audio_report()
        assert audio.duplicated_ms == 0, p.report(since)
        assert audio.lost_ms == 0 or told > 0, p.report(since)  # any loss told as a gap
