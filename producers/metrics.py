"""Prometheus metrics of the ingress side."""

from __future__ import annotations

from prometheus_client import Counter

from schemas import constants

SUBMITTED = Counter(constants.M_SUBMITTED, "Jobs accepted", ["kind", "priority"])
REFUSED = Counter(constants.M_REFUSED, "Requests refused, by error code", ["code"])
RELAY_PUBLISHED = Counter(constants.M_RELAY_PUBLISHED, "Outbox rows published", ["topic"])
