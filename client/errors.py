"""What the client raises: the API's answer that was not a success (``ApiError``), or no
answer at all (``Unreachable``)."""

from __future__ import annotations

from typing import Any

# Refusals a retry cannot turn into a success: the deadline stays where it is.
FINAL_CODES = frozenset({"deadline_unreachable"})


class Unreachable(Exception):
    """The API did not answer: nothing listens at the URL, or the connection broke."""

    def __init__(self, base_url: str, exc: Exception) -> None:
        cause = str(exc) or type(exc).__name__
        super().__init__(f"cannot reach the Sluicegate API at {base_url} ({cause})")
        self.base_url = base_url


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after_s: float | None = None,
        details: list[Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.details = details or []  # the error's details: a refused batch's bad lines

    @property
    def retriable(self) -> bool:
        return self.status in (429, 503) and self.code not in FINAL_CODES
