"""One frozen settings object, built once per entry point and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from platformdirs import user_data_path
from pydantic import Field, IPvAnyNetwork, NonNegativeFloat
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import constants


class MissingSetting(RuntimeError):
    """A role started without a setting it cannot run without."""


def default_data_dir() -> Path:
    return user_data_path("sluicegate", appauthor=False)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICEGATE_", frozen=True, extra="ignore")

    # Services. None means: start the embedded one (sluicegate up / demo only).
    database_url: str | None = None
    kafka_bootstrap_servers: str | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    log_level: str = "INFO"
    # Serve Prometheus metrics of a relay or worker process on this port (None: off).
    metrics_port: int | None = None

    # Kafka
    dispatch_topic: str = constants.DISPATCH_TOPIC
    events_topic: str = constants.EVENTS_TOPIC
    dead_letter_topic: str = constants.DEAD_LETTER_TOPIC
    consumer_group: str = constants.WORKER_GROUP
    partitions: int = Field(default=4, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    # Apache Kafka supports the idempotent producer; the embedded Tansu broker does not.
    kafka_idempotent_producer: bool = True
    # Apache Kafka's ListOffsets end is exact (the high watermark of acknowledged records);
    # Tansu's can trail by a record batch. Off, the reconciler does not take a record at or
    # past the end for a lost one.
    kafka_exact_end_offsets: bool = True

    # API
    # Who the caller is: "api_key" maps an `Authorization: Bearer <key>` to its tenant
    # (keys made with `sluicegate keys create`, stored hashed); "tenant_header" trusts the
    # X-Sluicegate-Tenant header, for a deployment behind a gateway that authenticates.
    auth: Literal["api_key", "tenant_header"] = "api_key"
    # How long a key looked up stays cached in the API (a revocation takes this long).
    api_key_cache_s: float = Field(default=30.0, ge=0)
    # The key the command-line clients send (default: the local stack's, from data_dir).
    api_key: str | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    # POST /v1/batches (a JSON list or a JSONL upload): its own body limit, and how many
    # requests a batch may hold (lag_hard bounds it too: a batch fits under it whole).
    max_batch_bytes: int = Field(default=128 * 1_048_576, ge=1024)
    max_batch_requests: int = Field(default=50_000, ge=1)
    # A request body must keep arriving (a slow-loris upload holds a connection and a task
    # for as long as it trickles): 408 request_timeout when no part of it came for
    # request_read_timeout_s, or when, after its first request_read_timeout_s, it averages
    # under request_min_rate bytes a second (0: no minimum rate).
    request_read_timeout_s: float = Field(default=15.0, gt=0)
    request_min_rate: int = Field(default=500, ge=0)
    max_input_bytes: int = Field(default=262_144, ge=1)
    max_tokens_limit: int = Field(default=8192, ge=1)
    default_ttl_s: float = Field(default=3600.0, gt=0)
    max_ttl_s: float = Field(default=7 * 86400.0, gt=0)

    # Admission (docs/operations.md derives the defaults from Little's law)
    lag_interval_s: float = Field(default=0.5, gt=0)
    lag_stale_after_s: float = Field(default=5.0, gt=0)
    # What the thresholds compare: "open", the records past the worker group's committed
    # offset whose job has not ended (PostgreSQL knows each job's dispatch position); or
    # "consumer", the plain consumer lag (end - committed). A worker runs many jobs of a
    # partition at once and commits only up to its oldest running one, so the consumer lag
    # also counts records of jobs that already ended (docs/operations.md).
    lag_measure: Literal["open", "consumer"] = "open"
    lag_soft: int = Field(default=2000, ge=0)
    lag_hard: int = Field(default=4000, ge=1)
    admission_mode: Literal["block", "reject"] = "block"
    max_block_ms: int = Field(default=5000, ge=0)
    max_blocked: int = Field(default=64, ge=0)
    # Leave the throttled state only once lag falls below lag_soft * (1 - hysteresis).
    admission_hysteresis: float = Field(default=0.1, ge=0, lt=1)
    # Low-priority jobs block from lag_soft * low_priority_factor and are refused at lag_soft.
    low_priority_factor: float = Field(default=0.5, gt=0, le=1)
    deadline_aware: bool = True
    # The service time deadline-aware admission predicts is max_tokens x seconds per output
    # token: with "measured", the median of the jobs that succeeded in the last minute
    # (started to finished over tokens decoded, prefill included) once speed_min_samples of
    # them ended; until then, and with "static", expected_token_time_s.
    deadline_speed: Literal["measured", "static"] = "measured"
    expected_token_time_s: float = Field(default=0.02, ge=0)
    retry_after_min_s: float = Field(default=1.0, gt=0)
    retry_after_max_s: float = Field(default=60.0, gt=0)
    # A refusal for lag says that no worker consumes when the backlog has not moved for
    # this long and no job is running.
    no_worker_after_s: float = Field(default=10.0, gt=0)
    # Per-tenant limits; None: unlimited.
    tenant_rpm: int | None = Field(default=None, ge=1)
    tenant_tpm: int | None = Field(default=None, ge=1)
    api_max_connections: int = Field(default=1024, ge=1)
    # Longest a request may hold its connection waiting for a terminal state (?wait=).
    max_wait_s: float = Field(default=60.0, gt=0)
    # On SIGTERM, how long the API lets open requests (waits included) finish.
    api_shutdown_timeout_s: int = Field(default=5, ge=1)
    # Group commit of single submits (producers/jobs/group_commit.py): concurrent POST /v1/jobs
    # are stored by one statement, one transaction, each answered after its commit. A group
    # is written at once when no other is being written; else when it holds
    # submit_batch_max submits, or submit_batch_wait_ms after its first, and one of the
    # submit_batch_writers is free. submit_batch_max = 1: one statement per submit.
    submit_batch_max: int = Field(default=256, ge=1)
    submit_batch_wait_ms: float = Field(default=2.0, ge=0, le=1000)
    submit_batch_writers: int = Field(default=2, ge=1, le=64)

    # Outbox relay
    relay_batch_size: int = Field(default=500, ge=1)
    relay_idle_poll_s: float = Field(default=1.0, gt=0)
    relay_send_timeout_s: float = Field(default=15.0, gt=0)
    # The reconciler (in the relay process, producers/outbox/reconciler.py) compares each job's
    # dispatch record position with the broker's log this often and dispatches again the
    # jobs whose record is gone: the bound on how long such a job waits.
    reconcile_interval_s: float = Field(default=15.0, gt=0)
    # A running job whose record is gone is dispatched again (a new attempt that fences the
    # old one) only once its attempt has run this long: its worker may still be decoding.
    reconcile_running_after_s: float = Field(default=900.0, gt=0)

    # Workers
    engine: Literal["sim", "vllm_http", "vllm_local", "llamacpp"] = "sim"
    # How a worker pulls: "kv" starts a job only when the engine's KV cache can hold it;
    # "greedy" takes every record it can fetch and lets the engine queue (for comparison).
    pull_policy: Literal["kv", "greedy"] = "kv"
    # Jobs in flight on one worker at most, whatever the KV cache could hold.
    worker_max_running: int = Field(default=256, ge=1)
    worker_db_pool_size: int = Field(default=8, ge=1)
    # Prompt tokens a worker lets be in prefill at once (None: no cap). About twice the
    # engine's max_num_batched_tokens keeps its step budget full while pacing refills.
    worker_max_prefill_tokens: int | None = Field(default=None, ge=1)
    # Fraction of the KV cache a worker keeps free beyond every reservation (vLLM's own
    # scheduler keeps a 1 % watermark too).
    kv_watermark: float = Field(default=0.01, ge=0, lt=1)
    # Output tokens to reserve for a job: its max_tokens, or once enough jobs of its kind
    # finished here, a high quantile of their observed output (capped by max_tokens).
    expected_output: Literal["max_tokens", "observed"] = "max_tokens"
    observed_quantile: float = Field(default=0.95, gt=0, le=1)
    observed_min_samples: int = Field(default=50, ge=1)
    observed_window: int = Field(default=1000, ge=1)
    # Bytes a worker's consumer fetches per partition at once (bounds the client's
    # prefetch of records it has not taken yet).
    worker_fetch_bytes: int = Field(default=64 * 1024, ge=1024)
    drain_timeout_s: float = Field(default=20.0, gt=0)
    # Most dispatch records claimed in one transaction (their states looked up in one query).
    claim_batch: int = Field(default=64, ge=1)
    # Expire a job before decode when now + its predicted service time (from its prompt,
    # its expected output and the engine's measured speed) is past its deadline.
    drop_unreachable: bool = True
    # Jobs finished here that the measured speed is the median of; the prediction waits
    # for speed_min_samples of them.
    speed_window: int = Field(default=256, ge=1)
    speed_min_samples: int = Field(default=8, ge=1)
    # How often a worker re-reads the states of the jobs it runs: catches a notice missed
    # while its LISTEN connection was down, and heartbeat leases that lapsed.
    control_sweep_s: float = Field(default=0.5, gt=0)

    # Simulator engine (engine = "sim"): an 8B Llama-class model on an 80 GB GPU by default.
    sim_time_scale: float = Field(default=1.0, ge=0)
    sim_num_blocks: int | None = Field(default=None, ge=1)  # None: sized from the profiles
    sim_block_size: int = Field(default=16, ge=1)
    sim_max_num_seqs: int = Field(default=256, ge=1)
    sim_max_num_batched_tokens: int = Field(default=8192, ge=1)

    # vLLM engines. vllm_http: a `vllm serve` (or `sluicegate sim-server`) at vllm_url;
    # vllm_local: an in-process AsyncLLM of vllm_model (needs the vllm extra and a GPU).
    vllm_url: str = "http://127.0.0.1:8001"
    vllm_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    vllm_metrics_interval_s: float = Field(default=0.1, gt=0)
    vllm_request_timeout_s: float = Field(default=600.0, gt=0)
    vllm_gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    vllm_max_model_len: int | None = Field(default=None, ge=1)
    vllm_block_size: int = Field(default=16, ge=1)
    vllm_max_num_seqs: int = Field(default=256, ge=1)

    # llama.cpp engine (engine = "llamacpp"): a llama.cpp server (`sluicegate llama-server`,
    # which `up --engine llamacpp` runs per worker) at llamacpp_url, on a GGUF model: the one
    # `sluicegate model pull` puts in data_dir/models when llamacpp_model_path is None.
    llamacpp_url: str = "http://127.0.0.1:8002"
    llamacpp_model_path: Path | None = None
    # Sequences decoded at once (llama.cpp's slots), each with a context of its own of
    # llamacpp_slot_context tokens: prompt + max_tokens of a job must fit in one.
    llamacpp_slots: int = Field(default=2, ge=1)
    llamacpp_slot_context: int = Field(default=2048, ge=64)
    llamacpp_threads: int = Field(default=2, ge=1)
    # How often the worker reads the server's /slots (its capacity).
    llamacpp_poll_interval_s: float = Field(default=0.05, gt=0)
    llamacpp_request_timeout_s: float = Field(default=300.0, gt=0)
    # Sampling of every job: temperature (0: greedy decoding) and llama.cpp's penalty on
    # repeating the last 64 tokens (1: none; a small model loops without one).
    llamacpp_temperature: float = Field(default=0.2, ge=0)
    llamacpp_repeat_penalty: float = Field(default=1.2, ge=1)

    # Webhooks (workers/webhooks/app.py, docs/webhooks.md)
    # The dispatcher's consumer group on the events topic (its faust app id).
    webhook_group: str = "sluicegate-webhooks"
    # Seconds before each attempt, the first one included; each wait is drawn uniformly
    # from [0, step] (full jitter). After the last attempt the delivery is dead-lettered.
    webhook_retry_schedule_s: Annotated[tuple[NonNegativeFloat, ...], Field(min_length=1)] = (
        0.0,
        5.0,
        300.0,
        1800.0,
        7200.0,
        18000.0,
        36000.0,
        36000.0,
    )
    # A Retry-After (429/503) is honoured up to this long.
    webhook_retry_after_max_s: float = Field(default=36000.0, ge=0)
    # One attempt, DNS, connect, TLS and response included.
    webhook_timeout_s: float = Field(default=15.0, gt=0)
    webhook_max_in_flight: int = Field(default=64, ge=1)
    # Attempts in flight at once to one endpoint (one URL of one tenant), per dispatcher.
    webhook_max_in_flight_per_endpoint: int = Field(default=4, ge=1)
    # Addresses a callback may resolve to although they are loopback, private, link-local
    # and so on (SSRF protection refuses those): CIDRs, e.g. ["10.1.0.0/16"]. Empty: none.
    webhook_allow_networks: tuple[IPvAnyNetwork, ...] = ()
    # The dispatcher's Kafka session timeout (a new member waits about half of it to join).
    webhook_session_timeout_s: float = Field(default=10.0, ge=1)

    def topic_partitions(self) -> dict[str, int]:
        return {
            self.dispatch_topic: self.partitions,
            self.events_topic: self.partitions,
            self.dead_letter_topic: 1,
        }

    def require_database_url(self) -> str:
        if not self.database_url:
            raise MissingSetting("SLUICEGATE_DATABASE_URL is not set")
        return self.database_url

    def require_kafka(self) -> str:
        if not self.kafka_bootstrap_servers:
            raise MissingSetting("SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS is not set")
        return self.kafka_bootstrap_servers
