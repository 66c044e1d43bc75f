"""The commit watermark: offsets commit only up to the lowest job not yet terminal."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class OffsetTracker(Generic[P]):
    """Tracks, per partition, the offsets whose jobs have started but not finished.

    Jobs finish out of order; the offset to commit for a partition is the lowest offset
    still in flight, or one past the highest offset seen when nothing is in flight.
    """

    def __init__(self) -> None:
        self._inflight: dict[P, set[int]] = {}
        self._next: dict[P, int] = {}
        self._committed: dict[P, int] = {}

    def started(self, partition: P, offset: int) -> None:
        self._inflight.setdefault(partition, set()).add(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def finished(self, partition: P, offset: int) -> None:
        inflight = self._inflight.get(partition)
        if inflight is not None:
            inflight.discard(offset)

    def commit_point(self, partition: P) -> int | None:
        inflight = self._inflight.get(partition)
        if inflight:
            return min(inflight)
        return self._next.get(partition)

    def due(self) -> dict[P, int]:
        """Commit points that moved past what was last committed."""
        points: dict[P, int] = {}
        for partition in self._next:
            point = self.commit_point(partition)
            if point is not None and point > self._committed.get(partition, -1):
                points[partition] = point
        return points

    def committed(self, points: dict[P, int]) -> None:
        for partition, point in points.items():
            if partition in self._next:
                self._committed[partition] = max(self._committed.get(partition, -1), point)

    def inflight(self, partition: P | None = None) -> int:
        if partition is not None:
            return len(self._inflight.get(partition, ()))
        return sum(len(offsets) for offsets in self._inflight.values())

    def forget(self, partition: P) -> None:
        """The partition was revoked: its offsets are no longer ours to commit."""
        self._inflight.pop(partition, None)
        self._next.pop(partition, None)
        self._committed.pop(partition, None)
