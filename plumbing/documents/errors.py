"""Why a document cannot be read: one error type with a stable code (the API answers it as
is; ``sluicegate summarize`` lists it beside the results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.errors import InvalidRequest

Reason = Literal[
    "unsupported_format",
    "too_large",
    "too_many_pages",
    "zip_bomb",
    "corrupt_file",
    "encrypted_pdf",
    "no_text_layer",
    "undecodable",
    "binary",
    "empty",
    "blank",
]


@dataclass(frozen=True, kw_only=True)
class Meaning:
    status: int
    text: str


# Each code's HTTP status and meaning: docs/api.md and docs/documents.md list them.
REASONS: dict[Reason, Meaning] = {
    "unsupported_format": Meaning(
        status=415,
        text="Not a kind of document that is read (by its name's suffix: .pdf, .docx, "
        ".html, .htm, .md, .markdown, .rst, .txt, .text).",
    ),
    "too_large": Meaning(
        status=413,
        text="The file is over `document_max_bytes`, or its text over the text limit "
        "(`max_input_bytes`).",
    ),
    "too_many_pages": Meaning(status=422, text="A PDF of more than `document_max_pdf_pages`."),
    "zip_bomb": Meaning(
        status=422,
        text="A .docx whose parts would unpack to more than `document_max_unzipped_bytes`, "
        "or a part packed more tightly than `document_max_zip_ratio`.",
    ),
    "corrupt_file": Meaning(
        status=422,
        text="The bytes are not what the suffix says (a .pdf without `%PDF`, a .docx that "
        "is not a zip), or its parser could not read them.",
    ),
    "encrypted_pdf": Meaning(status=422, text="A PDF that needs a password to be read."),
    "no_text_layer": Meaning(
        status=422,
        text="A PDF with pages but no text on them: a scan (no OCR is done).",
    ),
    "undecodable": Meaning(
        status=422,
        text="Text that is neither UTF-8 (with or without a BOM) nor UTF-16 with its BOM, "
        "nor in the encoding given.",
    ),
    "binary": Meaning(status=422, text="Text that holds NUL bytes: a binary file."),
    "empty": Meaning(status=422, text="No bytes, or a document with nothing in it."),
    "blank": Meaning(status=422, text="A document whose text is only whitespace."),
}


class UnreadableDocument(InvalidRequest):
    """A document that cannot be read; ``code`` says why (``REASONS``), ``message`` says
    what was found."""

    def __init__(self, code: Reason, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = REASONS[code].status
