"""An upload's size and lines, counted as its chunks arrive (``UploadCheck``), and the
pieces a batch's validation reads a stored file's lines with: the line splitter, a line's
JSON value, what a batch's lines keep together. Pure: no I/O."""

from __future__ import annotations

import codecs
import json
from typing import Any

from pydantic import ValidationError

from schemas.batches import InvalidJsonl, RequestLine
from schemas.errors import PayloadTooLarge

# A line is held whole while it is checked: the longest one a file may have.
MAX_LINE_BYTES = 16 * 1_048_576


class LineSplitter:
    """The complete lines of a stream of chunks, numbered from 1, split at ``\\n`` (a
    ``\\r`` before it is dropped); ``end()`` gives the last one when it has no newline."""

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._rest = bytearray()
        self._number = 0

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        lines = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if self._rest:
                self._rest += chunk[start:end]
                line = bytes(self._rest)
                self._rest.clear()
            else:
                line = chunk[start:end]
            lines.append(self._next(line))
            start = end + 1
        self._rest += chunk[start:]
        if len(self._rest) > self._max:
            raise InvalidJsonl(
                f"line {self._number + 1} is longer than {self._max} bytes",
                details=[{"line": self._number + 1}],
            )
        return lines

    def end(self) -> list[tuple[int, bytes]]:
        if not self._rest:
            return []
        line = bytes(self._rest)
        self._rest.clear()
        return [self._next(line)]

    def _next(self, line: bytes) -> tuple[int, bytes]:
        self._number += 1
        return self._number, line.removesuffix(b"\r")


def json_line(number: int, line: bytes) -> Any:
    """The JSON value of line ``number`` (InvalidJsonl naming it when it is not one). The
    first line may start with UTF-8's byte-order mark, as files saved on Windows do."""
    if number == 1:
        line = line.removeprefix(codecs.BOM_UTF8)
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        utf16 = number == 1 and line.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        reason = "UTF-16, not UTF-8: save it as UTF-8" if utf16 else f"not UTF-8 (byte {exc.start})"
    except json.JSONDecodeError as exc:
        reason = f"not JSON: {exc.msg}"
    except RecursionError:
        reason = "not JSON: nested too deeply"
    raise InvalidJsonl(f"line {number} is {reason}", details=[{"line": number}])


def validation_message(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


class SameBatch:
    """What a batch's lines keep together, fed them in order: each ``custom_id`` once,
    and one ``url`` (the batch's endpoint) for all of them."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.url: str | None = None

    def problem(self, line: RequestLine) -> tuple[str, str] | None:
        """(code, message) when ``line`` breaks a rule, as in a batch's refusal."""
        if line.custom_id in self._seen:
            return "duplicate_custom_id", "custom_id is used twice"
        self._seen.add(line.custom_id)
        self.url = self.url or line.url
        if line.url != self.url:
            return "mixed_urls", f"every line must name the same url ({self.url}), not {line.url}"
        return None


class UploadCheck:
    """Feed it an upload's chunks in order, then ``finish()``: it counts the request lines
    (the non-blank ones) without holding any, and raises PayloadTooLarge at the first chunk
    over ``max_bytes`` or at the line past ``max_lines``. What the lines say is checked in
    the batch made from the file (``validating``), as OpenAI's Batch API does."""

    def __init__(self, *, max_bytes: int, max_lines: int) -> None:
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.bytes = 0
        self.lines = 0  # request lines: the non-blank ones
        self._number = 0  # lines, blank ones too
        self._content = False  # whether the line being read holds more than whitespace

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self.max_bytes:
            raise PayloadTooLarge(f"a file holds at most {self.max_bytes} bytes")
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            self._content = self._content or bool(piece.strip())
            self._end_line()
        self._content = self._content or bool(rest.strip())

    def finish(self) -> int:
        """The number of request lines."""
        if self._content:
            self._end_line()
        return self.lines

    def _end_line(self) -> None:
        self._number += 1
        if self._content:
            self.lines += 1
            if self.lines > self.max_lines:
                raise PayloadTooLarge(
                    f"a file holds at most {self.max_lines} request lines; line {self._number} "
                    "is past it"
                )
        self._content = False
