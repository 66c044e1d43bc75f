"""Settings of the webhook dispatcher: its group, retries, timeouts and SSRF allowances."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, IPvAnyNetwork, NonNegativeFloat

from plumbing.settings.base import SettingsGroup


class WebhookSettings(SettingsGroup):
    """The webhook dispatcher (`sluicegate webhooks`; `workers/webhooks/process.py`,
    docs/webhooks.md), which delivers job events to the tenants' callback URLs."""

    title: ClassVar[str] = "Webhooks"
    path: ClassVar[str] = "webhooks"

    webhook_group: str = Field(
        default="sluicegate-webhooks",
        description="The dispatcher's consumer group on the events topic (its faust app id).",
    )
    webhook_retry_schedule_s: Annotated[tuple[NonNegativeFloat, ...], Field(min_length=1)] = Field(
        default=(0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0),
        description="Seconds before each attempt, the first one included (a JSON list); "
        "each wait is drawn uniformly from [0, step] (full jitter). After the last attempt "
        "the delivery is dead-lettered.",
    )
    webhook_retry_after_max_s: float = Field(
        default=36000.0,
        ge=0,
        description="A `Retry-After` (429, 503) from a callback is honoured up to this long.",
    )
    webhook_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="Longest one attempt takes, DNS, connect, TLS and response included.",
    )
    webhook_max_in_flight: int = Field(
        default=64, ge=1, description="Attempts in flight at once, per dispatcher."
    )
    webhook_max_in_flight_per_endpoint: int = Field(
        default=4,
        ge=1,
        description="Attempts in flight at once to one endpoint (one URL of one tenant), per "
        "dispatcher.",
    )
    webhook_claim_every_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest the dispatcher goes without looking for due deliveries, "
        "however quiet: the bound on how late a delivery whose wake was missed (a NOTIFY "
        "lost on a reconnect, another dispatcher gone) is claimed. An idle dispatcher runs "
        "one short statement this often.",
    )
    webhook_allow_networks: tuple[IPvAnyNetwork, ...] = Field(
        default=(),
        description="Addresses a callback may resolve to although they are loopback, "
        "private, link-local and so on (SSRF protection refuses those): CIDRs, as a JSON "
        'list, e.g. `["10.1.0.0/16"]`. Empty: none.',
    )
    webhook_session_timeout_s: float = Field(
        default=10.0,
        ge=1,
        description="The dispatcher's Kafka session timeout (a new member waits about half "
        "of it to join).",
    )
