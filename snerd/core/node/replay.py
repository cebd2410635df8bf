"""Log replay: a claimed shard's log, read back into this node's state.

`Replay` takes the records the shell reads (`LogRecordsRead`, in chunks) into the shard's
`ShardFold` (`snerd.core.shardlog`, the one fold the CLI uses too) and, at the last chunk,
turns the fold into state: the shard's claim, history, rate windows and inbox positions, and
every live task in enqueue order (those dispatched and never resolved keep their attempt, to
run again). Then it fences the shard with a claim record of our epoch; the shard is ACTIVE once
that record lands (`Tenure.claimed`). It keeps no state of its own: the fold is the shard's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node.model import (
    ENQUEUING,
    FENCING,
    LOADING,
    FinishedTwin,
    ShardInfo,
    Task,
)
from snerd.core.node.outbox import ClaimPart
from snerd.core.ownership import MAX_COUNT, shard_name
from snerd.core.records import task_problem
from snerd.core.schema import (
    CLAIM_EPOCH,
    CLAIM_NODE,
    DELETED_AT,
    KIND_CLAIM,
    OUTCOME_CANCELLED,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PAYLOAD_HASH,
    RECORD_AT,
    RETRY_COUNT,
    SNERD_KIND,
    TASK_DATA,
    TASK_ID,
    TASK_TYPE,
)
from snerd.core.shardlog import ShardFold, finished_at_us, past_retention, tombstone_outcome
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Replay"]


class Replay:
    """Replays a shard's log into the node (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox

    def on_log_records(self, event: ev.LogRecordsRead) -> None:
        info = self.shards[event.shard]
        if info.phase is not LOADING:
            return
        for offset, reason in event.corrupt:
            info.corrupt_lines += 1
            self.out.log(
                "warning",
                f"{shard_name(event.shard)}/tasks/tasks.log: skipped a corrupt line at byte "
                f"{offset} ({reason}); run `snerdmq fsck` for a report",
            )
        assert info.fold is not None
        info.fold.add_all(event.records)
        if event.final:
            info.size = info.loaded_size = event.size
            self._finish(event.shard, info)

    def _finish(self, shard: int, info: ShardInfo) -> None:
        """Turn the folded log into this node's state, then fence the shard with a claim
        record of our epoch."""
        fold = info.fold
        assert fold is not None
        info.fold = None
        self._restore_shard(shard, info, fold)
        self._restore_tasks(shard, info, fold)
        self.node.schedules.load(shard, fold.schedules)
        self.node.control.load(shard, fold.pauses)
        self._fence(shard, info, fold)

    def _restore_shard(self, shard: int, info: ShardInfo, fold: ShardFold) -> None:
        """The shard's own state from the fold: claim, sequence, inbox positions, the finished
        history and the dispatch records of rate windows."""

        def loc(record: ev.LogRecord) -> fx.Location:
            return fx.Location(shard, record.offset, record.length)

        info.loaded_records = fold.records
        info.log_epoch = fold.log_epoch
        info.claim_loc = loc(fold.claim) if fold.claim is not None else None
        info.next_seq = fold.next_seq
        info.inbox_done = dict(fold.inbox)
        info.inbox_taken = dict(fold.inbox)
        info.inbox_locs = {node: loc(record) for node, record in fold.inbox_records.items()}
        retention, now = self.config.result_retention_us, self.node.now.wall
        # The log is the history: what an earlier tenure of this node left in memory is not
        # (another owner may have put a task back, or purged it, since).
        info.history.clear()
        info.completed_at.clear()
        info.ended.clear()
        for task_id, record in list(fold.finished.items())[-self.config.history_limit :]:
            self._twin_from(shard, task_id, record.fields)
            outcome = tombstone_outcome(record.fields)
            if outcome != OUTCOME_COMPLETED:
                # (Cancelled ones, like dead letters, wait for an operator: never expired.)
                kept = OUTCOME_CANCELLED if outcome == OUTCOME_CANCELLED else OUTCOME_DEAD
                info.history[task_id] = (loc(record), kept)
                task_type = record.fields.get(TASK_TYPE)
                info.ended[task_id] = (
                    finished_at_us(record.fields, now),
                    task_type if isinstance(task_type, str) else "",
                )
            elif not past_retention(record.fields, now, retention):
                # (One past the result retention is not history: compaction drops it.)
                info.history[task_id] = (loc(record), OUTCOME_COMPLETED)
                info.completed_at[task_id] = finished_at_us(record.fields, now)
        windows = self.node.book.windows
        for group, at, record in fold.windows:
            windows.restore(group, [at])
            info.window_records.append((at, loc(record)))

    def _twin_from(self, shard: int, task_id: str, fields: dict[str, Any]) -> None:
        """A finished task with a dedupe fingerprint, for `unique_until` in seconds."""
        payload_hash = fields.get(PAYLOAD_HASH)
        at = fields.get(DELETED_AT)
        if not isinstance(payload_hash, str) or not isinstance(at, str):
            return
        try:
            finished = parse_rfc3339(at)
        except ValueError:
            return
        self.node.book.remember_twin(payload_hash, FinishedTwin(task_id, shard, finished))

    def _restore_tasks(self, shard: int, info: ShardInfo, fold: ShardFold) -> None:
        """Every live task of the fold, in enqueue order (snerdSeq, which compaction keeps:
        FIFO survives restarts), scheduled; those it cannot run with, kept to dead-letter."""
        now = self.node.now
        book = self.node.book
        tasks = book.tasks
        log = self.out.log

        def loc(record: ev.LogRecord) -> fx.Location:
            return fx.Location(shard, record.offset, record.length)

        in_flight = fold.in_flight()
        info.unrunnable = []
        for task_id, record in fold.live_in_order():
            if task_id in tasks:
                log(
                    "warning",
                    f"task {task_id} is live in two shards; keeping the one in "
                    f"{shard_name(tasks[task_id].shard)}",
                )
                continue
            why = task_problem(record.fields)
            if why is not None:
                # A record no enqueue would have taken (an older version's, or written by
                # hand): the task cannot run, so it ends as a dead letter saying why, once the
                # shard is ours; it is live until then (its id taken, its children waiting).
                log(
                    "warning",
                    f"{shard_name(shard)}/tasks/tasks.log: {why} (at byte {record.offset}); "
                    "it is dead-lettered",
                )
                book.seq += 1
                tasks[task_id] = _unrunnable_task(shard, record.fields, loc(record), book.seq)
                based = type(record.fields.get(TASK_DATA)) is str
                info.unrunnable.append((task_id, why, based))
                continue
            task = book.task_from_record(shard, record.fields, loc(record))
            if task is None:
                log("warning", f"task {task_id}: unreadable record in {shard_name(shard)}")
                continue
            if task_id in in_flight:
                # Dispatched, never resolved: it may have run. Run it again with the same attempt
                # number: a crash re-execution does not use up an attempt.
                task.attempt = in_flight[task_id]
                task.dispatch_loc = loc(fold.dispatch[task_id])
            tasks[task_id] = task
            book.add_fingerprint(task)
            book.schedule(task, now)
        self.node.parents.recheck()

    def _fence(self, shard: int, info: ShardInfo, fold: ShardFold) -> None:
        """Fence: our first record in this log is a claim with our epoch."""
        info.phase = FENCING
        # Our epoch comes from our claim; should the log already hold a newer one, or this one
        # claimed by another node (membership.json lost or restored from a backup), go past it
        # so fencing still holds. Our own claim of this epoch (the shard taken up again after a
        # lease ran out) keeps it: membership.json names this epoch, and the next claimant
        # bumps from there.
        fence = fold.fence_claim
        fence_node = fence.fields.get(CLAIM_NODE) if fence is not None else None
        node_id = self.config.node_id
        if info.reloading:
            info.reloading = False
            if fence is not None and fence_node == node_id and info.log_epoch == info.epoch:
                # Still the last claim: ours.
                loc = fx.Location(shard, fence.offset, fence.length)
                self.node.tenure.claimed(shard, info, loc)
                return
        if info.log_epoch > info.epoch or (info.log_epoch == info.epoch and fence_node != node_id):
            # (At most the largest counter a record may hold: a log with a claim of that epoch,
            # which no owner reaches by counting, is fenced at it, not past what readers take.)
            info.epoch = min(info.log_epoch + 1, MAX_COUNT)
        claim = fx.NewRecord(
            fields={
                SNERD_KIND: KIND_CLAIM,
                CLAIM_EPOCH: info.epoch,
                CLAIM_NODE: node_id,
                RECORD_AT: format_rfc3339(self.node.now.wall),
                **self.node.tenure.meta(shard),
            }
        )
        self.out.append(shard, [claim], ClaimPart(shard))


def _unrunnable_task(shard: int, f: dict[str, Any], loc: fx.Location, seq: int) -> Task:
    """The task of a record it cannot run with (`task_problem`), to dead-letter: only what
    the tombstone keeps of it (its base is the record) and where that record is."""
    task_type = f.get(TASK_TYPE)
    retry_count = f.get(RETRY_COUNT)
    if type(retry_count) is not int or retry_count < 0:
        retry_count = 0
    return Task(
        task_id=f[TASK_ID],
        task_type=task_type if type(task_type) is str else "",
        shard=shard,
        seq=seq,
        state=ENQUEUING,
        retry_count=retry_count,
        max_retries=0,
        retry_after_hours=0.0,
        ready_at_us=0,
        urgency=0.0,
        pool="default",
        group=None,
        max_per_minute=None,
        payload_hash=None,
        cron=None,
        webhook_url=None,
        max_execution_seconds=None,
        trigger_after_ids=(),
        loc=loc,
        # The tombstone counts the attempts made (`TaskBook.finish`): those that failed before, none now.
        attempt=retry_count,
        last_error=None,
    )
