"""Kept for tests/integration/drops.py, which imports ``Counting`` from here: the engine
wrapper lives in benchmarks/lib/engine.py, the overload scenario in
benchmarks/scenarios/overload.py. Delete this module once no test imports it."""

from benchmarks.lib.engine import Counting

__all__ = ["Counting"]
