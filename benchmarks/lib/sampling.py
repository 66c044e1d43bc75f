"""Sampling processes from outside: RSS and CPU of a process and its children (psutil), CPU
from /proc that counts reaped children too, and the peak RSS while something runs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil

MIB = 1024 * 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def family_usage(pid: int) -> tuple[float, float] | None:
    """RSS (MiB) and CPU seconds so far of ``pid`` and its children; None once it is gone."""
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
        rss = sum(p.memory_info().rss for p in family) / MIB
        cpu = sum(sum(p.cpu_times()[:2]) for p in family)
    except psutil.Error:
        return None
    return rss, cpu


def cpu_s(process: psutil.Process) -> float:
    """User and system CPU seconds of the process alone."""
    times = process.cpu_times()
    return float(times.user + times.system)


def process_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # fields from the third, state, on
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, reaped ones included (cutime)."""
    try:
        children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        children = []
    return process_cpu_s(pid) + sum(process_cpu_s(c) for c in children)


class PeakRss:
    """The largest resident set of a process and its children, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self.peak = self.now()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        family = [self._process, *self._process.children(recursive=True)]
        return sum(p.memory_info().rss for p in family if p.is_running())

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
