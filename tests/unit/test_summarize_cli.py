"""The pure parts of `sluicegate summarize`: what becomes the batch, and resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.summarize.documents import Skipped
from client.summarize.requests import (
    InputError,
    Resume,
    Written,
    build_requests,
    digest,
    passed_over_text,
    write_skipped,
    written,
)

MAX = 262_144


def test_a_directory_becomes_one_request_per_document(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("beta")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path / "skip.pdf").write_bytes(b"%PDF")
    requests = build_requests(tmp_path, max_tokens=64, max_bytes=MAX).requests
    assert [r["custom_id"] for r in requests] == ["b.md", "sub/a.txt"]
    assert requests[1]["body"] == {"input": "alpha", "max_tokens": 64}
    assert {r["method"] for r in requests} == {"POST"}


def test_a_jsonl_file_is_taken_as_is_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "in.jsonl"
    lines = [{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}]
    good.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert build_requests(good, max_tokens=1, max_bytes=MAX).requests == lines

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        build_requests(bad, max_tokens=1, max_bytes=MAX)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no documents under .*: only PDF, Word"):
        build_requests(empty, max_tokens=1, max_bytes=MAX)


def test_the_same_input_has_the_same_digest(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    once = digest(build_requests(tmp_path, max_tokens=64, max_bytes=MAX).requests, "30m")
    assert once == digest(build_requests(tmp_path, max_tokens=64, max_bytes=MAX).requests, "30m")
    assert once != digest(build_requests(tmp_path, max_tokens=65, max_bytes=MAX).requests, "30m")
    assert once != digest(build_requests(tmp_path, max_tokens=64, max_bytes=MAX).requests, "1h")


def test_resume_keeps_the_batch_and_drops_a_cut_last_line(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    assert Resume.load(out) is None
    Resume(batch_id="b1", digest="d").save(out)
    assert Resume.load(out) == Resume(batch_id="b1", digest="d")

    assert written(out) == Written(frozenset(), None)
    first = json.dumps({"custom_id": "a", "sluicegate": {"job_id": "j1"}}) + "\n"
    second = json.dumps({"custom_id": "b", "sluicegate": {"job_id": "j2"}}) + "\n"
    out.write_text(first + second + '{"custom_id": "c", "resp')
    assert written(out) == Written(frozenset({"a", "b"}), "j2")
    assert out.read_text() == first + second  # ready to append


def test_a_real_folder_reads_what_it_can_and_names_the_rest(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("plain text")
    (tmp_path / "bom.md").write_bytes("\ufeffwith a BOM".encode())
    (tmp_path / "notepad.txt").write_bytes("UTF-16 from Notepad".encode("utf-16"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.md").write_text(" \n\t\n")
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\x00\x00")
    (tmp_path / "huge.txt").write_text("x" * (MAX + 1))
    found = build_requests(tmp_path, max_tokens=8, max_bytes=MAX)
    inputs = {r["custom_id"]: r["body"]["input"] for r in found.requests}
    assert inputs == {
        "bom.md": "with a BOM",
        "good.txt": "plain text",
        "notepad.txt": "UTF-16 from Notepad",
    }
    reasons = {s.name: s.reason for s in found.skipped}
    assert reasons == {
        "blank.md": "blank",
        "empty.txt": "empty",
        "huge.txt": "too_large",
        "image.txt": "binary",
        "latin1.txt": "undecodable",
    }
    messages = {s.name: s.message for s in found.skipped}
    assert "byte 0xe9 at offset 3" in messages["latin1.txt"]
    assert "256 KiB" in messages["huge.txt"]

    legacy = build_requests(tmp_path, max_tokens=8, max_bytes=MAX, encoding="latin-1")
    assert {r["body"]["input"] for r in legacy.requests} >= {"café crème"}


def test_a_jsonl_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/summarize", "body": {}})
    path.write_bytes(good.encode() + b"\n" + b'{"custom_id": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"in\.jsonl:2: not UTF-8 \(byte 0xe9"):
        build_requests(path, max_tokens=1, max_bytes=MAX)


def test_skipped_files_are_listed_beside_the_results(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    skipped = [Skipped("a.txt", "empty", "the file is empty")]
    listed = write_skipped(out, skipped)
    assert listed == tmp_path / "results.skipped.jsonl"
    line = json.loads(listed.read_text())
    assert line == {
        "custom_id": "a.txt",
        "error": {"code": "empty", "message": "the file is empty"},
    }
    assert write_skipped(out, []) is None
    assert not listed.exists()  # a rerun with every file good leaves no stale list


def test_a_damaged_resume_record_or_results_file_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    Resume.path(out).write_text("{not json")
    with pytest.raises(InputError, match="damaged"):
        Resume.load(out)
    out.write_text("hello\n")
    with pytest.raises(InputError, match=r"results\.jsonl:1 is not a result line"):
        written(out)


def test_encoding_is_for_the_files_that_are_not_utf8_or_utf16_with_a_bom(tmp_path: Path) -> None:
    (tmp_path / "utf16.txt").write_bytes("naïve café".encode("utf-16"))  # with its BOM
    (tmp_path / "utf8.txt").write_text("crème brûlée", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("déjà vu".encode("latin-1"))
    (tmp_path / "wide.txt").write_bytes("plain".encode("utf-16-le"))  # no BOM: NUL bytes
    found = build_requests(tmp_path, max_tokens=8, max_bytes=MAX, encoding="latin-1")
    assert found.skipped[0].name == "wide.txt"  # NUL bytes, and latin-1 keeps them: binary
    texts = {r["custom_id"]: r["body"]["input"] for r in found.requests}
    assert texts == {"utf16.txt": "naïve café", "utf8.txt": "crème brûlée", "latin1.txt": "déjà vu"}
    wide = build_requests(tmp_path / "wide.txt", max_tokens=8, max_bytes=MAX, encoding="utf-16-le")
    assert wide.requests[0]["body"]["input"] == "plain"
    # Without --encoding the Latin-1 file is skipped, the others read the same.
    plain = build_requests(tmp_path, max_tokens=8, max_bytes=MAX)
    assert {s.name: s.reason for s in plain.skipped} == {
        "latin1.txt": "undecodable",
        "wide.txt": "binary",
    }
    assert {r["custom_id"] for r in plain.requests} == {"utf16.txt", "utf8.txt"}


def test_the_files_passed_over_are_named(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "README").write_text("read me")
    (tmp_path / "data.json").write_text("{}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.odt").write_bytes(b"PK\x03\x04")  # OpenDocument: not read
    found = build_requests(tmp_path, max_tokens=8, max_bytes=MAX)
    assert [r["custom_id"] for r in found.requests] == ["a.txt"]
    assert found.passed_over == ["README", "data.json", "docs/notes.odt"]
    assert (
        passed_over_text(found.passed_over) == "3 other files (README, data.json, docs/notes.odt)"
    )
    assert passed_over_text([f"f{i}" for i in range(5)]) == "5 other files (f0, f1, f2, ...)"

    (tmp_path / "a.txt").unlink()
    with pytest.raises(InputError) as refused:
        build_requests(tmp_path, max_tokens=8, max_bytes=MAX)
    assert str(refused.value) == (
        f"no documents under {tmp_path}: only PDF, Word (.docx), HTML, Markdown, "
        "reStructuredText and text files are read; passed over 3 other files (README, "
        "data.json, docs/notes.odt)"
    )


def test_a_resume_record_says_whether_a_new_run_made_it(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    Resume(batch_id="b1", digest="d", new=True).save(out)
    assert Resume.load(out) == Resume(batch_id="b1", digest="d", new=True)
    Resume.path(out).write_text(json.dumps({"batch_id": "b0", "digest": "d"}))  # older record
    assert Resume.load(out) == Resume(batch_id="b0", digest="d", new=False)
