"""The conversation so far of a duplex session, kept in Redis for a failover and a rollover.

The worker notes what each side said as text: the model's spoken text as it goes out, and the
user's words where the backend knows them (``DuplexStep.heard``, from a backend that transcribes).
It is written to ``Keys.session_history`` at the end of every response, so a worker that takes
the session over after a failure (or after its slot was given back while the client was away)
prepares the backend with it (``DuplexConfig.history``), as a rollover does on the same worker
(``tasks/prime.py`` picks what of it fits). The KV cache itself is not moved.

The worker holds the whole conversation, so after a Redis outage (which may have been a restart
that lost every key) it writes it again at once (``after_outage``), not only at the end of the
next response.
"""

from __future__ import annotations

import logging

import orjson
import redis

from inference import HistoryTurn
from streaming.keys import Keys
from streaming.outage import REDIS_ERRORS

log = logging.getLogger("omniserve.worker")

MAX_TURNS = 200  # a bound only: a prime takes the newest turns, far fewer than this


class Conversation:
    """Both sides' text of one session, in order."""

    def __init__(self, client: redis.Redis, keys: Keys, session_id: str, ttl_s: float) -> None:
        self.client = client
        self.key = keys.session_history(session_id)
        self.ttl_s = max(1, int(ttl_s))
        self.turns: list[HistoryTurn] = []
        self._reply = ""  # the model's text of the response in progress
        self._outages_seen = 0  # outages over when it was last written (``after_outage``)

    def load(self) -> list[HistoryTurn]:
        """What an earlier worker of this session kept (a failover starts from it)."""
        try:
            raw = self.client.get(self.key)
        except REDIS_ERRORS:
            log.warning("could not read the history of %s", self.key, exc_info=True)
            return []
        if not raw:
            return []
        try:
            items = orjson.loads(raw)
            self.turns = [
                HistoryTurn(role=t["role"], text=str(t["text"]))
                for t in items
                if t.get("role") in ("user", "assistant")
            ]
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
            log.warning("history %s is not a list of turns; ignored", self.key)
            self.turns = []
        return list(self.turns)

    def heard(self, text: str) -> None:
        """The user said ``text`` (a transcribing backend's words)."""
        text = text.strip()
        if text:
            self._end_reply()
            self._add("user", text)
            self.save()

    def said(self, text: str) -> None:
        """The model spoke ``text`` (a piece of the response in progress)."""
        self._reply += text

    def end_response(self) -> None:
        """The response in progress is over: keep it."""
        if self._end_reply():
            self.save()

    def truncate(self, spoken: str, heard: str) -> None:
        """Only ``heard`` of the response whose text was ``spoken`` reached the user: the rest
        of it (and whatever the model said after it in that turn) leaves the conversation. A
        response not found in the last assistant turn is left as it is."""
        self._end_reply()
        spoken, heard = spoken.strip(), heard.strip()
        if not spoken or not self.turns or self.turns[-1].role != "assistant":
            return
        text = self.turns[-1].text
        at = text.rfind(spoken)
        if at < 0:
            log.info("a truncated response is not in the last turn of %s; kept", self.key)
            return
        kept = f"{text[:at]}{heard}".strip()
        if kept:
            self.turns[-1] = HistoryTurn(role="assistant", text=kept)
        else:
            self.turns.pop()
        self.save()

    def save(self) -> None:
        """Write the conversation to Redis (a failure is logged: it only weakens a failover)."""
        data = orjson.dumps([{"role": t.role, "text": t.text} for t in self.turns])
        try:
            self.client.set(self.key, data, ex=self.ttl_s)
        except REDIS_ERRORS:
            log.warning("could not save the history of %s", self.key, exc_info=True)

    def after_outage(self, outages: int) -> None:
        """Write the conversation again once per outage of the session's Redis connection that
        is over (``outages``: how many began so far): Redis may have restarted empty."""
        if outages != self._outages_seen:
            self._outages_seen = outages
            if self.turns:
                self.save()

    def _end_reply(self) -> bool:
        text = self._reply.strip()
        self._reply = ""
        if text:
            self._add("assistant", text)
        return bool(text)

    def _add(self, role: str, text: str) -> None:
        if self.turns and self.turns[-1].role == role:
            self.turns[-1] = HistoryTurn(role=role, text=f"{self.turns[-1].text} {text}")
        else:
            self.turns.append(HistoryTurn(role=role, text=text))  # type: ignore[arg-type]
        del self.turns[:-MAX_TURNS]
