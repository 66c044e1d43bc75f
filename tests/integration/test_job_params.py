"""A request's model and sampling parameters on the real database and broker: stored with the
job, read back by the worker's claim and carried into its engine's generate call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.service import run_relay
from schemas.sampling import SummaryOptions, instruction
from schemas.tables import jobs
from tests.integration.pipeline import Pipeline, open_pipeline
from workers.engines.base import GenerationRequest, SamplingParams
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker


class RecordingEngine(SimEngine):
    """The simulator, remembering every request it was asked to generate."""

    def __init__(self) -> None:
        super().__init__(time_scale=0.0)
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        return super().generate(request)


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    async for p in open_pipeline(settings):
        yield p


def line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "the sluice gate holds"}], **body},
    }


async def test_a_batch_lines_parameters_reach_the_engine(
    pipeline: Pipeline, db: AsyncEngine
) -> None:
    asked = {"max_completion_tokens": 9, "temperature": 0.3, "top_p": 0.5, "stop": "gate"}
    lines = [
        line("with", model="sim", seed=11, **asked),
        line("without", max_tokens=5),
    ]
    r = await pipeline.client.post("/v1/batches", json={"requests": lines})
    assert r.status_code == 201, r.text
    async with db.connect() as conn:
        stored = dict((await conn.execute(select(jobs.c.custom_id, jobs.c.params))).all())
    assert stored == {
        "with": {"model": "sim", "temperature": 0.3, "top_p": 0.5, "stop": ["gate"], "seed": 11},
        "without": None,
    }
    engine = RecordingEngine()
    pipeline.start(run_relay)
    pipeline.start(partial(run_worker, engine=engine))
    batch_id = r.json()["id"]
    async with db.connect() as conn:
        ids = [str(i) for i in await conn.scalars(select(jobs.c.id))]
    views = await pipeline.wait_terminal(ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    by_tokens = {request.max_tokens: request for request in engine.requests}
    assert by_tokens[9].sampling == SamplingParams(
        model="sim", temperature=0.3, top_p=0.5, stop=("gate",), seed=11
    )
    assert by_tokens[5].sampling is None
    answer = await pipeline.client.get(f"/v1/batches/{batch_id}/results")
    lines_out = [json.loads(text) for text in answer.text.splitlines()]
    outputs = {o["custom_id"]: o["response"]["body"] for o in lines_out}
    assert "gate" not in outputs["with"]["choices"][0]["message"]["content"]  # stopped before
    assert outputs["with"]["model"] == "sim"


async def test_a_single_submits_parameters_are_stored(pipeline: Pipeline, db: AsyncEngine) -> None:
    body = {"kind": "complete", "input": "hi there", "temperature": 0, "stop": ["\n", "."]}
    r = await pipeline.client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    async with db.connect() as conn:
        params = await conn.scalar(select(jobs.c.params).where(jobs.c.id == r.json()["id"]))
    assert params == {"temperature": 0, "stop": ["\n", "."]}


async def test_an_unknown_model_is_refused(pipeline: Pipeline) -> None:
    r = await pipeline.client.post(
        "/v1/jobs", json={"kind": "complete", "input": "hi", "model": "gpt-4o"}
    )
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    lines = [line("a", model="sim"), line("b", model="gpt-4o"), line("c", temperature=3)]
    r = await pipeline.client.post("/v1/batches", json={"requests": lines})
    assert r.status_code == 422
    details = r.json()["error"]["details"]
    assert [(d["custom_id"], d["code"]) for d in details] == [
        ("b", "model_not_found"),
        ("c", "invalid_request"),
    ]
    assert details[0]["message"] == (
        "The model `gpt-4o` does not exist or you do not have access to it."
    )


async def test_a_summarys_options_reach_the_engine_and_results_say_why_they_ended(
    pipeline: Pipeline, db: AsyncEngine
) -> None:
    doc = " ".join(f"Sentence {i} says the sluice gate holds the water back." for i in range(30))
    asked = {"style": "bullets", "language": "French", "words": 40}
    r = await pipeline.client.post(
        "/v1/jobs", json={"kind": "summarize", "input": doc, "max_tokens": 300, "summary": asked}
    )
    assert r.status_code == 202, r.text
    cut = await pipeline.client.post(
        "/v1/jobs", json={"kind": "complete", "input": "the gate holds", "max_tokens": 3}
    )
    assert cut.status_code == 202, cut.text
    refused = await pipeline.client.post(
        "/v1/jobs", json={"kind": "complete", "input": "hi", "summary": {"style": "bullets"}}
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "summary_not_applicable"
    async with db.connect() as conn:
        params = await conn.scalar(select(jobs.c.params).where(jobs.c.id == r.json()["id"]))
    assert params == {"summary": asked}
    engine = RecordingEngine()
    pipeline.start(run_relay)
    pipeline.start(partial(run_worker, engine=engine))
    views = await pipeline.wait_terminal([r.json()["id"], cut.json()["id"]])
    summary, completion = views[r.json()["id"]], views[cut.json()["id"]]
    assert summary["state"] == completion["state"] == "succeeded"
    (request,) = [q for q in engine.requests if q.kind.value == "summarize"]
    assert request.instruction == instruction(SummaryOptions.model_validate(asked))
    assert summary["result"]["finish_reason"] == "stop"  # the extract ended first
    assert completion["result"]["finish_reason"] == "length"  # cut at its 3 tokens
    assert completion["result"]["output_tokens"] == 3
