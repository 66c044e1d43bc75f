"""How a document is cut into chunks and how summaries are grouped into reduces: pure
functions, measured in tokens by a counter the caller gives.

A document is cut on its structure: sections (a heading starts one), then paragraphs (blank
lines), then sentences, then words, so a chunk ends where the text does whenever it can. Each
chunk but the first begins with the last sentences of the one before it (``overlap``), so a
statement cut at a boundary is read whole once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas.jobs import reduce_levels

Count = Callable[[str], int]

_PARAGRAPHS = re.compile(r"\n\s*\n")
_HEADING = re.compile(r"^(#{1,6}\s|[A-Z0-9][^\n]{0,80}\n[=\-~^]{3,}\s*$)")
_SENTENCES = re.compile(r"(?<=[.!?…])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
SEPARATOR = "\n\n"  # between the summaries a reduce combines


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A document's graph as it is cut: its chunks, what one child may take, how many
    summaries one reduce combines, and how many levels that makes (the map included)."""

    chunks: list[str]
    budget_tokens: int
    fan_in: int

    @property
    def levels(self) -> int:
        return 1 + reduce_levels(len(self.chunks), self.fan_in)


def blocks(text: str) -> list[str]:
    """The document's paragraphs (a heading is one), stripped, in order."""
    return [b.strip() for b in _PARAGRAPHS.split(text.replace("\r\n", "\n")) if b.strip()]


def is_heading(block: str) -> bool:
    return bool(_HEADING.match(block)) and "\n" not in block.strip("=-~^ \n").split("\n", 1)[-1]


def sentences(block: str) -> list[str]:
    return [s for s in _SENTENCES.split(block) if s.strip()]


def _words(piece: str, budget: int, count: Count) -> list[str]:
    """A piece with no sentence boundary, cut into runs of words under ``budget``; a run of
    one word over it (no spaces at all) is cut by characters."""
    out: list[str] = []
    current: list[str] = []
    for word in piece.split():
        if current and count(" ".join([*current, word])) > budget:
            out.append(" ".join(current))
            current = []
        current.append(word)
    if current:
        out.append(" ".join(current))
    cut: list[str] = []
    for run in out:
        while count(run) > budget and len(run) > 1:
            size = max(1, len(run) * budget // max(1, count(run)))
            cut.append(run[:size])
            run = run[size:]
        cut.append(run)
    return cut


def units(text: str, budget: int, count: Count) -> list[str]:
    """The document as pieces each under ``budget``: paragraphs whole where they fit, else
    their sentences, else runs of words."""
    out: list[str] = []
    for block in blocks(text):
        if count(block) <= budget:
            out.append(block)
            continue
        for sentence in sentences(block):
            if count(sentence) <= budget:
                out.append(sentence)
            else:
                out.extend(_words(sentence, budget, count))
    return out


def _tail(chunk: str, overlap: int, count: Count) -> str:
    """The last whole sentences of ``chunk`` within ``overlap`` tokens ('' when none)."""
    kept: list[str] = []
    for sentence in reversed(sentences(chunk.rsplit(SEPARATOR, 1)[-1])):
        if count(" ".join([sentence, *kept])) > overlap:
            break
        kept.insert(0, sentence)
    return " ".join(kept)


def pack(pieces: Sequence[str], budget: int, count: Count, *, overlap: int = 0) -> list[str]:
    """Consecutive ``pieces`` joined into chunks of at most ``budget`` tokens. A section
    (a heading and what follows it up to the next) goes whole into the chunk before it when
    it fits there, else opens a chunk of its own, so sections stay together and chunks
    fill; each chunk after the first opens with up to ``overlap`` tokens of the one before,
    unless it opens a section."""
    sizes = [count(piece) + 1 for piece in pieces]
    sections = _sections(pieces, sizes)
    chunks: list[str] = []
    current: list[str] = []
    used = 0
    for piece, size, section in zip(pieces, sizes, sections, strict=True):
        # A section larger than a chunk is cut anyway: it starts a chunk of its own.
        closes = current and (used + size > budget or used + min(section, budget) > budget)
        if closes:
            chunks.append(SEPARATOR.join(current))
            # A new section needs no overlap: it starts where the text does.
            tail = _tail(chunks[-1], overlap, count) if overlap and not is_heading(piece) else ""
            current = [tail] if tail and count(tail) + size <= budget else []
            used = count(tail) + 1 if current else 0
        current.append(piece)
        used += size
    if current:
        chunks.append(SEPARATOR.join(current))
    return chunks


def _sections(pieces: Sequence[str], sizes: Sequence[int]) -> list[int]:
    """For each piece that is a heading, the tokens of its section (it and the pieces up to
    the next heading); 0 for the others."""
    out = [0] * len(pieces)
    start: int | None = None
    for i, piece in enumerate(pieces):
        if is_heading(piece):
            start = i
        if start is not None:
            out[start] += sizes[i]
    return out


def group(tokens: Sequence[int], budget: int, most: int) -> list[list[int]]:
    """The summaries of one level (their tokens, in order) grouped into reduces: runs of
    consecutive ones, at most ``most`` a run and ``budget`` tokens with their separators,
    as few runs as that allows, evened out (10 in three runs: 4, 3, 3, not 4, 4, 2). Any
    two summaries fit one budget (``fan_in``), so a level always shrinks."""
    count = len(tokens)
    need = sum(size + 2 for size in tokens)
    runs = max(math.ceil(count / most), math.ceil(need / max(1, budget)), 1)
    while runs < count:
        sizes = [count // runs + (1 if i < count % runs else 0) for i in range(runs)]
        out: list[list[int]] = []
        start = 0
        for size in sizes:
            out.append(list(range(start, start + size)))
            start += size
        if all(sum(tokens[i] + 2 for i in run) <= budget for run in out):
            return out
        runs += 1
    return [[i] for i in range(count)]
