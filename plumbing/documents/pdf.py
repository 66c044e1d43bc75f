"""A PDF's text layer, by pypdf: the pages' text in order, a blank line between pages.

A scan (pages of images, no text) has no text layer and is refused as such: no OCR is done.
pypdf reads damaged files leniently and says what it repaired in log records; those are
silenced here (the file's error, if it has one, is the answer)."""

from __future__ import annotations

import io
import logging

from pypdf import PasswordType, PdfReader

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import DocumentLimits, size_text

# Where a reader finds the header: the specification's readers look in the first 1024 bytes.
HEADER_WITHIN = 1024
# pypdf logs each repair of a broken file as a warning (or an error): not ours to show.
logging.getLogger("pypdf").setLevel(logging.CRITICAL)


def pdf_text(data: bytes, limits: DocumentLimits) -> str:
    if b"%PDF-" not in data[:HEADER_WITHIN]:
        raise UnreadableDocument("corrupt_file", "not a PDF: no %PDF header")
    try:
        return _text(data, limits)
    except UnreadableDocument:
        raise
    except Exception as exc:  # pypdf on a damaged file: any error is the file's
        raise UnreadableDocument("corrupt_file", f"a damaged PDF: {_said(exc)}") from None


def _text(data: bytes, limits: DocumentLimits) -> str:
    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not _opened(reader):
        raise UnreadableDocument("encrypted_pdf", "an encrypted PDF: it needs a password")
    pages = len(reader.pages)
    if pages == 0:
        raise UnreadableDocument("empty", "a PDF without pages")
    if pages > limits.max_pdf_pages:
        raise UnreadableDocument(
            "too_many_pages",
            f"{pages:,} pages, over the limit of {limits.max_pdf_pages:,} per PDF",
        )
    texts: list[str] = []
    size = 0
    for number, page in enumerate(reader.pages, start=1):
        text = page.extract_text().strip()
        if text:
            texts.append(text)
            size += len(text.encode("utf-8", "surrogatepass"))
        if limits.max_text_bytes is not None and size > limits.max_text_bytes:
            raise UnreadableDocument(
                "too_large",
                f"its text is over the limit of {size_text(limits.max_text_bytes)} bytes per "
                f"document by page {number:,} of {pages:,}",
            )
    if not texts:
        raise UnreadableDocument(
            "no_text_layer",
            f"{pages:,} page{'s' if pages != 1 else ''} without text: a scan? (no OCR is done)",
        )
    return "\n\n".join(texts)


def _opened(reader: PdfReader) -> bool:
    """Whether an encrypted PDF opens without a password (one encrypted only to restrict
    printing or copying has an empty user password)."""
    try:
        return reader.decrypt("") != PasswordType.NOT_DECRYPTED
    except Exception:  # an encryption pypdf cannot undo without an optional package
        return False


def _said(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__
