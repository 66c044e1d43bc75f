"""`sluicegate summarize` on a folder as people keep it (client/summarize/): every kind of
document read, and every file that is not summarized named with its reason in the skipped
list beside the results."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from client.summarize.requests import build_requests
from client.summarize.run import Options, read_input
from plumbing.documents.limits import DocumentLimits
from tests.support import documents as make

MAX = 262_144


def test_the_sample_folder_is_read_whole(tmp_path: Path) -> None:
    names = make.sample_folder(tmp_path)
    found = build_requests(tmp_path, max_tokens=64, max_bytes=MAX)
    assert [r["custom_id"] for r in found.requests] == names
    assert found.skipped == []
    assert found.passed_over == []
    inputs = {r["custom_id"]: r["body"]["input"] for r in found.requests}
    long = inputs["river-gate-records.txt"]
    assert 75_000 <= len(long.encode()) <= 90_000  # about 20,000 tokens
    assert long.count("\n## ") >= 10
    assert len(set(long.split("\n\n"))) > 100  # varied prose, not one paragraph repeated
    assert inputs["annual-report.pdf"].count("Chapter ") == 4
    assert inputs["committee-minutes.docx"].startswith("# Minutes of the gate committee")
    assert inputs["river-gate.html"].startswith(f"# {make.ARTICLE_HEADING}")
    assert not any(token in inputs["river-gate.html"] for token in make.BOILERPLATE_TOKENS)
    assert inputs["note.md"] == make.MARKDOWN_NOTE


def test_the_skipped_list_names_every_file_not_summarized(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    make.sample_folder(folder)
    make.encrypted_pdf(folder / "secret.pdf")
    make.scanned_pdf(folder / "scan.pdf")
    make.corrupt_pdf(folder / "broken.pdf")
    make.docx_zip_bomb(folder / "bomb.docx", unpacked_bytes=4 * 1_048_576)
    (folder / "latin1.txt").write_bytes("Caf\xe9".encode("latin-1"))
    (folder / "empty.md").write_bytes(b"")
    (folder / "README").write_text("read me")
    (folder / "sheet.xlsx").write_bytes(b"PK\x03\x04")
    (folder / "old.doc").write_bytes(b"\xd0\xcf\x11\xe0")
    out = tmp_path / "results.jsonl"
    console = Console(file=io.StringIO(), width=200)
    options = Options(window="1h", out=out, max_tokens=64, max_bytes=MAX, limits=DocumentLimits())

    found = read_input(folder, options, console)

    assert len(found.requests) == 5
    listed = [
        json.loads(line) for line in (tmp_path / "results.skipped.jsonl").read_text().splitlines()
    ]
    reasons = {line["custom_id"]: line["error"]["code"] for line in listed}
    assert reasons == {
        "README": "unsupported_format",
        "bomb.docx": "zip_bomb",
        "broken.pdf": "corrupt_file",
        "empty.md": "empty",
        "latin1.txt": "undecodable",
        "old.doc": "unsupported_format",
        "scan.pdf": "no_text_layer",
        "secret.pdf": "encrypted_pdf",
        "sheet.xlsx": "unsupported_format",
    }
    assert [line["custom_id"] for line in listed] == sorted(reasons)
    assert all(line["error"]["message"] for line in listed)
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert "read 11 files from" in said
    assert "6 skipped" in said
    assert "skipped secret.pdf: an encrypted PDF: it needs a password" in said
    assert "passed over 3 other files (README, old.doc, sheet.xlsx): only PDF, Word" in said
    # Passed over, not skipped: the exit code's "partial" counts the files of a kind read.
    assert [s.name for s in found.skipped] == [
        "bomb.docx",
        "broken.pdf",
        "empty.md",
        "latin1.txt",
        "scan.pdf",
        "secret.pdf",
    ]


def test_a_folder_of_only_other_files_lists_them_too(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "data.json").write_text("{}")
    out = tmp_path / "out" / "results.jsonl"
    out.parent.mkdir()
    options = Options(window="1h", out=out, max_tokens=8, max_bytes=MAX)
    read_input(tmp_path, options, Console(file=io.StringIO()))
    [line] = [
        json.loads(x) for x in (out.parent / "results.skipped.jsonl").read_text().splitlines()
    ]
    assert line == {
        "custom_id": "data.json",
        "error": {
            "code": "unsupported_format",
            "message": "a .json file: only PDF, Word (.docx), HTML, Markdown, "
            "reStructuredText and text files are read",
        },
    }
