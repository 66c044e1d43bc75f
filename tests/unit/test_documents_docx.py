"""Word files into text (plumbing/documents/word.py): headings as Markdown, paragraphs a
blank line apart, tables as rows; zip bombs refused by their declared sizes before anything
is unpacked; whatever else is not a .docx is a corrupt file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx
import pytest

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.extract import extract
from plumbing.documents.limits import MIB, DocumentLimits
from tests.support import documents as make

LIMITS = DocumentLimits(max_text_bytes=262_144)


def reason(data: bytes, limits: DocumentLimits = LIMITS) -> UnreadableDocument:
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "minutes.docx", limits)
    return refused.value


def test_a_word_file_keeps_its_headings_paragraphs_and_tables(tmp_path: Path) -> None:
    data = make.word_document(tmp_path / "minutes.docx").read_bytes()
    blocks = extract(data, "minutes.docx", LIMITS).split("\n\n")
    assert blocks[:2] == ["# Minutes of the gate committee", "# Attendance"]
    assert "## Costs" in blocks
    assert "Order new hinges before May." in blocks
    assert "Item | Cost\nHinges | 420 pounds" in blocks
    assert all(block.strip() == block and block for block in blocks)  # no empty paragraph
    paragraphs = [b for b in blocks if not b.startswith("#") and len(b) > 100]
    assert len(paragraphs) == 4


def test_a_zip_bomb_is_refused_by_its_declared_size(tmp_path: Path) -> None:
    """256 MiB of zeros in a zip of well under a megabyte: over the default limit."""
    path = make.docx_zip_bomb(tmp_path / "bomb.docx")
    assert path.stat().st_size < MIB
    refused = reason(path.read_bytes())
    assert refused.code == "zip_bomb"
    assert "268,435," in refused.message  # the declared size, read before any unpacking


def test_a_part_packed_too_tightly_is_a_zip_bomb(tmp_path: Path) -> None:
    data = make.docx_zip_bomb(tmp_path / "bomb.docx", unpacked_bytes=4 * MIB).read_bytes()
    refused = reason(data)  # under the total, but 4 MiB of zeros packs a thousand times
    assert refused.code == "zip_bomb"
    assert refused.message.startswith("word/document.xml unpacks ")
    small = DocumentLimits(max_unzipped_bytes=2 * MIB, max_zip_ratio=10**9)
    assert reason(data, small).code == "zip_bomb"


def test_what_is_not_a_docx_is_a_corrupt_file(tmp_path: Path) -> None:
    good = make.word_document(tmp_path / "minutes.docx").read_bytes()
    no_document = io.BytesIO()
    with zipfile.ZipFile(no_document, "w") as archive:
        archive.writestr("hello.txt", "a zip, not a Word file")
    cases = {
        "text": b"Minutes of the meeting, typed in a text editor",
        "a zip cut short": good[: len(good) // 2],
        "a zip without a document": no_document.getvalue(),
        "a zip with damaged parts": good[:200] + bytes(300) + good[500:],
    }
    for what, data in cases.items():
        assert reason(data).code == "corrupt_file", what


def test_a_legacy_or_protected_word_file_says_what_it_is() -> None:
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504)
    refused = reason(ole)
    assert refused.code == "corrupt_file"
    assert "Word 97-2003" in refused.message


def test_a_word_file_without_text_is_empty(tmp_path: Path) -> None:
    document = docx.Document()
    document.add_paragraph("   ")
    document.save(str(tmp_path / "blank.docx"))
    assert reason((tmp_path / "blank.docx").read_bytes()).code == "empty"
