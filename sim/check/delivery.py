"""Invariant 1: at-least-once delivery. Every acked task finishes, and none is invented.

- **Lost** (`LOST_TASK`): every task acked (not as a duplicate) has an accepted tombstone
  (completed or dead-lettered) durable after its enqueue was sent. A duplicate's ack is
  covered when some task enqueued with its fingerprint finished, and so is an *undecided* ack
  (`"deduplicated": null`: the owner had not decided when the ack went out) of a task with a
  fingerprint when a task with it finished (the owner may drop such a task at ingestion while
  its twin is pending). A plain ack is not covered by a twin: the daemon said the enqueue was
  taken in, so it must finish itself (`sim.check.honesty` says why when it never became a
  task at all).
- **Invented** (`INVENTED_TASK`): every task id in an accepted record or an execute was
  enqueued before, or is a schedule's run (its records carry `snerdSchedule`: no client
  enqueues it, `sim.check.schedules` judges it).

At-least-once is judged at the end of the history, so a run records its history up to the
end of its liveness phase, which it may end early once nothing acked is unfinished
(`unfinished_tasks`; `sim.check.liveness` asks it of a growing history). Judgements only, over
a parsed history (`sim.check.history.Analysis`).
"""

from __future__ import annotations

from typing import Any

from sim.check.history import Ack, Analysis, Execute, Record
from sim.check.report import INVENTED_TASK, LOST_TASK, Violation, at

__all__ = ["is_satisfied", "judge_at_least_once", "unfinished_tasks"]


def is_satisfied(a: Analysis, ack: Ack) -> bool:
    """Whether `ack` is covered so far: its task finished after the invoke (or, for a
    duplicate or an undecided ack, some task with its fingerprint finished)."""
    if not ack.deduplicated:
        if a.finished_after(ack.task, ack.invoke.index) is not None:
            return True
        # It may have been a duplicate: the daemon said it could not tell. A decided plain
        # ack said it was not (the inbox's verdict was waited for): no twin covers it.
        return ack.undecided and ack.invoke.fingerprint in a.finished_fingerprints
    # The daemon may answer a duplicate while the original's tombstone is being written, and
    # the original may be an enqueue whose client never saw the reply: any finished task with
    # the fingerprint covers it.
    return ack.invoke.fingerprint in a.finished_fingerprints


def judge_at_least_once(a: Analysis, satisfied: list[bool] | None = None) -> list[Violation]:
    """`satisfied`: `satisfied` of each of `a.acks`, if the caller has it already."""
    out: list[Violation] = []
    if satisfied is None:
        satisfied = [is_satisfied(a, ack) for ack in a.acks]
    for ack, done in zip(a.acks, satisfied, strict=True):
        if done:
            continue
        what = (
            f"as a duplicate of fingerprint {ack.invoke.fingerprint}, but no task with that "
            "fingerprint"
            if ack.deduplicated
            else "never"
        )
        fenced = [
            r
            for r in a.task_records.get(ack.task, ())
            if r.tombstone and not r.accepted and r.index > ack.invoke.index
        ]
        extra = (
            f" (its tombstone #{fenced[0].index} by {fenced[0].node} was fenced: epoch "
            f"{fenced[0].epoch} < {fenced[0].fence})"
            if fenced and not ack.deduplicated
            else ""
        )
        out.append(
            Violation(
                kind=LOST_TASK,
                index=ack.index,
                t=ack.t,
                message=(
                    f"task {ack.task} acked by {ack.node} at {at(ack.t)} {what} completed or "
                    f"dead-lettered{extra}"
                ),
            )
        )
    reported: set[str] = set()
    # In history order (an entry is a record or an execute, never both: indexes are unique).
    sightings: list[tuple[int, Record | Execute]] = [
        (r.index, r) for r in a.records if r.accepted and r.task_id is not None
    ]
    sightings += [(x.index, x) for x in a.executes]
    sightings.sort(key=_first)
    invokes = a.invokes
    for index, seen in sightings:
        task = seen.task if isinstance(seen, Execute) else seen.task_id
        assert task is not None
        if task in reported or task in a.run_schedule:
            continue
        listed = invokes.get(task)
        if listed and listed[0].index < index:  # `invoke_before(task, index) is not None`
            continue
        reported.add(task)
        if isinstance(seen, Execute):
            where = f"an execute on {seen.node}"
        else:
            where = f"an accepted {seen.kind or 'task'} record in shard {seen.shard}"
        out.append(
            Violation(
                kind=INVENTED_TASK,
                index=index,
                t=seen.t,
                message=f"task {task} appears in {where} but no client had enqueued it",
            )
        )
    return out


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def unfinished_tasks(a: Analysis) -> list[str]:
    """The tasks of the acks not covered yet, in ack order, once each."""
    out: dict[str, None] = {}
    for ack in a.acks:
        if not is_satisfied(a, ack):
            out.setdefault(ack.task)
    return list(out)
