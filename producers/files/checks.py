"""An upload's lines, checked as its chunks arrive: a ``purpose=batch`` file must be OpenAI
Batch input (one request line per non-blank line, ``custom_id`` unique, one ``url``), no
larger than its limits. Pure: no I/O."""

from __future__ import annotations

import codecs
import json
from typing import Any

from pydantic import ValidationError

from schemas.batches import MAX_ERRORS_SHOWN, InvalidJsonl, RequestLine, line_job
from schemas.errors import PayloadTooLarge
from schemas.files import InvalidBatchLine

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


class BatchFileCheck:
    """Feed it an upload's chunks in order, then ``finish()``: it raises at the first chunk
    over ``max_bytes`` (PayloadTooLarge), at a line that is not JSON (InvalidJsonl), past
    ``max_lines`` request lines (PayloadTooLarge), and, once ``MAX_ERRORS_SHOWN`` lines
    are bad or at the end, InvalidBatchLine listing the bad lines by number."""

    def __init__(self, *, max_bytes: int, max_lines: int) -> None:
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.bytes = 0
        self.lines = 0  # request lines: the non-blank ones
        self._splitter = LineSplitter()
        self._problems: list[dict[str, Any]] = []
        self._together = SameBatch()

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self.max_bytes:
            raise PayloadTooLarge(f"a file holds at most {self.max_bytes} bytes")
        for number, line in self._splitter.feed(chunk):
            self._line(number, line)

    def finish(self) -> int:
        """The number of request lines of a good file."""
        for number, line in self._splitter.end():
            self._line(number, line)
        if not self.lines:
            raise InvalidBatchLine("the file holds no request lines; nothing was stored")
        self._raise_problems()
        return self.lines

    def _line(self, number: int, line: bytes) -> None:
        if not line.strip():
            return
        self.lines += 1
        if self.lines > self.max_lines:
            raise PayloadTooLarge(
                f"a file holds at most {self.max_lines} request lines; line {number} is past it"
            )
        value = json_line(number, line)
        problem = self._problem(value)
        if problem is not None:
            custom_id = value.get("custom_id") if isinstance(value, dict) else None
            code, message = problem
            self._problems.append(
                {"line": number, "custom_id": custom_id, "code": code, "message": message}
            )
            if len(self._problems) >= MAX_ERRORS_SHOWN:
                self._raise_problems()

    def _problem(self, value: Any) -> tuple[str, str] | None:
        """What is wrong with a request line: (code, message), as in a batch's refusal."""
        try:
            request = RequestLine.model_validate(value)
            line_job(request)
        except ValidationError as exc:
            return "invalid_request", validation_message(exc)
        except ValueError as exc:
            return "invalid_request", str(exc)
        return self._together.problem(request)

    def _raise_problems(self) -> None:
        if not self._problems:
            return
        first = self._problems[0]
        more = len(self._problems) - 1
        also = f" (and {more} more line{'s' if more > 1 else ''})" if more else ""
        raise InvalidBatchLine(
            f"line {first['line']} is not a batch request line: {first['message']}{also}; "
            "nothing was stored",
            details=self._problems,
        )
