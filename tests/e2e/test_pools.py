"""Two models, one pipeline: `sluicegate up --models alpha,beta`, a worker pool each.

A flood of alpha meets alpha's pool's lag_hard (429) while beta's submits, made meanwhile,
are each accepted at once and succeed before alpha's backlog has drained: each pool is
admitted on its own lag. Each pool's workers read only its own topic, in its own group.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime

import asyncpg
import httpx
import openai
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from openai import OpenAI

from schemas import constants
from tests.e2e.stack import RunningStack, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FLOOD = 60
BETA = 5
PARTITIONS = 4


async def committed_total(bootstrap: str, group: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        found = [await consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)]
        return sum(o or 0 for o in found)
    finally:
        await consumer.stop()


async def topics_of(url: str) -> Counter[tuple[str, str]]:
    """(model, dispatch topic) of every job stored."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT params->>'model' AS model, dispatch_topic FROM jobs")
        return Counter((r["model"], r["dispatch_topic"]) for r in rows)
    finally:
        await conn.close()


async def flood_and_beta(
    stack: RunningStack,
) -> tuple[list[httpx.Response], list[float], list[str]]:
    """FLOOD submits of alpha at once; while they are answered, BETA submits of beta, one
    after the other, each timed."""
    async with httpx.AsyncClient(base_url=stack.api_url, headers=stack.headers, timeout=30) as api:

        def job(model: str, max_tokens: int, priority: str = "normal") -> dict[str, object]:
            return {
                "kind": "complete",
                "input": "Once upon a time",
                "max_tokens": max_tokens,
                "model": model,
                "priority": priority,
            }

        # High priority: admitted without waiting up to lag_hard, then refused.
        flood = asyncio.gather(
            *(api.post("/v1/jobs", json=job("alpha", 400, "high")) for _ in range(FLOOD))
        )
        seconds, ids = [], []
        for _ in range(BETA):
            began = time.monotonic()
            r = await api.post("/v1/jobs", json=job("beta", 20))
            seconds.append(time.monotonic() - began)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        return list(await flood), seconds, ids


def test_a_flood_of_one_model_never_refuses_another(stack_factory) -> None:
    stack = stack_factory(
        workers=1,
        args=["--models", "alpha,beta"],
        SLUICEGATE_LAG_SOFT="10",
        SLUICEGATE_LAG_HARD="20",
        SLUICEGATE_SIM_TIME_SCALE="3",
    )
    key = stack.headers["Authorization"].removeprefix("Bearer ")
    with OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0) as client:
        listed = list(client.models.list())  # an independent client reads the pools
        assert [m.id for m in listed] == ["alpha", "beta"]
        assert (listed[1].model_extra or {})["pool"]["topic"] == f"{constants.DISPATCH_TOPIC}.beta"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("sim")  # served by no pool
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as api:
        models = api.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
        pools = {m["id"]: m["pool"] for m in models["data"]}
        assert pools["alpha"]["topic"] == constants.DISPATCH_TOPIC  # the first keeps its name
        assert pools["beta"]["topic"] == f"{constants.DISPATCH_TOPIC}.beta"
        assert pools["beta"]["consumer_group"] == f"{constants.WORKER_GROUP}.beta"
        deadline = time.monotonic() + 30  # until each pool's worker has reported itself
        while api.get("/v1/models/beta").json()["pool"]["workers"] < 1:
            assert time.monotonic() < deadline, api.get("/v1/models").json()
            time.sleep(0.5)
        assert api.get("/v1/models/alpha").json()["pool"]["workers"] == 1
        pooled = api.get("/v1/overview").json()["pools"]  # `sluicegate status` shows each
        assert [p["model"] for p in pooled] == ["alpha", "beta"]
        assert [p["lag_hard"] for p in pooled] == [20, 20]

    answers, seconds, beta = asyncio.run(flood_and_beta(stack))
    codes = Counter(r.status_code for r in answers)
    refused = [r.json()["error"]["code"] for r in answers if r.status_code == 429]
    assert "lag_hard" in refused, codes
    assert max(seconds) < 1.0, seconds  # each beta submit accepted at once
    alpha = [r.json()["id"] for r in answers if r.status_code == 202]

    views = wait_terminal(stack, beta, timeout_s=60)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    assert {v["model"] for v in views.values()} == {"beta"}

    ended = wait_terminal(stack, alpha, timeout_s=180)
    assert {v["state"] for v in ended.values()} == {"succeeded"}
    # By the database's clock, not by when a poll saw it: alpha's backlog was still
    # draining when beta's last job ended.
    beta_done = max(datetime.fromisoformat(v["finished_at"]) for v in views.values())
    alpha_done = max(datetime.fromisoformat(v["finished_at"]) for v in ended.values())
    assert beta_done < alpha_done, "alpha's backlog should still be draining when beta's ended"
    # Each pool's jobs went to its own topic, and only its own group read them.
    stored = asyncio.run(topics_of(stack.database_url))
    assert stored == Counter(
        {
            ("alpha", constants.DISPATCH_TOPIC): len(alpha),
            ("beta", f"{constants.DISPATCH_TOPIC}.beta"): BETA,
        }
    )
    beta_group = f"{constants.WORKER_GROUP}.beta"
    beta_read = asyncio.run(
        committed_total(stack.bootstrap, beta_group, f"{constants.DISPATCH_TOPIC}.beta")
    )
    alpha_read = asyncio.run(
        committed_total(stack.bootstrap, constants.WORKER_GROUP, constants.DISPATCH_TOPIC)
    )
    assert (alpha_read, beta_read) == (len(alpha), BETA)
    metrics = httpx.get(f"{stack.api_url}/metrics").text
    assert f'{constants.M_LAG}{{model="beta"}}' in metrics
    assert stack.stop() == 0
