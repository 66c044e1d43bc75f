"""When the reconciler takes a dispatch record for gone."""

from __future__ import annotations

import pytest

from producers.outbox.reconciler import LogView

VIEW = LogView(log="A", first={0: 10}, end={0: 50}, exact_end=True, committed={0: 30})


@pytest.mark.parametrize(
    ("position", "started", "gone"),
    [
        (("A", 0, 40), False, False),  # waiting in the log, after the commit point
        (("A", 0, 40), True, False),
        (("B", 0, 40), False, True),  # written to another log
        (("B", 0, 40), True, True),
        ((None, 0, 40), False, True),
        (("A", 0, 9), True, True),  # before the first offset: retention took it
        (("A", 0, 50), True, True),  # at or past the end: truncated
        (("A", 0, 20), False, True),  # the group committed past it, the job never started
        (("A", 0, 20), True, False),  # started: its worker has it
    ],
)
def test_gone(position: tuple[str | None, int, int], started: bool, gone: bool) -> None:
    assert VIEW.gone(position, started=started) is gone


def test_an_inexact_end_is_not_evidence() -> None:
    tansu = LogView(log="A", first={0: 0}, end={0: 1}, exact_end=False, committed={0: 0})
    assert not tansu.gone(("A", 0, 5), started=False)
