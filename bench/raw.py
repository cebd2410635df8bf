"""The physical limit: a raw loop appending 200-byte JSON lines to a file and fsyncing.

Two shapes, both one `write(2)` per record on an `O_APPEND` file, as a log writer does:

- `raw_fsync1`: write + fsync per record. Its per-record latency is the floor for an ack that
  means "durable"; its rate is what any one-at-a-time durable queue can reach.
- `raw_fsync64`: 64 writes, then one fsync. The rate a group-committing writer could reach if
  every batch held 64 records and nothing else cost anything.
- `raw_fsync1_paced`: write + fsync per record, each after an idle pause since the last one
  returned (`PACED_GAP_S`, about what a daemon answering one request at a time spends between
  two of its fsyncs: its own work and the peer's turn). No target: it shows what the same disk
  gives a writer that is not back to back, which on a virtual disk is slower, most of all at the
  tail (docs/performance.md).
"""

from __future__ import annotations

import os
import time

from bench.common import Budget, Latency, Measurement, Rate, Scratch, json_line

__all__ = ["PACED_GAP_S", "raw_fsync1", "raw_fsync1_paced", "raw_fsync64"]

#: The idle pause before each write of `raw_fsync1_paced` (seconds).
PACED_GAP_S = 250e-6


def _open(directory: str) -> int:
    return os.open(
        os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )


def _fsync_each(
    scratch: Scratch, name: str, count: int, seconds: float, gap_s: float
) -> tuple[list[float], float]:
    """write + fsync per record (each after `gap_s` of sleep when not 0): the latency of each,
    and the time the loop took."""
    lines = [json_line(i) for i in range(min(count, 100_000))]
    with scratch.directory(name) as d:
        fd = _open(d)
        try:
            for line in lines[:50]:  # warm-up: allocate the first blocks
                os.write(fd, line)
                os.fsync(fd)
            samples: list[float] = []
            budget = Budget(count, seconds)
            perf, sleep = time.perf_counter, time.sleep
            write, fsync = os.write, os.fsync
            n = 0
            start = perf()
            while budget.more(n):
                if gap_s:
                    sleep(gap_s)
                t = perf()
                write(fd, lines[n % len(lines)])
                fsync(fd)
                samples.append(perf() - t)
                n += 1
            elapsed = perf() - start
        finally:
            os.close(fd)
    return samples, elapsed


def raw_fsync1(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """One fsync per record: records/s and the latency of each write+fsync."""
    samples, elapsed = _fsync_each(scratch, "raw1", count, seconds, 0.0)
    return [Rate("raw_fsync1", len(samples), elapsed), Latency("raw_fsync1", tuple(samples))]


def raw_fsync1_paced(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """One fsync per record, each write `PACED_GAP_S` after the last fsync returned (slept,
    not spun): the latency of each write+fsync."""
    samples, _ = _fsync_each(scratch, "raw1-paced", count, seconds, PACED_GAP_S)
    return [Latency("raw_fsync1_paced", tuple(samples))]


def raw_fsync64(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """64 appends per fsync: records/s."""
    lines = [json_line(i) for i in range(64 * 64)]
    with scratch.directory("raw64") as d:
        fd = _open(d)
        try:
            write, fsync = os.write, os.fsync
            for line in lines[:64]:
                write(fd, line)
            fsync(fd)
            budget = Budget(count, seconds)
            n = 0
            perf = time.perf_counter
            start = perf()
            while budget.more(n):
                base = n % len(lines)
                for line in lines[base : base + 64]:
                    write(fd, line)
                fsync(fd)
                n += 64
            elapsed = perf() - start
        finally:
            os.close(fd)
    return [Rate("raw_fsync64", n, elapsed)]
