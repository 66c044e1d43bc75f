"""The dispatcher's batching without a timer: attempts recorded together (``Recorder``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from workers.webhooks.attempt_repository import Attempted
from workers.webhooks.claim_repository import Claimed
from workers.webhooks.recorder import Recorder
from workers.webhooks.retry import Answer, Outcome, Verdict


def attempted(delivery_id: str) -> Attempted:
    claimed = Claimed(
        id=delivery_id,
        tenant="t",
        url="http://x/",
        subject="s",
        event_type="e",
        body="{}",
        attempt=1,
    )
    return Attempted(
        claimed=claimed, answer=Answer(status=204), verdict=Verdict(outcome=Outcome.DELIVERED)
    )


async def test_attempts_that_end_together_are_recorded_in_one_write() -> None:
    writes: list[list[str]] = []

    async def write(done: Sequence[Attempted]) -> set[str]:
        writes.append([a.claimed.id for a in done])
        await asyncio.sleep(0.01)
        return {a.claimed.id for a in done} - {"b"}

    recorder = Recorder(write)
    owned = await asyncio.gather(*(recorder.record(attempted(i)) for i in "abc"))
    assert owned == [True, False, True]  # b's lease was taken by another attempt
    assert writes == [["a", "b", "c"]]


async def test_a_failed_record_raises_for_each_attempt_it_held() -> None:
    async def write(done: Sequence[Attempted]) -> set[str]:
        raise ConnectionError("gone")

    recorder = Recorder(write)
    got = await asyncio.gather(
        *(recorder.record(attempted(i)) for i in "ab"), return_exceptions=True
    )
    assert [type(g) for g in got] == [ConnectionError, ConnectionError]
