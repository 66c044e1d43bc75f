"""Unit tests do no I/O: an internet socket (AF_INET, AF_INET6) or a name lookup in one fails
the test with ``SocketBlockedError`` (pytest-socket). Unix sockets stay allowed: asyncio's
event loop wakes itself over a socketpair. A test that needs a server belongs in
tests/contract or tests/integration."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest
import pytest_socket

from workers.engines.sim.engine import SimEngine

HERE = Path(__file__).resolve().parent
# pytest-socket also warns; with warnings as errors that warning would replace its error.
BLOCKED_WARNING = pytest.mark.filterwarnings("ignore:A test tried to use socket:UserWarning")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures are set up (a module fixture starting a server counts).
    pytest-socket lifts the block after each test (its pytest_runtest_teardown)."""
    pytest_socket.disable_socket(allow_unix_socket=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Collect the garbage a failure left (a server that never started) before its traceback
    is formatted: on CPython 3.11 the ast.parse that formats it can fail with "AST
    constructor recursion depth mismatch" when a collection runs inside it (python/cpython
    issue 106905), and the whole run stops with an INTERNALERROR."""
    if call.excinfo is not None:
        gc.collect()
    return (yield)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(BLOCKED_WARNING)


@pytest.fixture
async def small_sim() -> AsyncIterator[SimEngine]:
    """A simulated engine of 100 blocks and 8 sequences that takes no time: the pull gates'
    tests measure against it."""
    sim = SimEngine(num_blocks=100, max_num_seqs=8, time_scale=0.0)
    await sim.start()
    yield sim
    await sim.close()
