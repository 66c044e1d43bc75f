"""An upload counted as its chunks arrive (any JSONL is taken, up to the size and line
limits), and its lines checked in its batch (``validating``): splitting across chunks,
OpenAI Batch request lines, the bad lines named by number as OpenAI's errors.data.

Issue 31 changes the requirement: a bad line used to refuse the upload (400
invalid_batch_line / invalid_jsonl); now the upload is taken and the same rules fail the
batch made from it, so the rule tests below check the batch's validation."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest

from plumbing.settings import Settings
from producers.batches.input import FileValidation, RequestChecker
from producers.files.checks import LineSplitter, UploadCheck, json_line
from schemas.batches import InvalidJsonl
from schemas.errors import PayloadTooLarge


def request(custom_id: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if url == "/v1/completions":
        body = {"model": "m", "prompt": "hi"}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(*values: object) -> bytes:
    return "".join(json.dumps(v) + "\n" for v in values).encode()


def check(data: bytes, *, chunk: int = 7, max_bytes: int = 10**9, max_lines: int = 100) -> int:
    checker = UploadCheck(max_bytes=max_bytes, max_lines=max_lines)
    for start in range(0, len(data), chunk):
        checker.feed(data[start : start + chunk])
    return checker.finish()


def validate(
    data: bytes, *, max_errors: int = 1000, models: tuple[str, ...] = ("m",), max_lines: int = 100
) -> tuple[list[dict[str, Any]], int]:
    """A batch's validation of a stored file: its errors.data and the requests it made."""
    api = Settings(models=list(models), max_batch_requests=max_lines).api
    validation = FileValidation(RequestChecker(api), max_errors=max_errors)
    splitter = LineSplitter()
    made = 0
    for number, line in [*splitter.feed(data), *splitter.end()]:
        if line.strip() and not validation.done:
            made += validation.feed(number, line) is not None
    return validation.errors(), made


def test_the_splitter_numbers_lines_across_chunks() -> None:
    splitter = LineSplitter()
    got = splitter.feed(b"ab") + splitter.feed(b"c\r\n\nd") + splitter.feed(b"e\nf")
    assert got == [(1, b"abc"), (2, b""), (3, b"de")]
    assert splitter.end() == [(4, b"f")]
    assert splitter.end() == []


def test_the_splitter_refuses_a_line_over_its_limit() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    splitter.feed(b"short\n1234")
    with pytest.raises(InvalidJsonl, match="line 2 is longer than 8 bytes"):
        splitter.feed(b"56789")


@pytest.mark.parametrize("chunk", [1, 5, 64, 10_000])
def test_a_good_file_counts_its_request_lines(chunk: int) -> None:
    data = jsonl(request("a"), request("b")) + b"\n  \n" + json.dumps(request("c")).encode()
    assert check(data, chunk=chunk) == 3


def test_any_jsonl_is_taken_at_upload() -> None:
    data = jsonl(request("a"), request("a")) + b"{not json\n" + b'{"custom_id": "\xff"}\n'
    assert check(data) == 4
    assert check(data.decode("latin-1").encode("utf-16")) >= 1  # counted, checked later


def test_a_line_that_is_not_json_is_named() -> None:
    errors, made = validate(jsonl(request("a")) + b"{not json\n" + jsonl(request("c")))
    assert errors == [
        {
            "code": "invalid_json_line",
            "message": "line 2 is not JSON: Expecting property name enclosed in double quotes",
            "param": None,
            "line": 2,
        }
    ]
    assert made == 1  # the lines before it; none is kept once a line is bad
    with pytest.raises(InvalidJsonl, match="line 2 is not JSON"):
        json_line(2, b"{not json")


def test_a_line_that_is_not_utf8_is_named() -> None:
    errors, _ = validate(b'{"custom_id": "\xff"}\n')
    assert errors[0]["line"] == 1
    assert "line 1 is not UTF-8" in errors[0]["message"]


def test_a_file_saved_with_a_byte_order_mark() -> None:
    data = jsonl(request("a"), request("b"))
    assert validate(codecs.BOM_UTF8 + data) == ([], 2)  # UTF-8's, as Windows tools write it
    assert json_line(1, codecs.BOM_UTF8 + b'{"a": 1}') == {"a": 1}
    with pytest.raises(InvalidJsonl, match="line 2 is not JSON"):
        json_line(2, codecs.BOM_UTF8 + b'{"a": 1}')  # only a file's first line starts so
    errors, _ = validate(data.decode().encode("utf-16"))
    assert "line 1 is UTF-16, not UTF-8: save it as UTF-8" in errors[0]["message"]


def test_bad_request_lines_are_listed_by_number() -> None:
    data = jsonl(
        request("a"),
        {**request("b"), "method": "GET"},
        request("a"),
        request("d", url="/v1/completions"),
        {**request("e"), "url": "/v1/embeddings"},
        [1, 2],
        {**request("g"), "body": {"model": "nope", "messages": [{"role": "u", "content": "x"}]}},
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
    )
    errors, _ = validate(data)
    assert [(e["line"], e["code"], e["param"]) for e in errors] == [
        (2, "invalid_request", "method"),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "mixed_urls", "url"),
        (5, "invalid_request", "url"),
        (6, "invalid_request", ""),
        (7, "model_not_found", "body.model"),
        (8, "invalid_request", "custom_id"),
    ]
    assert "`nope` does not exist" in errors[5]["message"]


def test_a_body_that_does_not_fit_its_url_is_named() -> None:
    bad = {**request("a"), "body": {"model": "m"}}  # a chat line without messages
    errors, made = validate(jsonl(bad))
    assert (errors[0]["line"], errors[0]["code"], made) == (1, "invalid_request", 0)
    assert "messages" in errors[0]["message"]


def test_the_errors_are_capped() -> None:
    errors, _ = validate(jsonl(*({"custom_id": f"r{i}"} for i in range(30))), max_errors=20)
    assert len(errors) == 20
    assert errors[-1]["line"] == 20


def test_an_empty_file_fails_its_batch() -> None:
    assert check(b"\n \n") == 0  # taken at upload
    errors, made = validate(b"\n \n")
    assert (errors, made) == (
        [
            {
                "code": "empty_file",
                "message": "the file holds no request lines",
                "param": None,
                "line": None,
            }
        ],
        0,
    )


def test_a_batch_holds_at_most_max_batch_requests() -> None:
    errors, _ = validate(jsonl(*(request(f"r{i}") for i in range(4))), max_lines=3)
    assert [(e["line"], e["code"]) for e in errors] == [(4, "too_many_requests")]


def test_the_line_limit_counts_request_lines_only() -> None:
    data = jsonl(request("a"), request("b")) + b"\n\n"
    assert check(data, max_lines=2) == 2
    with pytest.raises(PayloadTooLarge, match="at most 2 request lines; line 5"):
        check(data + jsonl(request("c")), max_lines=2)


def test_the_size_limit_is_checked_as_the_chunks_arrive() -> None:
    data = jsonl(request("a"), request("b"))
    assert check(data, max_bytes=len(data)) == 2
    checker = UploadCheck(max_bytes=len(data) - 1, max_lines=100)
    checker.feed(data[:10])
    with pytest.raises(PayloadTooLarge, match=f"at most {len(data) - 1} bytes"):
        checker.feed(data[10:])
