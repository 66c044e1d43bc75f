"""PDFs into text (plumbing/documents/pdf.py): the text layer page by page, and a stable
reason for every PDF that cannot be read, never a traceback nor a log line."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.extract import extract
from plumbing.documents.limits import DocumentLimits
from tests.support import documents as make

LIMITS = DocumentLimits(max_text_bytes=262_144)


def reason(data: bytes, name: str = "doc.pdf", limits: DocumentLimits = LIMITS) -> str:
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, name, limits)
    return refused.value.code


def test_a_pdf_s_pages_are_its_text_a_blank_line_apart(tmp_path: Path) -> None:
    data = make.text_pdf(tmp_path / "report.pdf", pages=3).read_bytes()
    text = extract(data, "report.pdf", LIMITS)
    pages = text.split("\n\n")
    assert [page.splitlines()[0] for page in pages] == [
        "Chapter 1: the gate",
        "Chapter 2: the gate",
        "Chapter 3: the gate",
    ]
    assert all(len(page) > 200 for page in pages)
    assert extract(data, "REPORT.PDF", LIMITS) == text  # the suffix in any case


def test_an_encrypted_pdf_is_encrypted_pdf(tmp_path: Path) -> None:
    data = make.encrypted_pdf(tmp_path / "secret.pdf").read_bytes()
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "secret.pdf", LIMITS)
    assert refused.value.code == "encrypted_pdf"
    assert refused.value.status == 422
    assert "password" in refused.value.message


def test_a_pdf_encrypted_without_a_user_password_is_read() -> None:
    """Encrypted only to restrict printing or copying: any reader opens it."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make.pdf_bytes(1))))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    assert extract(out.getvalue(), "open.pdf", LIMITS).startswith("Chapter 1: the gate")


def test_a_scan_has_no_text_layer(tmp_path: Path) -> None:
    data = make.scanned_pdf(tmp_path / "scan.pdf", pages=2).read_bytes()
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "scan.pdf", LIMITS)
    assert refused.value.code == "no_text_layer"
    assert refused.value.message.startswith("2 pages without text")


def test_damaged_pdfs_are_corrupt_files_and_log_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = make.pdf_bytes(2)
    damaged = {
        "no header": b"Hello, this is not a PDF at all",
        "a header and junk": b"%PDF-1.7\n" + bytes(range(256)) * 4,
        "the middle of a PDF": make.corrupt_pdf(tmp_path / "bad.pdf").read_bytes(),
        "cut short": good[: len(good) // 2],
        "a header only": b"%PDF-1.4\n",
        "its objects shuffled": good[:9] + good[len(good) // 2 :] + good[9 : len(good) // 2],
    }
    caplog.set_level(logging.DEBUG)
    for what, data in damaged.items():
        assert reason(data) == "corrupt_file", what
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_pdf_that_does_not_start_as_one_says_so() -> None:
    with pytest.raises(UnreadableDocument, match="not a PDF: no %PDF header"):
        extract(b"PK\x03\x04 a zip named .pdf", "a.pdf", LIMITS)


def test_a_pdf_over_its_page_limit_is_too_many_pages() -> None:
    data = make.pdf_bytes(3)
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "long.pdf", DocumentLimits(max_pdf_pages=2))
    assert refused.value.code == "too_many_pages"
    assert refused.value.message == "3 pages, over the limit of 2 per PDF"
    assert extract(data, "long.pdf", DocumentLimits(max_pdf_pages=3))


def test_a_pdf_whose_text_is_over_the_limit_stops_being_read() -> None:
    data = make.pdf_bytes(5)
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "long.pdf", DocumentLimits(max_text_bytes=1500))
    assert refused.value.code == "too_large"
    assert refused.value.status == 413
    assert "of 5" in refused.value.message


def test_a_pdf_file_over_the_size_limit_is_too_large() -> None:
    data = make.pdf_bytes(2)
    assert reason(data, limits=DocumentLimits(max_bytes=len(data) - 1)) == "too_large"
