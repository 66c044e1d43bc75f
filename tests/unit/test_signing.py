"""Standard Webhooks signatures, checked with the standardwebhooks library itself."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from producers.webhooks.repository import new_secret
from workers.webhooks.signing import signed_headers

BODY = '{"type":"job.succeeded","timestamp":"2026-01-01T00:00:00Z","data":{"id":"j"}}'


def test_new_secrets_are_whsec_and_32_random_bytes() -> None:
    a, b = new_secret(), new_secret()
    assert a.startswith("whsec_")
    assert len(base64.b64decode(a.removeprefix("whsec_"))) == 32
    assert a != b


def test_one_secret_one_signature() -> None:
    secret = new_secret()
    now = datetime.now(UTC)
    headers = signed_headers("msg_1", BODY, [secret], now)
    assert headers["webhook-id"] == "msg_1"
    assert headers["webhook-timestamp"] == str(int(now.timestamp()))
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(secret).verify(BODY, headers)["data"]["id"] == "j"
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace("j", "k"), headers)


def test_rotation_signs_with_each_secret() -> None:
    old, new = new_secret(), new_secret()
    headers = signed_headers("msg_2", BODY, [old, new], datetime.now(UTC))
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(BODY, headers)
    Webhook(new).verify(BODY, headers)


def test_the_timestamp_is_the_instant_whatever_its_zone() -> None:
    secret = new_secret()
    now = datetime.now(UTC)
    elsewhere = now.astimezone(timezone(timedelta(hours=5)))
    assert signed_headers("m", BODY, [secret], elsewhere) == signed_headers(
        "m", BODY, [secret], now
    )
    Webhook(secret).verify(BODY, signed_headers("m", BODY, [secret], elsewhere))


def test_nothing_is_signed_without_a_secret() -> None:
    with pytest.raises(ValueError, match="no secret"):
        signed_headers("m", BODY, [], datetime.now(UTC))
