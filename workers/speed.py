"""The engine's measured speed, from the jobs it finished: how long a job would take now.

Two figures, each the median over a window of recent jobs: prefill seconds per prompt token
(time to the first output token over the prompt length) and seconds per output token after
the first. Both include whatever batching the engine did at the time, so the prediction
follows the load.
"""

from __future__ import annotations

import statistics
from collections import deque


class SpeedMeter:
    def __init__(self, *, window: int = 256, min_samples: int = 8) -> None:
        self._prefill: deque[float] = deque(maxlen=window)
        self._decode: deque[float] = deque(maxlen=window)
        self._min_samples = min_samples

    def record(
        self, *, prompt_tokens: int, first_token_s: float, output_tokens: int, total_s: float
    ) -> None:
        """One job that decoded to its end (an aborted one says nothing about speed)."""
        if prompt_tokens <= 0 or output_tokens <= 0:
            return
        self._prefill.append(max(first_token_s, 0.0) / prompt_tokens)
        if output_tokens > 1:
            self._decode.append(max(total_s - first_token_s, 0.0) / (output_tokens - 1))

    @property
    def samples(self) -> int:
        return len(self._decode)

    def service_s(self, *, prompt_tokens: int, output_tokens: int) -> float | None:
        """Predicted seconds from handing the job to the engine to its last token, or None
        until enough jobs were measured."""
        if len(self._decode) < self._min_samples:
            return None
        prefill = statistics.median(self._prefill) * prompt_tokens
        return prefill + statistics.median(self._decode) * max(output_tokens - 1, 0)
