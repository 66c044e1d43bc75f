"""A long document made by code: sections with headings and paragraphs of varied sentences,
the same for a given seed (no two paragraphs alike, so a summary's extract shows where it
came from). The tests of long documents take it too (``tests/support/long_text.py``)."""

from __future__ import annotations

import random

_SUBJECTS = (
    "The canal authority",
    "The harbour master",
    "Our finance team",
    "The night shift",
    "The review board",
    "Each lock keeper",
    "The regional office",
    "The survey crew",
)
_VERBS = (
    "reported",
    "measured",
    "recorded",
    "questioned",
    "approved",
    "delayed",
    "doubled",
    "replaced",
)
_OBJECTS = (
    "the spring water levels",
    "the cost of the new gates",
    "the traffic through lock {n}",
    "the maintenance budget for year {n}",
    "the staffing plan for section {n}",
    "the silt removed from basin {n}",
    "the repairs on bridge {n}",
    "the tonnage carried in quarter {n}",
)
_TAILS = (
    "after the flood of {n}.",
    "before the winter closure.",
    "at a cost of {n} thousand euros.",
    "with {n} vessels waiting.",
    "despite the complaints of {n} residents.",
    "for the first time since {n}.",
)


def sentence(rng: random.Random) -> str:
    n = rng.randint(2, 1990)
    parts = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS))
    return " ".join(parts).format(n=n)


def long_document(words: int, *, seed: int = 7) -> str:
    """About ``words`` words: sections of three to six paragraphs, each under a heading."""
    rng = random.Random(seed)
    out: list[str] = []
    count = 0
    section = 0
    while count < words:
        section += 1
        out.append(f"## Section {section}: report {rng.randint(100, 999)}")
        for _ in range(rng.randint(3, 6)):
            paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))
            out.append(paragraph)
            count += len(paragraph.split())
    return "\n\n".join(out) + "\n"
