"""An upload's lines checked as its chunks arrive: splitting across chunks, OpenAI Batch
request lines, the bad lines named by number, and the size and line limits."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest

from producers.files.checks import BatchFileCheck, LineSplitter, json_line
from schemas.batches import MAX_ERRORS_SHOWN, InvalidJsonl
from schemas.errors import PayloadTooLarge
from schemas.files import InvalidBatchLine


def request(custom_id: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if url == "/v1/completions":
        body = {"model": "m", "prompt": "hi"}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(*values: object) -> bytes:
    return "".join(json.dumps(v) + "\n" for v in values).encode()


def check(data: bytes, *, chunk: int = 7, max_bytes: int = 10**9, max_lines: int = 100) -> int:
    checker = BatchFileCheck(max_bytes=max_bytes, max_lines=max_lines)
    for start in range(0, len(data), chunk):
        checker.feed(data[start : start + chunk])
    return checker.finish()


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


def test_a_line_that_is_not_json_is_named() -> None:
    data = jsonl(request("a")) + b"{not json\n" + jsonl(request("c"))
    with pytest.raises(InvalidJsonl, match="line 2 is not JSON") as caught:
        check(data)
    assert caught.value.details == [{"line": 2}]


def test_a_line_that_is_not_utf8_is_named() -> None:
    with pytest.raises(InvalidJsonl, match="line 1 is not UTF-8"):
        check(b'{"custom_id": "\xff"}\n')


def test_a_file_saved_with_a_byte_order_mark() -> None:
    data = jsonl(request("a"), request("b"))
    assert check(codecs.BOM_UTF8 + data) == 2  # UTF-8's, as Windows tools write it
    assert json_line(1, codecs.BOM_UTF8 + b'{"a": 1}') == {"a": 1}
    with pytest.raises(InvalidJsonl, match="line 2 is not JSON"):
        json_line(2, codecs.BOM_UTF8 + b'{"a": 1}')  # only a file's first line starts so
    with pytest.raises(InvalidJsonl, match="line 1 is UTF-16, not UTF-8: save it as UTF-8"):
        check(data.decode().encode("utf-16"))


def test_bad_request_lines_are_listed_by_number() -> None:
    data = jsonl(
        request("a"),
        {**request("b"), "method": "GET"},
        request("a"),
        request("d", url="/v1/completions"),
        {**request("e"), "url": "/v1/embeddings"},
        [1, 2],
    )
    with pytest.raises(InvalidBatchLine, match=r"^line 2 is not a batch request line") as caught:
        check(data)
    problems = caught.value.details
    assert isinstance(problems, list)
    assert [(p["line"], p["code"]) for p in problems] == [
        (2, "invalid_request"),
        (3, "duplicate_custom_id"),
        (4, "mixed_urls"),
        (5, "invalid_request"),
        (6, "invalid_request"),
    ]
    assert problems[1]["custom_id"] == "a"
    assert "and 4 more lines" in str(caught.value)


def test_a_body_that_does_not_fit_its_url_is_refused() -> None:
    bad = {**request("a"), "body": {"model": "m"}}  # a chat line without messages
    with pytest.raises(InvalidBatchLine, match=r"line 1 .*messages"):
        check(jsonl(bad))


def test_the_check_stops_once_enough_lines_are_bad() -> None:
    checker = BatchFileCheck(max_bytes=10**9, max_lines=10**6)
    data = jsonl(*({"custom_id": f"r{i}"} for i in range(MAX_ERRORS_SHOWN + 5)))
    with pytest.raises(InvalidBatchLine) as caught:
        checker.feed(data)
    assert isinstance(caught.value.details, list)
    assert len(caught.value.details) == MAX_ERRORS_SHOWN
    assert checker.lines == MAX_ERRORS_SHOWN


def test_an_empty_file_is_refused() -> None:
    with pytest.raises(InvalidBatchLine, match="no request lines"):
        check(b"\n \n")


def test_the_line_limit_counts_request_lines_only() -> None:
    data = jsonl(request("a"), request("b")) + b"\n\n"
    assert check(data, max_lines=2) == 2
    with pytest.raises(PayloadTooLarge, match="at most 2 request lines; line 5"):
        check(data + jsonl(request("c")), max_lines=2)


def test_the_size_limit_is_checked_as_the_chunks_arrive() -> None:
    data = jsonl(request("a"), request("b"))
    assert check(data, max_bytes=len(data)) == 2
    checker = BatchFileCheck(max_bytes=len(data) - 1, max_lines=100)
    checker.feed(data[:10])
    with pytest.raises(PayloadTooLarge, match=f"at most {len(data) - 1} bytes"):
        checker.feed(data[10:])
