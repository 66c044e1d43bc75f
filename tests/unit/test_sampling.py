"""Model and sampling parameters: parsed and range-checked per request line (a bad one is
that line's error), stored as given, read back by the worker and mapped by each engine."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from plumbing.settings import Settings
from producers.batches.input import requests_of
from producers.jobs.submission import new_job, request_hash
from schemas.api import SubmitJob
from schemas.batches import InvalidBatch
from schemas.batches.lines import RequestLine, line_request
from schemas.jobs import JobKind
from schemas.sampling import ModelNotFound, check_model, sampling_params
from workers.engines.base import GenerationRequest, SamplingParams, openai_sampling
from workers.engines.errors import UnsupportedParameter
from workers.engines.llamacpp.engine import check_sampling
from workers.engines.sim.output import simulated_output
from workers.engines.vllm.local import sampling_kwargs

SETTINGS = Settings(models=["sim", "alias"])
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(custom_id: str = "c", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": MESSAGES, **body},
    }


def asked(url: str, body: dict[str, Any]) -> Any:
    return line_request(RequestLine(custom_id="c", method="POST", url=url, body=body))


def test_every_endpoint_takes_the_parameters() -> None:
    given = {"model": "sim", "temperature": 0.5, "top_p": 1, "stop": "\n", "seed": -3}
    stored = {"model": "sim", "temperature": 0.5, "top_p": 1, "stop": ["\n"], "seed": -3}
    for url, body in [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 9}),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 9}),
        ("/v1/jobs", {"kind": "complete", "input": "x", "max_tokens": 9}),
        ("/v1/summarize", {"input": "doc", "max_tokens": 9}),
    ]:
        request = asked(url, {**body, **given})
        assert (request.max_tokens, request.model, request.params) == (9, "sim", stored), url


def test_no_parameters_store_nothing() -> None:
    request = asked("/v1/completions", {"prompt": "Once", "temperature": None, "stop": []})
    assert (request.model, request.params) == (None, None)
    assert sampling_params() is None
    assert sampling_params(temperature=0, seed=0) == {"temperature": 0, "seed": 0}


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 2.01},
        {"temperature": -0.1},
        {"temperature": "hot"},
        {"top_p": 0},
        {"top_p": 1.5},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stop": [""]},
        {"stop": 5},
        {"seed": 1.5},
        {"seed": True},
        {"seed": 2**63},
        {"model": ""},
        {"model": 4},
    ],
)
def test_out_of_range_parameters_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        asked("/v1/chat/completions", {"messages": MESSAGES, **bad})


def test_a_bad_parameter_or_unknown_model_is_that_lines_error() -> None:
    lines = [
        chat("ok", model="alias", temperature=0),
        chat("hot", temperature=3),
        chat("who", model="gpt-4o"),
        chat("many", stop=["a", "b", "c", "d", "e"]),
        chat("plain"),
    ]
    with pytest.raises(InvalidBatch) as refused:
        requests_of(lines, SETTINGS.api)
    details = refused.value.details
    assert isinstance(details, list)
    assert [(d["line"], d["custom_id"], d["code"]) for d in details] == [
        (2, "hot", "invalid_request"),
        (3, "who", "model_not_found"),
        (4, "many", "invalid_request"),
    ]
    assert details[0]["message"].startswith("temperature: ")
    assert details[1]["message"] == (
        "The model `gpt-4o` does not exist or you do not have access to it."
    )


def test_the_lines_parameters_go_with_their_requests() -> None:
    _, requests = requests_of([chat("a", model="sim", seed=4), chat("b")], SETTINGS.api)
    assert [r.params for r in requests] == [{"model": "sim", "seed": 4}, None]


def test_the_default_models_are_the_names_results_report() -> None:
    served = Settings().models
    assert {"sim", "llamacpp", "vllm_http", "vllm_local"} <= set(served)
    check_model(None, served)
    check_model("sim", served)
    with pytest.raises(ModelNotFound) as refused:
        check_model("gpt-4o-mini", served)
    assert (refused.value.code, refused.value.status) == ("model_not_found", 404)


def submit(**fields: Any) -> SubmitJob:
    return SubmitJob.model_validate({"kind": "complete", "input": "hi", **fields})


def test_a_single_submit_carries_them_and_checks_the_model() -> None:
    now = datetime.now(UTC)
    job = new_job(
        submit(model="sim", top_p=0.9, stop=["x"]),
        tenant="t",
        header_key=None,
        now=now,
        api=SETTINGS.api,
    )
    assert job.params == {"model": "sim", "top_p": 0.9, "stop": ["x"]}
    with pytest.raises(ModelNotFound):
        new_job(submit(model="nope"), tenant="t", header_key=None, now=now, api=SETTINGS.api)
    with pytest.raises(ValidationError):
        submit(temperature=5)


def test_a_request_hash_without_parameters_is_unchanged() -> None:
    """Idempotency keys stored before the parameters (and ``summary``) existed still match
    their replays."""
    body = submit(idempotency_key="k")
    canonical = body.model_dump_json(
        exclude={"idempotency_key", "model", "temperature", "top_p", "stop", "seed", "summary"}
    )
    assert request_hash(body) == hashlib.sha256(canonical.encode()).hexdigest()
    assert request_hash(submit(seed=1)) != request_hash(submit(seed=2))


def test_the_worker_reads_them_back() -> None:
    assert SamplingParams.from_stored(None) is None
    assert SamplingParams.from_stored({}) is None
    stored = {"model": "sim", "temperature": 0, "top_p": 1, "stop": ["a"], "seed": 9}
    assert SamplingParams.from_stored(stored) == SamplingParams(
        model="sim", temperature=0.0, top_p=1.0, stop=("a",), seed=9
    )


def test_openai_bodies_and_vllm_sampling_params_get_them() -> None:
    sampling = SamplingParams(model="sim", temperature=0.0, stop=("a", "b"), seed=3)
    assert openai_sampling(None) == {}
    assert openai_sampling(sampling) == {"temperature": 0.0, "stop": ["a", "b"], "seed": 3}
    assert sampling_kwargs(None, 0.7) == {"temperature": 0.7}
    assert sampling_kwargs(SamplingParams(top_p=0.5), 0.7) == {"temperature": 0.7, "top_p": 0.5}
    assert sampling_kwargs(sampling, 0.7) == {"temperature": 0.0, "stop": ["a", "b"], "seed": 3}


def test_llamacpp_refuses_a_seed_it_would_not_apply() -> None:
    check_sampling(None)
    check_sampling(SamplingParams(seed=0))
    check_sampling(SamplingParams(seed=2**32 - 2))
    for seed in (-1, 2**32 - 1, 2**40):
        with pytest.raises(UnsupportedParameter) as refused:
            check_sampling(SamplingParams(seed=seed))
        assert refused.value.code == "unsupported_parameter"


def sim(sampling: SamplingParams | None, kind: JobKind = JobKind.COMPLETE) -> str:
    request = GenerationRequest(
        request_id="r", kind=kind, input="The gate holds the water back.", max_tokens=60,
        sampling=sampling,
    )  # fmt: skip
    return "".join(simulated_output(request))


def test_the_simulator_stops_at_a_stop_string_and_follows_its_seed() -> None:
    plain = sim(None)
    stop = plain.split()[3]
    assert sim(SamplingParams(stop=(stop,))) == plain[: plain.index(stop)]
    assert sim(SamplingParams(stop=("never there",))) == plain
    assert sim(SamplingParams(temperature=1.9, top_p=0.1)) == plain  # accepted, no effect
    assert sim(SamplingParams(seed=1)) == sim(SamplingParams(seed=1)) != sim(SamplingParams(seed=2))
    assert sim(SamplingParams(seed=1)) != plain
    summary = sim(None, JobKind.SUMMARIZE)
    assert sim(SamplingParams(stop=(".",)), JobKind.SUMMARIZE) == summary[: summary.index(".")]
