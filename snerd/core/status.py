"""A task's status as operators see it: `snerdmq stats`, `validate` and the dashboard.

This module owns the operator-visible taxonomy of a shard's tasks, read from its fold
(`snerd.core.shardlog.ShardFold`): a live task is in flight, retrying, delayed or waiting
(`LIVE_STATES`, judged by `live_state` against `now_us`); a finished one is completed,
cancelled or a dead letter (`FINISHED_STATES`, `finished_state`). `summarize` counts a shard's tasks by these states and by type.

It is not the daemon's `TaskState` (`snerd.core.node`): that one is what a node does with a task
it owns; this one is what the files say about a task, to a reader that owns nothing. The two
agree where they meet: a task the log shows dispatched and unresolved is the one a daemon
re-runs after a crash (`ShardFold.in_flight`), and "delayed" is the daemon's not-yet-due
(`ready_at_us`).

Pure: no files, no clocks (callers pass `now_us`); the one state is a bounded cache of parsed
times.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from snerd.core.schema import (
    EXECUTE_AT,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    TASK_TYPE,
)
from snerd.core.shardlog import ShardFold, ready_at_us, tombstone_outcome

__all__ = [
    "FINISHED_STATES",
    "LIVE_STATES",
    "ShardSummary",
    "finished_state",
    "live_state",
    "summarize",
]

#: The states of a live task (`live_state`), then of a finished one.
LIVE_STATES = ("in_flight", "retrying", "delayed", "waiting")
FINISHED_STATES = ("completed", "cancelled", "dead_letter")


def finished_state(fields: dict[str, Any]) -> str:
    """A tombstone's state (`FINISHED_STATES`), by its outcome (`tombstone_outcome`)."""
    outcome = tombstone_outcome(fields)
    if outcome == OUTCOME_COMPLETED:
        return "completed"
    return "cancelled" if outcome == OUTCOME_CANCELLED else "dead_letter"


@dataclass(slots=True)
class ShardSummary:
    """A shard's tasks counted by status (`summarize`); `add` sums shards."""

    live: int = 0
    waiting: int = 0
    delayed: int = 0
    retrying: int = 0
    in_flight: int = 0
    completed: int = 0
    dead_letters: int = 0
    types: Counter[str] = field(default_factory=Counter)

    def add(self, other: ShardSummary) -> None:
        for name in (
            "live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters"
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.types.update(other.types)


@functools.lru_cache(maxsize=1 << 17)
def _ready_at(execute_at: str | None, retry_after: str | None) -> int | None:
    """`ready_at_us` of a record with these two fields, remembered: a watching reader (the
    dashboard) judges every live task again at each refresh, and parsing the two times was
    most of that work."""
    return ready_at_us({EXECUTE_AT: execute_at, RETRY_AFTER_TIME: retry_after})


def live_state(task_id: str, fields: dict[str, Any], in_flight: dict[str, int], now_us: int) -> str:
    """A live task's state: in flight (dispatched, unresolved: running, or to be re-run after
    a crash), retrying (failed before, waiting for the next attempt), delayed (first attempt
    not due yet), waiting (due: for a worker, a handler, a rate window or its parents)."""
    if task_id in in_flight:
        return "in_flight"
    retry_count = fields.get(RETRY_COUNT)
    if isinstance(retry_count, int) and retry_count > 0:
        return "retrying"
    execute_at, retry_after = fields.get(EXECUTE_AT), fields.get(RETRY_AFTER_TIME)
    if isinstance(execute_at, str | None) and isinstance(retry_after, str | None):
        ready = _ready_at(execute_at, retry_after)
    else:  # not the shape snerd writes: nothing to remember
        ready = ready_at_us(fields)
    if ready is not None and ready > now_us:
        return "delayed"
    return "waiting"


def summarize(fold: ShardFold, now_us: int) -> ShardSummary:
    """Live tasks by state (`live_state`), finished and dead-lettered ones."""
    s = ShardSummary()
    in_flight = fold.in_flight()
    for task_id, record in fold.live.items():
        f = record.fields
        s.live += 1
        task_type = f.get(TASK_TYPE)
        s.types[task_type if isinstance(task_type, str) else "?"] += 1
        state = live_state(task_id, f, in_flight, now_us)
        setattr(s, state, getattr(s, state) + 1)
    s.completed = fold.completed()
    s.dead_letters = len(fold.dead_letters())
    return s
