"""Append outcomes: what an `AppendCommitted` or an `AppendFailed` means, part by part.

An append in flight carries its pending (`snerd.core.node.outbox`): what its records mean once
they land. `Outcomes` hands a commit or a failure to each part of it in turn, as if each were
an append of its own: an enqueue is acked and scheduled, a dispatch record starts its attempt,
a tombstone finishes its task, a claim fences the shard, an ingest takes the inbox that far.
A failed enqueue is answered with an error; a failed dispatch is retried after a hold; outcome
and claim records are retried until they land, or dead-lettered when their base record cannot
be read back. `on_commit` answers, straight after the fsync, what cannot change before the
burst that handles the commit (the acks of plain enqueues, an attempt dispatched with its
enqueue record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.model import (
    DISPATCHING,
    DRAINING,
    ENQUEUING,
    NODE_RUNNING,
    OUTCOME_COMPLETED,
    PARKED,
    READY,
    SECOND,
    UNOWNED,
    WAITING,
    InboxSegment,
    ShardInfo,
    Task,
    new_ack_enqueued,
    new_append,
    new_location,
    queue_in,
)
from snerd.core.node.outbox import PendingAppend, finish_pending
from snerd.core.ownership import shard_name
from snerd.core.ready_queue import ReadyQueue

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Outcomes"]

#: The kinds of part an append acked as it commits may hold (`Outcomes.on_commit`).
_EARLY_ACK_KINDS = frozenset({"enqueues", "dispatches", "finishes"})


class Outcomes:
    """Commit and failure outcomes of appends, part by part (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox

    def on_commit(
        self, token: int, now: ev.Now, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> list[fx.Effect]:
        """What may be carried out the moment the append `token` is durable (at `offsets`),
        before the burst that handles its `AppendCommitted`: the shell asks straight after the
        fsync, so an ack or an `execute` does not wait for that burst. What is returned here
        is marked answered, and that burst does not do it again; a step-down before it does
        not tell the SDK the enqueue may be lost (`_step_down` skips answered enqueues).

        The test is that burst's own: the lease still runs at `now` (read after the fsync
        returned, so a record that landed after the lease ran out is never acked nor run),
        and the enqueue is not answered yet (a step-down answered every enqueue of the shard
        in flight). Three cases go early, anything else the burst's way:
        - an enqueue to this node's own inbox file: its ack, whatever the lease, as the burst
          would (the shard's owner ingests it);
        - runs of plain enqueues (`_lines`), alone or merged only with dispatch records and
          tombstones (so acks leave in the order of their enqueues: an enqueue with options
          is acked by the burst), every task of them still known: their acks;
        - one task's enqueue dispatched with its record (`_runs_at_once`), no duplicate
          waiting on it, the node not draining, no webhook: its ack, and the attempt starts
          here (`_enqueue_landed`: its state, its deadline, the `execute`).
        No I/O."""
        p = self.out.pending.get(token)
        if p is None or p.answered:
            return []
        if p.kind == "inbox":
            p.answered = True
            return [new_ack_enqueued([p.task_id or ""], p.shard)]
        if self.node.tenure.lease_over(now):
            return []
        if p.kind == "enqueue":
            task = self.node.book.tasks.get(p.task_id or "")
            if (
                task is None
                or task.state is not DISPATCHING
                or p.dedupe_waiters
                or task.webhook_url is not None
                or self.node.phase is not NODE_RUNNING
            ):
                return []
            assert not self.out.out
            self.node.now = now
            p.answered = True
            self._enqueue_landed(p, task, offsets, lengths)
            out, self.out.out = self.out.out, []
            return out
        if p.kind == "enqueues":
            runs = [p]
        elif p.kind == "group":
            parts: list[PendingAppend] = p.extra["parts"]
            if any(part.kind not in _EARLY_ACK_KINDS for part in parts):
                return []
            runs = [part for part in parts if part.kind == "enqueues" and not part.answered]
        else:
            return []
        tasks = self.node.book.tasks
        acked = [task_id for run in runs for task_id in run.extra["ids"]]
        if not acked or not all(task_id in tasks for task_id in acked):
            return []
        for run in runs:
            run.answered = True
        return [new_ack_enqueued(acked, p.shard)]

    def on_append_committed(self, event: ev.AppendCommitted) -> None:
        p = self.out.pending.pop(event.token)
        if p.kind == "inbox":
            segment: InboxSegment = p.extra["segment"]
            segment.in_flight -= 1
            segment.end = max(segment.end, event.offsets[-1] + event.lengths[-1])
            if not p.answered:  # (else acked as it committed, `on_commit`)
                self.out.send(proto.ack_enqueued(p.task_id or "", p.shard))
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.node.tenure.appends_drained(p.shard, info)
        if info.phase is UNOWNED or p.tenure != info.tenure:
            return
        info.size = max(info.size, event.offsets[-1] + event.lengths[-1])
        if p.kind != "group":
            self._part_committed(p, info, event.offsets, event.lengths)
            return
        offsets, lengths = event.offsets, event.lengths
        at = 0
        for part in p.extra["parts"]:
            # An earlier part may have stepped the node down from the shard (mypy keeps the
            # narrowing of the check above across the calls).
            if info.phase is UNOWNED or part.tenure != info.tenure:  # type: ignore[comparison-overlap]
                return
            end = at + part.count
            self._part_committed(part, info, offsets[at:end], lengths[at:end])
            at = end

    def _part_committed(
        self, p: PendingAppend, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        """The records of one append (or of one part of merged ones) are in the log."""
        if p.kind == "enqueues":
            # (Answered already: acked by the shell as it committed, `on_commit`.)
            self._enqueues_committed(p.extra["ids"], p.shard, offsets, lengths, not p.answered)
            return
        if p.kind == "dispatches" or p.kind == "finishes":
            # A run: each task's record committed as its own "dispatch" or "finish" would be.
            tasks = self.node.book.tasks
            dispatches = p.kind == "dispatches"
            for i, task_id in enumerate(p.extra["ids"]):
                task = tasks.get(task_id)
                if task is not None:
                    loc = new_location(p.shard, offsets[i], lengths[i])
                    if dispatches:
                        self._dispatch_committed(task, info, loc)
                    else:
                        self.node.book.finished(task, OUTCOME_COMPLETED, None, loc)
            return
        loc = new_location(p.shard, offsets[0], lengths[0])
        if p.kind == "ingest":
            self._ingested(p, offsets, lengths, info)
            return
        if p.kind == "claim":
            if offsets[0] > info.loaded_size:
                self.node.tenure.reload(p.shard, info)
                return
            self.node.tenure.claimed(p.shard, info, loc)
            return
        task = self.node.book.tasks.get(p.task_id or "")
        if task is None:
            return
        if p.kind == "enqueue":
            if not p.answered:  # (else acked and started as it committed, `on_commit`)
                self._enqueue_landed(p, task, offsets, lengths)
        elif p.kind in ("retry", "rearm"):
            task.loc = loc
            if p.kind == "retry":
                task.retry_count = task.attempt
            else:
                task.retry_count = 0
            task.attempt = task.retry_count + 1
            task.dispatch_loc = None
            task.ready_at_us = p.extra["ready_at"]
            if task.ready_at_us > self.node.now.wall:
                self.node.book.move(task, WAITING)
                self.node.book.due.push(task.task_id, task.ready_at_us, task.seq)
            else:
                self.node.book.move(task, READY)
                self.node.book.push_ready(task)
        elif p.kind == "finish":
            self.node.book.finished(task, p.extra["outcome"], p.extra["error"], loc)

    def _enqueue_landed(
        self, p: PendingAppend, task: Task, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        """An "enqueue" part is in the log: ack it (and the duplicates waiting on it), then
        schedule its task or, dispatched with its record, start the attempt."""
        task.loc = new_location(p.shard, offsets[0], lengths[0])
        self.out.emit(new_ack_enqueued([task.task_id], task.shard))
        for dup in p.dedupe_waiters:
            self.out.send(proto.ack_enqueued(dup, task.shard, deduplicated=True))
        if task.state is DISPATCHING:
            # Dispatched with its enqueue record (`_runs_at_once`): that record is second.
            task.dispatch_loc = new_location(p.shard, offsets[1], lengths[1])
            if self.node.phase is DRAINING:
                self.node.book.end_flight_unsent(task)  # not sent yet: it runs elsewhere
                return
            self.node.book.begin_execution(task)
            return
        self.node.book.schedule(task, self.node.now)

    def _dispatch_committed(self, task: Task, info: ShardInfo, loc: fx.Location) -> None:
        """The dispatch record of `task`'s attempt is in the log: the attempt starts."""
        task.dispatch_loc = loc
        if task.group is not None:
            info.window_records.append((self.node.now.wall, loc))
        if self.node.phase is DRAINING and task.state is DISPATCHING:
            # Not sent yet, and we are draining: give the slot back; it runs elsewhere.
            self.node.book.end_flight_unsent(task)
            return
        self.node.book.begin_execution(task)

    def _enqueues_committed(
        self,
        ids: list[str],
        shard: int,
        offsets: tuple[int, ...],
        lengths: tuple[int, ...],
        ack: bool,
    ) -> None:
        """A run of plain enqueues (`_lines`) is in the log: each is acked (unless `ack` is
        false: the shell acked them as they committed, `on_commit`) and scheduled in
        turn, as an "enqueue" part would be (`_schedule`, for a task with no parents, no
        webhook, due at once and not dispatched with its record): ready, or parked when no
        handler here takes its type (`_park_by_type`). Consecutive ones bound for the same
        queue are pushed there in one call (`ReadyQueue.push_run`)."""
        tasks = self.node.book.tasks
        registered = self.node.book.registered
        acked: list[str] = []
        queue: ReadyQueue[str] | None = None
        urgency = 0.0
        keys: list[str] = []
        seqs: list[int] = []
        for i, task_id in enumerate(ids):
            task = tasks.get(task_id)
            if task is None:
                continue
            task.loc = new_location(shard, offsets[i], lengths[i])
            acked.append(task_id)
            if task.state is not ENQUEUING:
                self.node.book.move(task, READY)  # (its check: a task is ENQUEUING until now)
            # ENQUEUING -> READY (-> PARKED): the moves `_move` allows, made directly.
            if task.task_type in registered:
                task.state = READY
                target = queue_in(self.node.book.ready, task.pool)
            else:
                task.state = PARKED
                target = queue_in(self.node.book.parked_by_type, task.task_type)
            if target is not queue or task.urgency != urgency:
                if queue is not None and keys:
                    queue.push_run(keys, seqs, urgency)
                queue, urgency, keys, seqs = target, task.urgency, [], []
            keys.append(task_id)
            seqs.append(task.seq)
        if queue is not None and keys:
            queue.push_run(keys, seqs, urgency)
        if acked and ack:
            self.out.emit(new_ack_enqueued(acked, shard))

    def _ingested(
        self, p: PendingAppend, offsets: tuple[int, ...], lengths: tuple[int, ...], info: ShardInfo
    ) -> None:
        """An ingest append landed: its tasks are enqueued here, the inbox read that far."""
        ids: list[str | None] = p.extra["tasks"]
        for i, task_id in enumerate(ids):
            task = self.node.book.tasks.get(task_id) if task_id is not None else None
            if task is None or task.loc is not None or task.state is not ENQUEUING:
                continue
            task.loc = new_location(p.shard, offsets[i], lengths[i])
            self.node.book.schedule(task, self.node.now)
        node: str = p.extra["node"]
        end: int = p.extra["end"]
        if end >= info.inbox_done.get(node, -1):
            info.inbox_done[node] = end
            info.inbox_locs[node] = new_location(p.shard, offsets[len(ids)], lengths[len(ids)])

    def on_append_failed(self, event: ev.AppendFailed) -> None:
        p = self.out.pending[event.token]
        if p.kind == "inbox":
            # Whatever of the write reached the file stays there (an inbox is never cut: its
            # reader may have taken it already), so the owner may still run the task. Later
            # enqueues go to a new segment.
            del self.out.pending[event.token]
            failed: InboxSegment = p.extra["segment"]
            failed.in_flight -= 1
            failed.failed = True
            self.node.stats["total_enqueued"] -= 1
            message = proto.failed_to_enqueue(
                f"{event.error} (writing this daemon's inbox for {shard_name(p.shard)}; "
                "it may or may not be enqueued)"
            )
            self.out.send(proto.error(p.task_id, message))
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.node.tenure.appends_drained(p.shard, info)
        if p.tenure != info.tenure:
            del self.out.pending[event.token]  # from an earlier tenure: nothing to retry or say
            return
        if p.kind != "group":
            self._part_failed(event.token, p, info, event.error, event.permanent)
            return
        # Merged appends: each part fails as an append of its own (under a token of its own,
        # which a retry then uses); or, when the shell names the one record it could not
        # build, that record's part fails and the others, of which nothing was written, are
        # issued again as one new append.
        del self.out.pending[event.token]
        assert p.effect is not None
        records = p.effect.records
        bad = event.record
        again: list[tuple[PendingAppend, tuple[fx.NewRecord, ...]]] = []
        at = 0
        for part in p.extra["parts"]:
            end = at + part.count
            if part.tenure == info.tenure:  # (an earlier part may have stepped the node down)
                if bad is None or at <= bad < end:
                    token = self.out.next_token()
                    part.effect = new_append(token, p.shard, records[at:end], p.effect.lazy)
                    self.out.pending[token] = part
                    self._part_failed(token, part, info, event.error, event.permanent)
                else:
                    again.append((part, records[at:end]))
            at = end
        # A failed part handled after them may have stepped the node down from the shard.
        again = [(part, recs) for part, recs in again if part.tenure == info.tenure]
        if again:
            self.out.reissue(info, p.shard, again, lazy=p.effect.lazy)

    def _part_failed(
        self, token: int, p: PendingAppend, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        """The records of one append (or of one part of merged ones) did not reach the log;
        `p` is pending under `token`."""
        if p.kind == "ingest":
            # Nothing of it is in the log: forget its tasks and read the inbox again from
            # where the log says (after a pause, not in a loop on a full disk).
            del self.out.pending[token]
            for task_id in p.extra["tasks"]:
                task = self.node.book.tasks.get(task_id) if task_id is not None else None
                if task is not None and task.loc is None and task.state is ENQUEUING:
                    self.node.book.forget(task_id)
            node = p.extra["node"]
            info.inbox_taken[node] = info.inbox_done.get(node, 0)
            self.out.log(
                "warning",
                f"{shard_name(p.shard)}: could not ingest {node}'s inbox ({error}); "
                f"trying again in {self.config.retry_io_us // SECOND} s",
            )
            self.node.inbox.poll_at_mono = max(
                self.node.inbox.poll_at_mono or 0, self.node.now.mono + self.config.retry_io_us
            )
            return
        if p.kind == "enqueues":
            del self.out.pending[token]
            if p.answered:
                return
            message = proto.failed_to_enqueue(error)
            for task_id in p.extra["ids"]:
                dropped = self.node.book.tasks.pop(task_id, None)
                if dropped is not None:
                    self.node.book.drop_fingerprint(dropped)
                self.node.stats["total_enqueued"] -= 1
                self.out.send(proto.error(task_id, message))
            return
        if p.kind == "enqueue":
            del self.out.pending[token]
            if p.answered:
                return
            task = self.node.book.tasks.pop(p.task_id or "", None)
            flight = self.node.book.inflight.pop(p.task_id or "", None)
            if flight is not None:  # dispatched with its enqueue record: give the slot back
                self.node.book.pool_busy[flight.pool] -= 1
            self.node.stats["total_enqueued"] -= 1
            if task is not None:
                self.node.book.drop_fingerprint(task)
            message = proto.failed_to_enqueue(error)
            self.out.send(proto.error(p.task_id, message))
            for dup in p.dedupe_waiters:
                self.out.send(proto.error(dup, message))
            return
        if p.kind == "dispatches":
            del self.out.pending[token]
            for task_id in p.extra["ids"]:
                self.out.log("warning", f"task {task_id}: dispatch record not written ({error})")
                task = self.node.book.tasks.get(task_id)
                if task is not None and task.state is DISPATCHING:
                    # Try again later rather than spin on a full disk; the task keeps its place
                    # by urgency, and nothing else is dispatched from the shard meanwhile (a
                    # newer, less urgent task must not overtake it).
                    if info.hold_dispatch_until_mono is None:
                        info.hold_dispatch_until_mono = self.node.now.mono + self.config.retry_io_us
                    self.node.book.end_flight_unsent(task)
            return
        if p.kind == "finishes" and permanent:
            # One tombstone's base could not be read back (the shell wrote none of them): each
            # goes again as a "finish" of its own, so that one fails alone (and is
            # dead-lettered, below) and the others land.
            del self.out.pending[token]
            assert p.effect is not None
            for task_id, record in zip(p.extra["ids"], p.effect.records, strict=True):
                if task_id in self.node.book.tasks:
                    self.out.append(
                        p.shard,
                        (record,),
                        finish_pending(p.shard, task_id, OUTCOME_COMPLETED, None),
                    )
            return
        task = self.node.book.tasks.get(p.task_id or "")
        if permanent and task is not None and p.kind in ("retry", "rearm", "finish"):
            # The task's last record cannot be read back (damaged on disk): retrying cannot
            # help, and the task cannot run without its payload. Dead-letter it with a
            # tombstone that needs no base record, saying why.
            del self.out.pending[token]
            error = f"snerd could not rebuild the task's record: {error}"
            self.out.log("error", f"task {task.task_id}: {error}; dead-lettered")
            self.node.book.dead_letter_unbased(task, error)
            return
        # Outcome and claim records must land: retry the same append later.
        self.out.log(
            "warning",
            f"{shard_name(p.shard)}: could not write a {p.kind} record "
            f"({error}); retrying in {self.config.retry_io_us // SECOND} s",
        )
        self.out.retry_appends.push(token, self.node.now.mono + self.config.retry_io_us, 0)
