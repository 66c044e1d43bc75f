"""A small word-piece tokenizer shared by the simulator engine and the summarizer.

Each piece is a word (split into chunks of at most ``MAX_PIECE_CHARS`` characters) or a single
punctuation character, carrying the whitespace that precedes it. Whitespace at the very end of
a text is a piece of its own. The pieces therefore cover the text exactly:
``"".join(tokenize(text)) == text`` for every string, so streamed tokens concatenate to the
result text byte for byte.
"""

from __future__ import annotations

import re

MAX_PIECE_CHARS = 12
"""Longer words are split into pieces of this many characters, as word-piece tokenizers do."""

_PIECE = re.compile(rf"\s*(?:\w{{1,{MAX_PIECE_CHARS}}}|[^\w\s])|\s+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into pieces that concatenate back to ``text``."""
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    """The number of pieces ``tokenize`` would return, without building them."""
    return sum(1 for _ in _PIECE.finditer(text))


def truncate(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` made of at most ``max_tokens`` whole pieces."""
    if max_tokens <= 0:
        return ""
    end = 0
    for count, match in enumerate(_PIECE.finditer(text), start=1):
        end = match.end()
        if count == max_tokens:
            break
    return text[:end]
