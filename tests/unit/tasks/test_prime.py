"""The prime rule: the newest whole turns that fit, the tail of one that does not, older ones
dropped."""

from __future__ import annotations

from inference import HistoryTurn
from tasks.prime import TURN_OVERHEAD_TOKENS, prime_history


def words(text: str) -> int:
    return len(text.split())


def turns(*texts: str) -> list[HistoryTurn]:
    return [
        HistoryTurn("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(texts)
    ]


def test_everything_fits_and_stays_in_order() -> None:
    conv = turns("my name is Ada", "hello Ada", "what is my name", "Ada")
    prime = prime_history(conv, 100, words)
    assert prime.history == conv and prime.dropped == 0
    assert prime.tokens == sum(words(t.text) for t in conv) + 4 * TURN_OVERHEAD_TOKENS


def test_the_oldest_turns_are_dropped_first() -> None:
    conv = turns("one two three", "four five", "six seven eight nine", "ten")
    budget = (4 + TURN_OVERHEAD_TOKENS) + (1 + TURN_OVERHEAD_TOKENS)  # the last two exactly
    prime = prime_history(conv, budget, words)
    assert prime.history == conv[2:] and prime.dropped == 2 and prime.tokens == budget
    # a turn that does not fit stops the walk: nothing older slips in around it
    prime = prime_history(conv, budget + 1, words)
    assert prime.history == conv[2:]


def test_of_a_newest_turn_too_long_its_last_words() -> None:
    conv = turns("hello", " ".join(f"w{i}" for i in range(50)))
    prime = prime_history(conv, 10 + TURN_OVERHEAD_TOKENS, words)
    assert prime.history == [HistoryTurn("assistant", " ".join(f"w{i}" for i in range(40, 50)))]
    assert prime.dropped == 1


def test_nothing_fits_a_budget_below_one_turn() -> None:
    assert prime_history(turns("a b c"), TURN_OVERHEAD_TOKENS, words).history == []
    assert prime_history([], 100, words).history == []
