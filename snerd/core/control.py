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
  agree (`PauseMark`, `newer`, `is_paused`).

A task id names one task in the queue, wherever it is routed: a cancel or retry that reaches
every shard finds it in the one that holds it, and every other shard answers `unknown`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from snerd.core import protocol as proto
from snerd.core.schema import (
    COMMAND_ACTION,
    COMMAND_STAMP,
    COMMAND_TASK,
    COMMAND_TYPE,
    DROP_AT,
    INBOX_ANSWERS,
    INBOX_FROM,
    INBOX_OFFSET,
    KIND_COMMAND,
    KIND_PAUSE,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PAUSE_PAUSED,
    PAUSE_STAMP,
    PAUSE_TYPE,
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
    "FOUND_UNKNOWN",
    "GONE",
    "LATER",
    "REQUEUEABLE",
    "Answer",
    "PauseMark",
    "Stamp",
    "answer_entry",
    "answer_of",
    "answers_commands",
    "command_answer",
    "command_fields",
    "command_of",
    "ended_state",
    "is_paused",
    "live_state",
    "mark_at",
    "newer",
    "pause_fields",
    "pause_of",
    "reply",
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


def reply(cmd: proto.Cancel | proto.Requeue, answer: Answer, shard: int | None,
          *, pending: bool = False) -> dict[str, Any]:
    """The message that answers `cmd` with `answer`."""
    build = proto.cancelled if isinstance(cmd, proto.Cancel) else proto.retried
    return build(cmd.task_id, answer.found, done=answer.done, shard=shard, pending=pending)


# -- the command record (inbox files only)


def command_fields(cmd: proto.Cancel | proto.Requeue | proto.Pause, stamp: Stamp) -> dict[str, Any]:
    """The inbox record that carries `cmd` to a shard's owner."""
    if isinstance(cmd, proto.Pause):
        return {
            SNERD_KIND: KIND_COMMAND,
            COMMAND_ACTION: "pause" if cmd.paused else "resume",
            COMMAND_TYPE: cmd.task_type,
            COMMAND_STAMP: [stamp[0], stamp[1]],
        }
    action = "cancel" if isinstance(cmd, proto.Cancel) else "retry"
    return {SNERD_KIND: KIND_COMMAND, COMMAND_ACTION: action, COMMAND_TASK: cmd.task_id}


def command_of(
    fields: Mapping[str, Any],
) -> tuple[proto.Cancel | proto.Requeue | proto.Pause, Stamp | None] | str:
    """The command a `command` record carries (and a pause's stamp), or why it carries none."""
    action = fields.get(COMMAND_ACTION)
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
    """An `answers` entry of an `inbox` mark: the command at byte `at` of the file."""
    return {DROP_AT: at, "found": answer.found, "done": answer.done}


def answer_of(entry: Any) -> Answer | None:
    """The answer an `answers` entry holds (None: not one this snerd can read)."""
    if not isinstance(entry, dict):
        return None
    found, done = entry.get("found"), entry.get("done")
    if not isinstance(found, str) or not isinstance(done, bool):
        return None
    return Answer(found, done)


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


def answers_commands(marks: Iterable[Any]) -> bool:
    """Marks a `ReadLogTail` picked (`LogRecord`s) hold an owner's answers to commands: the
    shell makes the log durable (fsync(2) through its own descriptor, which flushes every
    writer's data of the file) before it answers, so that a sender never tells its client
    "cancelled" on a tombstone a crash could still take back (the owner's fsync may not have
    returned yet: readers see a write(2) before it is durable; found by the simulator)."""
    return any(r.fields.get(INBOX_ANSWERS) for r in marks)


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
