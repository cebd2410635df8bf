"""The peer: Huey's `SqliteHuey` with durable commits.

Settings: `SqliteHuey(filename=..., fsync=True, journal_mode="wal")`. `fsync=True` is Huey's
switch for `PRAGMA synchronous=FULL`; with WAL, every committed transaction fsyncs the WAL, so
an enqueue that returned is on stable storage — the same promise as snerd's `ack`. (Huey's
default, `fsync=None`, leaves SQLite's default, which in WAL mode may lose the last commits on
power loss; that would not be a like-for-like comparison.)

How it is driven, chosen to be the most favourable to Huey:

- `huey_enqueue`: one producer thread calling a task wrapper (`noop(i)`), each call one
  transaction. Huey has no pipelined enqueue and SQLite serialises writers (`begin exclusive`),
  so more producer threads do not share fsyncs; one thread is its best case.
- `huey_e2e`: enqueue N no-op tasks, then drain them in-process — `huey.dequeue()` (one
  transaction that takes and deletes the row) and `huey.execute(task)` (a no-op returning None,
  so no result row is written) until the queue is empty. No consumer process, no polling delay
  (Huey's consumer sleeps between empty polls), no worker hand-off: only the storage work a
  durable queue must do. Rate = N / (enqueue time + drain time).
"""

from __future__ import annotations

import os
import time

from bench.common import Budget, Measurement, Rate, Scratch

__all__ = ["huey_e2e", "huey_enqueue"]


def _make(directory: str):  # type: ignore[no-untyped-def]
    from huey import SqliteHuey

    huey = SqliteHuey(
        "bench", filename=os.path.join(directory, "huey.db"), fsync=True, journal_mode="wal"
    )

    @huey.task()
    def noop(n: int) -> None:
        return None

    return huey, noop


def huey_enqueue(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    with scratch.directory("huey-enqueue") as d:
        huey, noop = _make(d)
        for i in range(20):  # warm-up: tables, WAL file
            noop(i)
        huey.flush()
        budget = Budget(count, seconds)
        n = 0
        start = time.perf_counter()
        while budget.more(n):
            noop(n)
            n += 1
        elapsed = time.perf_counter() - start
        assert huey.pending_count() == n, "huey lost enqueues"
        huey.storage.close()
    return [Rate("huey_enqueue", n, elapsed)]


def huey_e2e(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    with scratch.directory("huey-e2e") as d:
        huey, noop = _make(d)
        for i in range(20):
            noop(i)
        while (task := huey.dequeue()) is not None:
            huey.execute(task)
        # Half the time budget for enqueueing; the drain takes about as long.
        budget = Budget(count, seconds / 2)
        n = 0
        start = time.perf_counter()
        while budget.more(n):
            noop(n)
            n += 1
        executed = 0
        while (task := huey.dequeue()) is not None:
            huey.execute(task)
            executed += 1
        elapsed = time.perf_counter() - start
        assert executed == n, f"huey executed {executed} of {n}"
        huey.storage.close()
    return [Rate("huey_e2e", n, elapsed)]
