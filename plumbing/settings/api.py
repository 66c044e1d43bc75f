"""Settings of the submit API: who the caller is, where it listens, what a request may be."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class ApiSettings(SettingsGroup):
    """The HTTP API (`sluicegate api`): authentication, its socket, request limits, and the
    group commit of single submits."""

    title: ClassVar[str] = "API"
    path: ClassVar[str] = "api"

    auth: Literal["api_key", "tenant_header"] = Field(
        default="api_key",
        description="Who the caller is: `api_key` maps an `Authorization: Bearer <key>` to "
        "its tenant (keys made with `sluicegate keys create`, stored hashed); "
        "`tenant_header` trusts the `X-Sluicegate-Tenant` header, for a deployment behind a "
        "gateway that authenticates.",
    )
    api_key_cache_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a key looked up stays cached in the API (a revocation takes "
        "this long to apply).",
    )
    api_host: str = Field(
        default="127.0.0.1",
        description="Address the API listens on (and the command-line clients call).",
    )
    api_port: int = Field(
        default=8000, description="Port the API listens on (and the command-line clients call)."
    )
    max_body_bytes: int = Field(
        default=5 * 1_048_576,
        ge=1024,
        description="Largest request body, in bytes, except a batch's (413 otherwise).",
    )
    max_batch_bytes: int = Field(
        default=128 * 1_048_576,
        ge=1024,
        description="Largest body of `POST /v1/batches` (a JSON list or a JSONL upload), in bytes.",
    )
    max_bulk_jobs: int = Field(
        default=1000,
        ge=1,
        description="Most jobs one `POST /v1/jobs/bulk` may hold (its body is also under "
        "`max_body_bytes`). Each is admitted as a single submit.",
    )
    max_batch_requests: int = Field(
        default=50_000,
        ge=1,
        description="Most requests one batch may hold (OpenAI's limit, 50,000). A batch is "
        "accepted whole and metered into the dispatch topic (`batch_fill`), whatever the lag.",
    )
    max_file_bytes: int = Field(
        default=200 * 1_048_576,
        ge=1024,
        description="Largest file `POST /v1/files` takes, in bytes (OpenAI's Batch input "
        "limit, 200 MB); its multipart body may be 64 KiB over it (413 otherwise).",
    )
    max_file_lines: int = Field(
        default=50_000,
        ge=1,
        description="Most request lines (blank lines aside) a `purpose=batch` file may hold "
        "(OpenAI's Batch limit).",
    )
    request_read_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="A request body must keep arriving (a slow-loris upload holds a "
        "connection and a task for as long as it trickles): 408 `request_timeout` when no "
        "part of it came for this long.",
    )
    request_min_rate: int = Field(
        default=500,
        ge=0,
        description="408 `request_timeout` when, after its first `request_read_timeout_s`, a "
        "body averages under this many bytes a second (0: no minimum rate).",
    )
    max_input_bytes: int = Field(
        default=4 * 1_048_576,
        ge=1,
        description="Largest `input` of one job, in UTF-8 bytes (a single submit's or a batch "
        "line's): about 1,000,000 tokens, a document of some 2,000 pages. A summarize job longer "
        "than its engine's context becomes a graph of jobs (docs/graphs.md).",
    )
    max_tokens_limit: int = Field(
        default=8192, ge=1, description="Largest `max_tokens` a job may ask for."
    )
    models: list[str] = Field(
        default=["sim", "llamacpp", "vllm_http", "vllm_local", "meta-llama/Llama-3.1-8B-Instruct"],
        min_length=1,
        description="The model names the workers serve (names of their one model): a request's "
        "`model` must be one of them or left out, else 404 `model_not_found` (a batch line's "
        "error). By default the engines' names, which results report as their `model`, and "
        '`vllm_model`\'s default. A JSON list: `["my-model"]`.',
    )
    default_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description="A job's time to live when its request gives no `ttl_s`: its deadline is "
        "that long after it was submitted.",
    )
    max_ttl_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="Largest `ttl_s` (and `abandon_after_s`) a request may give.",
    )
    api_max_connections: int = Field(
        default=1024,
        ge=1,
        description="Connections the API serves at once (uvicorn's concurrency limit), and "
        "the most requests waiting for a terminal state (`?wait=`).",
    )
    max_wait_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest a request may hold its connection waiting for a terminal state "
        "(`?wait=`).",
    )
    sync_deadline_s: float = Field(
        default=60.0,
        gt=0,
        description="The deadline of a synchronous `POST /v1/chat/completions` or "
        "`/v1/completions` that sends no `X-Sluicegate-Deadline-S` header: its job's time to "
        "live and how long the request waits for it (at most `max_wait_s`).",
    )
    api_shutdown_timeout_s: int = Field(
        default=5,
        ge=1,
        description="On SIGTERM, how long the API lets open requests (waits included) finish.",
    )
    api_fast_submit: bool = Field(
        default=True,
        description="Answer a plain `POST /v1/jobs` (no `?wait=`, a JSON body the model "
        "takes) in a route ahead of FastAPI's own, with the route's own code but "
        "without FastAPI's per-request dependency solving (`producers/api/fast_submit.py`); "
        "its answers are the route's, byte for byte. false: every submit through FastAPI.",
    )
    submit_batch_max: int = Field(
        default=256,
        ge=1,
        description="Group commit of single submits (`producers/jobs/group_commit.py`): "
        "concurrent `POST /v1/jobs` are stored by one statement in one transaction, each "
        "answered after its commit. A group is written at once when no other is being "
        "written; else when it holds this many submits, or `submit_batch_wait_ms` after its "
        "first, and one of the `submit_batch_writers` is free. 1: one statement per submit.",
    )
    submit_batch_wait_ms: float = Field(
        default=2.0,
        ge=0,
        le=1000,
        description="Longest a group of submits waits for more before it is written (while "
        "another group is being written).",
    )
    submit_batch_writers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Groups of submits being written at once.",
    )
    ride_linger_ms: float = Field(
        default=200.0,
        ge=0,
        le=5000,
        description="How long the API's own periodic reads (the lag reading, the flow "
        "report, the jobs-by-state gauge) wait to ride in the next group of submits' "
        "transaction instead of committing alone. Under load a submit comes within "
        "milliseconds; idle, a read runs alone this much later. 0: each reads alone.",
    )
