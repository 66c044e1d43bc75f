"""What a document may be: the limits that ``plumbing.documents.extract`` checks before and
while it reads one. The settings group ``plumbing.settings.documents`` has one setting each,
with these defaults."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1_048_576
MAX_BYTES = 32 * MIB
MAX_PDF_PAGES = 1000
MAX_UNZIPPED_BYTES = 128 * MIB
MAX_ZIP_RATIO = 200.0


@dataclass(frozen=True, kw_only=True)
class DocumentLimits:
    """``max_bytes``: the file; ``max_pdf_pages``: a PDF's pages; ``max_unzipped_bytes``:
    the parts of a .docx together, as its zip declares them; ``max_zip_ratio``: the most a
    part may be packed (its size over its packed size); ``max_text_bytes``: the text (UTF-8),
    None for no limit."""

    max_bytes: int = MAX_BYTES
    max_pdf_pages: int = MAX_PDF_PAGES
    max_unzipped_bytes: int = MAX_UNZIPPED_BYTES
    max_zip_ratio: float = MAX_ZIP_RATIO
    max_text_bytes: int | None = None


def size_text(size: int) -> str:
    """``262,144 (256 KiB)``: a size in bytes, and in MiB, KiB or bytes."""
    if size >= MIB:
        return f"{size:,} ({size / MIB:,.0f} MiB)"
    if size >= 1024:
        return f"{size:,} ({size / 1024:,.0f} KiB)"
    return f"{size:,} ({size} bytes)"
