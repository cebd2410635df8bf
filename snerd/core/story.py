"""A task's story: every record of one task's life the queue's files hold, in order, and what
they say the task is now.

This module owns two readings of the records of one task id, for `snerdmq status`, the
dashboard's task page and the daemon's `get` answer:

- `story(found)`: one `Step` per record — enqueued, written to an inbox, taken in from it,
  dropped at ingest, dispatched (node, epoch, attempt), failed with a retry scheduled, cron
  re-armed, completed, dead-lettered, cancelled, replayed, an operator's command — plus the
  shard's claims between its first and last record (a takeover in the middle of a task's life
  is most often why it ran twice). Records fencing ignores are marked `stale`, never hidden:
  a stale dispatch is an attempt a fenced daemon started after it lost the shard.
- `details(task_id, found, now_us)`: the task's state and facts as one JSON object (the keys
  are listed at `details`; keep them stable: `get` sends them as they are).

The rules are the fold's and the status's, not this module's: fencing and the live, finished
and in-flight sets come from `snerd.core.shardlog.ShardFold` fed the task's log records (with
the claims that fence them), and a live task's state from `snerd.core.status.live_state`.
What is added here is only the naming of each record by what it did to the task, which needs
the record before it (a task record after a tombstone is a replay; one whose `retryCount`
grew is a failure).

`pick_story` is the reader's filter: the lines of a buffer that may be about the id, decoded
(`snerd.core.records.scan`, never stopping at a bad line); every shell that reads for a
story calls it on the bytes it read.

Pure: no files, no clocks (`now_us` is the caller's). Every value is read from disk and may be
anything: nothing here raises on a record's content.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from snerd.core.control import purged_ids
from snerd.core.events import LogRecord
from snerd.core.fields import whole_or_none
from snerd.core.records import scan
from snerd.core.schema import (
    CLAIM_EPOCH,
    CLAIM_NODE,
    COMMAND_ACTION,
    COMMAND_TASK,
    CRON_EXPRESSION,
    DELETED_AT,
    DISPATCH_ATTEMPT,
    DISPATCH_TASK,
    DROP_AT,
    DROP_ERROR,
    DROP_OF,
    DROP_TASK,
    EXECUTE_AT,
    INBOX_ANSWERS,
    INBOX_DROPPED,
    INBOX_NODE,
    KIND_CLAIM,
    KIND_COMMAND,
    KIND_DISPATCH,
    KIND_INBOX,
    KIND_PURGE,
    LAST_ERROR_OBJ,
    MAX_RETRIES,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    RECORD_AT,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_OUTCOME,
    SNERD_REPLAYED_AT,
    SNERD_RESULT,
    SNERD_VIA,
    TASK_ID,
    TASK_TYPE,
    TRIGGER_AFTER_IDS,
)
from snerd.core.shardlog import ShardFold, tombstone_outcome
from snerd.core.status import live_state
from snerd.core.timefmt import format_rfc3339, parse_rfc3339_or_none

__all__ = [
    "DETAIL_KEYS",
    "LOG",
    "STATES",
    "STEP_KINDS",
    "Found",
    "Step",
    "details",
    "pick_story",
    "story",
]

#: `Found.source` of a record read from a shard's log (any other source names an inbox file).
LOG = "log"

#: What a step did to the task (`Step.kind`).
STEP_KINDS = (
    "enqueued",  # its first record in the shard's log (the owner took the enqueue)
    "inbox",  # written to the shard's inbox by a daemon that does not own the shard
    "taken_in",  # the owner copied it from an inbox into its log (`snerdVia`); `at`: its enqueue
    "dropped",  # the owner did not take an inbox copy in (a duplicate, or refused)
    "dispatched",  # an attempt started (node, epoch, attempt number)
    "retry_scheduled",  # an attempt failed (its error) and the next is due at `due`
    "cron_rearmed",  # a cron task's run ended; due again at its next tick
    "completed",  # it succeeded (its tombstone; the result with it, when there is one)
    "dead_lettered",  # it used every attempt, or could not run
    "cancelled",  # it was cancelled before it ended
    "purged",  # an operator's purge forgot it (a dead letter or cancelled task)
    "replayed",  # a dead letter put back (`snerdmq replay`, `retry`)
    "reenqueued",  # a new task under the id of one that ended
    "updated",  # another record of the live task
    "command",  # an operator's command for it, written to the shard's inbox
    "answered",  # the owner's answer to a command for it
    "claimed",  # the shard was claimed (taken over) while the task lived in it
)

#: The states `details` reports, as users of task queues know them.
STATES = (
    "queued",  # due, waiting for a worker (or a rate window); or in an inbox, not taken in yet
    "delayed",  # its first attempt is not due yet
    "blocked",  # due, and it names parents (`trigger_after_ids`) it runs after
    "running",  # dispatched and unresolved (running, or to be re-run after a crash)
    "retrying",  # failed before; waiting for its next attempt
    "succeeded",
    "dead_letter",
    "cancelled",
    "dropped",  # an inbox copy its shard's owner did not take in (`last_error` says why)
    "purged",  # it ended (dead letter, cancelled) and a purge forgot it: nothing runs it again
    "unknown",  # no file holds a task record of the id
)

#: The keys of `details`, always all present.
DETAIL_KEYS = (
    "task_id", "found", "state", "task_type", "shard", "attempts", "runs", "max_retries",
    "last_error", "enqueued_at", "started_at", "finished_at", "outcome", "result",
    "has_result", "cron", "stale_records", "waiting_in_inbox", "progress",
)

_LIVE_TO_STATE = {
    "in_flight": "running",
    "retrying": "retrying",
    "delayed": "delayed",
    "waiting": "queued",
}


@dataclass(frozen=True, slots=True)
class Found:
    """One record of the task as a reader found it: its shard, its file (`LOG`, or the inbox
    writer's name), its byte offset there and its fields."""

    shard: int
    source: str
    offset: int
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step of a task's life (`story`). Times are RFC 3339 (None: the record holds none)."""

    kind: str
    shard: int
    source: str
    offset: int
    #: When it happened, as far as the record says.
    at: str | None = None
    #: When the task may run next after it (an enqueue, a retry, a re-arm, a replay).
    due: str | None = None
    node: str | None = None
    epoch: int | None = None
    attempt: int | None = None
    error: str | None = None
    #: Fenced: why its shard's replay ignores it (None: it counts).
    stale: str | None = None
    #: One line for people.
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------
# Reading: the lines of one id
# ------------------------------------------------------------------------------------------

_CLAIM_MARK = b'"' + SNERD_KIND.encode() + b'":"' + KIND_CLAIM.encode() + b'"'


def pick_story(
    data: bytes | bytearray, base_offset: int, task_id: str
) -> tuple[list[LogRecord], int]:
    """The records of `data` (lines of a queue file, `data[0]` at `base_offset`) a story of
    `task_id` needs: its task records, its dispatch records, commands and inbox marks that name
    it, and every claim record (they fence the others). Returns them in file order and how
    many bytes were consumed (up to the last newline).

    Only lines holding the id as JSON writes it, a claim, or an escape (`\\u`, which could
    spell the id another way) are decoded; a damaged one is skipped (`fsck` reports it)."""
    end = data.rfind(b"\n") + 1
    try:
        needles = (orjson.dumps(task_id), _CLAIM_MARK, b"\\u")
    except TypeError:  # not text any record can hold (a lone surrogate)
        return [], end
    starts: set[int] = set()
    for needle in needles:
        at = data.find(needle, 0, end)
        while at >= 0:
            start = data.rfind(b"\n", 0, at) + 1
            starts.add(start)
            nl = data.find(b"\n", at, end)
            at = data.find(needle, nl + 1, end)
    keep = bytearray()
    offsets: dict[int, int] = {}
    for start in sorted(starts):
        nl = data.find(b"\n", start, end)
        offsets[len(keep)] = base_offset + start
        keep += data[start : nl + 1]
    records = [
        LogRecord(offset=offsets[r.offset], length=r.length, fields=r.fields)
        for r in scan(keep).records
        if _names(r.fields, task_id)
    ]
    return records, end


def _names(fields: dict[str, Any], task_id: str) -> bool:
    """Is this record one of the task's story (or a claim)?"""
    kind = fields.get(SNERD_KIND)
    if kind is None:
        return fields.get(TASK_ID) == task_id
    if kind == KIND_CLAIM:
        return True
    if kind == KIND_DISPATCH:
        return fields.get(DISPATCH_TASK) == task_id
    if kind == KIND_COMMAND:
        return fields.get(COMMAND_TASK) == task_id
    if kind == KIND_PURGE:
        return task_id in purged_ids(fields)
    if kind == KIND_INBOX:
        return any(_entries(fields, key, task_id) for key in (INBOX_DROPPED, INBOX_ANSWERS))
    return False


def _entries(fields: dict[str, Any], key: str, task_id: str) -> list[dict[str, Any]]:
    """The entries of a mark's list `key` (dropped, answers) that name `task_id`."""
    value = fields.get(key)
    if not isinstance(value, list):
        return []
    return [
        e for e in value
        if isinstance(e, dict) and (e.get(DROP_TASK) == task_id or e.get(COMMAND_TASK) == task_id)
    ]


# ------------------------------------------------------------------------------------------
# Small readers of values from disk
# ------------------------------------------------------------------------------------------


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _time(value: Any) -> str | None:
    """A time from a record in one spelling (RFC 3339, UTC, µs), or None."""
    us = parse_rfc3339_or_none(value)
    if us is None:
        return None
    try:
        return format_rfc3339(us)
    except (ValueError, OverflowError):
        return None


def _int(value: Any) -> int:
    return whole_or_none(value) or 0


# ------------------------------------------------------------------------------------------
# The story
# ------------------------------------------------------------------------------------------


def _ordered(found: Iterable[Found]) -> list[Found]:
    """Shard by shard, log records by offset, each inbox record just before its log copy (or
    the mark that dropped it); inbox records neither copied nor dropped come last."""
    out: list[Found] = []
    by_shard: dict[int, list[Found]] = {}
    for f in found:
        by_shard.setdefault(f.shard, []).append(f)
    for shard in sorted(by_shard):
        items = by_shard[shard]
        log = sorted((f for f in items if f.source == LOG), key=lambda f: f.offset)
        inbox = sorted((f for f in items if f.source != LOG), key=lambda f: (f.source, f.offset))
        before: dict[int, list[Found]] = {}
        used: set[int] = set()
        pending: list[Found] = []
        for item in inbox:
            anchor = _anchor(item, log, used)
            if anchor is None:
                pending.append(item)
            else:
                before.setdefault(anchor, []).append(item)
        for i, f in enumerate(log):
            out.extend(before.get(i, ()))
            out.append(f)
        out.extend(pending)
    return out


def _anchor(item: Found, log: Sequence[Found], used: set[int]) -> int | None:
    """The index in `log` of the record an inbox record became: its copy (a task record with
    `snerdVia` naming the inbox, not matched yet) or the mark that dropped it."""
    task_record = item.fields.get(SNERD_KIND) is None
    for i, f in enumerate(log):
        if i in used:
            continue
        fields = f.fields
        kind = fields.get(SNERD_KIND)
        if task_record and kind is None and fields.get(SNERD_VIA) == item.source:
            used.add(i)
            return i
        if kind == KIND_INBOX and fields.get(INBOX_NODE) == item.source:
            dropped = fields.get(INBOX_DROPPED)
            if isinstance(dropped, list) and any(
                isinstance(d, dict) and d.get(DROP_AT) == item.offset for d in dropped
            ):
                return i
    return None


def _stale_offsets(found: Iterable[Found]) -> dict[tuple[int, int], str]:
    """(shard, offset) of each log record fencing ignores, with why (the fold's rule)."""
    out: dict[tuple[int, int], str] = {}
    for shard, fold in _folds(found).items():
        for s in fold.stale:
            out[(shard, s.offset)] = (
                f"written under epoch {s.epoch} after the claim of epoch {s.fence}: "
                "its writer had lost the shard"
            )
    return out


def _folds(found: Iterable[Found]) -> dict[int, ShardFold]:
    """Each shard's log records of the task folded by the daemon's replay rules."""
    folds: dict[int, ShardFold] = {}
    for f in sorted(found, key=lambda f: (f.shard, f.offset)):
        if f.source == LOG:
            record = LogRecord(offset=f.offset, length=0, fields=f.fields)
            folds.setdefault(f.shard, ShardFold()).add(record)
    return folds


@dataclass(slots=True)
class _Life:
    """What the walk of one shard's records knows before the next one."""

    last: dict[str, Any] | None = None  # the latest counted task record
    ended: bool = False
    #: The attempt of the latest counted dispatch not resolved by a task record since.
    open_attempt: int | None = None
    open_node: str | None = None
    first: int | None = None  # index of the first task-related log step
    last_index: int | None = None  # ... and of the last


def story(found: Iterable[Found], task_id: str | None = None) -> list[Step]:
    """Every step of the task's life in order (see the module docstring). `task_id`: the id
    the records were read for (default: the one they name), which an inbox mark's entries
    are matched against."""
    items = _ordered(list(found))
    if task_id is None:
        task_id = _id_of(items)
    stale = _stale_offsets(items)
    steps: list[Step] = []
    claims: list[tuple[int, Step]] = []  # (index in steps it goes before, step)
    lives: dict[int, _Life] = {}
    for f in items:
        life = lives.setdefault(f.shard, _Life())
        why = stale.get((f.shard, f.offset)) if f.source == LOG else None
        step = _step(f, life, why, task_id)
        if step is None:
            continue
        if step.kind == "claimed":
            claims.append((len(steps), step))
            continue
        if f.source == LOG:
            if life.first is None:
                life.first = len(steps)
            life.last_index = len(steps)
        steps.append(step)
    return _with_claims(steps, claims, lives)


def _with_claims(
    steps: list[Step], claims: list[tuple[int, Step]], lives: dict[int, _Life]
) -> list[Step]:
    """`steps` with the claims that fall inside their shard's span of the task's records."""
    out: list[Step] = []
    at = 0
    for index, claim in claims:
        life = lives.get(claim.shard)
        if life is None or life.first is None or life.last_index is None:
            continue
        if not life.first < index <= life.last_index:
            continue
        out.extend(steps[at:index])
        at = index
        out.append(claim)
    out.extend(steps[at:])
    return out


def _id_of(items: Iterable[Found]) -> str:
    """The id the records name (a task record's, else a dispatch's or a command's)."""
    for f in items:
        for key in (TASK_ID, DISPATCH_TASK, COMMAND_TASK):
            value = f.fields.get(key)
            if isinstance(value, str) and (key == TASK_ID) == (f.fields.get(SNERD_KIND) is None):
                return value
    return ""


def _step(f: Found, life: _Life, stale: str | None, task_id: str) -> Step | None:
    fields = f.fields
    kind = fields.get(SNERD_KIND)
    base: dict[str, Any] = {
        "shard": f.shard,
        "source": f.source,
        "offset": f.offset,
        "node": _str(fields.get(SNERD_NODE)),
        "epoch": whole_or_none(fields.get(SNERD_EPOCH)),
        "stale": stale,
    }
    if kind is None:
        if f.source != LOG:
            return _inbox_step(fields, base)
        return _task_step(fields, life, base)
    if kind == KIND_DISPATCH:
        return _dispatch_step(fields, life, base)
    if kind == KIND_CLAIM:
        node = _str(fields.get(CLAIM_NODE))
        epoch = whole_or_none(fields.get(CLAIM_EPOCH))
        base.update(node=node, epoch=epoch)
        return Step(
            kind="claimed", at=_time(fields.get(RECORD_AT)),
            note=f"shard-{f.shard} claimed by {node or '?'} at epoch {epoch}", **base,
        )
    if kind == KIND_COMMAND:
        action = _str(fields.get(COMMAND_ACTION)) or "?"
        return Step(
            kind="command", at=_time(fields.get(RECORD_AT)),
            note=f"{action} requested through {f.source}", **base,
        )
    if kind == KIND_INBOX:
        return _mark_step(fields, task_id, base)
    if kind == KIND_PURGE and f.source == LOG and task_id in purged_ids(fields):
        return Step(
            kind="purged", at=_time(fields.get(RECORD_AT)),
            note="forgotten by an operator's purge (its tombstone goes at the next compaction)",
            **base,
        )
    return None


def _inbox_step(fields: dict[str, Any], base: dict[str, Any]) -> Step:
    writer = base["node"] or base["source"]
    return Step(
        kind="inbox", at=_time(fields.get(RETRY_AFTER_TIME)), due=_due(fields),
        note=f"enqueued through {writer}, which does not own shard-{base['shard']}: "
        "written to its inbox for the owner",
        **base,
    )


def _mark_step(fields: dict[str, Any], task_id: str, base: dict[str, Any]) -> Step | None:
    """An inbox mark naming the task: the owner dropped its inbox copy, or answered a command."""
    writer = _str(fields.get(INBOX_NODE)) or "?"
    for entry in _entries(fields, INBOX_DROPPED, task_id):
        of = _str(entry.get(DROP_OF))
        error = _str(entry.get(DROP_ERROR)) or (f"a duplicate of task {of}" if of else None)
        return Step(
            kind="dropped", error=error,
            note=f"the copy in {writer}'s inbox was not taken in: {error or 'no reason given'}",
            **base,
        )
    for entry in _entries(fields, INBOX_ANSWERS, task_id):
        said = ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("at", COMMAND_TASK))
        return Step(
            kind="answered", at=_time(entry.get("at")),
            note=f"the owner answered {writer}'s command: {said or 'done'}", **base,
        )
    return None


def _dispatch_step(fields: dict[str, Any], life: _Life, base: dict[str, Any]) -> Step:
    attempt = whole_or_none(fields.get(DISPATCH_ATTEMPT))
    note = f"attempt {attempt} started"
    if base["stale"] is not None:
        note += (
            " by a daemon that had lost the shard (fenced): the shard's owner runs this "
            "attempt too"
        )
    elif life.open_attempt is not None and life.open_attempt == attempt:
        note = (
            f"attempt {attempt} runs twice: the run on {life.open_node or '?'} never reported "
            "an outcome (its daemon stopped, or lost the shard)"
        )
    if base["stale"] is None:
        life.open_attempt, life.open_node = attempt, base["node"]
    at = _time(fields.get(RECORD_AT))
    return Step(kind="dispatched", at=at, attempt=attempt, note=note, **base)


def _task_step(fields: dict[str, Any], life: _Life, base: dict[str, Any]) -> Step:
    kind, note, extra = _task_kind(fields, life)
    if base["stale"] is None:
        life.last, life.ended = fields, fields.get(DELETED_AT) is not None
        life.open_attempt = None
    return Step(kind=kind, note=note, **extra, **base)


def _task_kind(fields: dict[str, Any], life: _Life) -> tuple[str, str, dict[str, Any]]:
    """What a log's task record did, given the task record before it."""
    error = _str(fields.get(LAST_ERROR_OBJ))
    if fields.get(DELETED_AT) is not None:
        return _ending(fields, error)
    due = _due(fields)
    replayed = _time(fields.get(SNERD_REPLAYED_AT))
    prev = life.last
    via = _str(fields.get(SNERD_VIA))
    if prev is None or life.ended:
        again = prev is None or prev.get(SNERD_REPLAYED_AT) != fields.get(SNERD_REPLAYED_AT)
        if replayed is not None and again:
            note = "put back into the queue, attempts reset"
            return "replayed", note, {"at": replayed, "due": due}
        again = " (enqueued again under the id of a task that ended)" if prev is not None else ""
        if via is not None:
            return (
                "taken_in",
                f"taken in from {via}'s inbox by the shard's owner{again}",
                {"at": _time(fields.get(RETRY_AFTER_TIME)), "due": due},
            )
        if prev is not None:
            return "reenqueued", "enqueued again under the id of a task that ended", {"due": due}
        at = _time(fields.get(RETRY_AFTER_TIME))
        return "enqueued", f"enqueued, due {due or '?'}", {"at": at, "due": due}
    count, before = _int(fields.get(RETRY_COUNT)), _int(prev.get(RETRY_COUNT))
    if count > before:
        return (
            "retry_scheduled",
            f"attempt {count} failed: {error or '?'}; the next is due {due or '?'}",
            {"attempt": count, "error": error, "due": due},
        )
    if fields.get(CRON_EXPRESSION) and fields.get(EXECUTE_AT) != prev.get(EXECUTE_AT):
        what = f"its run used every attempt ({error})" if error else "its run ended"
        note = f"{what}; due again at its next tick {due or '?'}"
        return "cron_rearmed", note, {"error": error, "due": due}
    return "updated", "another record of the live task", {"due": due}


def _ending(fields: dict[str, Any], error: str | None) -> tuple[str, str, dict[str, Any]]:
    at = _time(fields.get(DELETED_AT))
    outcome = _outcome(fields)
    attempts = _int(fields.get(RETRY_COUNT))
    if outcome == OUTCOME_CANCELLED:
        return "cancelled", "cancelled", {"at": at}
    if outcome == OUTCOME_COMPLETED:
        note = "completed"
        if SNERD_RESULT in fields:
            note += ", with a result"
        return "completed", note, {"at": at}
    return (
        "dead_lettered",
        f"dead-lettered after {attempts} attempt(s): {error or '?'}",
        {"at": at, "error": error, "attempt": attempts},
    )


def _outcome(fields: dict[str, Any]) -> str:
    """A tombstone's outcome: cancelled, completed or dead_letter (an upstream tombstone by
    its shape, `tombstone_outcome`)."""
    if fields.get(SNERD_OUTCOME) == OUTCOME_CANCELLED:
        return OUTCOME_CANCELLED
    if tombstone_outcome(fields) == OUTCOME_COMPLETED:
        return OUTCOME_COMPLETED
    return OUTCOME_DEAD


def _due(fields: dict[str, Any]) -> str | None:
    """When a task record says it may run next: the later of `executeAt` and
    `retryAfterTime` (the daemon's rule, `ready_at_us`)."""
    times = [parse_rfc3339_or_none(fields.get(k)) for k in (EXECUTE_AT, RETRY_AFTER_TIME)]
    known = [t for t in times if t is not None]
    return _time_us(max(known)) if known else None


def _time_us(us: int) -> str | None:
    try:
        return format_rfc3339(us)
    except (ValueError, OverflowError):
        return None


# ------------------------------------------------------------------------------------------
# The details
# ------------------------------------------------------------------------------------------


def details(task_id: str, found: Iterable[Found], now_us: int) -> dict[str, Any]:
    """The task as one JSON object, every key of `DETAIL_KEYS` present:

    `task_id`; `found` (any file holds a record of the task); `state` (one of `STATES`);
    `task_type`; `shard` (the shard that holds its latest word: where it lives, or where it
    ended last); `attempts` (attempts started in its current life: since its enqueue, or its
    latest replay); `runs` (dispatch records of that life, stale ones included: above
    `attempts` when an attempt ran twice); `max_retries`; `last_error`; `enqueued_at`;
    `started_at` (its latest attempt's start); `finished_at`; `outcome` (completed,
    dead_letter, cancelled, or None while it lives); `result` and `has_result` (the handler's
    return value, stored with a completion); `cron`; `stale_records` (records of it fencing
    ignores); `waiting_in_inbox` (an inbox holds a copy the owner has neither taken in nor
    dropped yet; the state is still what the logs say); `progress` (None here: the files hold
    none; the daemon running the task adds its latest).
    Times are RFC 3339 in UTC, None when unknown."""
    items = [f for f in found if _names(f.fields, task_id)]
    steps = story(items, task_id)
    out: dict[str, Any] = dict.fromkeys(DETAIL_KEYS)
    out.update(
        task_id=task_id, found=False, state="unknown", attempts=0, runs=0, has_result=False,
        stale_records=sum(1 for s in steps if s.stale is not None), waiting_in_inbox=False,
    )
    if not any(s.kind not in ("claimed", "command", "answered") for s in steps):
        return out
    out["found"] = True
    folds = _folds(items)
    shard = _home(folds)
    purged = [s for s in steps if s.kind == "purged" and s.stale is None]
    if shard is None and purged:
        out.update(state="purged", shard=purged[-1].shard, finished_at=None)
        return out
    if shard is None:
        return _from_inbox(out, steps, items)
    fold = folds[shard]
    record = fold.live.get(task_id) or fold.finished.get(task_id)
    if record is None:  # (`_home` chose the shard for holding one)
        return out
    fields = record.fields
    life = _current_life([s for s in steps if s.shard == shard and s.source == LOG])
    _facts(out, shard, fields, life)
    out["waiting_in_inbox"] = _pending_copy(steps)
    if task_id in fold.live:
        out["state"] = _live(task_id, fields, fold, now_us)
        return out
    outcome = _outcome(fields)
    out.update(outcome=outcome, finished_at=_time(fields.get(DELETED_AT)))
    out["state"] = {OUTCOME_COMPLETED: "succeeded", OUTCOME_CANCELLED: "cancelled"}.get(
        outcome, "dead_letter"
    )
    if outcome == OUTCOME_COMPLETED and SNERD_RESULT in fields:
        out.update(result=fields[SNERD_RESULT], has_result=True)
    return out


def _home(folds: dict[int, ShardFold]) -> int | None:
    """The shard holding the task's latest word: the lowest where it is live, else the one
    where it ended latest (the dead-letter rule of `find_dead_letters`); None: no log holds a
    counted task record of it."""
    live = [shard for shard, fold in folds.items() if fold.live]
    if live:
        return min(live)
    ended = [
        (parse_rfc3339_or_none(r.fields.get(DELETED_AT)) or 0, shard)
        for shard, fold in folds.items()
        for r in fold.finished.values()
    ]
    return max(ended)[1] if ended else None


def _current_life(steps: list[Step]) -> list[Step]:
    """The counted steps since the task's latest (re)enqueue or replay."""
    counted = [s for s in steps if s.stale is None or s.kind == "dispatched"]
    start = 0
    for i, s in enumerate(counted):
        if s.kind in ("enqueued", "taken_in", "replayed", "reenqueued") and s.stale is None:
            start = i
    return counted[start:]


def _facts(out: dict[str, Any], shard: int, fields: dict[str, Any], life: list[Step]) -> None:
    """What the latest record and the steps of the current life say, whatever the state."""
    dispatches = [s for s in life if s.kind == "dispatched"]
    counted = [s for s in dispatches if s.stale is None]
    first = life[0] if life else None
    ended = fields.get(DELETED_AT) is not None
    floor = _int(fields.get(RETRY_COUNT))
    if ended and _outcome(fields) == OUTCOME_COMPLETED:
        floor += 1  # a completion's retryCount counts the failures before it
    out.update(
        shard=shard,
        task_type=_str(fields.get(TASK_TYPE)),
        max_retries=whole_or_none(fields.get(MAX_RETRIES)),
        last_error=_str(fields.get(LAST_ERROR_OBJ)),
        cron=_str(fields.get(CRON_EXPRESSION)),
        attempts=max([floor, *(s.attempt or 0 for s in counted)]),
        runs=len(dispatches),
        started_at=counted[-1].at if counted else None,
        enqueued_at=None if first is None else first.at,
    )


def _pending_copy(steps: list[Step]) -> bool:
    """An inbox copy its owner has neither taken in nor dropped (`_ordered` puts each other
    copy just before the step it became): an enqueue under the id, not in a log yet."""
    for i, s in enumerate(steps):
        if s.kind != "inbox":
            continue
        after = steps[i + 1 :]
        became = next((t for t in after if t.kind != "inbox"), None)
        if became is None or became.kind not in ("taken_in", "dropped"):
            return True
    return False


def _live(task_id: str, fields: dict[str, Any], fold: ShardFold, now_us: int) -> str:
    state = _LIVE_TO_STATE[live_state(task_id, fields, fold.in_flight(), now_us)]
    parents = fields.get(TRIGGER_AFTER_IDS)
    if state == "queued" and isinstance(parents, list) and parents:
        return "blocked"
    return state


def _from_inbox(out: dict[str, Any], steps: list[Step], items: list[Found]) -> dict[str, Any]:
    """No log holds the task: an inbox copy waiting for its owner, or one it dropped."""
    copies = [s for s in steps if s.kind == "inbox"]
    dropped = [s for s in steps if s.kind == "dropped"]
    last = copies[-1] if copies else None
    if last is not None:
        out.update(shard=last.shard, enqueued_at=last.at)
        for f in items:
            if f.source == last.source and f.offset == last.offset:
                out.update(
                    task_type=_str(f.fields.get(TASK_TYPE)),
                    max_retries=whole_or_none(f.fields.get(MAX_RETRIES)),
                    cron=_str(f.fields.get(CRON_EXPRESSION)),
                )
    if dropped and len(dropped) >= len(copies):
        out.update(state="dropped", last_error=dropped[-1].error, shard=dropped[-1].shard)
        return out
    out.update(state="queued", waiting_in_inbox=last is not None)
    return out
