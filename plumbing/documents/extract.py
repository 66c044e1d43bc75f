"""A document's text from its bytes, by its kind, which its name's suffix says and its
bytes must bear out. Each kind's parser is imported when the first document of its kind is
read."""

from __future__ import annotations

from enum import StrEnum
from pathlib import PurePath

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import DocumentLimits, size_text
from plumbing.documents.text import checked, text_of


class Kind(StrEnum):
    PDF = "pdf"
    DOCX = "docx"
    HTML = "html"
    MARKDOWN = "markdown"
    RST = "rst"
    TEXT = "text"


SUFFIXES: dict[str, Kind] = {
    ".pdf": Kind.PDF,
    ".docx": Kind.DOCX,
    ".html": Kind.HTML,
    ".htm": Kind.HTML,
    ".md": Kind.MARKDOWN,
    ".markdown": Kind.MARKDOWN,
    ".rst": Kind.RST,
    ".txt": Kind.TEXT,
    ".text": Kind.TEXT,
}
# The kinds read, for messages.
KINDS_TEXT = "PDF, Word (.docx), HTML, Markdown, reStructuredText and text files"


def kind_of(name: str) -> Kind | None:
    """The kind of document a file's name says (None: not one that is read)."""
    return SUFFIXES.get(PurePath(name).suffix.lower())


def extract(data: bytes, name: str, limits: DocumentLimits, *, encoding: str | None = None) -> str:
    """The text of the file ``name`` whose bytes are ``data``: paragraphs apart by a blank
    line, headings on lines of their own. ``encoding``: of text that is neither UTF-8 nor
    UTF-16 with its BOM. UnreadableDocument says why there is none."""
    kind = kind_of(name)
    if kind is None:
        raise unsupported(name)
    if len(data) > limits.max_bytes:
        raise UnreadableDocument(
            "too_large",
            f"the file is {len(data):,} bytes, over the limit of {size_text(limits.max_bytes)} "
            "per file",
        )
    if not data:
        raise UnreadableDocument("empty", "the file is empty")
    return checked(_text(kind, data, limits, encoding), limits.max_text_bytes)


def unsupported(name: str) -> UnreadableDocument:
    """Why the file ``name`` is not read: ``unsupported_format``."""
    suffix = PurePath(name).suffix
    what = f"a {suffix} file" if suffix else "a file without a suffix"
    return UnreadableDocument("unsupported_format", f"{what}: only {KINDS_TEXT} are read")


def _text(kind: Kind, data: bytes, limits: DocumentLimits, encoding: str | None) -> str:
    if kind is Kind.PDF:
        from plumbing.documents.pdf import pdf_text

        return pdf_text(data, limits)
    if kind is Kind.DOCX:
        from plumbing.documents.word import docx_text

        return docx_text(data, limits)
    if kind is Kind.HTML:
        from plumbing.documents.webpage import html_text

        return html_text(data, limits, encoding)
    return text_of(data, encoding)
