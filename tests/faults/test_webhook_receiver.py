"""A webhook receiver that is down for a long stretch, hangs past the attempt's time limit,
or answers 500, 429 with Retry-After, 410, or never a 2xx: against the dispatcher as a
user runs it (``python -m sluicegate webhooks``, beside the relay and a worker), with a
real receiver that verifies every signature (tests/integration/webhooks.py).

Each delivery is read back from the database (``webhook_deliveries``, ``webhook_attempts``,
``webhook_endpoints``, ``dead_letters``) and compared with what the receiver got. The
retry schedule is scaled down from hours to about a second a step."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Response
from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.tables import (
    dead_letters,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
)
from tests.faults.processes import roles
from tests.integration.serving import serve
from tests.integration.webhooks import (
    Received,
    Receiver,
    create_secret,
    dead_letter_records,
    delivery_of,
    failing,
    receiving,
    reserved_port,
    submit,
    webhook_settings,
)

pytestmark = pytest.mark.timeout(180)


@contextlib.asynccontextmanager
async def stack(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """The relay, a worker and the webhook dispatcher as processes, the API in-process; on
    the way out, each process must still be running (none crashed or gave up)."""
    with roles(settings, tmp_path) as started:
        for name in ("relay", "worker", "webhooks"):
            started.start(name)
        async with serve(settings, db) as api:
            yield api
        for role in started.started:
            assert role.process.poll() is None, f"{role.name} exited:\n{role.output()}"


async def delivery(db: AsyncEngine, subject: str) -> Row[Any]:
    async with db.connect() as conn:
        found = await conn.execute(
            select(webhook_deliveries).where(webhook_deliveries.c.subject == subject)
        )
        (row,) = found.all()  # one delivery sequence per terminal state
        return row


async def attempts(db: AsyncEngine, delivery_id: str) -> list[Row[Any]]:
    async with db.connect() as conn:
        found = await conn.execute(
            select(webhook_attempts)
            .where(webhook_attempts.c.delivery_id == delivery_id)
            .order_by(webhook_attempts.c.attempt)
        )
        return list(found.all())


async def until_failed(
    db: AsyncEngine, subjects: Sequence[str], times: int, within_s: float = 60
) -> None:
    """Until each subject's delivery has failed ``times`` attempts; meanwhile each must
    stay pending (retried, not given up)."""
    count = (
        select(
            webhook_deliveries.c.subject,
            webhook_deliveries.c.state,
            func.count(webhook_attempts.c.id),
        )
        .join(webhook_attempts, webhook_attempts.c.delivery_id == webhook_deliveries.c.id)
        .where(webhook_deliveries.c.subject.in_(subjects))
        .group_by(webhook_deliveries.c.subject, webhook_deliveries.c.state)
    )
    async with asyncio.timeout(within_s):
        while True:
            async with db.connect() as conn:
                found = (await conn.execute(count)).all()
            assert all(state == "pending" for _, state, _ in found), found
            made = {str(subject): n for subject, _, n in found}
            if all(made.get(s, 0) >= times for s in subjects):
                return
            await asyncio.sleep(0.2)


def check_same_message(got: list[Received], row: Row[Any]) -> None:
    """Every request of a delivery is its one signed message: the same webhook-id (the
    row's id), the same body, and a signature the receiver verifies."""
    assert got
    assert {r.id for r in got} == {row.id}
    assert {r.body for r in got} == {row.body.encode()}
    assert all(r.verified_by == [0] for r in got)


# How many attempts each delivery fails while the receiver is down, at least.
DOWN_FOR_ATTEMPTS = 8


async def test_a_receiver_down_for_a_long_stretch_gets_every_event_once_it_is_up(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    # 32 attempts up to 1.5 s apart (0.75 s on average): the outage spans eight of them
    # and ends long before the last one.
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.5, *[1.5] * 30))
    receiver = Receiver()
    with reserved_port(receiver) as down:  # bound, not listening: connections are refused
        async with stack(s, db, tmp_path) as api:
            receiver.secrets.append((await create_secret(api))["secret"])
            ids = [await submit(api, receiver.url("/hook")) for _ in range(4)]
            await until_failed(db, ids, DOWN_FOR_ATTEMPTS)
            assert receiver.got == []

            async with receiving(receiver, sock=down):  # up, on the same address
                for job_id in ids:
                    await delivery_of(api, job_id, "delivered", within_s=30)

    rows = {job_id: await delivery(db, job_id) for job_id in ids}
    # Each terminal event reached the receiver exactly once, signed, under its one id.
    assert Counter(r.id for r in receiver.got) == Counter({row.id: 1 for row in rows.values()})
    for job_id, row in rows.items():
        (got,) = [r for r in receiver.got if r.id == row.id]
        check_same_message([got], row)
        assert got.payload is not None
        assert got.payload["type"] == "job.succeeded"
        assert got.payload["data"]["id"] == job_id
        # Every attempt is recorded: refused connections, then the one that got through.
        log = await attempts(db, row.id)
        assert [a.attempt for a in log] == list(range(1, len(log) + 1))
        assert len(log) == row.attempts > DOWN_FOR_ATTEMPTS
        *refused, delivered = log
        assert all(a.status_code is None and "ConnectError" in a.error for a in refused)
        assert (delivered.status_code, delivered.error) == (204, None)
        assert row.last_status == 204


async def test_a_receiver_that_hangs_is_timed_out_and_retried_and_holds_up_nothing(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    # Two attempts in flight at most, both to the hanging receiver: another endpoint is
    # served only because each hung attempt is cut off at its time limit (1 s).
    s = webhook_settings(
        settings,
        webhook_timeout_s=1.0,
        webhook_max_in_flight=2,
        webhook_retry_schedule_s=(0.0, *[0.5] * 20),
    )
    fast = asyncio.Event()

    async def hang(_: Received) -> Response:
        with contextlib.suppress(TimeoutError):  # bounded, so that the receiver can stop
            await asyncio.wait_for(fast.wait(), 90)
        return Response(status_code=204)

    receiver = Receiver(replies={"/slow": hang})
    async with receiving(receiver), stack(s, db, tmp_path) as api:
        try:
            receiver.secrets.append((await create_secret(api))["secret"])
            slow = [await submit(api, receiver.url("/slow")) for _ in range(2)]
            await receiver.wait(lambda: len({r.id for r in receiver.on("/slow")}) == 2)

            other = await submit(api, receiver.url("/other"))
            served = await delivery_of(api, other, "delivered", within_s=30)
            assert [a["status_code"] for a in served["attempt_log"]] == [204]
            for job_id in slow:
                assert (await delivery(db, job_id)).state == "pending"

            await until_failed(db, slow, times=3)
            fast.set()
            for job_id in slow:
                await delivery_of(api, job_id, "delivered", within_s=30)
        finally:
            fast.set()

    for job_id in slow:
        row = await delivery(db, job_id)
        log = await attempts(db, row.id)
        assert len(log) == row.attempts
        *timed_out, delivered = log
        assert len(timed_out) >= 3
        assert all(a.status_code is None for a in timed_out)
        assert all(a.error == "timed out after 1 s" for a in timed_out)
        assert delivered.status_code == 204
        # The retries reached the receiver, each the same signed message (an attempt cut
        # off before the receiver had read its request would not count there).
        got = [r for r in receiver.on("/slow") if r.id == row.id]
        assert 1 < len(got) <= len(log)
        check_same_message(got, row)




RETRY_AFTER_S = 2


async def test_500_and_429_are_retried_410_disables_and_the_last_failure_is_dead(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    # Four attempts, at most 0.2 s apart unless the receiver asks for longer.
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.2, 0.2, 0.2))
    receiver = Receiver()
    receiver.replies |= {
        "/flaky": failing(receiver, 2, 500),
        "/busy": failing(receiver, 1, 429, **{"Retry-After": str(RETRY_AFTER_S)}),
        "/gone": lambda _: Response(status_code=410),
        "/never": lambda _: Response(status_code=500),
    }
    async with receiving(receiver), stack(s, db, tmp_path) as api:
        receiver.secrets.append((await create_secret(api))["secret"])
        ids = {path: await submit(api, receiver.url(path)) for path in receiver.replies}
        views = {
            "/flaky": await delivery_of(api, ids["/flaky"], "delivered"),
            "/busy": await delivery_of(api, ids["/busy"], "delivered"),
            "/gone": await delivery_of(api, ids["/gone"], "dead"),
            "/never": await delivery_of(api, ids["/never"], "dead"),
        }
        # A later job to the disabled endpoint: given up without a request.
        later = await submit(api, receiver.url("/gone"))
        after_gone = await delivery_of(api, later, "dead")
        dead = await api.get("/v1/webhooks/deliveries", params={"state": "dead"})
        assert dead.status_code == 200, dead.text
        records = {
            view["id"]: await dead_letter_records(s, view["id"])
            for view in (views["/gone"], views["/never"], after_gone)
        }

    rows = {path: await delivery(db, job_id) for path, job_id in ids.items()}
    logs = {path: await attempts(db, row.id) for path, row in rows.items()}
    for path, row in rows.items():
        check_same_message(receiver.on(path), row)
        assert len(receiver.on(path)) == len(logs[path]) == row.attempts

    # 500 twice, then delivered on the third attempt.
    assert [a.status_code for a in logs["/flaky"]] == [500, 500, 204]

    # 429 with Retry-After: the next attempt waited for it, by the database's clock (the
    # schedule alone would have retried within 0.2 s).
    first, second = logs["/busy"]
    assert (first.status_code, second.status_code) == (429, 204)
    assert second.at - first.at >= timedelta(seconds=RETRY_AFTER_S)

    # 410: dead after that one attempt, the endpoint disabled, and nothing sent to it since.
    assert [a.status_code for a in logs["/gone"]] == [410]
    async with db.connect() as conn:
        disabled = (await conn.execute(select(webhook_endpoints))).all()
    assert [(e.tenant, e.url) for e in disabled] == [("default", receiver.url("/gone"))]
    assert after_gone["attempts"] == 0
    assert "disabled" in after_gone["dead_letter_reason"]
    assert len(receiver.on("/gone")) == 1

    # Never a 2xx: dead after the schedule's last step.
    assert [a.status_code for a in logs["/never"]] == [500] * 4
    assert "gave up after 4 attempts" in views["/never"]["dead_letter_reason"]

    # The dead are listed as such, each with one dead_letters row and one dead-letter
    # record (made in the outbox, in the same transaction), which reached the topic (the
    # relay publishes at least once: a consumer deduplicates by key).
    given_up = {views["/gone"]["id"], views["/never"]["id"], after_gone["id"]}
    assert {d["id"] for d in dead.json()["data"]} == given_up
    async with db.connect() as conn:
        letters = (await conn.execute(select(dead_letters))).all()
        made = await conn.scalars(select(outbox.c.key).where(outbox.c.topic == s.dead_letter_topic))
        made_keys = list(made)
    assert Counter((d.source, d.subject) for d in letters) == Counter(
        {("webhook", delivery_id): 1 for delivery_id in given_up}
    )
    assert Counter(made_keys) == Counter(dict.fromkeys(given_up, 1))
    for delivery_id, found in records.items():
        assert {json.loads(m.value)["delivery_id"] for m in found} == {delivery_id}
    never = json.loads(records[views["/never"]["id"]][0].value)
    assert (never["attempts"], never["last_status"]) == (4, 500)
