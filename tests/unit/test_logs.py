"""Log lines name their process's role, migrations are quiet unless asked, and a burst of the
same event is one line with its count."""

from __future__ import annotations

import asyncio
import logging
import logging.config
import multiprocessing
from collections.abc import Iterator

import pytest

from plumbing import logs


@pytest.fixture
def restored() -> Iterator[None]:
    """Put back the process name and the loggers' levels the test changed."""
    name = multiprocessing.current_process().name
    names = ("alembic", *logs.QUIET, "aiokafka.consumer.group_coordinator")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    multiprocessing.current_process().name = name
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)


def test_a_line_names_the_role_it_was_given(restored: None) -> None:
    logs.set_role("worker-2")
    record = logging.LogRecord("workers.execution", logging.INFO, __file__, 1, "hi", (), None)
    line = logging.Formatter(logs.FORMAT).format(record)
    assert " INFO worker-2 workers.execution: hi" in line
    assert "MainProcess" not in line


def test_uvicorns_lines_use_the_same_format() -> None:
    config = logs.uvicorn_log_config()
    assert {f["format"] for f in config["formatters"].values()} == {logs.FORMAT}
    logging.config.dictConfig(config)  # it is a valid configuration


@pytest.mark.parametrize(
    ("level", "alembic"), [("INFO", logging.WARNING), ("debug", logging.DEBUG)]
)
def test_migrations_are_heard_only_at_debug(restored: None, level: str, alembic: int) -> None:
    logs.configure(level, "up")
    assert logging.getLogger("alembic").level == alembic
    heard = logging.getLogger("alembic.runtime.migration").isEnabledFor(logging.INFO)
    assert heard == (alembic == logging.DEBUG)
    assert multiprocessing.current_process().name == "up"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_its_first_event_and_one_line_counting_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    summary = "{count} more fenced off in {seconds:.1f}s"
    tally = logs.Tally(logging.getLogger("t"), summary, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="t"):
        for i in range(346):
            tally.add("job %s fenced off", i)
            clock.now += 0.01
        assert tally.pending == 346
        tally.flush()
        tally.flush()  # nothing more to say
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert info == ["job 0 fenced off", "345 more fenced off in 3.5s"]
    assert len(debug) == 345
    assert debug[0].getMessage() == "job 1 fenced off"
    assert tally.pending == 0


def test_at_info_only_the_first_event_of_a_burst_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tally = logs.Tally(logging.getLogger("t2"), "{count} more events")
    with caplog.at_level(logging.INFO, logger="t2"):
        for i in range(10):
            tally.add("event %d", i)
        tally.flush()
        tally.add("event %d", 10)  # a lone event: itself, no count
        tally.flush()
    assert [r.getMessage() for r in caplog.records] == ["event 0", "9 more events", "event 10"]


def test_a_burst_is_logged_by_itself_once_its_window_passed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        tally = logs.Tally(logging.getLogger("t3"), "{count} more events", window_s=0.05)
        for i in range(3):
            tally.add("event %d", i)
        await asyncio.sleep(0.2)
        assert tally.pending == 0
        tally.add("event %d", 3)  # a new burst
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.INFO, logger="t3"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == ["event 0", "2 more events", "event 3"]
