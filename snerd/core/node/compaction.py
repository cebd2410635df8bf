"""Compaction: when a shard's log is rewritten with only the records its state still needs,
and what the node re-points once it is.

`Compaction` decides when a check runs (`maybe_compact`: a log big and mostly dead, checked at
most once per eighth of growth, `ShardInfo.compact_check_at`), which records are live (every
task's record and dispatch record, the claim, the inbox records, the finished history and the
dispatch records of open rate windows; a completed task older than the result retention is
forgotten first, `expire_history`), and, once the shell has written the new file, moves
every location the node holds into it, the appends held back or waiting for a retry included.
While a compaction runs the shard takes no append (`ShardInfo.backlog`, emitted in order when
it ends). Its state is per shard, in `ShardInfo`; it keeps none of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node.model import (
    ACTIVE,
    COMPACT_CHECK_BYTES_PER_TASK,
    ShardInfo,
    new_keep_range,
    new_location,
)
from snerd.core.node.outbox import CompactPart
from snerd.core.ownership import shard_name
from snerd.core.rate_limit import RateWindows

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Compaction", "expire_history"]


class Compaction:
    """Compaction checks, plans and outcomes (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox

    def maybe_compact(self) -> None:
        for shard, info in self.shards.items():
            if (
                info.phase is not ACTIVE
                or info.compacting
                or info.appends_in_flight
                or info.size < self.config.compact_min_bytes
                or info.size < info.compact_check_at
            ):
                continue
            offsets = self._live_offsets(shard, info)
            if sum(offsets.values()) * (self.config.compact_dead_ratio + 1) > info.size:
                self.next_check(info)
                continue
            self.compact(shard, offsets)

    def next_check(self, info: ShardInfo) -> None:
        """The log was found, or made, not dead enough: look again once it has grown by an
        eighth, and by enough bytes per task to pay for the walk over the tasks."""
        info.compact_check_at = info.size + max(
            info.size >> 3, COMPACT_CHECK_BYTES_PER_TASK * len(self.node.book.tasks)
        )

    def _live_ranges(
        self, shard: int, info: ShardInfo, offsets: dict[int, int] | None = None
    ) -> list[fx.KeepRange]:
        """Every record the shard's state still needs, in file order (from `offsets`, the
        `_live_offsets` of this moment, when the caller has them)."""
        if offsets is None:
            offsets = self._live_offsets(shard, info)
        return [new_keep_range(o, offsets[o]) for o in sorted(offsets)]

    def _live_offsets(self, shard: int, info: ShardInfo) -> dict[int, int]:
        """Offset -> length of every record the shard's state still needs (unordered; the
        compaction check only sums them, so it builds no `KeepRange`s and sorts nothing).
        Completed tasks past the result retention are forgotten first."""
        expire_history(info, self.node.now.wall, self.config.result_retention_us)
        offsets: dict[int, int] = {}
        if info.claim_loc is not None:
            offsets[info.claim_loc.offset] = info.claim_loc.length
        for at in info.inbox_locs.values():
            offsets[at.offset] = at.length
        for task in self.node.book.tasks.values():
            if task.shard == shard:
                loc = task.loc
                if loc is not None:
                    offsets[loc.offset] = loc.length
                loc = task.dispatch_loc
                if loc is not None:
                    offsets[loc.offset] = loc.length
        for loc, _ in info.history.values():
            offsets[loc.offset] = loc.length
        for loc in self.node.control.locs(shard):
            offsets[loc.offset] = loc.length
        for loc in self.node.schedules.locs(shard):
            offsets[loc.offset] = loc.length
        horizon = self.node.now.wall - RateWindows.WINDOW_US
        while info.window_records and info.window_records[0][0] < horizon:
            info.window_records.popleft()
        for _, loc in info.window_records:
            offsets[loc.offset] = loc.length
        return offsets

    def on_compaction_requested(self, event: ev.CompactionRequested) -> None:
        if not self.compact(event.shard):
            self.out.log("info", f"{shard_name(event.shard)}: no compaction now (busy or not ours)")

    def compact(self, shard: int, offsets: dict[int, int] | None = None) -> bool:
        """Start a compaction of one shard; False when it cannot start now. `offsets`: the
        shard's `_live_offsets` of this moment, when the caller has them."""
        info = self.shards.get(shard)
        if info is None or info.phase is not ACTIVE or info.compacting:
            return False
        if info.appends_in_flight:
            return False
        keep = self._live_ranges(shard, info, offsets)
        info.compacting = True
        # Counted as an append in flight: a step-down keeps the lock until the new file is in
        # place, and a shard taken up again is read only after it (`Tenure.appends_drained`).
        info.appends_in_flight += 1
        token = self.out.next_token()
        self.out.pending[token] = CompactPart(shard, tenure=info.tenure, keep=keep)
        self.out.emit(fx.Compact(token=token, shard=shard, keep=tuple(keep)))
        return True

    def _over(self, shard: int, info: ShardInfo) -> None:
        info.compacting = False
        info.compact_check_at = 0
        self.out.flush_backlog(info)
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.node.tenure.appends_drained(shard, info)
        self.node.control.compaction_over(shard)

    def on_compacted(self, event: ev.Compacted) -> None:
        p = self.out.pending.pop(event.token)
        info = self.shards[event.shard]
        if p.tenure != info.tenure:
            # Stepped down meanwhile: the tasks and the records held back were dropped then.
            self._over(event.shard, info)
            return
        assert type(p) is CompactPart
        keep = p.keep
        shard = event.shard
        # (`event.offsets` lists the kept ranges, then any new lines.)
        moved = {
            r.offset: new_location(shard, offset, length)
            for r, offset, length in zip(keep, event.offsets, event.lengths, strict=False)
        }
        # (A kept range is one record: its new place is where its record now is. Each live
        # task is re-pointed here, so this loop is kept lean: it runs once per live task.)
        if info.claim_loc is not None:
            info.claim_loc = moved.get(info.claim_loc.offset, info.claim_loc)
        info.inbox_locs = {
            node: moved.get(loc.offset, loc) for node, loc in info.inbox_locs.items()
        }
        get = moved.get
        for task in self.node.book.tasks.values():
            if task.shard == shard:
                loc = task.loc
                if loc is not None:
                    task.loc = get(loc.offset, loc)
                loc = task.dispatch_loc
                if loc is not None:
                    task.dispatch_loc = get(loc.offset, loc)
        info.history = {
            t: (moved.get(loc.offset, loc), outcome) for t, (loc, outcome) in info.history.items()
        }
        self.node.schedules.moved(shard, moved)
        self.node.control.moved(shard, moved)
        info.window_records = deque(
            (t, moved.get(loc.offset, loc)) for t, loc in info.window_records
        )
        # Appends decided while the compaction ran (held back) or waiting for a retry name
        # their base records by offsets in the old file: move them too.
        for pending in self.out.pending.values():
            effect = pending.effect
            if (
                pending.shard == event.shard
                and effect is not None
                and any(r.base is not None and r.base.offset in moved for r in effect.records)
            ):
                pending.effect = _rebased(effect, moved)
        info.backlog = [
            self.out.pending[e.token].effect or e if e.token in self.out.pending else e
            for e in info.backlog
        ]
        before, info.size = info.size, event.size
        self._over(event.shard, info)
        # The new log holds only what was live: no check (a walk over every task) until it
        # has grown again.
        self.next_check(info)
        self.out.log(
            "info",
            f"{shard_name(event.shard)}: compacted tasks.log from {before} to {event.size} bytes",
        )

    def on_compaction_failed(self, event: ev.CompactionFailed) -> None:
        self.out.pending.pop(event.token, None)
        info = self.shards[event.shard]
        self._over(event.shard, info)
        self.out.log("warning", f"{shard_name(event.shard)}: compaction failed ({event.error})")


def expire_history(info: ShardInfo, now_wall: int, retention_us: int) -> None:
    """Forget the completed tasks of `info.history` that finished more than `retention_us`
    before `now_wall` (0: none), so that compaction drops their tombstones and results. A
    dead letter is never expired here (only the history limit drops one)."""
    if not retention_us:
        return
    horizon = now_wall - retention_us
    # Every entry is looked at, not only the oldest: a wall clock stepped back leaves them
    # out of order. (Compaction, the caller, walks every task anyway.)
    for task_id in [t for t, at in info.completed_at.items() if at < horizon]:
        del info.completed_at[task_id]
        del info.history[task_id]


def _rebased(effect: fx.Append, moved: Mapping[int, fx.Location]) -> fx.Append:
    """`effect` with the base locations of its records moved by a compaction."""
    records = tuple(
        fx.NewRecord(fields=r.fields, base=moved.get(r.base.offset, r.base), remove=r.remove)
        if r.base is not None
        else r
        for r in effect.records
    )
    return fx.Append(token=effect.token, shard=effect.shard, records=records)
