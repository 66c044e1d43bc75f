"""A Word document's (.docx) text, by python-docx: its body's paragraphs and tables in
order, a blank line between paragraphs, headings as Markdown ``#`` lines and a table's rows
as lines of cells. Page headers and footers are left out.

A .docx is a zip. Its declared sizes are checked before python-docx unpacks anything: the
parts together at most ``max_unzipped_bytes``, none packed more tightly than
``max_zip_ratio``. The declared sizes hold: Python's zipfile stops a part at its declared
size and checks its CRC, so a part that lies about its size is a damaged file."""

from __future__ import annotations

import io
import zipfile

import docx
from docx.table import Table

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import MIB, DocumentLimits, size_text

# A part smaller than this may be packed as tightly as it likes: a small style sheet of
# repeated markup packs well and is harmless.
RATIO_FROM_BYTES = MIB
# A Word 97-2003 .doc, and a password-protected .docx, are OLE compound files.
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def docx_text(data: bytes, limits: DocumentLimits) -> str:
    if data.startswith(OLE_MAGIC):
        raise UnreadableDocument(
            "corrupt_file",
            "not a .docx: a Word 97-2003 document or a password-protected one",
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            _check_sizes(archive.infolist(), limits)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError):
        raise UnreadableDocument("corrupt_file", "not a .docx: not a zip file") from None
    try:
        return _text(data)
    except UnreadableDocument:
        raise
    except Exception as exc:  # python-docx on a damaged file: any error is the file's
        said = str(exc).strip() or type(exc).__name__
        raise UnreadableDocument("corrupt_file", f"a damaged .docx: {said}") from None


def _check_sizes(parts: list[zipfile.ZipInfo], limits: DocumentLimits) -> None:
    total = sum(part.file_size for part in parts)
    if total > limits.max_unzipped_bytes:
        raise UnreadableDocument(
            "zip_bomb",
            f"its parts unpack to {total:,} bytes, over the limit of "
            f"{size_text(limits.max_unzipped_bytes)}",
        )
    for part in parts:
        if part.file_size < RATIO_FROM_BYTES:
            continue
        ratio = part.file_size / max(part.compress_size, 1)
        if ratio > limits.max_zip_ratio:
            raise UnreadableDocument(
                "zip_bomb",
                f"{part.filename} unpacks {ratio:,.0f} times its packed size, over the limit "
                f"of {limits.max_zip_ratio:,.0f}",
            )


def _text(data: bytes) -> str:
    document = docx.Document(io.BytesIO(data))
    blocks: list[str] = []
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            rows = (" | ".join(c.text.strip() for c in row.cells) for row in item.rows)
            block = "\n".join(row for row in rows if row.strip(" |"))
        else:
            block = _heading(item.style.name if item.style else None, item.text.strip())
        if block.strip():
            blocks.append(block)
    if not blocks:
        raise UnreadableDocument("empty", "a Word document without text")
    return "\n\n".join(blocks)


def _heading(style: str | None, text: str) -> str:
    """A heading paragraph as a Markdown heading (``Title`` is level 1, ``Heading 2`` is
    ``##``); any other paragraph as it is."""
    if not text or style is None:
        return text
    if style == "Title":
        return f"# {text}"
    level = style.removeprefix("Heading ")
    if level != style and level.isdigit():
        return f"{'#' * min(int(level), 6)} {text}"
    return text
