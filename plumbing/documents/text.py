"""Text files (plain, Markdown, reStructuredText): their bytes into text by the decoding
rules, and the checks every document's text passes.

Text is UTF-8 (a byte-order mark is dropped) or UTF-16 with its byte-order mark; any other
bytes are ``undecodable`` unless an ``encoding`` is given, because a wrong guess would be
summarized as garbage without a word. The encoding is for those files only: a file that is
valid UTF-8, or UTF-16 with a BOM, is read as that whatever ``encoding`` says.
"""

from __future__ import annotations

import codecs

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import size_text

BINARY = "holds NUL bytes: a binary file, not text"
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def text_of(data: bytes, encoding: str | None = None) -> str:
    """The text of a text file, or why it has none (``empty``, ``binary``,
    ``undecodable``)."""
    if not data:
        raise UnreadableDocument("empty", "the file is empty")
    utf16 = data.startswith(_UTF16_BOMS)
    if b"\x00" in data and not utf16 and encoding is None:
        raise UnreadableDocument("binary", BINARY)
    try:
        text = decode(data, encoding)
    except UnicodeDecodeError as exc:
        raise UnreadableDocument("undecodable", undecodable_message(exc, encoding)) from None
    if "\x00" in text:
        raise UnreadableDocument("binary", BINARY)
    return text


def decode(data: bytes, encoding: str | None = None) -> str:
    """The text of a file: UTF-16 when it starts with its BOM, else UTF-8 when it is valid
    UTF-8, else in ``encoding`` (if one is given). UnicodeDecodeError when none fits."""
    own = "utf-16" if data.startswith(_UTF16_BOMS) else "utf-8-sig"
    try:
        text = data.decode(own)
    except UnicodeDecodeError:
        if encoding is None:
            raise
        return data.decode(encoding)
    if encoding is not None and own != "utf-16" and "\x00" in text:
        return data.decode(encoding)  # NUL bytes: a wide encoding without its BOM (utf-16-le)
    return text


def undecodable_message(exc: UnicodeDecodeError, encoding: str | None) -> str:
    """``not UTF-8: byte 0xe9 at offset 3``."""
    bad = exc.object[exc.start : exc.start + 1].hex()
    return f"not {encoding or 'UTF-8'}: byte 0x{bad} at offset {exc.start}"


def checked(text: str, max_text_bytes: int | None) -> str:
    """``text`` when it holds more than whitespace and is within ``max_text_bytes``."""
    if not text.strip():
        raise UnreadableDocument("blank", "holds only whitespace")
    if max_text_bytes is not None:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > max_text_bytes:
            raise UnreadableDocument(
                "too_large",
                f"{size:,} bytes of text, over the limit of {size_text(max_text_bytes)} "
                "per document",
            )
    return text
