"""Why a job ended without a result: the stable reasons shared by the API and the workers."""

from __future__ import annotations

DEADLINE_PASSED = "deadline_passed"
DEADLINE_UNREACHABLE = "deadline_unreachable"
HEARTBEAT_LAPSED = "heartbeat_lapsed"
CANCELLED = "cancelled"
DISCONNECTED = "disconnected"

MESSAGES = {
    DEADLINE_PASSED: "the deadline passed before the job finished",
    DEADLINE_UNREACHABLE: "the job could not finish by its deadline at the engine's speed",
    HEARTBEAT_LAPSED: "the caller stopped polling for longer than abandon_after_s",
    CANCELLED: "cancelled by the caller",
    DISCONNECTED: "the caller's waiting connection closed",
}


def message(reason: str) -> str:
    return MESSAGES.get(reason, reason)
