"""Kept for tests/unit/test_scale_model.py, which imports ``derive`` and ``gpu_capacity``
from here: the scale scenario lives in benchmarks/scenarios/scale.py. Delete this module
once no test imports it."""

from benchmarks.scenarios.scale import derive, gpu_capacity

__all__ = ["derive", "gpu_capacity"]
