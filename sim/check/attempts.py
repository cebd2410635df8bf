"""Invariants 4 and 5: attempts within `1 + max_retries`, and rate windows kept.

4. **Attempts** (`ATTEMPTS_EXCEEDED`): per task incarnation, the distinct attempt numbers
   executed stay within `1 + max_retries`, and none is above it. Re-executing an attempt
   number already executed is a crash re-execution, allowed and counted apart
   (`Metrics.re_executions`). Cron tasks (attrs `cron`) re-arm with their attempt count reset,
   so they are skipped. A schedule's run has no invoke: its budget is its record's
   `maxRetries` (`Analysis.run_schedule`).
4b. **Final failures** (`FINAL_RETRIED`): a failure its SDK marked final (`"retry": false`;
   `handler_done` with `final`) of attempt n on node N is not retried by N: the first accepted
   task record of the task that N decides (`t_queued`) after it, in the epoch of the execute
   it answered, is not a retry's record (`retryCount` n, not a tombstone). (Only the first: a
   retry command may put the dead letter back, and its new attempts fail as they may.) Another node,
   or N in a later tenure, may run attempt n again after a takeover (the result never reached
   a live owner) and retry a failure of that run that was not final. Tasks with a hard
   timeout are not judged: N may fail the attempt at its deadline, and retry it, while the
   result is on its way.
4c. **Retry waits** (`RETRIED_EARLY`): after an accepted retry record (`retryCount` n, not a
   tombstone) of a task whose `retryAfterHours` is above 0, its attempt n + 1 is not
   executed before the wait the core's rule gives (`snerd.core.retry.retry_delay_us` with the
   record's `retryAfterHours`, `snerdBackoff` (else the simulated daemon's `constant`) and
   `snerdBackoffMax`) has passed since attempt n began (the earliest the node can have
   decided it: the record's own write may come later, after a failed append), less the most
   two wall clocks can differ by then (the `control` entry: `2 offset_max + drift` over the wait
   and the run so far, and 5 ms for the hand-off). Not judged when clocks were stepped.
5. **Rate windows** (`RATE_EXCEEDED`): per rate-limit group (tasks with `group` and
   `max_per_minute`), the first execute of each (task, attempt) counts at its true time; any
   `m + 1` of them less than 60 s minus `window_slack_us` apart are a violation (`m`: the
   largest limit the group's tasks name). Crash re-executions do not count, so the judgement
   is never stricter than the daemon's, which counts every dispatch; the slack covers clock
   error and dispatch-to-execute delay.

Both read a task's executes grouped by incarnation (`task_runs`): a task id may be enqueued
again once finished. Judgements only, over a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sim.check.history import Analysis, Execute, Invoke
from sim.check.report import (
    ATTEMPTS_EXCEEDED,
    FINAL_RETRIED,
    RATE_EXCEEDED,
    RETRIED_EARLY,
    Params,
    Violation,
    at,
)
from snerd.core.retry import EXPONENTIAL_CAP_US, attempts_allowed, retry_delay_us
from snerd.core.schema import (
    MAX_EXECUTION_SECONDS,
    RETRY_AFTER_HOURS,
    RETRY_COUNT,
    SNERD_BACKOFF,
    SNERD_BACKOFF_MAX,
)
from snerd.core.shardlog import RATE_WINDOW_US

__all__ = [
    "Runs",
    "judge_attempts",
    "judge_finals",
    "judge_rate_windows",
    "judge_retry_waits",
    "task_runs",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Runs:
    """The executes of one task incarnation. A task id may be enqueued again once finished;
    an execute belongs to the latest invoke of its task before it."""

    task: str
    invoke: Invoke | None
    executes: list[Execute]
    #: Its budget: the invoke's `max_retries`, or a schedule run's `maxRetries`; None: not
    #: judged (a cron task, or a task never enqueued).
    max_retries: int | None = None


def task_runs(a: Analysis) -> list[Runs]:
    """The executes of `a` grouped by task incarnation: an execute belongs to the latest
    invoke of its task before it."""
    runs: dict[tuple[str, int], Runs] = {}
    for x in a.executes:
        inv = a.invoke_before(x.task, x.index)
        key = (x.task, inv.index if inv is not None else -1)
        if key not in runs:
            if inv is not None:
                budget = inv.max_retries if inv.cron is None else None
            else:
                budget = a.run_schedule.get(x.task, (None, None))[1]
            runs[key] = Runs(task=x.task, invoke=inv, executes=[], max_retries=budget)
        runs[key].executes.append(x)
    return list(runs.values())


def judge_attempts(runs: list[Runs]) -> tuple[list[Violation], int, int]:
    """Invariant 4 on `runs`: its violations, the crash re-executions, and the most distinct
    attempts any task made."""
    out: list[Violation] = []
    re_executions = 0
    most = 0
    for run in runs:
        # Cron tasks re-arm with retryCount 0, so their attempt numbers repeat by design; a task
        # never enqueued is `INVENTED_TASK`'s business.
        budget = run.max_retries
        judged = budget is not None
        allowed = attempts_allowed(budget) if budget is not None else 0
        seen: set[int] = set()
        for x in run.executes:
            if x.attempt in seen:
                re_executions += 1
                continue
            seen.add(x.attempt)
            if judged and (len(seen) > allowed or x.attempt > allowed):
                judged = False  # one violation per task is enough to read
                out.append(
                    Violation(
                        kind=ATTEMPTS_EXCEEDED,
                        index=x.index,
                        t=x.t,
                        message=(
                            f"task {run.task} ran attempt {x.attempt} on {x.node} at {at(x.t)}: "
                            f"attempts {sorted(seen)} so far, but max_retries={budget} "
                            f"allows {allowed}"
                        ),
                    )
                )
        most = max(most, len(seen))
    return out, re_executions, most


def judge_rate_windows(params: Params, runs: list[Runs]) -> list[Violation]:
    """Invariant 5 on `runs`, judged with the clock slack `params` allows."""
    window = RATE_WINDOW_US - params.window_slack_us
    if window <= 0:
        return []
    limits: dict[str, int] = {}
    firsts: dict[str, list[Execute]] = defaultdict(list)
    for run in runs:
        inv = run.invoke
        if inv is None or inv.group is None or inv.max_per_minute is None:
            continue
        # Tasks of one group may name different limits; the largest is the loosest judgement.
        limits[inv.group] = max(limits.get(inv.group, 0), inv.max_per_minute)
        seen: set[int] = set()
        for x in run.executes:
            if x.attempt not in seen:
                seen.add(x.attempt)
                firsts[inv.group].append(x)
    out: list[Violation] = []
    for group, execs in sorted(firsts.items()):
        execs.sort(key=lambda x: x.index)
        m = limits[group]
        for j in range(m, len(execs)):
            first, last = execs[j - m], execs[j]
            if last.t - first.t < window:
                out.append(
                    Violation(
                        kind=RATE_EXCEEDED,
                        index=last.index,
                        t=last.t,
                        message=(
                            f"group {group} (max_per_minute={m}): {m + 1} first executions within "
                            f"{(last.t - first.t) / 1e6:.3f} s, from task {first.task} at "
                            f"{at(first.t)} to task {last.task} at {at(last.t)} (window judged: "
                            f"{window / 1e6:.3f} s, 60 s less {params.window_slack_us} µs slack)"
                        ),
                    )
                )
    return out


def judge_finals(a: Analysis) -> list[Violation]:
    """Check 4b (the module's header): a failure marked final is never retried by the node
    it reached."""
    out: list[Violation] = []
    for index, t, task, attempt, node in a.finals:
        records = a.task_records.get(task, [])
        if any(MAX_EXECUTION_SECONDS in r.fields for r in records):
            continue  # (a hard timeout may fail the attempt while the result is on its way)
        ran = [x for x in a.executes if x.task == task and x.attempt == attempt
               and x.node == node and x.t <= t]
        if not ran:
            continue
        epoch = ran[-1].epoch
        # The node's decision on that failure: its first record of the task after it (a
        # later one may be of a new life: a retry command puts a dead letter back).
        decision = next((r for r in records if r.accepted and r.node == node
                         and r.epoch == epoch and r.t_queued > t), None)
        for r in () if decision is None else (decision,):
            if not r.tombstone and r.fields.get(RETRY_COUNT) == attempt:
                out.append(Violation(
                    kind=FINAL_RETRIED,
                    message=f"{task} attempt {attempt} failed final on {node} at {at(t)}, yet "
                    f"{node} wrote a retry of it at {at(r.t_queued)}",
                    index=index, t=t,
                ))
                break
    return out


def judge_retry_waits(a: Analysis) -> list[Violation]:
    """Check 4c (the module's header): a retry waits what the task's policy says."""
    bound = next(
        ((e["offset_max_us"], e["drift_max_ppm"], bool(e.get("steps")))
         for _i, e in a.control_entries if e["kind"] == "control"),
        None,
    )
    if bound is None or bound[2]:
        return []
    offset_max, drift_ppm, _ = bound
    out: list[Violation] = []
    by_task: dict[str, list[Execute]] = defaultdict(list)
    for x in a.executes:
        by_task[x.task].append(x)
    for task, records in a.task_records.items():
        for r in records:
            hours = r.fields.get(RETRY_AFTER_HOURS)
            n = r.fields.get(RETRY_COUNT)
            if (not r.accepted or r.tombstone or r.kind is not None or type(n) is not int
                    or n < 1 or not isinstance(hours, int | float) or hours <= 0):
                continue
            cap = r.fields.get(SNERD_BACKOFF_MAX)
            wait = retry_delay_us(
                retry_after_hours=hours, failures=n,
                policy=r.fields.get(SNERD_BACKOFF) or "constant", task_id=task,
                cap_us=cap * 1_000_000 if type(cap) is int else EXPONENTIAL_CAP_US,
            )
            # The node decided the wait when attempt n ended, after it began: its execute is
            # the earliest the decision can be (the record itself may have been written again
            # later, after a failed append: `t_queued` is that write's).
            runs = by_task.get(task, ())
            began = [x.t for x in runs if x.attempt == n and x.t <= r.t_queued]
            if not began:
                continue
            since = began[-1]
            slack = 2 * offset_max + drift_ppm * (since + wait) // 1_000_000 + 5_000
            nxt = next((x for x in runs if x.attempt == n + 1 and x.t >= r.t_queued), None)
            if nxt is not None and nxt.t < since + wait - slack:
                out.append(Violation(
                    kind=RETRIED_EARLY,
                    message=f"{task} attempt {n + 1} ran {at(nxt.t)}, "
                    f"{(since + wait - nxt.t) / 1e6:.3f} s before its retry's wait "
                    f"({wait / 1e6:.3f} s from attempt {n}'s start {at(since)}) had passed",
                    index=nxt.index, t=nxt.t,
                ))
    return out
