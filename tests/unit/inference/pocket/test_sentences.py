"""Cutting the LLM's text stream into clauses for Piper (pure Python, no model).

The pieces are also the text deltas that go out with each clause's audio, so joined they must
give back the text as the model wrote it; what Piper speaks is each piece stripped.
"""

from __future__ import annotations

import pytest

from inference.pocket.sentences import SentenceSplitter


def pieces(text: str, step: int = 3) -> list[str]:
    """Feed ``text`` in small deltas, as tokens come; return the pieces in order, as they are."""
    s, out = SentenceSplitter(), []
    for i in range(0, len(text), step):
        out += s.feed(text[i : i + step])
    return out + s.flush()


def split(text: str, step: int = 3) -> list[str]:
    """The clauses Piper is given: the pieces, stripped."""
    return [p.strip() for p in pieces(text, step)]


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
    clauses = pieces(text)
    assert clauses[0].strip() == first
    assert "".join(clauses) == text  # nothing lost, nothing added


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


REPLIES = [
    # the answers whose captions read "marine life,and", "own.Some", "include:One"
    "Oceans cover most of the planet and are home to marine life, and they shape our weather.",
    "Cats are independent animals that can take care of themselves on their own. Some of them "
    "like company, though.",
    "Popular dog breeds include: One, the Labrador; two, the poodle! Three?  The beagle.",
    "Here is a list:\n\n1. Boil the water.\n2. Pour it on the leaves.\n\nThat is all.",
    "A long run-on answer " + "that goes on and on without any stop " * 8 + "until here.",
    " It starts with a space, as a model's first token often does.\n",
]


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_pieces_joined_are_the_text_with_its_spaces(text: str, step: int) -> None:
    out = pieces(text, step)
    assert len(out) >= 2 or step == len(text) or step == 1000
    joined = "".join(out)
    assert text.startswith(joined) and joined.rstrip() == text.rstrip()  # but a blank end
    assert all(p.strip() for p in out)  # no piece is only whitespace: each has something to say


def test_what_piper_is_given_is_clean() -> None:
    for text in REPLIES:
        for clause in split(text, 2):
            assert clause and clause == clause.strip()
