"""The invariant checkers: judging one recorded history against the queue's guarantees.

This package owns the verdict on a run. It takes a plain history (a list of JSON-able dicts,
in the format `sim.check.history` defines) and knows nothing of how it was produced, so the
deterministic simulator (`sim.world`) and jepsen-lite (real processes) share it. It must never
import the shell (`snerd.io`), trio, os, time or random, nor reach into the simulator's
objects: everything it knows is in the history. It may import the pure core for shared names
(`snerd.core.shardlog`, `snerd.core.retry`).

One module per invariant or close family, each judging the parsed history alone, composed by
`sim.check.verdict`:

| module | invariants |
|---|---|
| `delivery` | 1 at-least-once: every acked task finishes; no task is invented |
| `ownership` | 2 one owner per shard epoch; 3 nothing told before it is accepted; 8 no belief overlap |
| `attempts` | 4 attempts within `1 + max_retries`; 5 rate windows |
| `order` | 6 priority; 7 dedupe |
| `deps` | 9 dependencies: no child before its parents completed; failed through; not left waiting |
| `honesty` | 10 dedupe honesty: a deduplicated enqueue was told so; a plain ack has its own task |
| `schedules` | 11 one dispatch per cron tick per schedule (minus crash re-executions, counted) |
| `results` | 12 a completed task's stored result, read back, is one a successful attempt returned |

`report` names the violation kinds and the verdict's types, `history` parses, `liveness`
follows a growing history.

Verdicts
--------
Each `check_*` function returns a list of `Violation`; `check` runs them all and adds
`Metrics`. At-least-once is judged at the end of the history, so a run records its history up
to the end of its liveness phase, which it may end early once `unfinished` (or a
`LivenessWatch`, for repeated polling) is empty. A false alarm costs a whole CI run, so where
a rule depends on timing the checker cannot see (priority, rate windows), it flags only what
the history proves. A malformed history is the recorder's bug and raises `HistoryError`.
"""

from sim.check.history import History, HistoryError
from sim.check.liveness import LivenessWatch, unfinished
from sim.check.report import (
    ACK_NOT_DURABLE,
    ATTEMPTS_EXCEEDED,
    BELIEF_OVERLAP,
    CHILD_NOT_FAILED,
    CHILD_NOT_RUN,
    CHILD_RAN_EARLY,
    CHILD_RAN_ON_PENDING,
    DOUBLE_OWNERSHIP,
    DUPLICATE_PENDING,
    FALSE_DUPLICATE,
    INVENTED_TASK,
    LOST_TASK,
    PRIORITY_INVERSION,
    RATE_EXCEEDED,
    STALE_OWNER_ACTED,
    TICK_FIRED_TWICE,
    UNTOLD_DUPLICATE,
    WRONG_RESULT,
    Metrics,
    Params,
    Report,
    Violation,
)
from sim.check.verdict import (
    check,
    check_at_least_once,
    check_attempts,
    check_belief,
    check_dedupe,
    check_dedupe_honesty,
    check_dependencies,
    check_fenced_acts,
    check_ownership,
    check_priority,
    check_rate_windows,
    check_results,
    check_schedule_runs,
)

__all__ = [
    "ACK_NOT_DURABLE",
    "ATTEMPTS_EXCEEDED",
    "BELIEF_OVERLAP",
    "CHILD_NOT_FAILED",
    "CHILD_NOT_RUN",
    "CHILD_RAN_EARLY",
    "CHILD_RAN_ON_PENDING",
    "DOUBLE_OWNERSHIP",
    "DUPLICATE_PENDING",
    "FALSE_DUPLICATE",
    "INVENTED_TASK",
    "LOST_TASK",
    "PRIORITY_INVERSION",
    "RATE_EXCEEDED",
    "STALE_OWNER_ACTED",
    "TICK_FIRED_TWICE",
    "UNTOLD_DUPLICATE",
    "WRONG_RESULT",
    "History",
    "HistoryError",
    "LivenessWatch",
    "Metrics",
    "Params",
    "Report",
    "Violation",
    "check",
    "check_at_least_once",
    "check_attempts",
    "check_belief",
    "check_dedupe",
    "check_dedupe_honesty",
    "check_dependencies",
    "check_fenced_acts",
    "check_ownership",
    "check_priority",
    "check_rate_windows",
    "check_results",
    "check_schedule_runs",
    "unfinished",
]
