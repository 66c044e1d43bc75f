"""What the costs benchmark's ``measure`` is given (the scenario's arguments of these names,
whose defaults these are)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Options:
    rate: float = 4.5  # jobs/s offered in each window
    load_s: float = 75.0  # seconds of load a window
    idle_s: float = 30.0  # the idle window's seconds
    settle_s: float = 11.0  # wait after the drain (statistics flush)
    batch_size: int = 20  # lines per batch in the batch window (0: none)
    time_scale: float = 2.0  # x roofline step time
    drain_s: float = 120.0  # longest drain a window
    capacity_warm_s: float = 10.0  # engine s before measuring capacity
    capacity_measure_s: float = 15.0  # engine s of capacity measured (0: not measured)
    quick: bool = False  # shorter quiet waits when reading the topics
