"""Settings of a worker: how it pulls jobs, reserves KV cache and drops unreachable ones."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class WorkerSettings(SettingsGroup):
    """A worker process (`sluicegate worker`): its engine, its pull gate and KV-cache
    reservations, and its pre-decode gate (docs/workers.md)."""

    title: ClassVar[str] = "Workers"
    path: ClassVar[str] = "worker"

    engine: Literal["sim", "vllm_http", "vllm_local", "llamacpp"] = Field(
        default="sim",
        description="The inference engine: `sim` (the simulator, in process), `vllm_http` (a "
        "`vllm serve` or `sluicegate sim-server` at `vllm_url`), `vllm_local` (an in-process "
        "vLLM; needs the vllm extra and a GPU) or `llamacpp` (a llama.cpp server at "
        "`llamacpp_url`).",
    )
    worker_max_running: int = Field(
        default=256,
        ge=1,
        description="Jobs in flight on one worker at most, whatever the KV cache could hold.",
    )
    worker_db_pool_size: int = Field(
        default=8, ge=1, description="Size of a worker's PostgreSQL connection pool."
    )
    worker_max_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Prompt tokens a worker lets be in prefill at once. About twice the "
        "engine's `max_num_batched_tokens` keeps its step budget full while pacing refills. "
        "Unset: no cap.",
    )
    kv_watermark: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="Fraction of the KV cache a worker keeps free beyond every reservation "
        "(vLLM's own scheduler keeps a 1 % watermark too).",
    )
    expected_output: Literal["max_tokens", "observed"] = Field(
        default="max_tokens",
        description="Output tokens to reserve for a job: its `max_tokens` (`max_tokens`), or "
        "(`observed`) once enough jobs of its kind finished here, a high quantile of their "
        "observed output (capped by `max_tokens`).",
    )
    observed_quantile: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="With `expected_output=observed`: the quantile of the observed outputs "
        "reserved for.",
    )
    observed_min_samples: int = Field(
        default=50,
        ge=1,
        description="With `expected_output=observed`: jobs of a kind that must have finished "
        "here before their outputs are used (until then, `max_tokens`).",
    )
    observed_window: int = Field(
        default=1000,
        ge=1,
        description="With `expected_output=observed`: the most recent outputs of each kind "
        "kept for the quantile.",
    )
    worker_fetch_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Bytes a worker's consumer fetches per partition at once (bounds the "
        "client's prefetch of records it has not taken yet).",
    )
    worker_group_protocol: Literal["classic", "consumer"] = Field(
        default="consumer",
        description="The worker group's rebalance protocol. `consumer` (KIP-848, through "
        "confluent-kafka): the broker assigns, and a member joining or leaving revokes only "
        "the partitions that move while the others go on; its session timeout and "
        "heartbeat are the broker's `group.consumer.*` settings. `classic`: aiokafka's eager "
        "protocol, where every move revokes every partition of every member (the only one "
        "Tansu and Kafka before 4.0 speak). "
        "docs/operations.md#rebalances-the-worker-groups-protocol",
    )
    worker_group_instance_id: str | None = Field(
        default=None,
        description="Static membership of the worker group (KIP-345, and its KIP-848 form on "
        "the consumer protocol): a stable id, unique in the group. A worker restarted with the "
        "same id within the session timeout gets its partitions back and no other partition "
        "moves; a stopped one keeps them until that timeout passes. Unset: a dynamic member. "
        "`sluicegate up` gives its workers `worker-1`, `worker-2`, ...",
    )
    worker_session_timeout_ms: int = Field(
        default=10_000,
        ge=1_000,
        description="The classic worker group's session timeout: a worker silent this long is "
        "taken out of the group and its partitions go to the others. On the consumer protocol "
        "the broker's `group.consumer.session.timeout.ms` holds instead.",
    )
    drain_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="The time a worker whose partitions are revoked (or that stops) has to "
        "end or abort their running jobs; a job taken over by a newer attempt is claimed "
        "back if it still runs after this long.",
    )
    claim_batch: int = Field(
        default=64,
        ge=1,
        description="Most dispatch records claimed in one transaction (their states looked "
        "up in one query).",
    )
    end_linger_ms: float = Field(
        default=250.0,
        ge=0,
        description="How long a finished job's terminal write may wait for the worker's next "
        "claim, to commit in the claim's transaction (one commit for both instead of two). "
        "Under load a claim follows each end within milliseconds; at low load a result shows "
        "up to this much later. 0: every end commits alone, at once.",
    )
    drop_unreachable: bool = Field(
        default=True,
        description="Expire a job before decode when now + its predicted service time (from "
        "its prompt, its expected output and the engine's measured speed) is past its "
        "deadline.",
    )
    speed_window: int = Field(
        default=256,
        ge=1,
        description="Jobs finished here that the measured speed is the median of.",
    )
    speed_min_samples: int = Field(
        default=8,
        ge=1,
        description="Jobs that must have finished before the measured speed is used (by the "
        "pre-decode gate here, and by the API's deadline-aware admission).",
    )
    worker_report_s: float = Field(
        default=5.0,
        gt=0,
        description="How often a worker writes its row in `workers` (its model, engine, "
        "capacity, running jobs and KV usage) for `GET /v1/overview` and `sluicegate status`; "
        "a row not written for three intervals is shown as stale.",
    )
    control_sweep_s: float = Field(
        default=0.5,
        gt=0,
        description="How often a worker re-reads the states of the jobs it runs while one of "
        "them has a heartbeat lease (`abandon_after_s`): abandons the jobs whose lease lapsed. "
        "Without a lease among them it re-reads every 10 intervals, which catches a job "
        "taken over by a newer attempt; it also re-reads at once whenever its LISTEN "
        "connection (re)connects, which catches notices missed while it was down.",
    )
