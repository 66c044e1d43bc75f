"""The pure parts of `sluicegate summarize`: what becomes the batch, and resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producers.summarize import InputError, Resume, Written, build_requests, digest, written


def test_a_directory_becomes_one_request_per_document(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("beta")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path / "skip.pdf").write_bytes(b"%PDF")
    requests = build_requests(tmp_path, max_tokens=64)
    assert [r["custom_id"] for r in requests] == ["b.md", "sub/a.txt"]
    assert requests[1]["body"] == {"input": "alpha", "max_tokens": 64}
    assert {r["method"] for r in requests} == {"POST"}


def test_a_jsonl_file_is_taken_as_is_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "in.jsonl"
    lines = [{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}]
    good.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert build_requests(good, max_tokens=1) == lines

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        build_requests(bad, max_tokens=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no \.txt or \.md"):
        build_requests(empty, max_tokens=1)


def test_the_same_input_has_the_same_digest(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    once = digest(build_requests(tmp_path, max_tokens=64), "30m")
    assert once == digest(build_requests(tmp_path, max_tokens=64), "30m")
    assert once != digest(build_requests(tmp_path, max_tokens=65), "30m")
    assert once != digest(build_requests(tmp_path, max_tokens=64), "1h")


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
