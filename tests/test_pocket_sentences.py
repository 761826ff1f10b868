"""Cutting the LLM's text stream into clauses for Piper (pure Python, no model)."""

from __future__ import annotations

import pytest

from inference.pocket.sentences import SentenceSplitter


def split(text: str, step: int = 3) -> list[str]:
    """Feed ``text`` in small deltas, as tokens come; return the clauses in order."""
    s, out = SentenceSplitter(), []
    for i in range(0, len(text), step):
        out += s.feed(text[i : i + step])
    return out + s.flush()


def test_sentences_come_out_whole_and_in_order() -> None:
    assert split("The capital of France is Paris. It is a big city.") == [
        "The capital of France is Paris.",
        "It is a big city.",
    ]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        (
            "The moon is a celestial body that orbits the Earth, and it",
            "The moon is a celestial body",
        ),
        ("Dogs are loyal, friendly animals. They", "Dogs are loyal, friendly animals."),
        ("Sure, here is a short answer, for you.", "Sure, here is a short answer,"),
        ("Tea is made by boiling water and pouring it on leaves.", "Tea is made by boiling water"),
        (
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
            "one two three four five six seven eight nine ten eleven twelve",
        ),
    ],
)
def test_the_first_clause_is_cut_short_at_a_phrase_boundary(text: str, first: str) -> None:
    clauses = split(text)
    assert clauses[0] == first
    assert " ".join(clauses) == " ".join(text.split())  # nothing lost, nothing added


def test_only_the_first_clause_is_cut_short() -> None:
    clauses = split("Yes, it is. The moon is a celestial body that orbits the Earth and it shines.")
    assert clauses == [
        "Yes, it is.",
        "The moon is a celestial body that orbits the Earth and it shines.",
    ]


def test_a_list_number_ends_nothing() -> None:
    assert split("1. Boil the water. 2. Add the tea.")[:2] == [
        "1. Boil the water.",
        "2. Add the tea.",
    ]


def test_a_word_starting_like_a_boundary_word_is_not_one() -> None:
    assert split("Elephants are large animals andesite is a rock.") == [
        "Elephants are large animals andesite is a rock."
    ]
