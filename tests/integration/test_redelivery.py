"""Redelivery of a dead webhook delivery on the real pipeline: a receiver refuses every
attempt of the schedule, the delivery dies, POST .../redeliver sends the same message once
more, and the receiver, accepting now, gets it."""

from __future__ import annotations

from plumbing.settings import Settings
from tests.integration.webhooks import (
    Receiver,
    create_secret,
    delivery_of,
    failing,
    receiving,
    submit,
    webhook_pipeline,
    webhook_settings,
)


async def test_a_dead_delivery_is_redelivered_as_the_same_message(settings: Settings) -> None:
    s = webhook_settings(settings, webhook_retry_schedule_s=(0.0, 0.2))
    receiver = Receiver()
    receiver.replies["/flaky"] = failing(receiver, times=2, status=503)
    async with receiving(receiver), webhook_pipeline(s) as pipeline:
        receiver.secrets.append((await create_secret(pipeline))["secret"])
        job_id = await submit(pipeline, receiver.url("/flaky"))
        dead = await delivery_of(pipeline, job_id, "dead")
        assert [a["status_code"] for a in dead["attempt_log"]] == [503, 503]

        other = {"X-Sluicegate-Tenant": "other"}
        path = f"/v1/webhooks/deliveries/{dead['id']}/redeliver"
        refused = await pipeline.client.post(path, headers=other)
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "delivery_not_found")

        again = await pipeline.client.post(path)
        assert again.status_code == 200, again.text
        assert again.json()["state"] in ("pending", "delivered")
        delivered = await delivery_of(pipeline, job_id, "delivered")
        assert [a["status_code"] for a in delivered["attempt_log"]] == [503, 503, 204]
        assert [a["attempt"] for a in delivered["attempt_log"]] == [1, 2, 3]
        got = receiver.on("/flaky")
        assert len(got) == 3
        assert {r.id for r in got} == {dead["id"]}  # the same webhook-id: a receiver dedupes
        assert len({r.body for r in got}) == 1
        assert got[-1].verified_by == [0]

        # Delivered now: nothing to redeliver.
        twice = await pipeline.client.post(path)
        assert (twice.status_code, twice.json()["error"]["code"]) == (409, "delivery_not_dead")
        missing = await pipeline.client.post("/v1/webhooks/deliveries/msg_nope/redeliver")
        assert missing.status_code == 404
