"""SIGTERM on a worker: it exits within its drain bound, commits the jobs it finished, and
hands back the ones it could not finish, which another worker runs; nothing runs twice
that had ended, and nothing is lost."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.states import TERMINAL_STATES
from sluicegate.local.embedded import free_port
from tests.faults.outcomes import DOC, states, until
from tests.faults.processes import DRAINING, assigned, logged, roles, running_at_least
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(240)

JOBS = 16
DRAIN_S = 3.0
EXIT_MARGIN_S = 10.0  # closing the consumer, the engine and the database pool


async def test_sigterm_drains_within_its_bound_and_hands_back_the_rest(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    terminal = {s.value for s in TERMINAL_STATES}
    with roles(settings, tmp_path) as started:
        started.start("relay")
        # Its engine runs 30 times slower than the roofline, so its long jobs cannot end
        # within the drain.
        port = free_port()
        leaving = started.start(
            "worker", drain_timeout_s=DRAIN_S, sim_time_scale=30.0, metrics_port=port
        )
        await assigned(leaving)
        staying = started.start("worker")
        # Both in the group before the jobs come: else one worker may take them all while
        # the other joins.
        await assigned(staying)
        async with serve(settings, db) as api:
            ids = []
            for i in range(JOBS):
                # Short and long jobs: some end within the drain, some cannot.
                max_tokens = 8 if i % 2 else 1500
                r = await api.post(
                    "/v1/jobs",
                    json={"kind": "complete", "input": DOC, "max_tokens": max_tokens},
                )
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            await until(db, ids, lambda s: sum(st == "running" for st, _ in s.values()) >= 8, 90)
            # The leaving worker holds jobs of its own: the group may have given every
            # partition to the other worker until it joined.
            await running_at_least(port, 3, within_s=90)
            stopping = time.monotonic()
            leaving.process.send_signal(signal.SIGTERM)
            # Read once it takes no more records: a job not running then is not its.
            await logged(leaving, DRAINING, within_s=30)
            before = await states(db, ids)
            code = await asyncio.to_thread(leaving.process.wait, DRAIN_S + 60)
            took_s = time.monotonic() - stopping
            await until(db, ids, lambda s: all(st in terminal for st, _ in s.values()), 180)
        assert staying.process.poll() is None

    assert code == 0, leaving.output()
    assert took_s < DRAIN_S + EXIT_MARGIN_S
    final = await states(db, ids)
    assert Counter(state for state, _ in final.values()) == Counter({"succeeded": JOBS})
    for job, (state, attempt) in before.items():
        if state in terminal:
            assert final[job][1] == attempt, "a job that had ended ran again"
    rerun = [job for job, (_, attempt) in final.items() if attempt >= 2]
    assert rerun, "the long jobs could not end within the drain and must have run again"
    assert all(before[job][0] == "running" for job in rerun)
    assert max(attempt for _, attempt in final.values()) <= 2

