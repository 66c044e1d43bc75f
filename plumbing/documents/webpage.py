"""A web page's main content, by trafilatura: the article without its navigation, header,
footer, cookie banner, scripts or comments; headings as Markdown ``#`` lines, paragraphs
and list items as their own lines, a blank line between blocks.

The page's encoding is taken as text files' is (UTF-8, or UTF-16 with its BOM, or the
encoding given); a page in another encoding goes to trafilatura as bytes, which reads its
``<meta charset>``."""

from __future__ import annotations

from functools import cache
from typing import Any

import trafilatura
from trafilatura.settings import use_config

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import DocumentLimits
from plumbing.documents.text import decode


@cache
def _config(max_bytes: int) -> Any:
    config = use_config()
    # Any main content is the document, however short (trafilatura's default wants 250
    # characters before it trusts what it found, and else falls back to its other readers).
    config.set("DEFAULT", "MIN_EXTRACTED_SIZE", "1")
    # Its size limit is the file's: trafilatura also unpacks a page given as compressed bytes
    # up to it.
    config.set("DEFAULT", "MAX_FILE_SIZE", str(max_bytes))
    return config


def html_text(data: bytes, limits: DocumentLimits, encoding: str | None = None) -> str:
    if not data.strip():
        raise UnreadableDocument("empty", "the file is empty")
    page: str | bytes
    try:
        page = decode(data, encoding)
    except UnicodeDecodeError:
        page = data
    try:
        text = trafilatura.extract(
            page,
            output_format="markdown",
            include_comments=False,
            include_tables=True,
            include_images=False,
            include_links=False,
            config=_config(limits.max_bytes),
        )
    except Exception as exc:  # trafilatura (lxml) on what is not a page
        said = str(exc).strip() or type(exc).__name__
        raise UnreadableDocument("corrupt_file", f"not a readable HTML page: {said}") from None
    if not text or not text.strip():
        raise UnreadableDocument("blank", "an HTML page without main content")
    return text
