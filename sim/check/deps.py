"""Invariant 9: dependencies. A child (`parents`, the enqueue's `trigger_after_ids`) runs only
after every parent completed, whichever shard or node holds each.

- **Ran early**: no execute of a child comes before an accepted tombstone of each parent that
  says it completed (`snerdOutcome`, read as `snerd.core.shardlog` reads it) is durable
  (`t_durable`, not the entry's place in the history: records are listed in file order, which
  may be after the execute). A parent that only ever dead-lettered, or that no one enqueued,
  never lets a child run. Reported as `CHILD_RAN_EARLY` when nothing had completed the parent
  by then, and as `CHILD_RAN_ON_PENDING` when its handler had succeeded (a `handler_done`
  with `ok`) but its tombstone was not durable yet, or never (pending when read, then lost in
  a crash: the history lists durable records only; or a result past its hard timeout, which
  the daemon refuses, when the parent never completed: either way the child ran early).
- **Failed through** (`CHILD_NOT_FAILED`): a child of a parent that was dead-lettered and never
  completed, or that nobody ever enqueued (no invoke of that id in the whole history), ends
  dead-lettered: its last accepted tombstone does not say it completed (that it never runs is
  the first rule).
- **Left waiting** (`CHILD_NOT_RUN`), judged on how each child ended (one that never ended is
  at-least-once's lost task, `sim.check.delivery`, which a run judges once its fault-free
  phase is over): a child whose parents all completed, each with a record durable in a log or
  an inbox file before the child was sent (so no pass over the queue's files after it was
  named can miss it), was executed before it ended.

Judgements only, over a parsed history (`sim.check.history.Analysis`); the invoke's `parents`
say who waits on whom, so a history recorded before dependencies were (every `parents` empty)
has nothing to judge.
"""

from __future__ import annotations

from sim.check.history import Analysis, Execute, Invoke, Record
from sim.check.report import (
    CHILD_NOT_FAILED,
    CHILD_NOT_RUN,
    CHILD_RAN_EARLY,
    CHILD_RAN_ON_PENDING,
    Violation,
    at,
)
from snerd.core.control import FOUND_DEAD, ended_state
from snerd.core.schema import OUTCOME_COMPLETED
from snerd.core.shardlog import tombstone_outcome

__all__ = ["judge_dependencies"]

_NEVER = 1 << 62


def judge_dependencies(a: Analysis) -> list[Violation]:
    """Every rule of the module's header, for every child of `a`."""
    children = [invokes[0] for invokes in a.invokes.values() if invokes[0].parents]
    if not children:
        return []
    done = {task: _completion(a, task) for c in children for task in c.parents}
    first: dict[str, Execute] = {}
    for x in a.executes:
        first.setdefault(x.task, x)
    out: list[Violation] = []
    for child in children:
        run = first.get(child.task)
        if run is not None:
            out += _ran_early(a, child, run, done)
        out += _ended(a, child, done)
    return out


def _tombstones(a: Analysis, task: str) -> list[Record]:
    return [r for r in a.task_records.get(task, ()) if r.accepted and r.tombstone]


def _completion(a: Analysis, task: str) -> Record | None:
    """The accepted tombstone of `task` saying it completed that was durable first."""
    done = [
        r for r in _tombstones(a, task) if tombstone_outcome(dict(r.fields)) == OUTCOME_COMPLETED
    ]
    return min(done, key=_durable) if done else None


def _durable(record: Record) -> int:
    return record.t_durable


def _ran_early(
    a: Analysis, child: Invoke, run: Execute, done: dict[str, Record | None]
) -> list[Violation]:
    """The child's first execute against when each parent's completion was durable."""
    for parent in child.parents:
        record = done[parent]
        if record is not None and record.t_durable <= run.t:
            continue
        handled = a.succeeded.get(parent)
        kind = CHILD_RAN_EARLY
        if record is not None and record.t_issue <= run.t:
            # Readers see a write before its fsync returns: a child let go on it runs on a
            # completion a crash may still lose.
            kind = CHILD_RAN_ON_PENDING
            status = (
                f"was completed by a tombstone written at {at(record.t_issue)} but durable "
                f"only at {at(record.t_durable)}"
            )
        elif handled is not None and handled <= run.t:
            kind = CHILD_RAN_ON_PENDING
            status = (
                f"succeeded at {at(handled)} but no tombstone saying so was durable"
                + ("" if record is None else f" before {at(record.t_durable)}")
                + " (one written meanwhile was pending or lost, or the result came too late)"
            )
        elif record is None:
            status = "had not completed"
        else:
            status = f"completed only at {at(record.t_durable)}"
        message = (
            f"child {child.task} executed (attempt {run.attempt}) on {run.node} while its "
            f"parent {parent} {status}"
        )
        return [Violation(kind=kind, index=run.index, t=run.t, message=message)]
    return []


def _ended(a: Analysis, child: Invoke, done: dict[str, Record | None]) -> list[Violation]:
    """How the child ended, against how its parents did (no tombstone: nothing judged)."""
    ends = _tombstones(a, child.task)
    if not ends:
        return []
    last = ends[-1]
    completed = tombstone_outcome(dict(last.fields)) == OUTCOME_COMPLETED
    failed = [p for p in child.parents if done[p] is None and _tombstones(a, p)]
    ghosts = [p for p in child.parents if p not in a.invokes]
    if completed and (failed or ghosts):
        if failed:
            how = tombstone_outcome(dict(_tombstones(a, failed[0])[-1].fields))
            what = f"its parent {failed[0]} ended {how} and never completed"
        else:
            what = f"its parent {ghosts[0]} was never enqueued"
        return [_violation(CHILD_NOT_FAILED, last, child, f"{what}, yet it completed")]
    if failed or ghosts:
        return []
    for start, sent, end in _lives(a, child):
        if _ran_in(a, child.task, start, end) or not _failed(end):
            continue
        if not all(_known_before(a, p, sent) for p in child.parents):
            continue
        stopped = [p for p in child.parents if _ended_unfinished(a, p, sent, end.t_queued)]
        if stopped:
            continue
        what = (
            "every parent completed, each durable before it was sent"
            + ("" if start is None or sent == child.t else " (again, by a retry)")
            + ", yet it ended unrun"
        )
        return [_violation(CHILD_NOT_RUN, end, child, what)]
    return []


def _lives(a: Analysis, child: Invoke) -> list[tuple[Record | None, int, Record]]:
    """Each life of `child` that ended: (the accepted task record that began it, when it was
    sent, its tombstone). The first life was sent with the invoke; a later one (a retry put
    the task back: a fresh record after a tombstone) when its owner decided that record."""
    out: list[tuple[Record | None, int, Record]] = []
    start: Record | None = None
    sent = child.t
    ended = False
    for r in a.task_records.get(child.task, ()):
        if not r.accepted or r.kind is not None:
            continue
        if r.tombstone:
            out.append((start, sent, r))
            start, ended = None, True
        elif start is None:
            start = r
            if ended:
                sent = r.t_queued
    return out


def _ran_in(a: Analysis, task: str, start: Record | None, end: Record) -> bool:
    """An attempt of `task` was handed to a handler within the life from `start` to `end`."""
    since = -1 if start is None else start.t_queued
    return any(x.task == task and since < x.t <= end.t_durable for x in a.executes)


def _failed(end: Record) -> bool:
    """A life that ended dead-lettered (a cancel is the app's doing, not the dependency's)."""
    return ended_state(tombstone_outcome(dict(end.fields))) == FOUND_DEAD


def _ended_unfinished(a: Analysis, parent: str, since: int, until: int) -> bool:
    """`parent`'s latest accepted word, at some time from `since` to `until`, was a tombstone
    that did not say it completed (dead-lettered or cancelled, and put back by a retry only
    later): a child judged then is failed through by the rule, whatever the parent did next."""
    words = sorted(
        (r for r in a.task_records.get(parent, ()) if r.accepted and r.kind is None),
        key=_durable,
    )
    for i, r in enumerate(words):
        if not r.tombstone or tombstone_outcome(dict(r.fields)) == OUTCOME_COMPLETED:
            continue
        later = words[i + 1].t_durable if i + 1 < len(words) else _NEVER
        if r.t_durable <= until and later > since:
            return True
    return False


def _known_before(a: Analysis, parent: str, t: int) -> bool:
    """`parent` completed, and a record of it was durable before `t` (when the child, or its
    life put back by a retry, was sent)."""
    if _completion(a, parent) is None:
        return False
    times = [r.t_durable for r in a.task_records.get(parent, ()) if r.accepted]
    times += [r.t_durable for r in a.inbox_by_task.get(parent, ())]
    return any(time < t for time in times)


def _violation(kind: str, last: Record, child: Invoke, what: str) -> Violation:
    return Violation(
        kind=kind,
        index=last.index,
        t=last.t,
        message=f"child {child.task} (parents {', '.join(child.parents)}): {what}",
    )
