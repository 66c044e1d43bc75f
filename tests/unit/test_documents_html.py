"""Web pages into text (plumbing/documents/webpage.py): the article, its headings as
Markdown and its paragraphs a blank line apart; never the navigation, header, footer, cookie
banner or scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.extract import extract
from plumbing.documents.limits import DocumentLimits
from tests.support import documents as make

LIMITS = DocumentLimits(max_text_bytes=262_144)


def test_a_page_is_its_article_without_navigation_or_footer(tmp_path: Path) -> None:
    data = make.web_page(tmp_path / "gate.html").read_bytes()
    text = extract(data, "gate.html", LIMITS)
    for token in make.BOILERPLATE_TOKENS:
        assert token not in text
    for junk in ("Accept all", "Privacy", "History", "window.tracker"):
        assert junk not in text
    blocks = text.split("\n\n")
    assert blocks[0] == f"# {make.ARTICLE_HEADING}"
    assert "## Opening the gate" in blocks
    for phrase in make.ARTICLE_PHRASES:
        assert sum(phrase in block for block in blocks) == 1, phrase
    assert extract(data, "gate.htm", LIMITS) == text


def test_a_page_in_its_own_encoding_is_read_by_its_meta_charset() -> None:
    page = make.WEB_PAGE.replace('charset="utf-8"', 'charset="windows-1252"')
    page = page.replace("miller's family", "miller\u2019s family, caf\xe9")
    text = extract(page.encode("cp1252"), "gate.html", LIMITS)
    assert "miller\u2019s family, caf\xe9" in text


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"<html><head><title>x</title></head><body></body></html>", "blank"),
        (b"<html><body><script>var a = 1;</script></body></html>", "blank"),
        (bytes(range(256)) * 8, "blank"),
        (b"\x1f\x8b\x08" + bytes(64), "blank"),  # gzip's magic and junk: nothing to unpack
    ],
)
def test_a_page_without_content_says_so(data: bytes, code: str) -> None:
    with pytest.raises(UnreadableDocument) as refused:
        extract(data, "page.html", LIMITS)
    assert refused.value.code == code


def test_a_short_page_is_still_read() -> None:
    page = b"<html><body><nav>Home</nav><p>The gate opens at dawn.</p></body></html>"
    assert extract(page, "short.html", LIMITS) == "The gate opens at dawn."
