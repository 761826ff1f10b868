"""What a fresh model session is primed with: as much of the conversation so far as fits.

A rollover (and a failover) starts a new backend session from the session's ``InitControl``
(system prompt, voices) and the conversation's text. The KV cache is not carried over, so the
prime has a budget (``rollover_prime_tokens``) and this rule decides what of the conversation
goes in it, the same way every time:

1. the newest turns, whole, as many as fit the budget, in their order;
2. when not even the newest turn fits whole, its last words that fit (the end of what was said
   matters most to what comes next);
3. everything older is dropped; the prime says how many turns were left out (``dropped``),
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


@dataclass(frozen=True, slots=True)
class Prime:
    """The conversation a fresh model session starts from."""

    history: list[HistoryTurn] = field(default_factory=list)
    dropped: int = 0  # older turns left out
    tokens: int = 0  # the budget this history takes (``TokenCount`` plus the turn overhead)


def prime_history(turns: list[HistoryTurn], budget: int, count: TokenCount) -> Prime:
    """The newest turns that fit ``budget`` tokens (see the module docstring)."""
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
                used = count(tail) + TURN_OVERHEAD_TOKENS
        break
    kept.reverse()
    return Prime(history=kept, dropped=len(turns) - len(kept), tokens=used)


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
