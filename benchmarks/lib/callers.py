"""The overload benchmark's callers, in the same process as the API: each submits its
arrival (retrying 429 and 503 while its deadline allows), then cancels, or polls and goes
away, as the trace says; every refused attempt is counted in ``REFUSALS``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from benchmarks.lib.stack import TERMINAL, Bench
from benchmarks.lib.trace import Arrival
from schemas import constants

TENANT = "bench"
LEASE_S = 3.0  # the leaving callers' heartbeat lease; they poll every LEASE_S / 3


async def call(
    bench: Bench, arrival: Arrival, t0: float, wall0: datetime, accepted: dict[str, Arrival]
) -> None:
    """One caller: submit (retrying on 429/503 while its deadline allows), then cancel,
    or poll and go away, as the trace says."""
    await asyncio.sleep(max(0.0, arrival.at_s - (time.monotonic() - t0)))
    deadline = wall0 + timedelta(seconds=arrival.at_s + arrival.ttl_s)
    body: dict[str, Any] = {
        "kind": "summarize",
        "input": arrival.doc,
        "max_tokens": arrival.max_tokens,
        "deadline": deadline.isoformat(),
    }
    if arrival.action == "leave":
        body["abandon_after_s"] = LEASE_S
    headers = {constants.HEADER_TENANT: TENANT}
    while True:
        r = await bench.client.post("/v1/jobs", json=body, headers=headers)
        if r.status_code == 202:
            break
        REFUSALS[refusal_reason(r)] += 1
        if r.status_code not in (429, 503):
            return  # refused for good (deadline unreachable, or already past)
        wait_s = float(r.headers.get("Retry-After", "1"))
        if datetime.now(UTC) + timedelta(seconds=wait_s) >= deadline:
            return
        await asyncio.sleep(wait_s)
    job_id = r.json()["id"]
    accepted[job_id] = arrival
    act_at = arrival.at_s + arrival.action_after_s
    if arrival.action == "cancel":
        await asyncio.sleep(max(0.0, act_at - (time.monotonic() - t0)))
        await bench.client.delete(f"/v1/jobs/{job_id}", headers=headers)
    elif arrival.action == "leave":
        while time.monotonic() - t0 < act_at:
            view = await bench.client.get(f"/v1/jobs/{job_id}", headers=headers)
            if view.json().get("state") in TERMINAL:
                return
            await asyncio.sleep(LEASE_S / 3)


REFUSALS: Counter[str] = Counter()  # every refused attempt, retried or not, by reason


def refusal_reason(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return str(r.status_code)
    return str(body.get("reason") or body.get("error", {}).get("code") or r.status_code)


async def warm_up(bench: Bench, count: int) -> None:
    """Let the worker join its group and measure the engine's speed on a few jobs."""
    ids = []
    for _ in range(count):
        r = await bench.client.post(
            "/v1/jobs",
            json={"kind": "summarize", "input": "A short warm-up note. " * 40, "max_tokens": 64},
            headers={constants.HEADER_TENANT: "warmup"},
        )
        ids.append(r.json()["id"])
    async with asyncio.timeout(120):
        for job_id in ids:
            while True:
                view = await bench.client.get(
                    f"/v1/jobs/{job_id}", headers={constants.HEADER_TENANT: "warmup"}
                )
                if view.json()["state"] in TERMINAL:
                    break
                await asyncio.sleep(0.2)
