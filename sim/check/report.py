"""The verdict's vocabulary: violation kinds, `Violation`, `Params`, `Metrics` and `Report`.

Every invariant module (`sim.check.delivery`, `.ownership`, `.attempts`, `.order`, `.deps`,
`.schedules`, `.results`) reports what
it finds as `Violation`s of the kinds named here, and `sim.check.verdict` gathers them into one
`Report` with the run's `Metrics`. Data only: nothing here reads a history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACK_NOT_DURABLE",
    "ATTEMPTS_EXCEEDED",
    "BELIEF_OVERLAP",
    "CANCELLED_RAN",
    "CANCEL_NOT_KEPT",
    "CHILD_NOT_FAILED",
    "CHILD_NOT_RUN",
    "CHILD_RAN_EARLY",
    "CHILD_RAN_ON_PENDING",
    "DOUBLE_OWNERSHIP",
    "DUPLICATE_PENDING",
    "FALSE_DUPLICATE",
    "FINAL_RETRIED",
    "INVENTED_TASK",
    "LOST_TASK",
    "PAUSED_RAN",
    "PRIORITY_INVERSION",
    "PURGED_WRONG",
    "RATE_EXCEEDED",
    "RETRIED_EARLY",
    "RETRY_NOT_RUN",
    "STALE_OWNER_ACTED",
    "TICK_FIRED_TWICE",
    "UNTOLD_DUPLICATE",
    "WRONG_RESULT",
    "Metrics",
    "Params",
    "Report",
    "Violation",
    "at",
]

#: An acked task never completed nor dead-lettered (check 1).
LOST_TASK = "lost_task"
#: A task id in an accepted record or an execute that no client ever enqueued (check 1).
INVENTED_TASK = "invented_task"
#: Accepted transitions out of epoch order, or one epoch of a shard used by two nodes (check 2).
DOUBLE_OWNERSHIP = "double_ownership"
#: An execute without an accepted dispatch record durable before it (check 3).
STALE_OWNER_ACTED = "stale_owner_acted"
#: An ack without an accepted enqueue record durable before it (check 3).
ACK_NOT_DURABLE = "ack_not_durable"
#: More distinct attempts than `1 + max_retries` (check 4).
ATTEMPTS_EXCEEDED = "attempts_exceeded"
#: A failure its SDK marked final (`"retry": false`) that its node retried (check 4).
FINAL_RETRIED = "final_retried"
#: A task's next attempt started before its retry's wait had passed (check 4c).
RETRIED_EARLY = "retried_early"
#: More than `max_per_minute` first executions of a group in one window (check 5).
RATE_EXCEEDED = "rate_exceeded"
#: A ready task passed over for a less urgent one while a slot was free (check 6).
PRIORITY_INVERSION = "priority_inversion"
#: Two live tasks with one fingerprint in one shard (check 7).
DUPLICATE_PENDING = "duplicate_pending"
#: Two nodes believed they owned one shard at once, though the assumptions held (check 8).
BELIEF_OVERLAP = "belief_overlap"
#: A child executed before some parent had completed at all (check 9).
CHILD_RAN_EARLY = "child_ran_early"
#: A child executed after a parent's handler succeeded but before its completion was
#: durable: on a tombstone still pending, or one a crash then lost (check 9).
CHILD_RAN_ON_PENDING = "child_ran_on_pending"
#: A child of a dead-lettered or never-enqueued parent that completed (check 9).
CHILD_NOT_FAILED = "child_not_failed"
#: A child whose parents all completed, known before it was sent, that ended unrun (check 9).
CHILD_NOT_RUN = "child_not_run"
#: A plain ack (not deduplicated, not undecided) of an enqueue with dedupe that never became a
#: task of its own: dropped as a duplicate, told it was taken in (check 10).
UNTOLD_DUPLICATE = "untold_duplicate"
#: A deduplicated ack of a task that has a task of its own, or naming as its twin a task
#: without its fingerprint (check 10).
FALSE_DUPLICATE = "false_duplicate"
#: A schedule's run id enqueued twice (two accepted records creating it), the schedule not
#: removed in between: its tick fired twice (check 11).
TICK_FIRED_TWICE = "tick_fired_twice"
#: A completed task's stored result (read back from the final files) that no successful
#: attempt of it returned (check 12).
WRONG_RESULT = "wrong_result"
#: A task acked cancelled dispatched after the ack (check 13).
CANCELLED_RAN = "cancelled_ran"
#: A task acked cancelled without a `cancelled` tombstone durable by the ack, or ending
#: otherwise after it; or acked cancelled in a state a cancel does not end (check 13).
CANCEL_NOT_KEPT = "cancel_not_kept"
#: A task of a type paused on every shard dispatched before a resume was sent (check 14).
PAUSED_RAN = "paused_ran"
#: A task acked retried that never ran again; a dead letter of a type whose retry was acked
#: that was not put back (check 15).
RETRY_NOT_RUN = "retry_not_run"
#: A purge record naming a task whose latest record before it is not a dead-letter or
#: cancelled tombstone of the purge's type that finished before its `before`; or a purged
#: task's record after it (check 16).
PURGED_WRONG = "purged_wrong"


def at(t: int) -> str:
    """True time `t` (µs) as a message shows it."""
    return f"t={t / 1_000_000:.6f}s"


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken invariant, located at the history entry that proves it."""

    #: One of the module's violation kinds (`LOST_TASK`, `DOUBLE_OWNERSHIP`, ...).
    kind: str
    #: What happened, for a person reading a failed run.
    message: str
    #: Index of the offending history entry.
    index: int
    #: That entry's true time (µs).
    t: int

    def __str__(self) -> str:
        return f"[{self.kind}] #{self.index} {at(self.t)}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    """The history's first entry: the run's settings as the checker needs them."""

    ttl_us: int
    margin_us: int
    fence: bool
    assumptions_hold: bool
    window_slack_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """Measurements reported whether or not anything failed."""

    #: True time during which two or more nodes believed they owned one shard, summed over
    #: shards; and per shard.
    belief_overlap_us: int
    belief_overlap_us_by_shard: Mapping[int, int]
    #: "ok" enqueue replies, and how many of them said `deduplicated`.
    acked: int
    deduplicated: int
    #: Acks of enqueues made durable in an inbox file (see `inbox_record`).
    inbox_acked: int
    #: Acked tasks that finished (accepted tombstone; deduplicated: their fingerprint finished).
    finished: int
    #: Dead-letter deliveries the SDK saw.
    dead_letters: int
    #: Execute entries, and those that repeated a (task, attempt) already executed.
    executions: int
    re_executions: int
    #: The most distinct attempts any task made.
    max_attempts: int
    #: Records fencing kept out of the state (0 when the system under test does not fence).
    fenced_records: int
    #: Schedule runs enqueued (run ids with an accepted enqueue record).
    schedule_runs: int = 0
    #: Completed tasks whose stored result was read back and compared (check 12).
    stored_results: int = 0
    #: Cancels acked `cancelled: true` while an attempt of the task ran (check 13 allows it).
    cancels_running: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The verdict on one history: every violation found, and the metrics."""

    violations: tuple[Violation, ...]
    metrics: Metrics

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return not self.violations

    def describe(self, limit: int = 20) -> str:
        """A few lines for a person: the verdict, the metrics, the first `limit` violations."""
        m = self.metrics
        lines = [
            f"{'OK' if self.ok else 'FAILED'}: {len(self.violations)} violation(s); "
            f"acked {m.acked} ({m.deduplicated} deduplicated), finished {m.finished}, "
            f"executions {m.executions} (re-executions {m.re_executions}), max attempts "
            f"{m.max_attempts}, fenced records {m.fenced_records}, belief overlap "
            f"{m.belief_overlap_us} µs"
        ]
        lines += [str(v) for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more")
        return "\n".join(lines)
