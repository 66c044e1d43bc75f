"""Text, Markdown and reStructuredText files (plumbing/documents/text.py), the kinds by
suffix, and every reason's code and status; garbage under any suffix is a reason, never an
exception of a parser."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from plumbing.documents.errors import REASONS, UnreadableDocument
from plumbing.documents.extract import SUFFIXES, Kind, extract, kind_of
from plumbing.documents.limits import DocumentLimits
from tests.support import documents as make

LIMITS = DocumentLimits(max_text_bytes=262_144)


def refused(data: bytes, name: str, **given: object) -> UnreadableDocument:
    with pytest.raises(UnreadableDocument) as caught:
        extract(data, name, given.pop("limits", LIMITS), **given)  # type: ignore[arg-type]
    return caught.value


def test_markdown_and_rst_are_read_as_they_are_written(tmp_path: Path) -> None:
    note = make.markdown_note(tmp_path / "note.md").read_bytes()
    rst = make.rst_file(tmp_path / "procedures.rst").read_bytes()
    assert extract(note, "note.md", LIMITS) == make.MARKDOWN_NOTE
    assert extract(note, "note.markdown", LIMITS) == make.MARKDOWN_NOTE
    assert extract(rst, "procedures.rst", LIMITS) == make.RST_TEXT


def test_text_in_odd_encodings(tmp_path: Path) -> None:
    texts = make.odd_text_files(tmp_path)
    read = {}
    for name in texts:
        try:
            read[name] = extract((tmp_path / name).read_bytes(), name, LIMITS)
        except UnreadableDocument as exc:
            read[name] = exc.code
    assert read == {
        "bom.txt": texts["bom.txt"],
        "notepad.txt": texts["notepad.txt"],
        "big-endian.text": texts["big-endian.text"],
        "latin1.txt": "undecodable",
        "wide.txt": "binary",
    }
    latin1 = (tmp_path / "latin1.txt").read_bytes()
    assert refused(latin1, "latin1.txt").message == "not UTF-8: byte 0xe9 at offset 3"
    assert extract(latin1, "latin1.txt", LIMITS, encoding="latin-1") == texts["latin1.txt"]
    wide = (tmp_path / "wide.txt").read_bytes()
    assert extract(wide, "wide.txt", LIMITS, encoding="utf-16-le") == texts["wide.txt"]


def test_the_kind_is_the_suffix_s() -> None:
    assert set(SUFFIXES) == {
        ".pdf",
        ".docx",
        ".html",
        ".htm",
        ".md",
        ".markdown",
        ".rst",
        ".txt",
        ".text",
    }
    assert kind_of("notes/A.MD") is Kind.MARKDOWN
    assert kind_of("C:\\docs\\report.Pdf") is Kind.PDF
    assert kind_of("README") is None
    assert kind_of("data.json") is None
    assert kind_of("old.doc") is None


def test_every_reason_has_its_code_and_status(tmp_path: Path) -> None:
    seen = {
        "unsupported_format": refused(b"{}", "data.json"),
        "too_large": refused(b"x" * 2048, "a.txt", limits=DocumentLimits(max_bytes=1024)),
        "too_many_pages": refused(
            make.pdf_bytes(2), "a.pdf", limits=DocumentLimits(max_pdf_pages=1)
        ),
        "zip_bomb": refused(
            make.docx_zip_bomb(tmp_path / "b.docx", 2 * 1_048_576).read_bytes(), "b.docx"
        ),
        "corrupt_file": refused(b"not a zip", "a.docx"),
        "encrypted_pdf": refused(make.encrypted_pdf(tmp_path / "e.pdf").read_bytes(), "e.pdf"),
        "no_text_layer": refused(make.scanned_pdf(tmp_path / "s.pdf").read_bytes(), "s.pdf"),
        "undecodable": refused(b"caf\xe9", "a.txt"),
        "binary": refused(b"\x89PNG\x00\x00", "a.md"),
        "empty": refused(b"", "a.rst"),
        "blank": refused(b" \n\t\n", "a.txt"),
    }
    assert set(seen) == set(REASONS)
    for code, error in seen.items():
        assert error.code == code
        assert error.status == REASONS[code].status
        assert error.message
    assert {c for c, m in REASONS.items() if m.status != 422} == {"unsupported_format", "too_large"}
    assert seen["unsupported_format"].status == 415
    assert seen["unsupported_format"].message.startswith("a .json file: only PDF, Word")
    assert refused(b"x", "README").message.startswith("a file without a suffix: only")


def test_text_over_the_limit_is_too_large() -> None:
    error = refused(b"x" * 2000, "a.txt", limits=DocumentLimits(max_text_bytes=1024))
    assert error.code == "too_large"
    assert error.message == "2,000 bytes of text, over the limit of 1,024 (1 KiB) per document"


@pytest.mark.parametrize("suffix", sorted(SUFFIXES))
def test_garbage_under_any_suffix_is_a_reason_never_an_exception(suffix: str) -> None:
    rng = random.Random(suffix)
    heads = [b"", b"%PDF-1.4\n", b"PK\x03\x04", b"<html>", b"\xef\xbb\xbf", b"\xff\xfe"]
    codes = []
    for head in heads:
        for size in (0, 1, 17, 600):
            data = head + rng.randbytes(size)
            codes.append(_code_of(data, f"garbage{suffix}"))
    assert set(codes) <= {*REASONS, "read"}


def _code_of(data: bytes, name: str) -> str:
    try:
        extract(data, name, LIMITS)
    except UnreadableDocument as exc:
        return exc.code
    return "read"
