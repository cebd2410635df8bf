"""`snerd.core.status`: a task's status as operators see it, from a shard's fold and a clock."""

from __future__ import annotations

from typing import Any

from snerd.core.records import encode_record, scan
from snerd.core.shardlog import fold_records
from snerd.core.status import (
    FINISHED_STATES,
    LIVE_STATES,
    ShardSummary,
    finished_state,
    live_state,
    summarize,
)
from snerd.core.timefmt import format_rfc3339

SECOND = 1_000_000
NOW = 1_800_000_000 * SECOND


def fields(**extra: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "taskId": "t",
        "taskType": "resize",
        "retryCount": 0,
        "maxRetries": 2,
        "retryAfterHours": 0.0,
        "retryAfterTime": format_rfc3339(NOW - SECOND),
        "executeAt": format_rfc3339(NOW - SECOND),
        "taskData": "{}",
    }
    f.update(extra)
    return f


def test_each_live_state_and_which_rule_wins() -> None:
    due, later = format_rfc3339(NOW - SECOND), format_rfc3339(NOW + 60 * SECOND)
    assert live_state("t", fields(), {}, NOW) == "waiting"
    assert live_state("t", fields(executeAt=later), {}, NOW) == "delayed"
    assert live_state("t", fields(retryAfterTime=later, executeAt=due), {}, NOW) == "delayed"
    assert live_state("t", fields(retryCount=1, executeAt=later), {}, NOW) == "retrying"
    # A dispatched, unresolved task is in flight whatever its record says.
    assert live_state("t", fields(retryCount=1, executeAt=later), {"t": 2}, NOW) == "in_flight"
    # Due exactly now is due; a time that does not parse holds nothing back.
    assert live_state("t", fields(executeAt=format_rfc3339(NOW)), {}, NOW) == "waiting"
    assert live_state("t", fields(executeAt="soon", retryAfterTime=3), {}, NOW) == "waiting"
    assert set(LIVE_STATES).isdisjoint(FINISHED_STATES)


def test_a_summary_counts_every_live_task_once_by_state_and_type() -> None:
    later = format_rfc3339(NOW + 60 * SECOND)
    records = [
        fields(taskId="a"),
        fields(taskId="b", executeAt=later),
        fields(taskId="c", retryCount=1),
        fields(taskId="d", taskType="email"),
        {**fields(taskId="e"), "deletedAt": format_rfc3339(NOW), "snerdOutcome": "completed"},
        {**fields(taskId="f"), "deletedAt": format_rfc3339(NOW), "snerdOutcome": "dead_letter"},
    ]
    fold = fold_records(scan(b"".join(encode_record(r) for r in records)).records)
    s = summarize(fold, NOW)
    assert (s.live, s.waiting, s.delayed, s.retrying, s.in_flight) == (4, 2, 1, 1, 0)
    assert (s.completed, s.dead_letters) == (1, 1)
    assert s.types == {"resize": 3, "email": 1}
    total = ShardSummary()
    total.add(s)
    total.add(s)
    assert (total.live, total.waiting, total.dead_letters) == (8, 4, 2)
    assert total.types == {"resize": 6, "email": 2}


def test_a_tombstone_is_completed_cancelled_or_a_dead_letter() -> None:
    assert finished_state({"deletedAt": "x", "snerdOutcome": "completed"}) == "completed"
    assert finished_state({"deletedAt": "x", "snerdOutcome": "cancelled"}) == "cancelled"
    assert finished_state({"deletedAt": "x", "snerdOutcome": "dead_letter"}) == "dead_letter"
    assert set(FINISHED_STATES) == {"completed", "cancelled", "dead_letter"}
