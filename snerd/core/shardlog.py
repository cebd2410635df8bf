"""Folding one shard's log into that shard's state: the offline view of `tasks.log`.

This module owns the meaning of a shard log read from start to end, for readers that are not
the daemon owning it: `snerdmq stats`, `validate`, `dlq`, `replay`, `fsck` and `compact`.
Given the log's well-formed records in file order, `ShardFold` yields what the shard holds:
the live tasks (the latest record of each), the unresolved dispatch of each, the finished
history (latest tombstone of each task), the dead letters, the claim records, the dispatch
records that feed rate windows, and the records fencing ignored as stale.

It follows the daemon's replay (`snerd.core.node.replay.Replay`) rule for
rule, so a tool and a daemon never disagree about a shard:

- Fencing (docs/architecture.md, "Epochs, claim records and fencing") is judged in file
  order: a record whose `snerdEpoch` is an int below the highest claim epoch read before it
  is stale and is not part of the state. Claim records are never stale; they raise the
  fence.
- A task record (no `snerdKind`) with `deletedAt` is a tombstone: the task leaves the live set
  and its unresolved dispatch is dropped. Any other task record makes it live (the last one
  wins) and resolves its dispatch: only an attempt's outcome writes a full record after a
  dispatch.
- A `dispatch` record with a string `task` and an int `attempt` is the task's unresolved
  dispatch until a later full record; with a `group` and a parseable `at`, it also counts in
  that group's rate window.
- An `inbox` record (`node`, `offset`) says the owner has ingested the writer `node`'s inbox
  file up to byte `offset` (the tasks it held are the task records before it); the highest
  offset per node wins, and a new owner resumes reading each inbox from there.
- A `purge` record forgets the ended tasks it names whose latest record before it is a
  dead-letter or cancelled tombstone (`snerd.core.control.purge_fields`): they leave the
  finished history, so no tool lists them and compaction drops their tombstones.
- Record kinds it does not know (a newer snerd) are ignored.
- A live task's dispatch counts as in flight only when its attempt is above the task's
  `retryCount` (the daemon re-runs exactly those after a crash, with the same attempt number).

The daemon's replay is this fold: it feeds each `LogRecord` to `ShardFold.add` (with
`keep_payloads=False` it holds no payload), then builds its tasks from `live`, `in_flight()`
and `finished`, and dead-letters those of `unrunnable()`; `keep_ranges` is its compaction's
`_live_ranges` with a fixed history bound.

The records it is fed passed the record rule's first half (`snerd.core.records.check_record`:
a reader skips the others as corrupt lines), so each is what its kind says; whether a live
task can run with its latest record is the second half (`unrunnable`).

Across shards it owns two rules of the operator tools: which dead letters count
(`find_dead_letters`: live nowhere, and the latest `deletedAt` of a task that finished in
several shards), and what `snerdmq replay` writes back (`plan_replay`: the auto-dedupe filter
against pending tasks, then `replay_record`, the fresh task record). A replayed task goes back
into the shard it died in.

It is pure: no files, no clocks (callers pass `now_us`), no threads. It never judges bytes (that
is `snerd.core.records`), and never decides anything for a daemon.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snerd.core.control import PauseMark, newer, pause_of, purged_ids
from snerd.core.effects import KeepRange
from snerd.core.events import LogRecord
from snerd.core.ownership import MAX_COUNT
from snerd.core.records import task_problem
from snerd.core.schema import (
    AUTO_DEDUPE,
    CLAIM_EPOCH,
    DELETED_AT,
    DISPATCH_ATTEMPT,
    DISPATCH_GROUP,
    DISPATCH_TASK,
    EXECUTE_AT,
    INBOX_NODE,
    INBOX_OFFSET,
    KIND_CLAIM,
    KIND_DISPATCH,
    KIND_INBOX,
    KIND_PAUSE,
    KIND_PURGE,
    KIND_SCHEDULE,
    LAST_ERROR_OBJ,
    LAST_JOB_ERROR,
    MAX_RETRIES,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PAYLOAD_HASH,
    RECORD_AT,
    RETRY_AFTER_TIME,
    RETRY_COUNT,
    SCHEDULE_NAME,
    SCHEDULE_REMOVED,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_OUTCOME,
    SNERD_REPLAYED_AT,
    SNERD_SEQ,
    TASK_DATA,
    TASK_ID,
    TASK_TYPE,
)
from snerd.core.timefmt import parse_rfc3339

__all__ = [
    "HISTORY_LIMIT",
    "KIND_CLAIM",
    "KIND_DISPATCH",
    "KIND_INBOX",
    "OUTCOME_COMPLETED",
    "OUTCOME_DEAD",
    "OUTCOME_DEAD_INFERRED",
    "RATE_WINDOW_US",
    "DeadLetter",
    "FoundDeadLetter",
    "ReplayPlan",
    "ShardFold",
    "StaleRecord",
    "enqueue_order",
    "find_dead_letters",
    "finished_at_us",
    "fold_records",
    "past_retention",
    "plan_replay",
    "ready_at_us",
    "replay_record",
    "tombstone_outcome",
]

# KIND_DISPATCH, KIND_CLAIM, KIND_INBOX, OUTCOME_COMPLETED and OUTCOME_DEAD are
# `snerd.core.schema`'s, named here too for the readers of the fold.
#: A tombstone without `snerdOutcome` (written by upstream SnerdMQ) that has the shape of
#: upstream's dead letter: `LastErrorObj` set and `retryCount >= maxRetries - 1` (upstream's
#: `maxRetries` is the total attempt budget and its final failure is never written, reference
#: §4.1 and §6.6 #29). A task that succeeded on its last allowed attempt leaves the same record,
#: so this is an inference, never a certainty.
OUTCOME_DEAD_INFERRED = "dead_letter_inferred"

#: How many finished tasks compaction keeps per shard (the daemon's `history_limit`).
HISTORY_LIMIT = 10_000
#: A rate window's length: dispatch records younger than this are kept by compaction.
RATE_WINDOW_US = 60 * 1_000_000


@dataclass(frozen=True, slots=True)
class StaleRecord:
    """A record fencing ignored: written under `epoch`, after a claim of `fence` was read."""

    offset: int
    epoch: int
    fence: int
    kind: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A task whose latest record in the shard is a dead-letter tombstone."""

    task_id: str
    task_type: str
    #: Attempts the task made (snerd writes this count into the tombstone's `retryCount`;
    #: for an upstream tombstone it is `retryCount + 1`, the final attempt not being written).
    attempts: int
    #: The final error (upstream tombstones: the error of the attempt before the last one).
    error: str | None
    #: When it was dead-lettered (the tombstone's `deletedAt`).
    at: str | None
    #: True for an upstream tombstone judged a dead letter by its shape only.
    inferred: bool
    record: LogRecord


def tombstone_outcome(fields: dict[str, Any]) -> str:
    """How a tombstone's task ended: `OUTCOME_COMPLETED`, `OUTCOME_DEAD`, `OUTCOME_CANCELLED`,
    or, for a tombstone
    without `snerdOutcome` (upstream), `OUTCOME_DEAD_INFERRED` when it has upstream's dead-letter
    shape, else `OUTCOME_COMPLETED`."""
    outcome = fields.get(SNERD_OUTCOME)
    if outcome == OUTCOME_DEAD:
        return OUTCOME_DEAD
    if outcome == OUTCOME_CANCELLED:
        return OUTCOME_CANCELLED
    if outcome is not None:
        return OUTCOME_COMPLETED
    retry_count = _int_or(fields.get(RETRY_COUNT), 0)
    max_retries = _int_or(fields.get(MAX_RETRIES), 0)
    if fields.get(LAST_ERROR_OBJ) is not None and retry_count >= max_retries - 1:
        return OUTCOME_DEAD_INFERRED
    return OUTCOME_COMPLETED


def finished_at_us(fields: dict[str, Any], default: int) -> int:
    """When a tombstone says its task finished (`deletedAt`, wall µs), or `default` when that
    is not a time this reads (an upstream record's, say)."""
    at = fields.get(DELETED_AT)
    if isinstance(at, str):
        with contextlib.suppress(ValueError):
            return parse_rfc3339(at)
    return default


def past_retention(fields: dict[str, Any], now_us: int, retention_us: int) -> bool:
    """A completed task's tombstone that finished more than `retention_us` before `now_us`
    (0: none is): the history forgets it, and compaction drops it with its result. Dead
    letters never are (they wait for an operator); a `deletedAt` that does not parse counts
    as just now."""
    return (
        retention_us > 0
        and tombstone_outcome(fields) == OUTCOME_COMPLETED
        and finished_at_us(fields, now_us) < now_us - retention_us
    )


def ready_at_us(fields: dict[str, Any]) -> int | None:
    """When a live task may run next: the later of `executeAt` and `retryAfterTime` (the
    daemon's rule); None when neither parses."""
    times = []
    for key in (EXECUTE_AT, RETRY_AFTER_TIME):
        value = fields.get(key)
        if isinstance(value, str):
            try:
                times.append(parse_rfc3339(value))
            except ValueError:
                continue
    return max(times) if times else None


def _int_or(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


@dataclass(slots=True)
class ShardFold:
    """The state of one shard, built by feeding its records in file order to `add`.

    With `keep_payloads=False`, each task record's `taskData` string is replaced by an empty
    one as it is folded (in place: the fold takes ownership of the records fed to it), so the
    state holds no payloads (the daemon's way: payloads stay on disk). Attributes are read
    after the last `add`.
    """

    keep_payloads: bool = True
    #: Ignore records written under an epoch older than a claim read before them
    #: (docs/architecture.md, "Epochs, claim records and fencing").
    #: Only the simulator's negative control `--unsafe-no-fence` turns it off, to prove that
    #: the checkers notice what fencing prevents.
    fence: bool = True
    #: Well-formed records seen.
    records: int = 0
    #: The highest claim epoch read so far (the fence).
    log_epoch: int = 0
    #: The latest claim record in the file (the daemon's `claim_loc`).
    claim: LogRecord | None = None
    #: The claim record that set `log_epoch` (differs from `claim` only when a later claim
    #: record carries a lower epoch).
    fence_claim: LogRecord | None = None
    #: Live tasks: the latest record of each, in first-appearance order (`live_in_order` gives
    #: the daemon's FIFO order).
    live: dict[str, LogRecord] = field(default_factory=dict)
    #: One more than the highest `snerdSeq` (enqueue sequence number) seen.
    next_seq: int = 1
    #: The latest dispatch record of each task not resolved by a later full record.
    dispatch: dict[str, LogRecord] = field(default_factory=dict)
    #: Finished tasks: the latest tombstone of each, ordered by that tombstone's position.
    finished: dict[str, LogRecord] = field(default_factory=dict)
    #: Tombstone records seen (a reused id counts each time it finished).
    tombstones: int = 0
    #: Dispatch records of rate-limited groups: (group, time in µs, record), in file order.
    windows: list[tuple[str, int, LogRecord]] = field(default_factory=list)
    #: How far each writer node's inbox file has been ingested (bytes), and the record that
    #: says so (kept by compaction).
    inbox: dict[str, int] = field(default_factory=dict)
    inbox_records: dict[str, LogRecord] = field(default_factory=dict)
    #: The latest record of each named schedule (a removal included), by name.
    schedules: dict[str, LogRecord] = field(default_factory=dict)
    #: Per task type (None: the whole queue), the pause record with the latest stamp (a
    #: resume included: `snerd.core.control`).
    pauses: dict[str | None, tuple[PauseMark, LogRecord]] = field(default_factory=dict)
    #: Ended tasks purge records forgot.
    purged: int = 0
    #: Records ignored by fencing.
    stale: list[StaleRecord] = field(default_factory=list)
    #: Records of a kind this snerd does not know, and task records without a string
    #: `taskId` (both ignored, as the daemon does).
    ignored: int = 0

    def add(self, record: LogRecord) -> None:
        """Fold one record (the next one in file order)."""
        f = record.fields
        self.records += 1
        kind = f.get(SNERD_KIND)
        epoch = f.get(SNERD_EPOCH)
        if isinstance(epoch, int) and epoch < self.log_epoch and kind != KIND_CLAIM and self.fence:
            self.stale.append(
                StaleRecord(
                    offset=record.offset,
                    epoch=epoch,
                    fence=self.log_epoch,
                    kind=kind if isinstance(kind, str) else "task",
                )
            )
            return
        if kind == KIND_CLAIM:
            e = f.get(CLAIM_EPOCH)
            if isinstance(e, int) and (e > self.log_epoch or self.fence_claim is None):
                self.log_epoch = max(self.log_epoch, e)
                self.fence_claim = record
            self.claim = record
            return
        if kind == KIND_DISPATCH:
            task_id = f.get(DISPATCH_TASK)
            attempt = f.get(DISPATCH_ATTEMPT)
            if isinstance(task_id, str) and isinstance(attempt, int):
                self.dispatch[task_id] = record
                group = f.get(DISPATCH_GROUP)
                at = f.get(RECORD_AT)
                if group and isinstance(group, str) and isinstance(at, str):
                    with contextlib.suppress(ValueError):
                        self.windows.append((group, parse_rfc3339(at), record))
            return
        if kind == KIND_INBOX:
            node = f.get(INBOX_NODE)
            offset = f.get(INBOX_OFFSET)
            if isinstance(node, str) and isinstance(offset, int):
                if offset >= self.inbox.get(node, -1):
                    self.inbox[node] = offset
                    self.inbox_records[node] = record
            else:
                self.ignored += 1
            return
        if kind == KIND_SCHEDULE:
            name = f.get(SCHEDULE_NAME)
            if isinstance(name, str):
                self.schedules.pop(name, None)  # re-insert: in the order of their latest
                self.schedules[name] = record
            return
        if kind == KIND_PAUSE:
            found = pause_of(f)
            if found is None:
                self.ignored += 1
                return
            task_type, mark = found
            held = self.pauses.get(task_type)
            if newer(None if held is None else held[0], mark.stamp):
                self.pauses[task_type] = (mark, record)
            return
        if kind == KIND_PURGE:
            for task_id in purged_ids(f):
                ended = self.finished.get(task_id)
                if (
                    ended is not None
                    and task_id not in self.live
                    and tombstone_outcome(ended.fields) != OUTCOME_COMPLETED
                ):
                    del self.finished[task_id]
                    self.purged += 1
            return
        if kind is not None:
            self.ignored += 1
            return
        task_id = f.get(TASK_ID)
        if not isinstance(task_id, str):
            self.ignored += 1
            return
        if not self.keep_payloads and type(f.get(TASK_DATA)) is str:
            # Released, but still there for `unrunnable`: a record whose payload is missing
            # or not a string keeps what it has.
            f[TASK_DATA] = ""
        seq = f.get(SNERD_SEQ)
        if isinstance(seq, int) and seq >= self.next_seq:
            # (At most the largest counter a record may hold: a sequence number of that size,
            # which no shard reaches by counting, does not make the next records unreadable.)
            self.next_seq = min(seq + 1, MAX_COUNT)
        kept = record
        if f.get(DELETED_AT) is not None:
            self.live.pop(task_id, None)
            self.dispatch.pop(task_id, None)
            self.finished.pop(task_id, None)  # re-insert: ordered by the latest tombstone
            self.finished[task_id] = kept
            self.tombstones += 1
            return
        self.live[task_id] = kept
        self.dispatch.pop(task_id, None)

    def add_all(self, records: Iterable[LogRecord]) -> ShardFold:
        """Fold records in order; returns self."""
        for record in records:
            self.add(record)
        return self

    # ------------------------------------------------------------------ views

    def live_in_order(self) -> list[tuple[str, LogRecord]]:
        """Live tasks in enqueue order: by the `snerdSeq` each enqueue record carries (and every
        later record of the task inherits), so the order survives compaction, which keeps only
        a task's latest record; records without one (written by upstream) come first, in the
        order they first appear."""
        return enqueue_order(self.live.items())

    def in_flight(self) -> dict[str, int]:
        """Live tasks whose latest attempt was dispatched and never resolved: id -> attempt.
        After a crash the daemon runs these again with the same attempt number."""
        out: dict[str, int] = {}
        for task_id, record in self.dispatch.items():
            task = self.live.get(task_id)
            if task is None:
                continue
            attempt = record.fields[DISPATCH_ATTEMPT]
            if attempt > _int_or(task.fields.get(RETRY_COUNT), 0):
                out[task_id] = attempt
        return out

    def dead_letters(self) -> list[DeadLetter]:
        """Tasks whose latest record here is a dead-letter tombstone, oldest first. A task
        that is live again (replayed or re-enqueued) is not one."""
        out: list[DeadLetter] = []
        for task_id, record in self.finished.items():
            if task_id in self.live:
                continue
            outcome = tombstone_outcome(record.fields)
            if outcome in (OUTCOME_COMPLETED, OUTCOME_CANCELLED):
                continue
            f = record.fields
            retry_count = _int_or(f.get(RETRY_COUNT), 0)
            inferred = outcome == OUTCOME_DEAD_INFERRED
            error = f.get(LAST_ERROR_OBJ)
            at = f.get(DELETED_AT)
            task_type = f.get(TASK_TYPE)
            out.append(
                DeadLetter(
                    task_id=task_id,
                    task_type=task_type if isinstance(task_type, str) else "",
                    attempts=retry_count + 1 if inferred else retry_count,
                    error=error if isinstance(error, str) else None,
                    at=at if isinstance(at, str) else None,
                    inferred=inferred,
                    record=record,
                )
            )
        return out

    def unrunnable(self) -> list[tuple[LogRecord, str]]:
        """Live tasks whose latest record is one they cannot run with, and why
        (`snerd.core.records.task_problem`), in file order: a daemon dead-letters each with
        that reason when it loads the shard."""
        found = []
        for record in self.live.values():
            why = task_problem(record.fields)
            if why is not None:
                found.append((record, why))
        return sorted(found, key=lambda item: item[0].offset)

    def completed(self) -> int:
        """Finished tasks (latest tombstone per id, not live again) that did not dead-letter."""
        return sum(
            1
            for task_id, record in self.finished.items()
            if task_id not in self.live and tombstone_outcome(record.fields) == OUTCOME_COMPLETED
        )

    def keep_ranges(
        self,
        now_us: int,
        *,
        history_limit: int = HISTORY_LIMIT,
        window_us: int = RATE_WINDOW_US,
        retention_us: int = 0,
    ) -> list[KeepRange]:
        """The records a compaction must carry over, in file order: the latest record of each
        live task and its in-flight dispatch record, the latest claim record and the one that
        set the fence, the latest inbox record of each writer, the latest record of each
        schedule not removed, the winning pause record of each type, dispatch records of
        rate-limited groups younger than `window_us`, and the latest `history_limit` finished
        tasks, but for completed ones past `retention_us` (`past_retention`). Folding the kept
        records gives the same live tasks, in-flight attempts, fence and (younger) rate
        windows."""
        if history_limit < 0:
            raise ValueError("history_limit must be 0 or more")
        keep: dict[int, int] = {}

        def add(record: LogRecord | None) -> None:
            if record is not None:
                keep[record.offset] = record.length

        add(self.claim)
        add(self.fence_claim)
        for record in self.inbox_records.values():
            add(record)
        for record in self.schedules.values():
            if record.fields.get(SCHEDULE_REMOVED) is not True:
                add(record)
        for _mark, record in self.pauses.values():
            add(record)
        for record in self.live.values():
            add(record)
        for task_id in self.in_flight():
            add(self.dispatch[task_id])
        horizon = now_us - window_us
        for _group, at, record in self.windows:
            if at >= horizon:
                add(record)
        if history_limit:
            finished = [r for t, r in self.finished.items() if t not in self.live]
            for record in finished[-history_limit:]:
                if not past_retention(record.fields, now_us, retention_us):
                    add(record)
        return [KeepRange(offset=o, length=keep[o]) for o in sorted(keep)]


def _seq_of(item: tuple[str, LogRecord]) -> int:
    return _int_or(item[1].fields.get(SNERD_SEQ), 0)


def enqueue_order(
    items: Iterable[tuple[str, LogRecord]], limit: int | None = None
) -> list[tuple[str, LogRecord]]:
    """(task id, record) pairs in enqueue order (`ShardFold.live_in_order`'s rule); only the
    first `limit` when given (without sorting them all)."""
    if limit is None:
        return sorted(items, key=_seq_of)
    return heapq.nsmallest(limit, items, key=_seq_of)


def fold_records(records: Iterable[LogRecord], *, keep_payloads: bool = True) -> ShardFold:
    """Fold a whole log's records (in file order) into a `ShardFold`."""
    return ShardFold(keep_payloads=keep_payloads).add_all(records)


# ------------------------------------------------------------------------------------------
# Across shards: dead letters and their replay
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoundDeadLetter:
    """A dead letter and the shard whose log holds it."""

    shard: int
    letter: DeadLetter


def find_dead_letters(
    folds: Mapping[int, ShardFold],
    *,
    task_type: str | None = None,
    ids: Sequence[str] = (),
) -> list[FoundDeadLetter]:
    """Dead letters across shards (`folds` by shard number): a task whose latest record is a
    dead-letter tombstone and which is not live in any shard. When one id finished in several
    shards (ids reused after `add-shards`), the latest `deletedAt` decides. Oldest first."""
    live: set[str] = set()
    for fold in folds.values():
        live.update(fold.live)
    latest: dict[str, tuple[int, int, LogRecord]] = {}
    for shard, fold in folds.items():
        for task_id, record in fold.finished.items():
            at = record.fields.get(DELETED_AT)
            try:
                at_us = parse_rfc3339(at) if isinstance(at, str) else 0
            except ValueError:
                at_us = 0
            if task_id not in latest or at_us >= latest[task_id][0]:
                latest[task_id] = (at_us, shard, record)
    out: list[FoundDeadLetter] = []
    for shard, fold in folds.items():
        for letter in fold.dead_letters():
            if letter.task_id in live:
                continue
            if latest[letter.task_id][2] is not letter.record:
                continue
            if task_type is not None and letter.task_type != task_type:
                continue
            if ids and letter.task_id not in ids:
                continue
            out.append(FoundDeadLetter(shard, letter))
    out.sort(key=lambda d: (d.letter.at or "", d.shard, d.letter.task_id))
    return out


#: Keys of a tombstone that a replayed task record does not carry over.
_NOT_REPLAYED = frozenset(
    {
        TASK_ID, DELETED_AT, SNERD_OUTCOME, LAST_ERROR_OBJ, LAST_JOB_ERROR, SNERD_NODE,
        SNERD_EPOCH,
    }
)


def replay_record(record: LogRecord, *, now: str, epoch: int, node: str) -> dict[str, Any]:
    """A fresh task record from a dead letter's tombstone: same task, attempts and errors reset,
    due `now` (an RFC 3339 time), written by `node` under `epoch`; `snerdSeq` and the task
    data kept. `taskId` stays the first key (upstream's order; `scan` resynchronises on it)."""
    f = record.fields
    fields: dict[str, Any] = {TASK_ID: f[TASK_ID]}
    fields.update((k, v) for k, v in f.items() if k not in _NOT_REPLAYED)
    fields.update(
        {
            RETRY_COUNT: 0,
            RETRY_AFTER_TIME: now,
            EXECUTE_AT: now,
            SNERD_REPLAYED_AT: now,
            SNERD_NODE: node,
            SNERD_EPOCH: epoch,
        }
    )
    return fields


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a replay writes back (`replay`, in order) and what it leaves, each with why."""

    replay: list[FoundDeadLetter]
    skipped: list[str]


def plan_replay(found: Sequence[FoundDeadLetter], folds: Mapping[int, ShardFold]) -> ReplayPlan:
    """Which of the dead letters `found` to replay into the shards of `folds`: not one whose
    `autoDedupe` fingerprint (`payloadHash`) matches a pending task, or one replayed before it
    here (the daemon's auto-dedupe rule: one pending task per fingerprint), and not one whose
    tombstone lost its task data (there is nothing to run)."""
    pending: dict[str, str] = {}
    for fold in folds.values():
        for task_id, record in fold.live.items():
            h = record.fields.get(PAYLOAD_HASH)
            if isinstance(h, str):
                pending.setdefault(h, task_id)
    replay: list[FoundDeadLetter] = []
    skipped: list[str] = []
    for d in found:
        f = d.letter.record.fields
        h = f.get(PAYLOAD_HASH)
        if f.get(AUTO_DEDUPE) and isinstance(h, str):
            if h in pending:
                skipped.append(
                    f"{d.letter.task_id}: an identical task ({pending[h]}) is pending (auto_dedupe)"
                )
                continue
            pending[h] = d.letter.task_id
        if TASK_DATA not in f:
            skipped.append(f"{d.letter.task_id}: its tombstone has no taskData")
            continue
        replay.append(d)
    return ReplayPlan(replay=replay, skipped=skipped)
