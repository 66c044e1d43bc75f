"""Per-tenant token buckets for requests per minute and tokens per minute."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``capacity`` tokens, refilled continuously at ``capacity`` per ``period_s``."""

    capacity: float
    period_s: float = 60.0
    level: float = field(default=-1.0)
    at: float = 0.0

    def _refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.at = self.capacity, now
            return
        rate = self.capacity / self.period_s
        self.level = min(self.capacity, self.level + (now - self.at) * rate)
        self.at = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` is available (0: now). More than capacity never is."""
        self._refill(now)
        if amount > self.capacity:
            return float("inf")
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / (self.capacity / self.period_s)

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


class TenantLimits:
    """RPM and TPM buckets per tenant; a request takes from both or from neither."""

    def __init__(self, *, rpm: int | None, tpm: int | None) -> None:
        self._rpm = rpm
        self._tpm = tpm
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}

    def _of(self, tenant: str) -> tuple[TokenBucket | None, TokenBucket | None]:
        if tenant not in self._buckets:
            self._buckets[tenant] = (
                TokenBucket(self._rpm) if self._rpm else None,
                TokenBucket(self._tpm) if self._tpm else None,
            )
        return self._buckets[tenant]

    def fits(self, tokens: int) -> bool:
        """Whether ``tokens`` could ever be taken at once (a full TPM bucket holds them)."""
        return self._tpm is None or tokens <= self._tpm

    def try_take(self, tenant: str, tokens: int, now: float) -> tuple[str, float] | None:
        """Take one request and ``tokens``; else (reason, seconds until they refill)."""
        requests, token_bucket = self._of(tenant)
        waits = []
        if requests is not None:
            waits.append(("tenant_rpm", requests.wait_s(1, now)))
        if token_bucket is not None:
            waits.append(("tenant_tpm", token_bucket.wait_s(tokens, now)))
        refused = [(reason, wait) for reason, wait in waits if wait > 0]
        if refused:
            return max(refused, key=lambda pair: pair[1])
        if requests is not None:
            requests.take(1, now)
        if token_bucket is not None:
            token_bucket.take(tokens, now)
        return None

    def give_back(self, tenant: str, tokens: int) -> None:
        requests, token_bucket = self._of(tenant)
        if requests is not None:
            requests.give_back(1)
        if token_bucket is not None:
            token_bucket.give_back(tokens)
