"""Invariants 13-16: job control. An acked cancel holds, an acked pause holds, a retry runs, a
purge forgets only what it may.

Judged on `command` entries (an invoke, then its "ok" answer carrying the daemon's `reply`,
matched first in, first out per node, action and target), with executes, dispatch and task
records, and process pauses. What the design promises, and so all that is judged
(`snerd.core.control`, `snerd.core.node.control`):

13. **Cancel** (`CANCELLED_RAN`, `CANCEL_NOT_KEPT`). A cancel answered `"cancelled": true` at
    time a (sent at s) ended the task by a tombstone durable before the answer. Until a
    `retry` of the task is sent (one in flight at s, or answered `pending`, voids the
    judgement: it may be applied after the cancel): no execute of the task whose dispatch record was handed to its writer
    after a; an accepted `cancelled` tombstone of it is durable in (s, a], and no accepted
    tombstone of another outcome follows a. Attempts already running at a
    (executed, no result yet) are allowed to finish their handler and are counted
    (`Metrics.cancels_running`); the node drops their results. `"cancelled": true` also names a
    cancellable state (`found`). An `unknown` answer is not judged: a cancel sent through an
    inbox may reach the owner before the enqueue it follows does (it sits in another daemon's
    inbox), which is legal.
14. **Pause** (`PAUSED_RAN`). A pause of a type (or of the queue) answered `"paused": true`
    with `"pending": []` at a (sent at s) holds on every shard: no task of that type (of any
    type) is dispatched by a record handed to its writer after a, until the next `resume` of
    the same key (a type resume does not lift a queue pause, nor the other way) is sent.
    Marks are latest-wins on `[wall µs, node]` stamps, so a resume sent *before* the pause
    can win when its sender's wall clock was ahead: the pause is judged only when every
    earlier resume of its key was answered more than the clocks' largest difference
    (`2 offset_max + 2 drift_max * s`, from the `control` entry) before s, and never when
    clocks were stepped. A node stopped (SIGSTOP) at some time between s and a may carry out a
    dispatch decided before the pause reached it: its executes are not judged.
15. **Retry** (`RETRY_NOT_RUN`). A retry answered `"retried": true` (sent at s) put the task
    back: it has an execute after s by the end of the history, unless a cancel of it may act
    after s (sent after s, answered after s or never, or answered pending). `"retried": true` names a retryable state (dead, cancelled).
    A retry of a type's dead letters (`retry_type`, answered `requeued` with `"pending": []`,
    sent at s, answered at a) puts back every task of that type (of any, for the queue)
    whose latest accepted record at s was a durable dead-letter tombstone, its death told to
    an SDK (`dead_letter`) before s, still in its shard's history (fewer than `history_limit` other tasks, from the `control` entry, ended
    in the shard after it by a; no accepted `purge` record after it, decided by a, named it:
    a purge answered with the shard `pending` is applied whenever its owner takes it in): an
    accepted live record of it is handed to its writer after s. A task some other command could have changed meanwhile (a cancel or retry of it, a
    sweep of its type, in flight between its tombstone and a) is not judged, nor one with
    `auto_dedupe` (it is put back only while no live task holds its fingerprint).
16. **Purge** (`PURGED_WRONG`). Every accepted `purge` record names only tasks whose latest
    accepted record before it in its shard is a dead-letter or cancelled tombstone of the
    record's `type` (any, when null) that finished (`deletedAt`) before its `before` (not
    judged when clocks were stepped: a node's finish time and its tombstone's may then
    disagree); and no accepted record of a purged task follows it in that shard (nothing puts
    a forgotten task back, nothing runs it).

The same holds for a history recorded from real processes: nothing here reads the simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.check.history import Analysis, Record
from sim.check.report import (
    CANCEL_NOT_KEPT,
    CANCELLED_RAN,
    PAUSED_RAN,
    PURGED_WRONG,
    RETRY_NOT_RUN,
    Violation,
    at,
)
from snerd.core.control import CANCELLABLE, FOUND_DEAD, REQUEUEABLE, ended_state, purged_ids
from snerd.core.node.parents import PARENT_ERRORS
from snerd.core.schema import (
    AUTO_DEDUPE,
    COMMAND_BEFORE,
    COMMAND_TYPE,
    DISPATCH_ATTEMPT,
    KIND_DISPATCH,
    KIND_PURGE,
    LAST_ERROR_OBJ,
    OUTCOME_CANCELLED,
    TASK_TYPE,
    TRIGGER_AFTER_IDS,
)
from snerd.core.shardlog import finished_at_us, tombstone_outcome

__all__ = ["Command", "commands", "judge_control"]

_NEVER = 1 << 62


@dataclass(slots=True)
class Command:
    """A command invoke, with its answer once one came."""

    index: int
    t: int
    node: str
    action: str
    target: str | None
    reply: Mapping[str, Any] | None = None
    t_answer: int = _NEVER
    #: A purge's `before`, as sent (RFC 3339).
    before: str | None = None


def _in_force_after(other: Command, t: int) -> bool:
    """`other` may still act after `t`: sent after it, answered after it (or never), or
    answered pending (durable in the inboxes of shards that had not answered, it acts when
    their next owner reads them: seed 68 of the batch worlds, a cancel sent before a retry
    whose sender was paused, applied to the retried task)."""
    return (
        other.t > t
        or other.t_answer > t
        or (other.reply is not None and other.reply.get("pending") is True)
    )


def commands(a: Analysis) -> list[Command]:
    """The command invokes of `a`, in history order, each with its answer if any."""
    out: list[Command] = []
    open_: dict[tuple[str, str, str | None], deque[Command]] = {}
    for i, e in a.control_entries:
        if e["kind"] != "command":
            continue
        action = e["action"]
        target = e.get("task") if action in ("cancel", "retry") else e.get("type")
        key = (e["node"], action, target)
        if e["phase"] == "invoke":
            cmd = Command(i, e["t"], e["node"], action, target, before=e.get("before"))
            out.append(cmd)
            open_.setdefault(key, deque()).append(cmd)
        elif open_.get(key):
            cmd = open_[key].popleft()
            cmd.t_answer = e["t"]
            if e["phase"] == "ok":
                cmd.reply = e.get("reply")
    return out


def _stopped(a: Analysis) -> dict[str, list[tuple[int, int]]]:
    """Per node: the (start, end) of each process pause (SIGSTOP)."""
    out: dict[str, list[tuple[int, int]]] = {}
    since: dict[str, int] = {}
    for _i, e in a.control_entries:
        kind, node = e["kind"], e.get("node")
        if not isinstance(node, str):
            continue
        if kind == "pause":
            since[node] = e["t"]
        elif kind in ("resume", "crash") and node in since:
            out.setdefault(node, []).append((since.pop(node), e["t"]))
    for node, start in since.items():
        out.setdefault(node, []).append((start, _NEVER))
    return out


def _history_limit(a: Analysis) -> int:
    """The finished tasks a shard's history keeps (the `control` entry; 10,000 by default)."""
    for _i, e in a.control_entries:
        if e["kind"] == "control" and isinstance(e.get("history_limit"), int):
            return int(e["history_limit"])
    return 10_000


def _skew(a: Analysis) -> tuple[int, int] | None:
    """(offset_max_us, drift_max_ppm) of the `control` entry; None: clocks were stepped
    (or the bound is not known)."""
    for _i, e in a.control_entries:
        if e["kind"] == "control":
            return None if e.get("steps") else (e["offset_max_us"], e["drift_max_ppm"])
    return None


class _Judge:
    def __init__(self, a: Analysis) -> None:
        self.a = a
        self.cmds = commands(a)
        #: Per task: when its SDK was told it was dead-lettered (`dead_letter`).
        self.dead_at: dict[str, list[int]] = {}
        for _i, e in a.control_entries:
            if e["kind"] == "dead_letter" and isinstance(e.get("task"), str):
                self.dead_at.setdefault(e["task"], []).append(e["t"])
        self.stopped = _stopped(a)
        self.out: list[Violation] = []
        self.running = 0
        self._purges: dict[int, list[Record]] | None = None
        self.types: dict[str, str] = {}
        for r in a.records:
            value = r.fields.get(TASK_TYPE)
            if r.task_id is not None and isinstance(value, str):
                self.types.setdefault(r.task_id, value)

    def flag(self, kind: str, cmd: Command, message: str) -> None:
        self.out.append(Violation(kind=kind, message=message, index=cmd.index, t=cmd.t))

    def was_stopped(self, node: str, s: int, t: int) -> bool:
        return any(start <= t and end >= s for start, end in self.stopped.get(node, ()))

    def decided_after(self, task: str, attempt: int, shard: int, t_exec: int, t: int) -> bool:
        """The dispatch record behind an execute was handed to its writer after `t`."""
        for r in self.a.dispatches.get(task, ()):
            if (
                r.shard == shard
                and r.accepted
                and r.fields.get(DISPATCH_ATTEMPT) == attempt
                and r.t_durable <= t_exec
                and r.t_queued > t
            ):
                return True
        return False

    def late_executes(self, cmd: Command, task_ok: Any, end: int) -> list[str]:
        out = []
        for x in self.a.executes:
            if not (cmd.t_answer < x.t < end) or not task_ok(x.task):
                continue
            if self.was_stopped(x.node, cmd.t, cmd.t_answer):
                continue
            if self.decided_after(x.task, x.attempt, x.shard, x.t, cmd.t_answer):
                out.append(f"{x.task} attempt {x.attempt} on {x.node} at {at(x.t)}")
        return out

    # -- 13

    def cancel(self, cmd: Command) -> None:
        reply, task = cmd.reply, cmd.target
        if reply is None or reply.get("cancelled") is not True or task is None:
            return
        if reply.get("found") not in CANCELLABLE:
            self.flag(CANCEL_NOT_KEPT, cmd, f"cancel of {task} acked but found {reply.get('found')!r}")
        end = _NEVER
        for r in self.cmds:
            if r.action == "retry" and r.target == task:
                if r.t > cmd.t:
                    end = min(end, r.t)
                elif r.t_answer > cmd.t or r.reply is None or r.reply.get("pending"):
                    return  # a retry in flight at the cancel (or left pending in the
                    # inboxes, applied when an owner reads it): it may apply after it
        late = self.late_executes(cmd, lambda t: t == task, end)
        if late:
            self.flag(
                CANCELLED_RAN, cmd,
                f"{task} cancelled (acked {at(cmd.t_answer)} by {cmd.node}) was dispatched "
                f"after: {', '.join(late[:3])}",
            )
        self.cancel_tombstones(cmd, task, end)
        self.count_running(cmd, task)

    def cancel_tombstones(self, cmd: Command, task: str, end: int) -> None:
        ends = [r for r in self.a.task_records.get(task, ()) if r.accepted and r.tombstone]
        by_ack = [r for r in ends if cmd.t < r.t_durable <= cmd.t_answer]
        if not any(tombstone_outcome(dict(r.fields)) == OUTCOME_CANCELLED for r in by_ack):
            self.flag(
                CANCEL_NOT_KEPT, cmd,
                f"{task} acked cancelled at {at(cmd.t_answer)} without a tombstone durable by then",
            )
            return
        for r in ends:
            outcome = tombstone_outcome(dict(r.fields))
            if cmd.t_answer < r.t_durable < end and outcome != OUTCOME_CANCELLED:
                self.flag(
                    CANCEL_NOT_KEPT, cmd,
                    f"{task} acked cancelled, then ended {outcome!r} at {at(r.t_durable)}",
                )
                return

    def count_running(self, cmd: Command, task: str) -> None:
        started = [x for x in self.a.executes if x.task == task and x.t <= cmd.t_answer]
        if not started:
            return
        last = started[-1]
        for _i, e in self.a.control_entries:
            if (
                e["kind"] == "handler_done" and e.get("task") == task
                and e.get("attempt") == last.attempt and last.t <= e["t"] <= cmd.t_answer
            ):
                return
        self.running += 1

    # -- 14

    def pause(self, cmd: Command, skew: tuple[int, int] | None) -> None:
        reply, key = cmd.reply, cmd.target
        if reply is None or reply.get("paused") is not True or reply.get("pending") != []:
            return
        end = _NEVER
        for r in self.cmds:
            if r.action != "resume" or r.target != key:
                continue
            if r.t > cmd.t:
                end = min(end, r.t)
                continue
            if skew is None:
                return  # stepped clocks: any earlier resume may carry a later stamp
            bound = 2 * skew[0] + 2 * skew[1] * cmd.t // 1_000_000 + 1_000
            if r.t_answer + bound >= cmd.t:
                return
        if end <= cmd.t_answer:
            return
        late = self.late_executes(
            cmd, lambda t: key is None or self.types.get(t) == key, end
        )
        if late:
            what = "the queue" if key is None else f"type {key!r}"
            self.flag(
                PAUSED_RAN, cmd,
                f"{what} paused on every shard (acked {at(cmd.t_answer)} by {cmd.node}), yet "
                f"dispatched before a resume was sent: {', '.join(late[:3])}",
            )

    # -- 15

    def retry(self, cmd: Command) -> None:
        reply, task = cmd.reply, cmd.target
        if reply is None or reply.get("retried") is not True or task is None:
            return
        if reply.get("found") not in REQUEUEABLE:
            self.flag(RETRY_NOT_RUN, cmd, f"retry of {task} acked but found {reply.get('found')!r}")
        if any(r.action == "cancel" and r.target == task and _in_force_after(r, cmd.t)
               for r in self.cmds):
            return
        if any(x.task == task and x.t > cmd.t for x in self.a.executes):
            return
        if self.failed_through(task, cmd.t):
            return  # put back, then failed by its parents: invariant 9 judges that end
        self.flag(
            RETRY_NOT_RUN, cmd,
            f"{task} acked retried at {at(cmd.t_answer)} by {cmd.node}, never executed again",
        )

    def failed_through(self, task: str, since: int) -> bool:
        """`task` was put back after `since` (an accepted live record) and that life ended
        dead-lettered by its parents (`trigger_after_ids`: one dead-lettered or cancelled,
        or nowhere to be found) before any attempt: a child is held, using no attempt,
        until its parents completed (docs/protocol.md, "Dependencies"). Whether that end
        was right is invariant 9's to judge (`sim.check.deps`, each life of a child)."""
        back = False
        for r in self.a.task_records.get(task, ()):
            if not r.accepted or r.kind is not None or r.t_queued <= since:
                continue
            if not r.tombstone:
                back = True
                continue
            if not back:
                continue  # the end of the life before it
            error = r.fields.get(LAST_ERROR_OBJ)
            return (
                bool(r.fields.get(TRIGGER_AFTER_IDS))
                and ended_state(tombstone_outcome(dict(r.fields))) == FOUND_DEAD
                and isinstance(error, str)
                and error.startswith(PARENT_ERRORS)
            )
        return False


    def retry_type(self, cmd: Command) -> None:
        reply, key = cmd.reply, cmd.target
        if reply is None or reply.get("action") != "requeued" or reply.get("pending") != []:
            return
        limit = _history_limit(self.a)
        for task, records in self.a.task_records.items():
            if key is not None and self.types.get(task) != key:
                continue
            before = [r for r in records if r.accepted and r.t_durable < cmd.t]
            if not before or not before[-1].tombstone:
                continue
            tomb = before[-1]
            if ended_state(tombstone_outcome(dict(tomb.fields))) != FOUND_DEAD:
                continue
            if tomb.fields.get(AUTO_DEDUPE) is True:
                continue  # (put back only while no live task holds its fingerprint)
            if self.touched(task, tomb.t_durable, cmd) or self.pushed_out(tomb, cmd, limit):
                continue
            if not any(tomb.t_queued <= t < cmd.t for t in self.dead_at.get(task, ())):
                # Its owner had not told of its death when the retry was sent: its tombstone
                # was in the file (the disk full, or the fsync slow) but its append not yet
                # committed, so the owner did not hold it dead (jepsen-lite's disk-full run).
                continue
            if self.purged_by(tomb, cmd.t_answer):
                continue
            if not any(
                r.accepted and not r.tombstone and r.t_queued > cmd.t
                and r.t_queued <= cmd.t_answer
                for r in records
            ):
                self.flag(
                    RETRY_NOT_RUN, cmd,
                    f"dead letters of {'the queue' if key is None else repr(key)} acked put "
                    f"back at {at(cmd.t_answer)} by {cmd.node} ({reply.get('count')}), but "
                    f"{task} (dead since {at(tomb.t_durable)}) was not",
                )
                return

    def touched(self, task: str, since: int, cmd: Command) -> bool:
        """Another command that may change `task` was in flight between `since` and `cmd`'s
        answer."""
        kind = self.types.get(task)
        for other in self.cmds:
            if other is cmd or other.t > cmd.t_answer or other.t_answer < since:
                continue
            if other.action in ("cancel", "retry") and other.target == task:
                return True
            if other.action in ("purge", "retry_type") and other.target in (None, kind):
                return True
        return False

    def purged_by(self, tomb: Record, until: int) -> bool:
        """An accepted `purge` record after the tombstone in its shard, decided by `until`,
        forgot the task: a retry that reached the owner after it finds nothing to put back
        (the purge may come from a sweep answered long before, its shard `pending`, and
        applied when an owner took it in)."""
        return any(
            r.accepted and r.index > tomb.index and r.t_queued <= until
            and tomb.task_id in purged_ids(r.fields)
            for r in self.purges_of(tomb.shard)
        )

    def purges_of(self, shard: int) -> list[Record]:
        """The `purge` records of `shard`, in file order."""
        if self._purges is None:
            self._purges = {}
            for r in self.a.records:
                if r.kind == KIND_PURGE:
                    self._purges.setdefault(r.shard, []).append(r)
        return self._purges.get(shard, [])

    def pushed_out(self, tomb: Record, cmd: Command, limit: int) -> bool:
        """`limit` other tasks ended in the tombstone's shard after it, by `cmd`'s answer:
        it may have left the shard's history."""
        later = {
            r.task_id for r in self.a.records
            if r.shard == tomb.shard and r.accepted and r.tombstone and r.index > tomb.index
            and r.t_durable <= cmd.t_answer and r.task_id != tomb.task_id
        }
        return len(later) >= limit

    # -- 16

    def purges(self) -> None:
        stepped = any(
            e["kind"] == "control" and e.get("steps") for _i, e in self.a.control_entries
        )
        latest: dict[tuple[int, str], Record] = {}
        purged: dict[tuple[int, str], Record] = {}
        for r in self.a.records:
            if not r.accepted:
                continue
            if r.kind == KIND_PURGE:
                self.purge_record(r, latest, purged, stepped)
                continue
            if r.task_id is None or r.kind not in (None, KIND_DISPATCH):
                continue
            key = (r.shard, r.task_id)
            gone = purged.pop(key, None)
            if gone is not None:
                self.out.append(Violation(
                    kind=PURGED_WRONG, index=r.index, t=r.t,
                    message=f"{r.task_id} purged from shard {r.shard} at {at(gone.t)} by "
                    f"{gone.node}, yet {r.node} wrote a record of it after",
                ))
            if r.kind is None:
                latest[key] = r

    def purge_record(
        self, r: Record, latest: dict[tuple[int, str], Record],
        purged: dict[tuple[int, str], Record], stepped: bool,
    ) -> None:
        task_type, before = r.fields.get(COMMAND_TYPE), r.fields.get(COMMAND_BEFORE)
        for task in purged_ids(r.fields):
            last = latest.get((r.shard, task))
            why = None
            if last is None or not last.tombstone:
                why = "it was not ended"
            else:
                state = ended_state(tombstone_outcome(dict(last.fields)))
                finished = finished_at_us(dict(last.fields), -1)
                if state not in REQUEUEABLE:
                    why = f"it ended {state}"
                elif isinstance(task_type, str) and self.types.get(task) != task_type:
                    why = f"it is of type {self.types.get(task)!r}, not {task_type!r}"
                elif isinstance(before, int) and not stepped and finished >= before:
                    why = f"it finished at {finished} µs, not before {before}"
            if why is not None:
                self.out.append(Violation(
                    kind=PURGED_WRONG, index=r.index, t=r.t,
                    message=f"{r.node} purged {task} from shard {r.shard} at {at(r.t)}, but {why}",
                ))
                continue
            purged[(r.shard, task)] = r


def judge_control(a: Analysis) -> tuple[list[Violation], int]:
    """Invariants 13-16 on `a`, and the cancels acked while an attempt ran."""
    if not any(e["kind"] == "command" for _i, e in a.control_entries):
        return [], 0
    judge = _Judge(a)
    skew = _skew(a)
    for cmd in judge.cmds:
        if cmd.action == "cancel":
            judge.cancel(cmd)
        elif cmd.action == "retry":
            judge.retry(cmd)
        elif cmd.action == "retry_type":
            judge.retry_type(cmd)
        elif cmd.action == "pause":
            judge.pause(cmd, skew)
    judge.purges()
    return judge.out, judge.running
