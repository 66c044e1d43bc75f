"""The greedy pull the KV-pull benchmarks compare the worker's gate against, built here:
production has one pull gate (``workers.gate.PullGate``), and this baseline is no setting
of it. A worker runs with it through ``working`` / ``run_worker``'s ``gate_type``."""

from __future__ import annotations

from schemas.envelopes import DispatchEnvelope
from workers.gate import PullGate


class GreedyGate(PullGate):
    """Starts whatever it is given, up to ``max_running`` jobs in flight, and lets the engine
    queue (and preempt): it reads neither the KV cache, nor the engine's sequence cap, nor
    the prefill cap. Its ledger still counts the jobs it started, for that cap."""

    def room(self) -> bool:
        return self.ledger.running < self.max_running

    def admits(self, envelope: DispatchEnvelope) -> bool:
        return self.room()  # a document cut into a graph as well: it holds no KV either


# The benchmarks' pull policies: the worker's gate, and the greedy baseline.
GATES: dict[str, type[PullGate]] = {"kv": PullGate, "greedy": GreedyGate}
