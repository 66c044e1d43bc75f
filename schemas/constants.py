"""Topic, header and metric names: every shared name in one place."""

from __future__ import annotations

DISPATCH_TOPIC = "sluicegate.dispatch"
EVENTS_TOPIC = "sluicegate.events"
DEAD_LETTER_TOPIC = "sluicegate.deadletter"
WORKER_GROUP = "sluicegate-workers"

HEADER_TENANT = "X-Sluicegate-Tenant"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_IDEMPOTENT_REPLAY = "Idempotent-Replayed"
# A synchronous completion's deadline in seconds from now (else setting sync_deadline_s).
HEADER_DEADLINE_S = "X-Sluicegate-Deadline-S"
HEADER_JOB_ID = "X-Sluicegate-Job-Id"  # the job that answered a synchronous completion

OUTBOX_CHANNEL = "sluicegate_outbox"
# Every change of a job into a terminal state, payload "<job id> <state> <epoch> <reason>"
# (a trigger on jobs sends it, so no writer can forget): wakes long-polls, and tells workers
# to abort a job that was cancelled or abandoned while it decodes.
JOBS_CHANNEL = "sluicegate_jobs"
DEFAULT_TENANT = "default"

# Prometheus metric names (the sim-server also exposes vLLM's own names).
M_SUBMITTED = "sluicegate_jobs_submitted_total"
M_REFUSED = "sluicegate_requests_refused_total"
M_SUBMIT_GROUP = "sluicegate_submit_group_size"
M_RELAY_PUBLISHED = "sluicegate_outbox_published_total"
M_RECONCILED = "sluicegate_reconciled_total"
M_METERED = "sluicegate_batch_jobs_metered_total"
M_PRUNED = "sluicegate_pruned_rows_total"
M_JOBS_STARTED = "sluicegate_worker_jobs_started_total"
M_JOBS_FINISHED = "sluicegate_worker_jobs_finished_total"
M_JOBS_RUNNING = "sluicegate_worker_jobs_running"
M_TOKENS_DECODED = "sluicegate_worker_tokens_decoded_total"
M_JOB_SECONDS = "sluicegate_job_latency_seconds"
M_DEAD_LETTERED = "sluicegate_dead_lettered_total"
M_RETRIES = "sluicegate_retries_total"
M_AT_ONCE = "sluicegate_outbox_at_once_total"
M_RIDES = "sluicegate_rides_total"
M_KV_USAGE = "sluicegate_worker_kv_usage"
M_KV_RESERVED = "sluicegate_worker_kv_blocks_reserved"
M_KV_FREE = "sluicegate_worker_kv_blocks_free"
M_PAUSED_SECONDS = "sluicegate_worker_paused_seconds_total"
M_PARTITIONS = "sluicegate_worker_partitions"
M_REVOKED = "sluicegate_worker_revoked_partitions_total"
M_GENERATION = "sluicegate_worker_group_generation"
M_PREEMPTIONS = "sluicegate_worker_engine_preemptions"
M_UNDER_RESERVED = "sluicegate_worker_kv_under_reserved_total"
M_DROPPED = "sluicegate_worker_jobs_dropped_total"
M_ABORTED = "sluicegate_worker_jobs_aborted_total"
M_WASTED_TOKENS = "sluicegate_worker_tokens_wasted_total"
M_ABORT_SECONDS = "sluicegate_worker_cancel_to_abort_seconds"
M_ADMISSIONS = "sluicegate_admission_decisions_total"
M_BLOCKED = "sluicegate_admission_blocked"
M_LAG = "sluicegate_lag_records"
M_CONSUMER_LAG = "sluicegate_consumer_lag_records"
M_LAG_KNOWN = "sluicegate_lag_known"
M_LAG_READER = "sluicegate_lag_reader"
M_DRAIN_RATE = "sluicegate_drain_rate"
M_ARRIVAL_RATE = "sluicegate_arrival_rate"
M_IN_FLIGHT = "sluicegate_jobs_in_flight"
M_JOBS_BY_STATE = "sluicegate_jobs_by_state"
M_LATENCY_W = "sluicegate_latency_w_seconds"
M_LITTLE_L = "sluicegate_littles_law_l"

# The model of a job whose request named none (the engine's own), in lists and metrics.
DEFAULT_MODEL = "default"
