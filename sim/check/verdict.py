"""The harness: every invariant judged on one history, alone or all together.

Each invariant module judges a parsed history (`sim.check.history.Analysis`) and knows nothing
of the others, in the manner of TigerBeetle's one checker per file. This module composes them:
`judge` runs each once on one parse, sharing what several ask (each ack's inbox and finished
judgement, each task's runs), and gathers the violations, in history order, with the metrics
into one `Report`. `check` is `judge` of a whole history; each `check_*` is one invariant alone
(the tests' view: a planted history must fail the check it was planted for).
"""

from __future__ import annotations

from sim.check.attempts import (
    judge_attempts,
    judge_finals,
    judge_rate_windows,
    judge_retry_waits,
    task_runs,
)
from sim.check.control import judge_control
from sim.check.delivery import is_satisfied, judge_at_least_once
from sim.check.deps import judge_dependencies
from sim.check.history import Analysis, History, analyse
from sim.check.honesty import judge_dedupe_honesty
from sim.check.order import judge_dedupe, judge_priority
from sim.check.ownership import judge_belief, judge_fenced_acts
from sim.check.report import Metrics, Report, Violation
from sim.check.results import judge_results
from sim.check.schedules import judge_schedule_runs

__all__ = [
    "check",
    "check_at_least_once",
    "check_attempts",
    "check_belief",
    "check_control",
    "check_dedupe",
    "check_dedupe_honesty",
    "check_dependencies",
    "check_fenced_acts",
    "check_finals",
    "check_ownership",
    "check_priority",
    "check_rate_windows",
    "check_results",
    "check_retry_waits",
    "check_schedule_runs",
    "judge",
]


def check(history: History) -> Report:
    """Run every check on one history and measure it."""
    return judge(analyse(history))


def judge(a: Analysis) -> Report:
    """Every invariant judged on `a`, and its metrics: the verdict."""
    runs = task_runs(a)
    attempts, re_executions, most = judge_attempts(runs)
    belief, overlap = judge_belief(a)
    control, cancels_running = judge_control(a)
    # Each ack judged once for every check and measure that asks.
    via_inbox = [a.via_inbox(ack) for ack in a.acks]
    satisfied = [is_satisfied(a, ack) for ack in a.acks]
    violations = [
        # Before at-least-once: an ack sorts first among violations of one entry, and an
        # untold duplicate is also a task lost, but this says why.
        *judge_dedupe_honesty(a),
        *judge_at_least_once(a, satisfied),
        *a.epochs.violations,
        *judge_fenced_acts(a, via_inbox),
        *attempts,
        *judge_rate_windows(a.params, runs),
        *judge_priority(a, via_inbox),
        *judge_dedupe(a),
        *judge_dependencies(a),
        *judge_schedule_runs(a),
        *judge_results(a),
        *judge_finals(a),
        *judge_retry_waits(a),
        *control,
        *belief,
    ]
    violations.sort(key=lambda v: v.index)
    metrics = Metrics(
        belief_overlap_us=sum(overlap.values()),
        belief_overlap_us_by_shard=overlap,
        acked=len(a.acks),
        deduplicated=sum(1 for k in a.acks if k.deduplicated),
        inbox_acked=sum(via_inbox),
        finished=sum(satisfied),
        dead_letters=a.dead_letters,
        executions=len(a.executes),
        re_executions=re_executions,
        max_attempts=most,
        fenced_records=sum(1 for r in a.records if not r.accepted),
        schedule_runs=sum(
            1 for rs in a.run_creations.values() if any(r.accepted for r in rs)
        ),
        stored_results=len(a.stored),
        cancels_running=cancels_running,
    )
    return Report(violations=tuple(violations), metrics=metrics)


def check_at_least_once(history: History) -> list[Violation]:
    """Every task acked (not as a duplicate) has an accepted tombstone — completed or
    dead-lettered — durable after its enqueue was sent; a duplicate's ack is covered when some
    task enqueued with its fingerprint finished, and so is an inbox ack of a task with a
    fingerprint when a task with it finished after the invoke (the owner drops such a task at
    ingestion while its twin is pending). And no task is invented: every task id in an
    accepted record or an execute was enqueued before."""
    return judge_at_least_once(analyse(history))


def check_ownership(history: History) -> list[Violation]:
    """No double ownership, judged on accepted records (see Acceptance in `sim.check.history`):
    accepted transitions are in epoch order per shard (only a non-fencing system can break
    this), one epoch of a shard is claimed by one node, and accepted records under an epoch are
    written by the node that claimed it."""
    return list(analyse(history).epochs.violations)


def check_fenced_acts(history: History) -> list[Violation]:
    """Nothing is told before the record that makes it true is accepted: every execute matches
    an accepted dispatch record (same shard, task, attempt and epoch) durable before it, and
    every ack (not as a duplicate) follows an accepted enqueue record of the task (`retryCount`
    0, no `deletedAt`, in the acked shard) durable between the invoke and the ack — or is an
    inbox ack, made durable by its `inbox_record` (one writer, no fence)."""
    return judge_fenced_acts(analyse(history))


def check_attempts(history: History) -> list[Violation]:
    """Per task, the distinct attempt numbers executed stay within `1 + max_retries` (and none
    is above it). Re-executing an attempt number already executed is a crash re-execution,
    allowed and counted apart (`Metrics.re_executions`). Cron tasks (attrs `cron`) re-arm with
    their attempt count reset, so they are skipped."""
    return judge_attempts(task_runs(analyse(history)))[0]


def check_rate_windows(history: History) -> list[Violation]:
    """Per rate-limit group (tasks with `group` and `max_per_minute`), the first execute of
    each (task, attempt) counts at its true time; any `m + 1` of them less than 60 s minus
    `window_slack_us` apart are a violation (`m`: the largest limit the group's tasks name).
    Crash re-executions do not count, so the judgement is never stricter than the daemon's,
    which counts every dispatch; the slack covers clock error and dispatch-to-execute delay."""
    a = analyse(history)
    return judge_rate_windows(a.params, task_runs(a))


def check_priority(history: History) -> list[Violation]:
    """No ready task is passed over for a less urgent one while a worker slot is free, judged
    only where the history proves it: the six conditions are stated once, in
    `sim.check.order`'s header."""
    return judge_priority(analyse(history))


def check_dedupe(history: History) -> list[Violation]:
    """Per shard, over accepted records in file order: no two live tasks (enqueued, not yet
    tombstoned) with `autoDedupe` and one `payloadHash` at the same time."""
    return judge_dedupe(analyse(history))


def check_belief(history: History) -> list[Violation]:
    """Belief overlap: the true time two or more nodes believed they owned one shard at once
    (a node's belief ends at its "off", its crash, or the end of the history). Always measured
    (`Metrics.belief_overlap_us`); a violation only when `params.assumptions_hold`."""
    return judge_belief(analyse(history))[0]


def check_dependencies(history: History) -> list[Violation]:
    """No child (an enqueue with `parents`) executes before an accepted tombstone saying each
    parent completed is durable; a child of a dead-lettered (never completed) or never-enqueued
    parent ends dead-lettered; a child whose parents all completed, each durable before it was
    sent, ran before it ended (the rules are stated once, in `sim.check.deps`'s header)."""
    return judge_dependencies(analyse(history))


def check_dedupe_honesty(history: History) -> list[Violation]:
    """A deduplicated enqueue was told so, and a non-deduplicated one has its own task: a plain
    ack of an enqueue with a fingerprint is of a task with an accepted record or an execute
    after its invoke; a deduplicated ack's task has neither, and its `duplicate_of` names
    another task with its fingerprint. Undecided acks are judged by neither rule."""
    return judge_dedupe_honesty(analyse(history))


def check_schedule_runs(history: History) -> list[Violation]:
    """One dispatch per cron tick per schedule: each run id (a task with `snerdSchedule`) has
    one accepted enqueue record, unless the schedule was removed between two (the rule is in
    `sim.check.schedules`'s header; its executions are invariant 4's)."""
    return judge_schedule_runs(analyse(history))


def check_results(history: History) -> list[Violation]:
    """A completed task's stored result, read back from the final files (`stored_result`),
    is one that a successful attempt of it returned (`handler_done`'s `result`; none counts
    as a value); tasks with no successful attempt recorded are not judged (the rule is in
    `sim.check.results`'s header)."""
    return judge_results(analyse(history))
def check_finals(history: History) -> list[Violation]:
    """A failure marked final (`"retry": false`) is not retried by the node it reached (the
    rule is in `sim.check.attempts`'s header, 4b)."""
    return judge_finals(analyse(history))


def check_retry_waits(history: History) -> list[Violation]:
    """A task's next attempt does not start before its retry's wait has passed (the rule is
    in `sim.check.attempts`'s header, 4c)."""
    return judge_retry_waits(analyse(history))


def check_control(history: History) -> list[Violation]:
    """Job control: an acked cancel ends its task for good, an acked pause holds until a
    resume is sent, an acked retry runs again (the rules are stated once, in
    `sim.check.control`'s header)."""
    return judge_control(analyse(history))[0]
