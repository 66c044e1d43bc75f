"""The API server's filter of uvicorn's spurious error line: dropped once for each
handshake the submit channel refused, kept otherwise."""

from __future__ import annotations

import logging

import pytest

from producers.api import channel
from producers.api.server import HANDSHAKE_ERROR, DenialsSent


def line(message: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, message, (), None)


def test_the_line_is_dropped_once_for_each_refused_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channel.OPEN, "denied", 2)
    kept = [DenialsSent().filter(line(HANDSHAKE_ERROR)) for _ in range(3)]
    assert kept == [False, False, True]  # the third had no denial: uvicorn's to keep
    assert channel.OPEN.denied == 0


def test_other_lines_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel.OPEN, "denied", 1)
    assert DenialsSent().filter(line("Exception in ASGI application"))
    assert channel.OPEN.denied == 1
