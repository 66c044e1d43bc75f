"""One lock order for rows taken several at a time.

Two transactions that each lock several rows of a table deadlock when they take them in
different orders (each holds a row the other waits for). Every statement that locks or
updates more than one row of ``jobs`` and waits for the rows it finds locked (the worker's
claim, the relay recording dispatch positions, the reconciler's redispatch, a batch cancel)
first locks them with ``locking_in_order``: by primary key, ascending. A statement that
may skip a locked row instead uses ``SKIP LOCKED`` and never waits (the meter, retention,
the worker's heartbeat-lapse sweep, the webhook dispatcher's claim).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, Table, select


def locking_in_order(table: Table, which: ColumnElement[bool]) -> Select[tuple[object]]:
    """``SELECT id … WHERE which ORDER BY id FOR UPDATE``: the rows locked in key order
    (PostgreSQL locks the rows of such a query as they leave the sort)."""
    return select(table.c.id).where(which).order_by(table.c.id).with_for_update()
