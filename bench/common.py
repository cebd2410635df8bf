"""Shared pieces of the benchmarks: measurements, percentiles, the scratch directory, records.

Every benchmark returns `Rate`s (operations over seconds) and `Latency`s (raw samples);
`bench.__main__` combines rounds (the median rate; latency samples pooled) into the table. Percentiles are
taken from the sorted samples by the nearest-rank rule (the p-th percentile of n samples is the
ceil(p/100 * n)-th smallest), so p50 and p99 are always values that were actually observed.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = [
    "Budget",
    "Latency",
    "Measurement",
    "Rate",
    "Scratch",
    "Unavailable",
    "json_line",
    "percentile",
]


@dataclass(frozen=True, slots=True)
class Rate:
    """A throughput measurement: `ops` operations in `seconds`."""

    key: str
    ops: int
    seconds: float
    note: str = ""
    #: CPU time the daemon process used (all threads, user + system) over the same period.
    cpu_seconds: float | None = None

    @property
    def cpu_us_per_op(self) -> float | None:
        if self.cpu_seconds is None or self.ops <= 0:
            return None
        return self.cpu_seconds / self.ops * 1e6

    @property
    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency samples, in seconds, one per operation, in the order taken."""

    key: str
    samples: tuple[float, ...]
    note: str = ""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A figure that could not be taken, and why (e.g. the daemon refused the operation)."""

    key: str
    reason: str


#: What a benchmark returns.
Measurement = Rate | Latency | Unavailable


@dataclass(slots=True)
class Budget:
    """Bounds a benchmark in both count and time: `more()` is False once either is used up."""

    count: int
    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def more(self, done: int) -> bool:
        return done < self.count and time.perf_counter() - self.started < self.seconds

    @property
    def expired(self) -> bool:
        return time.perf_counter() - self.started >= self.seconds


def percentile(sorted_samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of samples that are already sorted ascending."""
    if not sorted_samples:
        return math.nan
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_samples)))
    return sorted_samples[min(rank, len(sorted_samples)) - 1]




def json_line(i: int, size: int = 200) -> bytes:
    """A JSON object line of exactly `size` bytes, newline included (a stand-in task record)."""
    head = b'{"taskId":"t%09d","taskType":"bench","taskData":"' % i
    tail = b'"}\n'
    pad = size - len(head) - len(tail)
    assert pad >= 0
    return head + b"x" * pad + tail


class Scratch:
    """One base directory for every benchmark of a run, so that all of them (baselines and
    snerd) write to the same filesystem on the same disk. Removed at the end."""

    def __init__(self, base: str | None) -> None:
        if base is not None:
            os.makedirs(base, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="snerd-bench-", dir=base)
        self._n = 0

    @contextmanager
    def directory(self, name: str) -> Iterator[str]:
        self._n += 1
        path = os.path.join(self.root, f"{self._n:02d}-{name}")
        os.makedirs(path)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def device(self) -> str:
        """`/dev/xxx (fstype)` of the scratch directory, from /proc/self/mounts."""
        best = ("", "?", "?")
        try:
            with open("/proc/self/mounts", encoding="utf-8") as f:
                for line in f:
                    dev, mnt, fstype, *_ = line.split()
                    if (self.root == mnt or self.root.startswith(mnt.rstrip("/") + "/")) and len(
                        mnt
                    ) >= len(best[0]):
                        best = (mnt, dev, fstype)
        except OSError:
            pass
        return f"{best[1]} ({best[2]}, mounted at {best[0] or '?'})"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
