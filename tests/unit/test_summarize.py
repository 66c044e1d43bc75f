from __future__ import annotations

import pytest

from client.samples import sample_documents
from workers.engines.sim.summarize import (
    content_words,
    score_sentences,
    select_sentences,
    split_sentences,
    summarize,
)
from workers.engines.sim.tokens import count_tokens, tokenize, truncate

DOC = """The river authority opened the new lock on Monday. Engineers tested the lock gates for
a week before the opening. Local boat owners welcomed the new lock and the shorter journey.

The lock replaces an older lock that leaked badly. A small ceremony marked the day."""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        (
            "Dr. Lee met Mr. Ng at 3.5 km, e.g. near the bridge. They talked.",
            ["Dr. Lee met Mr. Ng at 3.5 km, e.g. near the bridge.", "They talked."],
        ),
        ("Version v2.1.0 shipped. It works.", ["Version v2.1.0 shipped.", "It works."]),
        ("J. R. Smith wrote it. Then he left.", ["J. R. Smith wrote it.", "Then he left."]),
        ('She said "Stop." Then silence.', ['She said "Stop."', "Then silence."]),
        ("It rained (a lot.) We stayed in.", ["It rained (a lot.)", "We stayed in."]),
        ("Wait... What happened?", ["Wait...", "What happened?"]),
        ("Apples, pears, etc. are fruit.", ["Apples, pears, etc. are fruit."]),
        ("We moved to the U.S. The end.", ["We moved to the U.S.", "The end."]),
        ("A line that\nwraps here. Next one.", ["A line that wraps here.", "Next one."]),
        ("Heading\n\nBody text here.", ["Heading", "Body text here."]),
        ("Items:\n- first\n- second\n1. third", ["Items:", "- first", "- second", "1. third"]),
        ("  \n\n ", []),
        ("", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_summarize_is_deterministic() -> None:
    assert summarize(DOC, max_tokens=25) == summarize(DOC, max_tokens=25)
    assert score_sentences(split_sentences(DOC)) == score_sentences(split_sentences(DOC))


@pytest.mark.parametrize("budget", [10, 20, 30, 50, 1000])
def test_budget_respected_and_order_preserved(budget: int) -> None:
    sentences = split_sentences(DOC)
    summary = summarize(DOC, max_tokens=budget)
    picked = split_sentences(summary)
    assert picked
    assert all(s in sentences for s in picked)
    positions = [sentences.index(s) for s in picked]
    assert positions == sorted(positions)
    if len(picked) > 1:
        assert count_tokens(summary) <= budget


def test_at_least_one_sentence_even_when_nothing_fits() -> None:
    summary = summarize(DOC, max_tokens=1)
    assert summary in split_sentences(DOC)
    assert summarize("no punctuation and only stop words", max_tokens=0) != ""
    assert summarize("a the of", max_tokens=5) == "a the of"


def test_empty_document_gives_empty_summary() -> None:
    assert summarize("", max_tokens=10) == ""
    assert summarize(" \n ", max_tokens=10) == ""


def test_top_scored_sentence_is_picked() -> None:
    # "lock" is the document's main term; the middle sentence is about nothing else.
    sentences = [
        "Weather was mild and dry for most of the afternoon today.",
        "The lock keeper checked the lock gates, lock chamber and lock sluices.",
        "Visitors bought coffee and sandwiches at the little kiosk nearby.",
        "Nobody expected the lock to need repairs this soon, said the keeper.",
    ]
    scores = score_sentences(sentences)
    best = max(range(len(sentences)), key=lambda i: scores[i])
    assert best == 1
    budget = count_tokens(sentences[1])
    assert select_sentences(sentences, scores, max_tokens=budget) == [1]
    assert summarize(" ".join(sentences), max_tokens=budget) == sentences[1]


def test_position_bonus_breaks_even_scores() -> None:
    sentences = ["Boats pass the lock gates slowly.", "Boats pass the lock gates slowly."]
    first, second = score_sentences(sentences)
    assert first > second


def test_fragments_and_headings_score_low() -> None:
    sentences = ["Lock", "The lock gates open when the lock chamber is full of water."]
    heading, body = score_sentences(sentences)
    assert heading < body


def test_content_words_drop_stop_words() -> None:
    assert content_words("The keeper and the lock, it is old!") == ["keeper", "lock", "old"]


@pytest.mark.parametrize(
    "text",
    ["", "Hello, world!", "  leading\tand trailing  \n", "x" * 40, "naïve café—ok?  ", "a\n\nb"],
)
def test_tokenize_round_trips(text: str) -> None:
    pieces = tokenize(text)
    assert "".join(pieces) == text
    assert count_tokens(text) == len(pieces)
    assert all(pieces)


def test_tokenize_pieces_keep_leading_whitespace() -> None:
    assert tokenize("Hello, big world.") == ["Hello", ",", " big", " world", "."]
    assert truncate("Hello, big world.", 3) == "Hello, big"
    assert truncate("Hello", 0) == ""


def test_sample_documents_are_bundled() -> None:
    docs = sample_documents()
    assert len(docs) >= 6
    assert [name for name, _ in docs] == sorted(name for name, _ in docs)
    for name, text in docs:
        assert name.endswith(".txt")
        assert 250 <= len(text.split()) <= 700, name
        summary = summarize(text, max_tokens=60)
        assert 0 < count_tokens(summary) <= 60, name
        assert set(split_sentences(summary)) <= set(split_sentences(text)), name
