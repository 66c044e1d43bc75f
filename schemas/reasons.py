"""Why a job ended without a result: the stable reasons shared by the API and the workers."""

from __future__ import annotations

from schemas.states import JobState

DEADLINE_PASSED = "deadline_passed"
DEADLINE_UNREACHABLE = "deadline_unreachable"
HEARTBEAT_LAPSED = "heartbeat_lapsed"
CANCELLED = "cancelled"
DISCONNECTED = "disconnected"
DOCUMENT_ENDED = "document_ended"  # a job of a document's graph, ended with its document
GRAPHED = "graphed"  # a document's record read again after it became a graph

MESSAGES = {
    DEADLINE_PASSED: "the deadline passed before the job finished",
    DEADLINE_UNREACHABLE: "the job could not finish by its deadline at the engine's speed",
    HEARTBEAT_LAPSED: "the caller stopped polling for longer than abandon_after_s",
    CANCELLED: "cancelled by the caller",
    DISCONNECTED: "the caller's waiting connection closed",
    DOCUMENT_ENDED: "its document ended (cancelled, expired, abandoned, or another part failed)",
    GRAPHED: "the document is being summarized in parts",
}


def message(reason: str) -> str:
    return MESSAGES.get(reason, reason)


def error(state: JobState, reason: str, stage: str | None = None) -> dict[str, str]:
    """The ``error`` body of a job that ended without a result. Its code is the state,
    except for an expiry, whose code says which (``deadline_passed``, ...). ``stage`` says
    whether it ended before or during decode, where the writer knows."""
    body = {
        "code": reason if state is JobState.EXPIRED else state.value,
        "reason": reason,
        "message": message(reason),
    }
    if stage is not None:
        body["stage"] = stage
    return body
