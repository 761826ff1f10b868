"""The prime rule: all of a conversation that fits; else the user's opening turn in a share of
the budget, then the newest whole turns that fit, the tail of one that does not, the rest
dropped."""

from __future__ import annotations

from inference import HistoryTurn
from tasks.prime import OPENING_SHARE, TURN_OVERHEAD_TOKENS, prime_history


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


def test_the_users_opening_is_kept_before_the_newest_turns() -> None:
    conv = turns("my name is Ada", "hello Ada", *(f"turn {i} a b c d e" for i in range(20)))
    budget = 40
    prime = prime_history(conv, budget, words)
    assert prime.history[0] == conv[0]  # the name, said at the start
    assert prime.history[1:] == conv[-len(prime.history) + 1 :]  # then the newest, in order
    assert prime.tokens <= budget
    assert prime.dropped == len(conv) - len(prime.history) > 0


def test_a_long_opening_keeps_its_first_words_in_its_share() -> None:
    opening = " ".join(f"w{i}" for i in range(100))
    conv = turns(opening, "ok", "and now", "sure")
    budget = 60
    prime = prime_history(conv, budget, words)
    share = int(budget * OPENING_SHARE) - TURN_OVERHEAD_TOKENS
    assert prime.history[0] == HistoryTurn("user", " ".join(f"w{i}" for i in range(share)))
    assert prime.history[1:] == conv[1:]


def test_a_conversation_opened_by_the_model_keeps_the_users_first_turn() -> None:
    later = turns("I am Ada", "hello Ada", *(f"turn {i} x y z" for i in range(10)))
    conv = [HistoryTurn("assistant", "hi, how can I help"), *later]
    prime = prime_history(conv, 30, words)
    assert prime.history[0] == HistoryTurn("user", "I am Ada")
