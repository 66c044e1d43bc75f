"""Webhook delivery on the real pipeline: API → relay → worker → events topic → the faust
dispatcher → a real HTTP receiver that verifies every signature."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Response
from sqlalchemy import delete, func, insert, select, update

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.tables import (
    batches,
    dead_letters,
    jobs,
    outbox,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
)
from tests.integration.webhooks import (
    Receiver,
    create_secret,
    dead_letter_records,
    delivery_of,
    receiving,
    start_roles,
    submit,
    webhook_pipeline,
    webhook_settings,
)
from tests.support.topics import caught_up
from workers.service import run_worker
from workers.webhooks.process import run_webhooks


async def rows(settings: Settings, statement: Any) -> list[dict[str, Any]]:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.begin() as conn:
            result = await conn.execute(statement)
            return [dict(r) for r in result.mappings().all()] if result.returns_rows else []
    finally:
        await db.dispose()


async def test_terminal_job_is_delivered_signed(settings: Settings) -> None:
    s = webhook_settings(settings)
    async with receiving(Receiver()) as receiver, webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        hooked = [await submit(pipeline, receiver.url("/hook")) for _ in range(2)]
        silent = await submit(pipeline, None)
        await pipeline.wait_terminal([*hooked, silent])
        await receiver.wait(lambda: len(receiver.got) >= 2)

        for job_id in hooked:
            view = await delivery_of(pipeline, job_id, "delivered")
            assert view["event_type"] == "job.succeeded"
            assert view["attempts"] == 1
            assert [a["status_code"] for a in view["attempt_log"]] == [204]
        got = {r.payload["data"]["id"]: r for r in receiver.got if r.payload}
        assert set(got) == set(hooked)
        for job_id, received in got.items():
            assert received.verified_by == [0]
            assert received.payload is not None
            assert received.payload["type"] == "job.succeeded"
            data = received.payload["data"]
            assert data["state"] == "succeeded"
            assert data["result"]["engine"] == "sim"
            assert received.payload["timestamp"] == data["finished_at"]
            assert received.headers["content-type"] == "application/json"
            assert received.headers["webhook-signature"].startswith("v1,")
            view = await delivery_of(pipeline, job_id, "delivered")
            assert received.id == view["id"]
        # A job without a callback_url has no delivery.
        r = await pipeline.client.get("/v1/webhooks/deliveries", params={"subject": silent})
        assert r.json()["data"] == []
        assert len(receiver.got) == 2


async def test_batch_is_delivered_once_when_its_last_job_ends(settings: Settings) -> None:
    # The last job is held back by deleting its outbox row: the relay must be its publisher.
    s = webhook_settings(settings).model_copy(update={"publish_at_once": False})
    batch_id = str(uuid.uuid4())
    async with receiving(Receiver()) as receiver, webhook_pipeline(s, start=False) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        await rows(
            s,
            insert(batches).values(
                id=batch_id,
                tenant="default",
                status="in_progress",
                endpoint="/v1/jobs",
                completion_window="24h",
                deadline=datetime.now(UTC) + timedelta(hours=1),
                callback_url=receiver.url("/batch"),
                total=3,
                metadata={"run": "nightly"},
            ),
        )
        ids = [await submit(pipeline, receiver.url("/job")) for _ in range(3)]
        for i, job_id in enumerate(ids):
            in_batch = update(jobs).where(jobs.c.id == job_id)
            await rows(s, in_batch.values(batch_id=batch_id, custom_id=f"r{i}"))
        # The last job is held back (its dispatch record is never published).
        await rows(s, delete(outbox).where(outbox.c.key == ids[2]))
        start_roles(pipeline)
        for job_id in ids[:2]:
            view = await delivery_of(pipeline, job_id, "delivered")
            assert view["payload"]["data"]["batch_id"] == batch_id
        # Two of three ended, their events consumed: no batch delivery yet.
        r = await pipeline.client.get("/v1/webhooks/deliveries", params={"subject": batch_id})
        assert r.json()["data"] == []

        assert (await pipeline.client.delete(f"/v1/jobs/{ids[2]}")).status_code == 200
        view = await delivery_of(pipeline, batch_id, "delivered")
        assert view["event_type"] == "batch.completed"
        (got,) = receiver.on("/batch")
        assert got.verified_by == [0]
        assert got.payload is not None
        assert got.payload["type"] == "batch.completed"
        data = got.payload["data"]
        assert data["id"] == batch_id
        assert data["counts"] == {"succeeded": 2, "cancelled": 1}
        assert data["total"] == 3
        assert data["metadata"] == {"run": "nightly"}
        await delivery_of(pipeline, ids[2], "delivered")  # the cancelled job's own
        assert len(receiver.got) == 4


async def test_failing_receiver_is_retried_then_dead_lettered(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.2, 0.2))
    receiver = Receiver(replies={"/fail": lambda _: Response(status_code=500)})
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        job_id = await submit(pipeline, receiver.url("/fail"))
        view = await delivery_of(pipeline, job_id, "dead")

        # Three attempts, the schedule's length, all the same signed message.
        attempts = receiver.on("/fail")
        assert len(attempts) == 3
        assert {r.id for r in attempts} == {view["id"]}
        assert all(r.verified_by == [0] for r in attempts)
        assert len({r.body for r in attempts}) == 1
        assert view["attempts"] == 3
        assert [a["attempt"] for a in view["attempt_log"]] == [1, 2, 3]
        assert [a["status_code"] for a in view["attempt_log"]] == [500, 500, 500]
        assert view["last_status"] == 500
        assert "gave up after 3 attempts" in view["dead_letter_reason"]
        # Listed among the dead letters, to its tenant only.
        dead = await pipeline.client.get("/v1/webhooks/deliveries", params={"state": "dead"})
        assert [d["id"] for d in dead.json()["data"]] == [view["id"]]
        other = {"X-Sluicegate-Tenant": "other"}
        r = await pipeline.client.get(f"/v1/webhooks/deliveries/{view['id']}", headers=other)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "delivery_not_found"
        r = await pipeline.client.get("/v1/webhooks/deliveries", headers=other)
        assert r.json()["data"] == []
        # A dead_letters row and a record on the dead-letter topic (through the outbox).
        letters = await rows(s, select(dead_letters))
        assert [(d["source"], d["subject"]) for d in letters] == [("webhook", view["id"])]
        records = await dead_letter_records(s, view["id"])
        record = json.loads(records[0].value)
        assert record["delivery_id"] == view["id"]
        assert record["subject"] == job_id
        assert record["attempts"] == 3
        assert record["last_status"] == 500
        assert len(records) == 1


async def test_retry_after_is_honoured_on_429_and_503(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.05, 0.05))

    def busy_once(status: int) -> Any:
        def reply(r: Any) -> Response:
            first = len([g for g in receiver.got if g.id == r.id]) == 1
            if first:
                return Response(status_code=status, headers={"Retry-After": "1"})
            return Response(status_code=200)

        return reply

    receiver = Receiver(replies={"/429": busy_once(429), "/503": busy_once(503)})
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        ids = [await submit(pipeline, receiver.url(p)) for p in ("/429", "/503")]
        for job_id, path in zip(ids, ("/429", "/503"), strict=True):
            view = await delivery_of(pipeline, job_id, "delivered")
            assert [a["status_code"] for a in view["attempt_log"]] == [int(path[1:]), 200]
            first, second = receiver.on(path)
            assert first.id == second.id == view["id"]
            # The schedule alone would have retried within 0.05 s; Retry-After says 1 s.
            assert second.at - first.at >= 0.95


async def test_410_disables_the_endpoint(settings: Settings) -> None:
    s = webhook_settings(settings)
    receiver = Receiver(replies={"/gone": lambda _: Response(status_code=410)})
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        first = await submit(pipeline, receiver.url("/gone"))
        view = await delivery_of(pipeline, first, "dead")
        assert [a["status_code"] for a in view["attempt_log"]] == [410]
        assert "410" in view["dead_letter_reason"]
        endpoints = await rows(s, select(webhook_endpoints))
        assert [(e["tenant"], e["url"]) for e in endpoints] == [("default", receiver.url("/gone"))]

        # Later deliveries to it are dead-lettered at once, without a request.
        later = await submit(pipeline, receiver.url("/gone"))
        other = await submit(pipeline, receiver.url("/fine"))
        view = await delivery_of(pipeline, later, "dead")
        assert view["attempts"] == 0
        assert view["attempt_log"] == []
        assert "disabled" in view["dead_letter_reason"]
        await delivery_of(pipeline, other, "delivered")  # another URL is another endpoint
        assert len(receiver.on("/gone")) == 1


async def test_a_delayed_retry_does_not_hold_up_other_deliveries(settings: Settings) -> None:
    # One attempt in flight per endpoint: a retry that waited in line would block it.
    s = webhook_settings(settings, webhook_max_in_flight_per_endpoint=1)
    first: list[str] = []

    def reply(r: Any) -> Response:
        if r.payload["data"]["id"] in first:
            return Response(status_code=503, headers={"Retry-After": "120"})
        return Response(status_code=204)

    receiver = Receiver(replies={"/hook": reply})
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        first.append(await submit(pipeline, receiver.url("/hook")))
        await receiver.wait(lambda: len(receiver.got) == 1)
        later = [await submit(pipeline, receiver.url("/hook")) for _ in range(3)]
        for job_id in later:
            await delivery_of(pipeline, job_id, "delivered", within_s=60)

        r = await pipeline.client.get("/v1/webhooks/deliveries", params={"subject": first[0]})
        (waiting,) = r.json()["data"]
        assert waiting["state"] == "pending"
        assert waiting["attempts"] == 1
        assert waiting["last_status"] == 503
        due = datetime.fromisoformat(waiting["next_attempt_at"])
        assert due > datetime.now(UTC) + timedelta(seconds=60)
        assert len(receiver.got) == 4


async def test_loopback_destinations_are_refused(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_allow_networks=())  # the default policy
    v4, v6 = Receiver(), Receiver()
    async with (
        receiving(v4, "127.0.0.1"),
        receiving(v6, "::1"),
        webhook_pipeline(s) as pipeline,
    ):
        await create_secret(pipeline)
        urls = {
            "127.0.0.1": v4.url("/hook"),
            "::1": v6.url("/hook"),
            "localhost": v4.url("/hook", host="localhost"),  # a name that resolves to loopback
        }
        ids = {name: await submit(pipeline, url) for name, url in urls.items()}
        for name, job_id in ids.items():
            view = await delivery_of(pipeline, job_id, "dead")
            assert view["attempts"] == 1, name  # given up at once, never retried
            error = view["attempt_log"][0]["error"]
            assert "refused by the SSRF policy" in error, name
            assert "loopback" in error, name
            assert view["attempt_log"][0]["status_code"] is None
        assert v4.got == []
        assert v6.got == []


async def test_redirects_are_never_followed(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.1))
    receiver = Receiver(
        replies={"/redirect": lambda _: Response(status_code=307, headers={"Location": "/ok"})}
    )
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        job_id = await submit(pipeline, receiver.url("/redirect"))
        view = await delivery_of(pipeline, job_id, "dead")
        assert [a["status_code"] for a in view["attempt_log"]] == [307, 307]
        assert all("redirect refused" in a["error"] for a in view["attempt_log"])
        assert len(receiver.on("/redirect")) == 2
        assert receiver.on("/ok") == []


async def test_no_secret_means_nothing_is_sent_unsigned(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.1))
    async with receiving(Receiver()) as receiver, webhook_pipeline(s) as pipeline:
        job_id = await submit(pipeline, receiver.url("/hook"))
        view = await delivery_of(pipeline, job_id, "dead")
        assert view["attempts"] == 2
        assert all("no signing secret" in a["error"] for a in view["attempt_log"])
        assert receiver.got == []


async def test_every_unexpired_secret_signs(settings: Settings) -> None:
    s = webhook_settings(settings)
    async with receiving(Receiver()) as receiver, webhook_pipeline(s) as pipeline:
        old, new = await create_secret(pipeline), await create_secret(pipeline)
        assert old["secret"].startswith("whsec_")
        receiver.secrets += [old["secret"], new["secret"]]
        listed = (await pipeline.client.get("/v1/webhooks/secrets")).json()["data"]
        assert [x["id"] for x in listed] == [old["id"], new["id"]]
        assert all("secret" not in x and x["active"] for x in listed)

        first = await submit(pipeline, receiver.url("/hook"))
        await delivery_of(pipeline, first, "delivered")
        (got,) = receiver.got
        assert len(got.headers["webhook-signature"].split(" ")) == 2
        assert got.verified_by == [0, 1]  # a receiver with either secret verifies

        # Another tenant cannot see or expire them.
        other = {"X-Sluicegate-Tenant": "other"}
        r = await pipeline.client.post(f"/v1/webhooks/secrets/{old['id']}/expire", headers=other)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "webhook_secret_not_found"
        assert (await pipeline.client.get("/v1/webhooks/secrets", headers=other)).json() == {
            "data": []
        }
        # Rotation done: the old secret expires and signs no more.
        r = await pipeline.client.post(f"/v1/webhooks/secrets/{old['id']}/expire")
        assert r.status_code == 200
        assert r.json()["active"] is False
        second = await submit(pipeline, receiver.url("/hook"))
        await delivery_of(pipeline, second, "delivered")
        latest = receiver.got[1]
        assert len(latest.headers["webhook-signature"].split(" ")) == 1
        assert latest.verified_by == [1]


async def test_an_event_consumed_twice_makes_one_delivery(settings: Settings) -> None:
    s = webhook_settings(settings)
    async with receiving(Receiver()) as receiver, webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        ids = [await submit(pipeline, receiver.url("/hook")) for _ in range(3)]
        for job_id in ids:
            await delivery_of(pipeline, job_id, "delivered")

        # A second dispatcher in a new group reads every event again from the start.
        again = s.model_copy(update={"webhook_group": f"{s.webhook_group}-again"})
        pipeline.tasks.append(asyncio.ensure_future(run_webhooks(again, pipeline.stop)))
        await consumed_everything(again)

        r = await pipeline.client.get("/v1/webhooks/deliveries")
        assert sorted(d["subject"] for d in r.json()["data"]) == sorted(ids)
        assert len(receiver.got) == 3
        attempts = await rows(s, select(webhook_attempts))
        assert len(attempts) == 3


async def consumed_everything(settings: Settings, within_s: float = 60) -> None:
    """Until the dispatcher's group has committed the end of every events partition."""
    await caught_up(
        settings.require_kafka(),
        settings.webhook_group,
        settings.events_topic,
        settings.partitions,
        within_s=within_s,
    )


async def test_callback_url_must_be_an_absolute_http_url(settings: Settings) -> None:
    async with webhook_pipeline(settings, start=False) as pipeline:
        for bad in ("ftp://example.com/hook", "/relative/hook", "http://", "example.com/hook"):
            r = await pipeline.client.post(
                "/v1/jobs", json={"kind": "summarize", "input": "x", "callback_url": bad}
            )
            assert r.status_code == 422, bad
            assert r.json()["error"]["code"] == "invalid_callback_url", bad
        r = await pipeline.client.post(
            "/v1/jobs",
            json={"kind": "summarize", "input": "x", "callback_url": "https://example.com/h"},
        )
        assert r.status_code == 202


async def test_in_flight_attempts_per_endpoint_are_limited(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_max_in_flight_per_endpoint=2)
    release = asyncio.Event()

    async def held(_: Any) -> Response:
        await release.wait()
        return Response(status_code=204)

    receiver = Receiver(replies={"/slow": held})
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        slow = [await submit(pipeline, receiver.url("/slow")) for _ in range(5)]
        await pipeline.wait_terminal(slow)
        await receiver.wait(lambda: receiver.in_flight >= 2)
        # Another endpoint is not held up, and by the time it is served the dispatcher
        # has looked at the due deliveries to /slow again.
        other = await submit(pipeline, receiver.url("/other"))
        await delivery_of(pipeline, other, "delivered")
        assert receiver.most_in_flight <= 3  # two to /slow, one to /other
        assert len(receiver.on("/slow")) == 2

        release.set()
        for job_id in slow:
            await delivery_of(pipeline, job_id, "delivered")
        assert len(receiver.on("/slow")) == 5
        assert receiver.most_in_flight <= 3


async def test_a_burst_of_ends_is_attempted_within_2s_of_coming_due(settings: Settings) -> None:
    """40 jobs ending together on two workers, every callback to one endpoint (four in
    flight at most): each delivery's first attempt starts within 2 s of its coming due,
    and the last ones are not left waiting for a wake that never comes."""
    s = webhook_settings(settings, sim_time_scale=1.0)
    async with receiving(Receiver()) as receiver, webhook_pipeline(s, start=False) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        pipeline.start(run_relay)
        pipeline.start(run_worker)
        pipeline.start(run_worker)
        pipeline.start(run_webhooks)
        ids = [await submit(pipeline, receiver.url("/hook"), max_tokens=64) for _ in range(40)]
        await pipeline.wait_terminal(ids, timeout_s=90)
        late = await attempted_late(s, ids, within_s=2.0)
        assert late == {}, f"{len(late)} of 40 deliveries not attempted within 2 s of due"
        await receiver.wait(lambda: len({r.id for r in receiver.got}) == 40)
        assert all(r.verified_by == [0] for r in receiver.got)


async def attempted_late(settings: Settings, subjects: list[str], within_s: float) -> dict:
    """The deliveries of ``subjects`` whose first attempt did not start within ``within_s``
    of their coming due (their row's first ``next_attempt_at``; the schedule's first wait is
    0, so their creation), by subject: (seconds late so far, attempts)."""
    first_attempt = (
        select(func.min(webhook_attempts.c.at))
        .where(webhook_attempts.c.delivery_id == webhook_deliveries.c.id)
        .scalar_subquery()
    )
    query = select(
        webhook_deliveries.c.subject,
        webhook_deliveries.c.created_at,
        webhook_deliveries.c.attempts,
        first_attempt.label("first_at"),
        func.now().label("now"),
    ).where(webhook_deliveries.c.subject.in_(subjects))
    async with asyncio.timeout(60):  # until each delivery is made and attempted, or late
        while True:
            found = await rows(settings, query)
            made = {r["subject"]: r for r in found}
            late = {
                subject: ((r["first_at"] or r["now"]) - r["created_at"], r["attempts"])
                for subject, r in made.items()
                if (r["first_at"] or r["now"]) - r["created_at"] > timedelta(seconds=within_s)
            }
            attempted = all(r["first_at"] is not None for r in made.values())
            if late or (len(made) == len(subjects) and attempted):
                return late
            await asyncio.sleep(0.2)
