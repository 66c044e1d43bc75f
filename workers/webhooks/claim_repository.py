"""The webhook dispatcher's SQL for taking work: one statement leases the deliveries that
are due, with the signing secrets of their tenants, and says when the next one comes due.

Rows are locked with ``FOR UPDATE SKIP LOCKED`` (several dispatchers share the table) and
leased: ``next_attempt_at`` moves past the attempt's time limit, so a dispatcher that dies
mid-attempt leaves a row that comes due again. At most ``per_endpoint`` attempts run at
once to one endpoint (``busy``: those this dispatcher has in flight). A due delivery to an
endpoint disabled by a 410 is leased without counting an attempt, to be given up
(``AttemptRepository.give_up_disabled``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

Endpoint = tuple[str, str]  # (tenant, url)

# ``wait_s``: until the first pending delivery not leased here comes due (negative: it is
# overdue, e.g. locked by another dispatcher), leaving out endpoints that are full once
# these are leased; NULL when there is none. ``due_for_s``: how long the oldest delivery
# that is due and was not leased here has been due (full endpoints included); NULL when
# none is. Both are on every row, and on a row of NULLs when nothing was leased. (A CTE
# sees the table as it was when the statement began, so the rows just leased are left out
# by id.)
_CLAIM = text(
    """
WITH busy AS (
    SELECT * FROM unnest(CAST(:busy_tenants AS text[]), CAST(:busy_urls AS text[]),
                         CAST(:busy_counts AS int[])) AS b(tenant, url, n)
), due AS (
    SELECT d.id, d.tenant, d.url, d.next_attempt_at
    FROM webhook_deliveries d
    WHERE d.state = 'pending' AND d.next_attempt_at <= now()
      AND NOT EXISTS (SELECT 1 FROM busy b
                      WHERE b.tenant = d.tenant AND b.url = d.url AND b.n >= :per_endpoint)
    ORDER BY d.next_attempt_at
    LIMIT :limit
    FOR UPDATE OF d SKIP LOCKED
), ranked AS (
    SELECT due.id, due.tenant, due.url, due.next_attempt_at,
           e.tenant IS NOT NULL AS disabled,
           coalesce(b.n, 0) + row_number() OVER (
               PARTITION BY due.tenant, due.url ORDER BY due.next_attempt_at, due.id) AS slot
    FROM due
    LEFT JOIN busy b ON b.tenant = due.tenant AND b.url = due.url
    LEFT JOIN webhook_endpoints e ON e.tenant = due.tenant AND e.url = due.url
), picked AS (
    SELECT id, tenant, url, disabled FROM ranked
    WHERE disabled OR slot <= :per_endpoint
    ORDER BY next_attempt_at, id
    LIMIT :limit
), leased AS (
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + CASE WHEN p.disabled THEN 0 ELSE 1 END,
        next_attempt_at = now() + make_interval(secs => :lease_s)
    FROM picked p
    WHERE d.id = p.id
    RETURNING d.id, d.tenant, d.url, d.subject, d.event_type, d.body, d.attempts, p.disabled
), load AS (
    SELECT tenant, url, sum(n) AS n
    FROM (SELECT tenant, url, n FROM busy
          UNION ALL
          SELECT tenant, url, 1 FROM picked WHERE NOT disabled) AS x
    GROUP BY tenant, url
), next_due AS (
    SELECT CAST(extract(epoch FROM (
        SELECT d.next_attempt_at
        FROM webhook_deliveries d
        WHERE d.state = 'pending'
          AND d.id NOT IN (SELECT id FROM picked)
          AND NOT EXISTS (SELECT 1 FROM load l
                          WHERE l.tenant = d.tenant AND l.url = d.url AND l.n >= :per_endpoint)
        ORDER BY d.next_attempt_at
        LIMIT 1
    ) - now()) AS float8) AS wait_s
), oldest_due AS (
    SELECT CAST(extract(epoch FROM now() - min(d.next_attempt_at)) AS float8) AS due_for_s
    FROM webhook_deliveries d
    WHERE d.state = 'pending' AND d.next_attempt_at <= now()
      AND d.id NOT IN (SELECT id FROM picked)
)
SELECT next_due.wait_s, oldest_due.due_for_s, leased.*,
       ARRAY(SELECT s.secret FROM webhook_secrets s
             WHERE s.tenant = leased.tenant AND (s.expires_at IS NULL OR s.expires_at > now())
             ORDER BY s.id) AS secrets
FROM next_due CROSS JOIN oldest_due LEFT JOIN leased ON true
"""
)


@dataclass(frozen=True, kw_only=True)
class ClaimedDelivery:
    """A delivery leased to this dispatcher for one attempt, with the secrets that sign
    it (its tenant's unexpired ones when it was leased, oldest first)."""

    id: str
    tenant: str
    url: str
    subject: str
    event_type: str
    body: str
    attempt: int  # this attempt's number, 1-based
    secrets: tuple[str, ...] = ()

    @property
    def endpoint(self) -> Endpoint:
        return (self.tenant, self.url)


@dataclass(frozen=True, kw_only=True)
class Claim:
    claimed: list[ClaimedDelivery]
    disabled: list[str]  # ids of deliveries to disabled endpoints, leased to be given up
    wait_s: float | None  # until the next one not leased here comes due (None: none)
    due_for_s: float | None  # how long the oldest due one not leased here has been due
    full: frozenset[Endpoint]  # the endpoints at their limit once these were leased


class ClaimRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def claim(
        self, *, limit: int, per_endpoint: int, busy: Mapping[Endpoint, int], lease_s: float
    ) -> Claim:
        """Lease up to ``limit`` due deliveries, at most ``per_endpoint`` in flight to an
        endpoint (``busy``: those in flight here), in one statement."""
        ends = list(busy.items())
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    _CLAIM,
                    {
                        "busy_tenants": [t for (t, _), _ in ends],
                        "busy_urls": [u for (_, u), _ in ends],
                        "busy_counts": [n for _, n in ends],
                        "per_endpoint": per_endpoint,
                        "limit": limit,
                        "lease_s": lease_s,
                    },
                )
            ).all()
        claimed = [
            ClaimedDelivery(
                id=r.id,
                tenant=r.tenant,
                url=r.url,
                subject=r.subject,
                event_type=r.event_type,
                body=r.body,
                attempt=r.attempts,
                secrets=tuple(r.secrets),
            )
            for r in rows
            if r.id is not None and not r.disabled
        ]
        disabled = [r.id for r in rows if r.id is not None and r.disabled]
        first = rows[0] if rows else None
        return Claim(
            claimed=claimed,
            disabled=disabled,
            wait_s=_seconds(first.wait_s if first else None),
            due_for_s=_seconds(first.due_for_s if first else None),
            full=full_after(ends, claimed, per_endpoint),
        )


def full_after(
    busy: Iterable[tuple[Endpoint, int]], claimed: Iterable[ClaimedDelivery], per_endpoint: int
) -> frozenset[Endpoint]:
    """The endpoints at their limit once ``claimed`` start beside ``busy`` (the attempts in
    flight that the claim was given): the claim left their other deliveries out of its
    ``wait_s``."""
    load = Counter(dict(busy)) + Counter(c.endpoint for c in claimed)
    return frozenset(e for e, n in load.items() if n >= per_endpoint)


def _seconds(value: float | None) -> float | None:
    return None if value is None else float(value)
