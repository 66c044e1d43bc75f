"""The reconciler's rule, pure: when a job's dispatch record is gone from the broker, and which
suspects are lost for sure.

A record at (cluster id, partition, offset) is gone when

- it was written to another cluster (the cluster id changed: a broker whose data was replaced),
- it lies before the partition's first offset (retention deleted it unread),
- it lies at or past the partition's end (the log was truncated or recreated; only on a
  broker whose end offsets are exact, ``kafka_exact_end_offsets``), or
- the job has not started although the worker group committed past its record (a record
  the group consumed without running the job).

A suspect is lost only if both the view read before the database query and the one read after
it say so, so a record published meanwhile is never mistaken for a lost one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

# Where a dispatch record lies: (the broker cluster's id, partition, offset).
Position = tuple[str | None, int, int]
# Jobs whose record a view takes for gone: id → (position, whether the job started).
Suspects = Mapping[str, tuple[Position, bool]]
# Jobs to dispatch again: (id, the position judged gone).
Lost = list[tuple[str, Position]]

CHUNK = 1000


@dataclass(frozen=True, kw_only=True)
class TopicView:
    """The broker's dispatch topic as the reconciler saw it."""

    cluster_id: str | None
    first: dict[int, int]
    end: dict[int, int]
    exact_end: bool  # False: the end may trail the last record (Tansu)
    committed: dict[int, int]

    def gone(self, position: Position, *, started: bool) -> bool:
        """Whether the record at ``position`` (cluster id, partition, offset) is gone."""
        record_cluster_id, partition, offset = position
        if record_cluster_id != self.cluster_id or offset < self.first.get(partition, 0):
            return True
        if self.exact_end and offset >= self.end.get(partition, 0):
            return True
        return not started and offset < self.committed.get(partition, 0)


def lost(suspects: Suspects, after: TopicView) -> Lost:
    """Of the suspects (found with the view read before), those ``after`` also takes for gone."""
    return [
        (job_id, position)
        for job_id, (position, started) in suspects.items()
        if after.gone(position, started=started)
    ]


def chunks(jobs: Lost, size: int = CHUNK) -> Iterator[Lost]:
    """The lost jobs in pieces of at most ``size``: one transaction each."""
    for start in range(0, len(jobs), size):
        yield jobs[start : start + size]
