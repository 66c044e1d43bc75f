from workers.group.offsets import OffsetTracker


def test_commit_point_waits_for_lowest_running_job() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    for offset in (10, 11, 12):
        t.started("p0", offset)
    t.finished("p0", 12)
    t.finished("p0", 11)
    # 10 is still running: committing past it would lose it on a crash.
    assert t.commit_point("p0") == 10
    assert t.due() == {"p0": 10}
    t.finished("p0", 10)
    assert t.commit_point("p0") == 13


def test_due_only_reports_movement() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.started("p0", 0)
    t.started("p1", 5)
    t.finished("p0", 0)
    due = t.due()
    assert due == {"p0": 1, "p1": 5}
    t.committed(due)
    assert t.due() == {}
    t.finished("p1", 5)
    assert t.due() == {"p1": 6}


def test_out_of_order_finish_never_skips_a_running_job() -> None:
    t: OffsetTracker[int] = OffsetTracker()
    for offset in range(100):
        t.started(0, offset)
    for offset in reversed(range(1, 100)):
        t.finished(0, offset)
        assert t.commit_point(0) == 0
    t.finished(0, 0)
    assert t.commit_point(0) == 100


def test_forget_drops_a_revoked_partition() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.started("p0", 3)
    t.forget("p0")
    t.finished("p0", 3)  # a late finish of a revoked partition is ignored
    assert t.due() == {}
    assert t.inflight() == 0
