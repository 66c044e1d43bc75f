"""The admission unit tests' fixed policy and fakes: a clock that moves when told, a lag
source that is never read."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from producers.admission.policy import Policy
from producers.lag.rule import Reading

NOW = datetime(2026, 1, 1, tzinfo=UTC)


POLICY = Policy(
    soft=100,
    hard=200,
    mode="reject",
    max_block_s=2.0,
    max_blocked=1,
    hysteresis=0.1,
    low_factor=0.5,
    deadline_aware=True,
    token_time_s=0.01,
    retry_min_s=0.5,
    retry_max_s=60.0,
    lag_interval_s=0.5,
)


class NoSource:
    async def read(self, mark: Callable[[], int] | None = None) -> Reading:
        raise OSError("unused")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
