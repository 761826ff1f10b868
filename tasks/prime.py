"""What a fresh model session is primed with: as much of the conversation so far as fits.

A rollover (and a failover) starts a new backend session from the session's ``InitControl``
(system prompt, voices) and the conversation's text. The KV cache is not carried over, so the
prime has a budget (``rollover_prime_tokens``) and this rule decides what of the conversation
goes in it, the same way every time:

1. when the whole conversation fits the budget, all of it;
2. else the call's opening first: the user's first turn, whole or its first words, in at most
   ``OPENING_SHARE`` of the budget (where people say who they are and what they want: a name
   given at the start is still known hours later);
3. then the newest turns, whole, as many as fit the rest, in their order; when not even the
   newest turn fits whole, its last words that fit (the end of what was said matters most to
   what comes next);
4. everything between is dropped; the prime says how many turns were left out (``dropped``),
   in the rollover event's metrics.

Only what was said goes in: the model's reply in progress is the text it has already sent
(``Conversation`` notes a reply's text as it goes out), never what it had not yet spoken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inference import HistoryTurn

TokenCount = Callable[[str], int]

# what one turn costs besides its words: the role label and line break around it
TURN_OVERHEAD_TOKENS = 3
OPENING_SHARE = 0.25  # of the prime budget, at most, for the user's first turn


@dataclass(frozen=True, slots=True)
class Prime:
    """The conversation a fresh model session starts from."""

    history: list[HistoryTurn] = field(default_factory=list)
    dropped: int = 0  # older turns left out
    tokens: int = 0  # the budget this history takes (``TokenCount`` plus the turn overhead)


def prime_history(turns: list[HistoryTurn], budget: int, count: TokenCount) -> Prime:
    """The call's opening and the newest turns that fit ``budget`` tokens (see the module
    docstring)."""
    costs = [count(t.text) + TURN_OVERHEAD_TOKENS for t in turns]
    if sum(costs) <= budget:
        return Prime(history=list(turns), dropped=0, tokens=sum(costs))
    opening: list[HistoryTurn] = []
    used = 0
    first = next((i for i, t in enumerate(turns) if t.role == "user"), None)
    if first is not None:
        share = int(budget * OPENING_SHARE)
        text = turns[first].text
        if costs[first] > share:
            text = _head(text, share - TURN_OVERHEAD_TOKENS, count)
        if text:
            opening = [HistoryTurn(role="user", text=text)]
            used = count(text) + TURN_OVERHEAD_TOKENS
    later = turns[first + 1 :] if opening and first is not None else turns
    recent = _newest(later, budget - used, count)
    tokens = used + sum(count(t.text) + TURN_OVERHEAD_TOKENS for t in recent)
    kept = [*opening, *recent]
    return Prime(history=kept, dropped=len(turns) - len(kept), tokens=tokens)


def _newest(turns: list[HistoryTurn], budget: int, count: TokenCount) -> list[HistoryTurn]:
    """The newest whole turns that fit ``budget``, or the last words of the newest one."""
    kept: list[HistoryTurn] = []
    used = 0
    for turn in reversed(turns):
        cost = count(turn.text) + TURN_OVERHEAD_TOKENS
        if used + cost <= budget:
            kept.append(turn)
            used += cost
            continue
        if not kept:
            tail = _tail(turn.text, budget - TURN_OVERHEAD_TOKENS, count)
            if tail:
                kept.append(HistoryTurn(role=turn.role, text=tail))
        break
    kept.reverse()
    return kept


def _head(text: str, budget: int, count: TokenCount) -> str:
    """The longest run of first words of ``text`` that takes at most ``budget`` tokens."""
    words = text.split()
    lo, hi = 0, len(words)  # the answer keeps words[:cut]; find the largest cut that fits
    if budget <= 0 or not words:
        return ""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def _tail(text: str, budget: int, count: TokenCount) -> str:
    """The longest run of last words of ``text`` that takes at most ``budget`` tokens."""
    words = text.split()
    lo, hi = 0, len(words)  # the answer keeps words[cut:]; find the smallest cut that fits
    if budget <= 0 or not words:
        return ""
    while lo < hi:
        mid = (lo + hi) // 2
        if count(" ".join(words[mid:])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[lo:])
