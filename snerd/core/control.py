"""Job control: what cancel, retry and pause mean, for every daemon and every tool.

A command (`snerd.core.protocol`'s `Cancel`, `Requeue`, `Pause`) is decided by the owner of
the shard it acts on, in that shard's log: a cancel by the tombstone that ends the task, a
retry by the record that puts a finished task back, a pause by a `pause` record. A daemon
applies a command to the shards it owns at once and writes it, as a `command` record, into
its inbox of every other shard; each owner applies it when it ingests the file, in the
ingest's own append, and answers in the ingest's `inbox` mark (`answers`: one entry per
command, at its byte in the file). The sender reads the answers back as an enqueue with
dedupe reads its verdict (`snerd.core.node.verdicts`), and answers its SDK once every shard
has, or its wait ends (then `pending`: the command is durable and is applied when an owner
reads it).

This module holds the rules the node, the tools and the simulator share:

- the states a user knows a task by (`FOUND_*`), from the node's live state or a tombstone;
- which states a cancel ends and a retry puts back (`CANCELLABLE`, `REQUEUEABLE`);
- the `command` record and its parse, the `answers` entry and its parse;
- a pause: `pause` records per task type (or `None`, the whole queue), the latest stamp
  (`[wall µs, node id]`) winning, so shards that see a pause and a resume in either order
  agree (`PauseMark`, `newer`, `is_paused`);
- a sweep (`proto.Sweep`: a purge, or a retry of a type's dead letters): which ended tasks it
  takes (`swept`), decided by each owner over the ended tasks its shard holds when the
  command reaches it; a purge's `purge` record names the ids it forgets (`purge_fields`,
  `purged_ids`), and every reader of the log forgets them at that record (the fold), so
  compaction drops their tombstones.

A task id names one task in the queue, wherever it is routed: a cancel or retry that reaches
every shard finds it in the one that holds it, and every other shard answers `unknown`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from snerd.core import protocol as proto
from snerd.core.events import LogRecord
from snerd.core.schema import (
    COMMAND_ACTION,
    COMMAND_BEFORE,
    COMMAND_STAMP,
    COMMAND_TASK,
    COMMAND_TYPE,
    DROP_AT,
    INBOX_ANSWERS,
    INBOX_FROM,
    INBOX_OFFSET,
    KIND_COMMAND,
    KIND_PAUSE,
    KIND_PURGE,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PAUSE_PAUSED,
    PAUSE_STAMP,
    PAUSE_TYPE,
    PURGE_TASKS,
    RECORD_AT,
    SNERD_KIND,
)

__all__ = [
    "CANCELLABLE",
    "FOUND_BLOCKED",
    "FOUND_CANCELLED",
    "FOUND_DEAD",
    "FOUND_DELAYED",
    "FOUND_QUEUED",
    "FOUND_RETRYING",
    "FOUND_RUNNING",
    "FOUND_SUCCEEDED",
    "FOUND_SWEPT",
    "FOUND_UNKNOWN",
    "GONE",
    "LATER",
    "PURGE_RECORD_IDS",
    "REQUEUEABLE",
    "Answer",
    "PauseMark",
    "Stamp",
    "answer_entry",
    "answer_of",
    "command_answer",
    "command_fields",
    "command_of",
    "decided_in",
    "ended_state",
    "is_paused",
    "live_state",
    "mark_at",
    "newer",
    "pause_fields",
    "pause_of",
    "paused_where",
    "purge_fields",
    "purged_ids",
    "reply",
    "swept",
]

FOUND_QUEUED = "queued"
FOUND_DELAYED = "delayed"
FOUND_BLOCKED = "blocked"
FOUND_RUNNING = "running"
FOUND_RETRYING = "retrying"
FOUND_SUCCEEDED = "succeeded"
FOUND_DEAD = "dead_letter"
FOUND_CANCELLED = "cancelled"
FOUND_UNKNOWN = "unknown"

#: What a cancel ends: every live state.
CANCELLABLE = frozenset(
    {FOUND_QUEUED, FOUND_DELAYED, FOUND_BLOCKED, FOUND_RUNNING, FOUND_RETRYING}
)
#: What a retry puts back in the queue: a task that ended without succeeding.
REQUEUEABLE = frozenset({FOUND_DEAD, FOUND_CANCELLED})

#: A pause's order: the wall clock (µs) of the daemon that took the command, then its id.
Stamp: TypeAlias = tuple[int, str]


def live_state(*, waiting: bool, blocked: bool, running: bool, retry_count: int) -> str:
    """A live task's state as users know it: `running` (an attempt dispatched or running, or
    its end being written), `blocked` (on parents), `retrying` (waiting after a failure),
    `delayed` (not due yet), else `queued`."""
    if running:
        return FOUND_RUNNING
    if blocked:
        return FOUND_BLOCKED
    if waiting:
        return FOUND_RETRYING if retry_count > 0 else FOUND_DELAYED
    return FOUND_QUEUED


def ended_state(outcome: str) -> str:
    """A finished task's state from its tombstone's outcome (`shardlog.tombstone_outcome`)."""
    if outcome == OUTCOME_COMPLETED:
        return FOUND_SUCCEEDED
    if outcome == OUTCOME_CANCELLED:
        return FOUND_CANCELLED
    return FOUND_DEAD if outcome.startswith(OUTCOME_DEAD) else FOUND_SUCCEEDED


@dataclass(frozen=True, slots=True)
class Answer:
    """An owner's answer to a cancel or a retry: the state it found the task in, and whether
    the command changed it (cancelled it, put it back)."""

    found: str
    done: bool
    #: A sweep's: how many tasks of the shard it acted on.
    count: int = 0


def reply(cmd: proto.Cancel | proto.Requeue, answer: Answer, shard: int | None,
          *, pending: bool = False) -> dict[str, Any]:
    """The message that answers `cmd` with `answer`."""
    build = proto.cancelled if isinstance(cmd, proto.Cancel) else proto.retried
    return build(cmd.task_id, answer.found, done=answer.done, shard=shard, pending=pending)


# -- the command record (inbox files only)


def command_fields(
    cmd: proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep, stamp: Stamp
) -> dict[str, Any]:
    """The inbox record that carries `cmd` to a shard's owner."""
    if isinstance(cmd, proto.Sweep):
        return {
            SNERD_KIND: KIND_COMMAND,
            COMMAND_ACTION: _SWEEP_PURGE if cmd.purge else _SWEEP_RETRY,
            COMMAND_TYPE: cmd.task_type,
            COMMAND_BEFORE: cmd.before_us,
        }
    if isinstance(cmd, proto.Pause):
        return {
            SNERD_KIND: KIND_COMMAND,
            COMMAND_ACTION: "pause" if cmd.paused else "resume",
            COMMAND_TYPE: cmd.task_type,
            COMMAND_STAMP: [stamp[0], stamp[1]],
        }
    action = "cancel" if isinstance(cmd, proto.Cancel) else "retry"
    return {SNERD_KIND: KIND_COMMAND, COMMAND_ACTION: action, COMMAND_TASK: cmd.task_id}


#: The `action` of a sweep's command record.
_SWEEP_PURGE = "purge"
_SWEEP_RETRY = "retry_dead"


def command_of(
    fields: Mapping[str, Any],
) -> tuple[proto.Cancel | proto.Requeue | proto.Pause | proto.Sweep, Stamp | None] | str:
    """The command a `command` record carries (and a pause's stamp), or why it carries none."""
    action = fields.get(COMMAND_ACTION)
    if action in (_SWEEP_PURGE, _SWEEP_RETRY):
        task_type, before = fields.get(COMMAND_TYPE), fields.get(COMMAND_BEFORE)
        if task_type is not None and not isinstance(task_type, str):
            return f"a {action} command whose type is not a string"
        if before is not None and (not isinstance(before, int) or isinstance(before, bool)):
            return f"a {action} command whose `before` is not a time in µs"
        sweep = proto.Sweep(purge=action == _SWEEP_PURGE, task_type=task_type, before_us=before)
        return sweep, None
    if action in ("cancel", "retry"):
        task_id = fields.get(COMMAND_TASK)
        if not isinstance(task_id, str) or not task_id:
            return f"a {action} command without a task id"
        if action == "cancel":
            return proto.Cancel(task_id=task_id), None
        return proto.Requeue(task_id=task_id), None
    if action in ("pause", "resume"):
        task_type = fields.get(COMMAND_TYPE)
        stamp = _stamp(fields.get(COMMAND_STAMP))
        if (task_type is not None and not isinstance(task_type, str)) or stamp is None:
            return f"a {action} command without a type or a stamp"
        return proto.Pause(task_type=task_type, paused=action == "pause"), stamp
    return f"a command record with an unknown action {action!r}"


def answer_entry(at: int, answer: Answer) -> dict[str, Any]:
    """An `answers` entry of an `inbox` mark: the command at byte `at` of the file (a sweep's
    with its `count`)."""
    entry: dict[str, Any] = {DROP_AT: at, "found": answer.found, "done": answer.done}
    if answer.count:
        entry["count"] = answer.count
    return entry


def answer_of(entry: Any) -> Answer | None:
    """The answer an `answers` entry holds (None: not one this snerd can read)."""
    if not isinstance(entry, dict):
        return None
    found, done, count = entry.get("found"), entry.get("done"), entry.get("count", 0)
    if not isinstance(found, str) or not isinstance(done, bool):
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    return Answer(found, done, count)


# -- finding an owner's answer in its log


#: `mark_at`: no `inbox` record says yet; only one of a later range is left (compacted away).
LATER = "later"
GONE = "gone"


def mark_at(marks: Iterable[Mapping[str, Any]], at: int) -> Mapping[str, Any] | str:
    """The `inbox` record of one writer's file (in log order) whose range (`from`, `offset`)
    holds its record at byte `at`, `GONE` or `LATER`. (The verdict of an enqueue with dedupe
    is found the same way.)"""
    for mark in marks:
        start, end = mark.get(INBOX_FROM), mark.get(INBOX_OFFSET)
        if not isinstance(start, int) or not isinstance(end, int):
            continue
        if start > at:
            return GONE
        if at >= end:
            continue
        return mark
    return LATER


def decided_in(marks: Iterable[LogRecord]) -> bool:
    """Marks a reader of a log found hold an owner's answer to a command: the reader fsyncs
    the log before it answers, so that what it says cannot be lost with the owner's unsynced
    bytes (the queue scan does the same for tombstones, `snerd.core.watch.ends_a_task`)."""
    return any(m.fields.get(INBOX_ANSWERS) for m in marks)


def command_answer(mark: Mapping[str, Any] | str, at: int) -> Answer | None:
    """The owner's answer to the command at byte `at` of the file `mark` covers; a command it
    skipped (a record it could not read) found nothing; None: undecided (`GONE`)."""
    if not isinstance(mark, Mapping):
        return None
    for entry in mark.get(INBOX_ANSWERS) or ():
        if isinstance(entry, dict) and entry.get(DROP_AT) == at:
            answer = answer_of(entry)
            if answer is not None:
                return answer
    return Answer(FOUND_UNKNOWN, False)


# -- sweeps: purges, and retries of a type's dead letters

#: At most this many ids in one `purge` record (a bigger purge writes several).
PURGE_RECORD_IDS = 1000
#: The `found` of a sweep's answer.
FOUND_SWEPT = "swept"


def swept(cmd: proto.Sweep, outcome: str, task_type: str | None, finished_us: int) -> bool:
    """Whether `cmd` takes an ended task: its tombstone's `outcome`, type and finish time.
    A purge takes dead letters and cancelled tasks (what waits for an operator; completed
    ones leave with the result retention); a retry takes dead letters only (a cancel was
    meant). Only those of `cmd.task_type` (None: any) that finished before `cmd.before_us`
    (None: whenever)."""
    if ended_state(outcome) not in (REQUEUEABLE if cmd.purge else (FOUND_DEAD,)):
        return False
    if cmd.task_type is not None and task_type != cmd.task_type:
        return False
    return cmd.before_us is None or finished_us < cmd.before_us


def purge_fields(task_ids: list[str], cmd: proto.Sweep, at: str) -> dict[str, Any]:
    """A `purge` record (`at`: RFC 3339, when): every reader of the log forgets the ended
    tasks it names (those whose latest record before it is a dead-letter or cancelled
    tombstone), and compaction drops their tombstones. The command's type and `before` go
    with it, for the task's story and for a checker to hold the ids to them."""
    return {
        SNERD_KIND: KIND_PURGE,
        PURGE_TASKS: task_ids,
        COMMAND_TYPE: cmd.task_type,
        COMMAND_BEFORE: cmd.before_us,
        RECORD_AT: at,
    }


def purged_ids(fields: Mapping[str, Any]) -> list[str]:
    """The ids a `purge` record names (none: a record this snerd cannot read)."""
    ids = fields.get(PURGE_TASKS)
    if not isinstance(ids, list):
        return []
    return [i for i in ids if isinstance(i, str)]


# -- pauses


@dataclass(frozen=True, slots=True)
class PauseMark:
    """A task type's pause state in one shard: the latest command's."""

    paused: bool
    stamp: Stamp


def newer(mark: PauseMark | None, stamp: Stamp) -> bool:
    """A command stamped `stamp` replaces `mark` (the later stamp wins; a tie, the same
    command seen twice, changes nothing)."""
    return mark is None or stamp > mark.stamp


def is_paused(marks: Mapping[str | None, PauseMark], task_type: str) -> bool:
    """Nothing of `task_type` may start: it, or the whole queue (`None`), is paused."""
    mark = marks.get(task_type)
    if mark is not None and mark.paused:
        return True
    whole = marks.get(None)
    return whole is not None and whole.paused


def pause_fields(task_type: str | None, mark: PauseMark) -> dict[str, Any]:
    """The `pause` record of a shard's log (kept by compaction: the latest per type)."""
    return {
        SNERD_KIND: KIND_PAUSE,
        PAUSE_TYPE: task_type,
        PAUSE_PAUSED: mark.paused,
        PAUSE_STAMP: [mark.stamp[0], mark.stamp[1]],
    }


def pause_of(fields: Mapping[str, Any]) -> tuple[str | None, PauseMark] | None:
    """The type and state a `pause` record holds (None: a record this snerd cannot read)."""
    task_type = fields.get(PAUSE_TYPE)
    paused = fields.get(PAUSE_PAUSED)
    stamp = _stamp(fields.get(PAUSE_STAMP))
    if (task_type is not None and not isinstance(task_type, str)) or not isinstance(paused, bool):
        return None
    if stamp is None:
        return None
    return task_type, PauseMark(paused, stamp)


def paused_where(
    shards: Mapping[int, Mapping[str | None, PauseMark]],
) -> dict[str | None, list[int]]:
    """Each task type (None: the whole queue) paused on some shard, and the shards where it
    is, by each shard's own latest mark (for the tools: a type paused on some shards and not
    others is a pause or resume still pending on those others)."""
    where: dict[str | None, list[int]] = {}
    for shard in sorted(shards):
        for task_type, mark in shards[shard].items():
            if mark.paused:
                where.setdefault(task_type, []).append(shard)
    return dict(sorted(where.items(), key=lambda kv: (kv[0] is not None, kv[0] or "")))


def _stamp(value: Any) -> Stamp | None:
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
        and isinstance(value[1], str)
    ):
        return value[0], value[1]
    return None
