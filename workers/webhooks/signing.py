"""Standard Webhooks signatures: ``webhook-signature`` is ``v1,<base64 HMAC-SHA256 of
id.timestamp.body>`` for every secret of the tenant that has not expired, space-separated,
so a receiver verifies with whichever of them it knows (that is how a secret rotates)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from math import floor

from standardwebhooks import Webhook

from schemas.webhooks import HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP


def signed_headers(msg_id: str, body: str, secrets: Sequence[str], at: datetime) -> dict[str, str]:
    """The three headers of one attempt: the same id on every attempt, the time of this
    one, and one signature per secret. ``at`` must be timezone-aware."""
    if not secrets:
        raise ValueError("no secret to sign with")
    at = at.astimezone(UTC)  # the library reads the time as UTC whatever its zone
    signatures = [Webhook(secret).sign(msg_id, at, body) for secret in secrets]
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(floor(at.timestamp())),
        HEADER_SIGNATURE: " ".join(signatures),
    }
