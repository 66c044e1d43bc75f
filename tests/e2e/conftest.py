"""The e2e fixture: stacks started with `sluicegate up`, always stopped afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import RunningStack, start_stack


@pytest.fixture
def stack_factory(tmp_path: Path) -> Iterator[Callable[..., RunningStack]]:
    started: list[RunningStack] = []

    def factory(workers: int = 2, args: list[str] | None = None, **env: str) -> RunningStack:
        stack = start_stack(tmp_path, workers=workers, extra_env=env, args=args)
        started.append(stack)
        return stack

    yield factory
    for stack in started:
        if stack.process.poll() is None:
            stack.stop()
        stack.log.close()
        for proc in stack.descendants:
            if proc.is_running():
                proc.kill()
