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

A shard log is read as its owner's replay reads it (`snerd.core.shardlog.ShardFold`): a
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
    KIND_CLAIM,
    OUTCOME_COMPLETED,
    SNERD_EPOCH,
    SNERD_KIND,
    TASK_ID,
)
from snerd.core.shardlog import tombstone_outcome

__all__ = ["COMPLETED", "DEAD", "LIVE", "UNKNOWN", "TaskWatch", "pick"]

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
    the watch needs: task records whose `taskId` is in `ids`, and claim records. Returns them,
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


@dataclass(slots=True)
class _File:
    identity: int
    offset: int = 0
    #: The highest claim epoch read so far (shard logs only): the fence.
    epoch: int = 0
    #: The latest word of this file on each watched id.
    states: dict[str, str] = field(default_factory=dict)


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
        present = {
            (shard, segment): (identity, size) for shard, segment, identity, size in event.files
        }
        for key in list(files):
            if key not in present or files[key].identity != present[key][0]:
                del files[key]  # removed (an ingested inbox), or replaced (compacted)
        for chunk in event.chunks:
            key = (chunk.shard, chunk.segment)
            f = files.get(key)
            if f is None or f.identity != chunk.identity or chunk.start != f.offset:
                if chunk.start != 0:
                    continue  # not the read this state asked for: the next pass catches up
                f = files[key] = _File(chunk.identity)
            self._fold(f, chunk.segment == "", chunk.records)
            f.offset = chunk.end
        # A file is read to its end when it is, or when this answer brought nothing of it:
        # the shell reads to the last complete line, and a torn last line no writer ever
        # follows (a crashed writer's inbox file) keeps a file's size past it for good.
        chunked = {(chunk.shard, chunk.segment) for chunk in event.chunks}
        behind = any(
            key in chunked and (key not in files or files[key].offset < size)
            for key, (_identity, size) in present.items()
        )
        if not behind and not event.errors and self.covering is not None:
            self.settled |= self.covering & self.ids
            self.covering = None
        return self._changes()

    def caught_up(self) -> bool:
        """No pass is in progress and nothing asked for waits for one."""
        return self.covering is None and not self.fresh

    def state(self, task_id: str) -> str | None:
        """The combined state of a watched id (None: nothing known yet)."""
        seen = {f.states[task_id] for f in self.files.values() if task_id in f.states}
        for state in (COMPLETED, DEAD, LIVE):
            if state in seen:
                return state
        return UNKNOWN if task_id in self.settled else None

    def _fold(self, f: _File, is_log: bool, records: Iterable[ev.LogRecord]) -> None:
        ids = self.ids
        for record in records:
            fields = record.fields
            kind = fields.get(SNERD_KIND)
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
