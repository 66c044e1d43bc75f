"""Settings of document reading (``plumbing.documents``): what a file may be, and how many
the API reads at once."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from plumbing.documents.limits import (
    MAX_BYTES,
    MAX_PDF_PAGES,
    MAX_UNZIPPED_BYTES,
    MAX_ZIP_RATIO,
    DocumentLimits,
)
from plumbing.settings.base import SettingsGroup


class DocumentSettings(SettingsGroup):
    """Documents read from their files (PDF, Word, HTML, Markdown, reStructuredText, text):
    a file of `sluicegate summarize`, an upload of `POST /v1/documents` (docs/documents.md)."""

    title: ClassVar[str] = "Documents"
    path: ClassVar[str] = "documents"

    document_max_bytes: int = Field(
        default=MAX_BYTES,
        ge=1024,
        description="Largest document file read, in bytes: `too_large` otherwise (an upload "
        "to `POST /v1/documents` over it is refused before it is read, 413). Its text is "
        "also under `max_input_bytes`.",
    )
    document_max_pdf_pages: int = Field(
        default=MAX_PDF_PAGES,
        ge=1,
        description="Most pages a PDF may have (`too_many_pages` otherwise).",
    )
    document_max_unzipped_bytes: int = Field(
        default=MAX_UNZIPPED_BYTES,
        ge=1024,
        description="Most bytes a .docx's parts may unpack to together, as its zip declares "
        "them before anything is unpacked (`zip_bomb` otherwise).",
    )
    document_max_zip_ratio: float = Field(
        default=MAX_ZIP_RATIO,
        gt=1,
        description="Most times its packed size a part of a .docx of 1 MiB or more may "
        "unpack to (`zip_bomb` otherwise).",
    )
    document_extractions: int = Field(
        default=4,
        ge=1,
        description="Documents the API reads at once, each in a thread of its own; an "
        "upload that finds them all busy is answered 503 `documents_busy` with Retry-After.",
    )

    def limits(self, *, max_text_bytes: int | None = None) -> DocumentLimits:
        """The limits a document is read under; ``max_text_bytes``: its text's."""
        return DocumentLimits(
            max_bytes=self.document_max_bytes,
            max_pdf_pages=self.document_max_pdf_pages,
            max_unzipped_bytes=self.document_max_unzipped_bytes,
            max_zip_ratio=self.document_max_zip_ratio,
            max_text_bytes=max_text_bytes,
        )
