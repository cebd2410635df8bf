"""The task watch: what the queue's files say about task ids, whichever daemon owns them.

A child (`trigger_after_ids`) may name a parent that is not a live task of the node that
holds the child: the parent sits in a shard another daemon owns, in an inbox no owner has
ingested yet, or it finished before the child came. Its outcome is in the queue's files,
which every daemon can read. The node names the ids it waits on; the shell reads every
shard's log and inbox files (`ScanQueue`) and keeps, through `pick`, only the records about
those ids and the claim records that fence a log; `TaskWatch` folds them into one state per id:

- `COMPLETED`: some file's latest word on the id is a tombstone of a task that succeeded;
- `DEAD`: ... of a task that was dead-lettered (and none says it succeeded);
- `LIVE`: some file holds it as a task that has not ended (a shard log, or an inbox);
- `UNKNOWN`: a whole pass over every file, begun after the id was named, found no record of it.

A tombstone a reader sees may not be durable yet (its writer's fsync still out): before it
answers with one, the shell fsyncs the file (`ends_a_task`), so what the watch acts on is
durable. A shard log is read as its owner's replay reads it (`snerd.core.shardlog.ShardFold`): a
record written under an epoch older than a claim read before it is ignored. A file whose
identity changed (compaction renames a new log into place) is read again from its start.
When ids are added the next pass reads every file from its start, so an id's state never
rests on a part of a file read before it was named.

Pure: no file access, no clock. The node part `snerd.core.node.parents` says when to scan and
what each state means for the children; both shells call `pick` on the bytes they read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.records import scan
from snerd.core.schema import (
    CLAIM_EPOCH,
    DELETED_AT,
    INBOX_NODE,
    INBOX_OFFSET,
    KIND_CLAIM,
    KIND_INBOX,
    OUTCOME_COMPLETED,
    SNERD_EPOCH,
    SNERD_KIND,
    TASK_ID,
    TRIGGER_AFTER_IDS,
)
from snerd.core.shardlog import tombstone_outcome

__all__ = [
    "COMPLETED",
    "DEAD",
    "LIVE",
    "UNKNOWN",
    "TaskWatch",
    "ends_a_task",
    "pick",
    "pick_marks",
    "resume_at",
]

LIVE = "live"
COMPLETED = "completed"
DEAD = "dead"
UNKNOWN = "unknown"

_TASK_PREFIX = b'{"' + TASK_ID.encode() + b'":"'
_TASK_KEY = b'"' + TASK_ID.encode() + b'"'
_CLAIM_MARK = b'"' + SNERD_KIND.encode() + b'":"' + KIND_CLAIM.encode() + b'"'


def pick(
    data: bytes | bytearray, base_offset: int, ids: frozenset[str]
) -> tuple[list[ev.LogRecord], list[tuple[int, str]], int]:
    """The records of `data` (complete lines of a queue file, `data[0]` at `base_offset`) that
    the watch needs: task records whose `taskId` is in `ids`, claim records, and `inbox`
    records (how far an ingest took an inbox file). Returns them,
    the lines among those that could not be decoded as (offset, reason), and how many bytes
    were consumed (up to the last newline).

    A line is decoded (checksum and all, `snerd.core.records.scan`) only when it may be one
    of those: one whose id, read straight from its first key (every writer puts `taskId`
    first), is watched; one with an escape in its id; one that is not a task record and names
    the claim kind; or one that does not start like a record at all (so a damaged line is
    judged, never skipped unread). Every other line is a task record of an id not watched."""
    wanted = {i.encode() for i in ids}
    keep = bytearray()
    offsets: list[int] = []
    pos = 0
    find = data.find
    prefix_len = len(_TASK_PREFIX)
    while True:
        nl = find(b"\n", pos)
        if nl < 0:
            break
        line_start = pos
        pos = nl + 1
        if data.startswith(_TASK_PREFIX, line_start):
            start = line_start + prefix_len
            end = find(b'"', start, nl)
            if end >= 0:
                task_id = bytes(data[start:end])
                if task_id not in wanted and b"\\" not in task_id:
                    continue
        elif data.startswith(_INBOX_MARK, line_start):
            pass  # an ingest's record: how far it took an inbox file (`TaskWatch.state`)
        elif (
            find(_CLAIM_MARK, line_start, nl) < 0
            and data.startswith(b"{", line_start)
            and find(_TASK_KEY, line_start, nl) < 0
        ):
            # Another kind of record (dispatch, inbox), and not a task record written by
            # hand with its keys in another order.
            continue
        offsets.append(base_offset + line_start)
        keep += data[line_start:pos]
    result = scan(keep)
    records: list[ev.LogRecord] = []
    corrupt: list[tuple[int, str]] = []
    # `keep` holds whole lines only, so each record and each corrupt line of the scan starts
    # a kept line: map its offset in `keep` back to the file's.
    starts: dict[int, int] = {}
    at = 0
    for offset in offsets:
        starts[at] = offset
        at = keep.index(b"\n", at) + 1
    for record in result.records:
        if record.fields.get(SNERD_KIND) is None and record.fields.get(TASK_ID) not in ids:
            continue
        records.append(
            ev.LogRecord(offset=starts[record.offset], length=record.length, fields=record.fields)
        )
    for offset, reason in result.corrupt:
        corrupt.append((starts.get(offset, base_offset), reason))
    return records, corrupt, pos


def resume_at(known: tuple[int, int] | None, identity: int, size: int) -> int:
    """Where a reader of a queue file goes on: from the offset it `known`ly read to, when the
    file is the one it read (same identity) and still reaches that far; else from 0 (a new
    file, one compaction put in place, or one a crash's lost tail shortened). Every shell's
    `ScanQueue` and `ReadLogTail` asks this."""
    if known is not None and known[0] == identity and known[1] <= size:
        return known[1]
    return 0


def ends_a_task(records: list[ev.LogRecord]) -> bool:
    """Records `pick` kept hold the end (a tombstone) of a watched task: the shell makes the
    file durable (fsync(2) through its own descriptor, which flushes every writer's data of
    the file) before it answers, so a child never goes on on an end a crash could still take
    back (its writer's fsync may not have returned yet)."""
    return any(
        r.fields.get(DELETED_AT) is not None and r.fields.get(SNERD_KIND) is None for r in records
    )


_INBOX_MARK = b'{"' + SNERD_KIND.encode() + b'":"' + KIND_INBOX.encode() + b'"'


def pick_marks(
    data: bytes | bytearray, base_offset: int, writers: frozenset[str]
) -> list[ev.LogRecord]:
    """The `inbox` records of `data` (complete lines of a shard log, `data[0]` at
    `base_offset`) for the inbox files named in `writers`, in file order: how far each ingest
    took a file, and what it did not take in (`snerd.core.node.verdicts`). Only lines that
    start as an `inbox` record are decoded; a damaged one is skipped."""
    keep = bytearray()
    starts: list[int] = []
    pos = 0
    find = data.find
    while True:
        nl = find(b"\n", pos)
        if nl < 0:
            break
        if data.startswith(_INBOX_MARK, pos):
            starts.append(base_offset + pos)
            keep += data[pos : nl + 1]
        pos = nl + 1
    found: list[ev.LogRecord] = []
    at = 0
    by_offset: dict[int, int] = {}
    for start in starts:
        by_offset[at] = start
        at = keep.index(b"\n", at) + 1
    for record in scan(keep).records:
        if record.fields.get(SNERD_KIND) == KIND_INBOX and record.fields.get(INBOX_NODE) in writers:
            found.append(
                ev.LogRecord(
                    offset=by_offset[record.offset], length=record.length, fields=record.fields
                )
            )
    return found


@dataclass(slots=True)
class _File:
    identity: int
    offset: int = 0
    #: The highest claim epoch read so far (shard logs only): the fence.
    epoch: int = 0
    #: The latest word of this file on each watched id.
    states: dict[str, str] = field(default_factory=dict)
    #: An inbox file: where the record that says a watched id is live starts.
    live_at: dict[str, int] = field(default_factory=dict)
    #: A shard log: how far its owner took each inbox file of the shard (`inbox` records).
    ingested: dict[str, int] = field(default_factory=dict)


class TaskWatch:
    """The state of watched task ids across the queue's files (see the module docstring).

    `request` gives the next `ScanQueue`; `scanned` folds its answer and returns the ids
    whose state changed. Call `want` with the ids to watch before each request."""

    def __init__(self, *, fence: bool = True) -> None:
        self.fence = fence
        self.ids: frozenset[str] = frozenset()
        self.files: dict[tuple[int, str], _File] = {}
        #: The ids a whole pass has covered (each may be `UNKNOWN`).
        self.settled: set[str] = set()
        #: Ids named since the last pass from the start began: the next pass starts over.
        self.fresh: set[str] = set()
        #: The ids the pass in progress covers (None: no pass from the start is going on).
        self.covering: frozenset[str] | None = None
        #: The state last returned for each id.
        self.reported: dict[str, str] = {}
        #: The last read left complete lines unread (it stopped at `max_bytes`).
        self.more = False
        #: The parents (`trigger_after_ids`) of each watched id some file holds live, as its
        #: latest live record names them: the node follows dependency cycles through them.
        self.parents_of: dict[str, tuple[str, ...]] = {}

    def want(self, ids: Iterable[str]) -> None:
        """Watch exactly `ids` from now on."""
        ids = frozenset(ids)
        if ids == self.ids:
            return
        gone = self.ids - ids
        self.fresh |= ids - self.ids
        self.fresh -= gone
        self.settled -= gone
        for task_id in gone:
            self.reported.pop(task_id, None)
            self.parents_of.pop(task_id, None)
            for f in self.files.values():
                f.states.pop(task_id, None)
        self.ids = ids

    def request(self, shards: int, max_bytes: int) -> fx.ScanQueue:
        """The next read. With ids named since the last pass began, every file is read from
        its start again (a new pass); otherwise each from where it was left."""
        if self.fresh:
            self.fresh.clear()
            self.files.clear()
            self.covering = self.ids
        known = {key: (f.identity, f.offset) for key, f in self.files.items()}
        return fx.ScanQueue(shards=shards, known=known, ids=self.ids, max_bytes=max_bytes)

    def scanned(self, event: ev.QueueScanned) -> dict[str, str]:
        """Fold an answer; return {id: state} for each watched id whose state changed."""
        files = self.files
        present = {(shard, segment): identity for shard, segment, identity, _rest in event.files}
        for key in list(files):
            if present.get(key) != files[key].identity:
                del files[key]  # removed (an ingested inbox), or replaced (compacted)
        # More to read at once: a file the read left lines of (it stopped at `max_bytes`).
        # A file that could not be read does not hold the pass up: the node says so, and an
        # id only it might hold is unknown until it can be read (an operator has to mend it).
        more = any(rest > 0 for _shard, _segment, _identity, rest in event.files)
        for chunk in event.chunks:
            key = (chunk.shard, chunk.segment)
            f = files.get(key)
            if f is None or f.identity != chunk.identity or chunk.start != f.offset:
                if chunk.start != 0:
                    # Not the read this state asked for: read that file again from its start.
                    files.pop(key, None)
                    more = True
                    continue
                f = files[key] = _File(chunk.identity)
            self._fold(f, chunk.segment == "", chunk.records)
            f.offset = chunk.end
        self.more = more
        if not more and self.covering is not None:
            self.settled |= self.covering & self.ids
            self.covering = None
        return self._changes()

    def caught_up(self) -> bool:
        """Nothing is left to read at once: the last read left no file with lines unread,
        and no id named waits for a pass to begin."""
        return not self.more and not self.fresh

    def state(self, task_id: str) -> str | None:
        """The combined state of a watched id (None: nothing known yet). An inbox file's copy
        of a task counts only until the shard's owner took it in (then the shard's log says
        what became of it: a task, or nothing, when it was dropped at ingest)."""
        seen = {
            f.states[task_id]
            for key, f in self.files.items()
            if task_id in f.states and not self._taken_in(key, f, task_id)
        }
        for state in (COMPLETED, DEAD, LIVE):
            if state in seen:
                return state
        return UNKNOWN if task_id in self.settled else None

    def _taken_in(self, key: tuple[int, str], f: _File, task_id: str) -> bool:
        at = f.live_at.get(task_id)
        if at is None:
            return False
        log = self.files.get((key[0], ""))
        return log is not None and log.ingested.get(key[1], -1) > at

    def _fold(self, f: _File, is_log: bool, records: Iterable[ev.LogRecord]) -> None:
        ids = self.ids
        for record in records:
            fields = record.fields
            kind = fields.get(SNERD_KIND)
            if kind == KIND_INBOX:
                writer, upto = fields.get(INBOX_NODE), fields.get(INBOX_OFFSET)
                if is_log and isinstance(writer, str) and type(upto) is int:
                    f.ingested[writer] = max(f.ingested.get(writer, 0), upto)
                continue
            if kind == KIND_CLAIM:
                epoch = fields.get(CLAIM_EPOCH)
                if is_log and type(epoch) is int and epoch > f.epoch:
                    f.epoch = epoch
                continue
            if kind is not None:
                continue
            task_id = fields.get(TASK_ID)
            if task_id not in ids:
                continue
            epoch = fields.get(SNERD_EPOCH)
            if is_log and self.fence and type(epoch) is int and epoch < f.epoch:
                continue  # fenced: the replay of the shard ignores it too
            if fields.get(DELETED_AT) is None:
                f.states[task_id] = LIVE
                if not is_log:
                    f.live_at[task_id] = record.offset
                parents = fields.get(TRIGGER_AFTER_IDS)
                if isinstance(parents, list) and all(type(p) is str for p in parents):
                    self.parents_of[task_id] = tuple(parents)
            elif tombstone_outcome(fields) == OUTCOME_COMPLETED:
                f.states[task_id] = COMPLETED
            else:
                f.states[task_id] = DEAD

    def _changes(self) -> dict[str, str]:
        changed: dict[str, str] = {}
        for task_id in self.ids:
            state = self.state(task_id)
            if state is not None and self.reported.get(task_id) != state:
                self.reported[task_id] = state
                changed[task_id] = state
        return changed
