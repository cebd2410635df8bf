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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.model import (
    DISPATCHING,
    DRAINING,
    ENQUEUING,
    NODE_RUNNING,
    PARKED,
    READY,
    SECOND,
    UNOWNED,
    WAITING,
    ShardInfo,
    Task,
    new_ack_enqueued,
    new_append,
    new_location,
    queue_in,
)
from snerd.core.node.outbox import (
    ClaimPart,
    DispatchRun,
    EnqueuePart,
    EnqueueRun,
    FinishPart,
    FinishRun,
    FirePart,
    GroupPart,
    InboxPart,
    IngestPart,
    PausePart,
    PendingAppend,
    PurgePart,
    RearmPart,
    RequeuePart,
    RetryPart,
    SchedulePart,
)
from snerd.core.ownership import shard_name
from snerd.core.ready_queue import ReadyQueue
from snerd.core.schema import OUTCOME_COMPLETED

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["Outcomes"]

#: The kinds of part an append acked as it commits may hold (`Outcomes.on_commit`).
_EARLY_ACK_KINDS = (EnqueueRun, DispatchRun, FinishRun)


def _holds_enqueue(part: PendingAppend) -> bool:
    """Whether the append `part` carries an enqueue whose ack the SDK waits for."""
    if type(part) is GroupPart:
        return any(not inner.answered and _holds_enqueue(inner) for inner in part.parts)
    return type(part) is EnqueuePart or type(part) is EnqueueRun


Offsets = tuple[int, ...]
#: What the records of one part mean once in the log: (part, shard, offsets, lengths).
Committed = Callable[[Any, ShardInfo, Offsets, Offsets], None]
#: What one part's failure means: (token, part, shard, error, permanent).
Failed = Callable[[int, Any, ShardInfo, str, bool], None]


class Outcomes:
    """Commit and failure outcomes of appends, part by part (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox
        book, tenure, inbox = node.book, node.tenure, node.inbox
        #: The outcome of each kind of part, handed to the part that owns what it means
        #: (aioquic's frame-handler table): every kind an `Append` can carry is listed.
        self.committed: dict[type[PendingAppend], Committed] = {
            EnqueuePart: self._enqueue_committed,
            EnqueueRun: self._enqueues_committed,
            DispatchRun: self._dispatches_committed,
            FinishRun: self._finishes_committed,
            FinishPart: self._finish_committed,
            RetryPart: self._retry_committed,
            RearmPart: self._retry_committed,
            ClaimPart: tenure.claim_committed,
            IngestPart: inbox.ingest_committed,
            FirePart: node.schedules.fire_committed,
            SchedulePart: node.schedules.schedule_committed,
            PausePart: node.control.pause_committed,
            PurgePart: node.control.purge_committed,
            RequeuePart: node.control.requeue_committed,
        }
        self.failed: dict[type[PendingAppend], Failed] = {
            EnqueuePart: self._enqueue_failed,
            EnqueueRun: self._enqueues_failed,
            DispatchRun: self._dispatches_failed,
            FinishRun: self._finishes_failed,
            FinishPart: self._outcome_failed,
            RetryPart: self._outcome_failed,
            RearmPart: self._outcome_failed,
            ClaimPart: self._retry_later,
            IngestPart: inbox.ingest_failed,
            FirePart: node.schedules.fire_failed,
            SchedulePart: node.schedules.schedule_failed,
            PausePart: self._retry_later,
            PurgePart: self._retry_later,
            RequeuePart: node.control.requeue_failed,
        }
        self.book = book

    def _earlier_enqueue_waits(self, token: int) -> bool:
        """Whether an enqueue appended before `token` is still unanswered: its ack, left to
        the burst that handles its commit (or not durable yet), must not be overtaken, so
        that acks leave in the order of their enqueues across appends too. Few appends are
        in flight at once, so the walk is short."""
        for other, part in self.out.pending.items():
            if other < token and not part.answered and _holds_enqueue(part):
                return True
        return False

    def on_commit(
        self, token: int, now: ev.Now, offsets: Offsets, lengths: Offsets
    ) -> list[fx.Effect]:
        """What may be carried out the moment the append `token` is durable (at `offsets`),
        before the burst that handles its `AppendCommitted`: the shell asks straight after the
        fsync, so an ack or an `execute` does not wait for that burst. What is returned here
        is marked answered, and that burst does not do it again; a step-down before it does
        not tell the SDK the enqueue may be lost (`Tenure.step_down` skips answered enqueues).

        The test is that burst's own: the lease still runs at `now` (read after the fsync
        returned, so a record that landed after the lease ran out is never acked nor run),
        and the enqueue is not answered yet (a step-down answered every enqueue of the shard
        in flight). Three cases go early, anything else the burst's way:
        - an enqueue to this node's own inbox file: its ack, whatever the lease, as the burst
          would (the shard's owner ingests it);
        - runs of plain enqueues (`Intake.lines`), alone or merged only with dispatch records
          and tombstones (so acks leave in the order of their enqueues: an enqueue with
          options is acked by the burst), every task of them still known: their acks;
        - one task's enqueue dispatched with its record (`Intake._runs_at_once`), no duplicate
          waiting on it, the node not draining, no webhook: its ack, and the attempt starts
          here (`_enqueue_landed`: its state, its deadline, the `execute`).
        None of them goes early while an enqueue appended before it is unanswered
        (`_earlier_enqueue_waits`): acks leave in the order of their enqueues. No I/O."""
        p = self.out.pending.get(token)
        if p is None or p.answered:
            return []
        if type(p) is InboxPart:
            if self.node.verdicts.awaits(p) or p.schedule:
                return []  # answered with the owner's decision; a schedule's, as it lands
            p.answered = True
            return [new_ack_enqueued([p.task_id], p.shard)]
        if self.node.tenure.lease_over(now):
            return []
        if self._earlier_enqueue_waits(token):
            return []
        if type(p) is EnqueuePart:
            return self._enqueue_early(p, now, offsets, lengths)
        runs: list[EnqueueRun]
        if type(p) is EnqueueRun:
            runs = [p]
        elif type(p) is GroupPart:
            parts = p.parts
            if any(type(part) not in _EARLY_ACK_KINDS for part in parts):
                return []
            runs = [part for part in parts if isinstance(part, EnqueueRun) and not part.answered]
        else:
            return []
        tasks = self.book.tasks
        acked = [task_id for run in runs for task_id in run.ids]
        if not acked or not all(task_id in tasks for task_id in acked):
            return []
        for run in runs:
            run.answered = True
        return [new_ack_enqueued(acked, p.shard)]

    def _enqueue_early(
        self, p: EnqueuePart, now: ev.Now, offsets: Offsets, lengths: Offsets
    ) -> list[fx.Effect]:
        """`on_commit` for one task's enqueue dispatched with its record: its ack and the
        start of its attempt, unless anything could change them before the burst."""
        task = self.book.tasks.get(p.task_id)
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

    def on_append_committed(self, event: ev.AppendCommitted) -> None:
        p = self.out.pending.pop(event.token)
        if type(p) is InboxPart:
            self.node.inbox.segment_committed(p, event.offsets[-1] + event.lengths[-1])
            if p.ask:
                self.node.control.forwarded(p, event.offsets[0], event.log_identity, event.log_size)
            elif self.node.verdicts.awaits(p):
                self.node.verdicts.hold(p, event.offsets[0], event.log_identity, event.log_size)
            elif p.schedule:
                self.out.send(proto.scheduled(p.schedule, "forwarded"))
            elif not p.answered:
                self.out.send(proto.ack_enqueued(p.task_id, p.shard))
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.node.tenure.appends_drained(p.shard, info)
        if info.phase is UNOWNED or p.tenure != info.tenure:
            return
        info.size = max(info.size, event.offsets[-1] + event.lengths[-1])
        committed = self.committed
        if type(p) is not GroupPart:
            committed[type(p)](p, info, event.offsets, event.lengths)
            return
        offsets, lengths = event.offsets, event.lengths
        at = 0
        for part in p.parts:
            # An earlier part may have stepped the node down from the shard.
            if info.phase is UNOWNED or part.tenure != info.tenure:
                return
            end = at + part.count
            committed[type(part)](part, info, offsets[at:end], lengths[at:end])
            at = end

    # -- commits, one per kind of part

    def _enqueue_committed(
        self, p: EnqueuePart, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        task = self.book.tasks.get(p.task_id)
        if task is not None and not p.answered:  # (else acked and started, `on_commit`)
            self._enqueue_landed(p, task, offsets, lengths)

    def _enqueue_landed(
        self, p: EnqueuePart, task: Task, offsets: Offsets, lengths: Offsets
    ) -> None:
        """An enqueue part is in the log: ack it (and the duplicates waiting on it), then
        schedule its task or, dispatched with its record, start the attempt."""
        task.loc = new_location(p.shard, offsets[0], lengths[0])
        self.out.emit(new_ack_enqueued([task.task_id], task.shard))
        for dup in p.dedupe_waiters:
            self.out.send(
                proto.ack_enqueued(dup, task.shard, deduplicated=True, duplicate_of=task.task_id)
            )
        if task.state is DISPATCHING:
            # Dispatched with its enqueue record (`Intake._runs_at_once`): that record is second.
            task.dispatch_loc = new_location(p.shard, offsets[1], lengths[1])
            if self.node.phase is DRAINING:
                self.book.end_flight_unsent(task)  # not sent yet: it runs elsewhere
                return
            self.book.begin_execution(task)
            return
        self.book.schedule(task, self.node.now)

    def _dispatches_committed(
        self, p: DispatchRun, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        """A run of dispatch records: each attempt starts as its own would."""
        tasks = self.book.tasks
        for i, task_id in enumerate(p.ids):
            task = tasks.get(task_id)
            if task is not None:
                self._dispatch_committed(task, info, new_location(p.shard, offsets[i], lengths[i]))

    def _dispatch_committed(self, task: Task, info: ShardInfo, loc: fx.Location) -> None:
        """The dispatch record of `task`'s attempt is in the log: the attempt starts."""
        task.dispatch_loc = loc
        if task.group is not None:
            info.window_records.append((self.node.now.wall, loc))
        if self.node.phase is DRAINING and task.state is DISPATCHING:
            # Not sent yet, and we are draining: give the slot back; it runs elsewhere.
            self.book.end_flight_unsent(task)
            return
        self.book.begin_execution(task)

    def _finishes_committed(
        self, p: FinishRun, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        """A run of success tombstones: each task finishes as its own would."""
        book = self.book
        tasks = book.tasks
        for i, task_id in enumerate(p.ids):
            task = tasks.get(task_id)
            if task is not None:
                loc = new_location(p.shard, offsets[i], lengths[i])
                book.finished(task, OUTCOME_COMPLETED, None, loc)

    def _finish_committed(
        self, p: FinishPart, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        task = self.book.tasks.get(p.task_id)
        if task is not None:
            loc = new_location(p.shard, offsets[0], lengths[0])
            self.book.finished(task, p.outcome, p.error, loc)

    def _retry_committed(
        self, p: RetryPart | RearmPart, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        """A retry or re-arm record: the task's next attempt waits for `ready_at`."""
        book = self.book
        task = book.tasks.get(p.task_id)
        if task is None:
            return
        task.loc = new_location(p.shard, offsets[0], lengths[0])
        task.retry_count = task.attempt if type(p) is RetryPart else 0
        task.attempt = task.retry_count + 1
        task.dispatch_loc = None
        task.ready_at_us = p.ready_at
        if task.ready_at_us > self.node.now.wall:
            book.move(task, WAITING)
            book.due.push(task.task_id, task.ready_at_us, task.seq)
        else:
            book.move(task, READY)
            book.push_ready(task)

    def _enqueues_committed(
        self, p: EnqueueRun, info: ShardInfo, offsets: Offsets, lengths: Offsets
    ) -> None:
        """A run of plain enqueues (`Intake.lines`) is in the log: each is acked (unless the
        run is answered: the shell acked them as they committed, `on_commit`) and scheduled
        in turn, as an enqueue part would be (`TaskBook.schedule`, for a task with no
        parents, no webhook, due at once and not dispatched with its record): ready, or
        parked when no handler here takes its type (`TaskBook.park_by_type`). Consecutive
        ones bound for the same queue are pushed there in one call (`ReadyQueue.push_run`)."""
        ids, shard, ack = p.ids, p.shard, not p.answered
        book = self.book
        tasks = book.tasks
        registered = book.registered
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
                book.move(task, READY)  # (its check: a task is ENQUEUING until now)
            # ENQUEUING -> READY (-> PARKED): the moves `TaskBook.move` allows, made directly.
            if task.task_type in registered:
                task.state = READY
                target = queue_in(book.ready, task.pool)
            else:
                task.state = PARKED
                target = queue_in(book.parked_by_type, task.task_type)
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

    def on_append_failed(self, event: ev.AppendFailed) -> None:
        p = self.out.pending[event.token]
        if type(p) is InboxPart:
            del self.out.pending[event.token]
            self.node.inbox.segment_failed(p, event.error)
            if p.ask:
                self.node.control.forward_failed(p, event.error)
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.node.tenure.appends_drained(p.shard, info)
        if p.tenure != info.tenure:
            del self.out.pending[event.token]  # from an earlier tenure: nothing to retry or say
            return
        if type(p) is not GroupPart:
            self.failed[type(p)](event.token, p, info, event.error, event.permanent)
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
        failed = self.failed
        for part in p.parts:
            end = at + part.count
            if part.tenure == info.tenure:  # (an earlier part may have stepped the node down)
                if bad is None or at <= bad < end:
                    token = self.out.next_token()
                    part.effect = new_append(token, p.shard, records[at:end], p.effect.lazy)
                    self.out.pending[token] = part
                    failed[type(part)](token, part, info, event.error, event.permanent)
                else:
                    again.append((part, records[at:end]))
            at = end
        # A failed part handled after them may have stepped the node down from the shard.
        again = [(part, recs) for part, recs in again if part.tenure == info.tenure]
        if again:
            self.out.reissue(info, p.shard, again, lazy=p.effect.lazy)

    # -- failures, one per kind of part (`token`: the part's own, which a retry then uses)

    def _enqueue_failed(
        self, token: int, p: EnqueuePart, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        if p.answered:
            return
        book = self.book
        task = book.tasks.pop(p.task_id, None)
        flight = book.inflight.pop(p.task_id, None)
        if flight is not None:  # dispatched with its enqueue record: give the slot back
            book.pool_busy[flight.pool] -= 1
        self.node.stats["total_enqueued"] -= 1
        if task is not None:
            book.drop_fingerprint(task)
        message = proto.failed_to_enqueue(error)
        self.out.send(proto.error(p.task_id, message))
        for dup in p.dedupe_waiters:
            self.out.send(proto.error(dup, message))

    def _enqueues_failed(
        self, token: int, p: EnqueueRun, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        if p.answered:
            return
        book = self.book
        message = proto.failed_to_enqueue(error)
        for task_id in p.ids:
            dropped = book.tasks.pop(task_id, None)
            if dropped is not None:
                book.drop_fingerprint(dropped)
            self.node.stats["total_enqueued"] -= 1
            self.out.send(proto.error(task_id, message))

    def _dispatches_failed(
        self, token: int, p: DispatchRun, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        del self.out.pending[token]
        book = self.book
        for task_id in p.ids:
            self.out.log("warning", f"task {task_id}: dispatch record not written ({error})")
            task = book.tasks.get(task_id)
            if task is not None and task.state is DISPATCHING:
                # Try again later rather than spin on a full disk; the task keeps its place
                # by urgency, and nothing else is dispatched from the shard meanwhile (a
                # newer, less urgent task must not overtake it).
                if info.hold_dispatch_until_mono is None:
                    info.hold_dispatch_until_mono = self.node.now.mono + self.config.retry_io_us
                book.end_flight_unsent(task)

    def _finishes_failed(
        self, token: int, p: FinishRun, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        if not permanent:
            self._retry_later(token, p, info, error, permanent)
            return
        # One tombstone's base could not be read back (the shell wrote none of them): each
        # goes again as a finish of its own, so that one fails alone (and is dead-lettered,
        # `_outcome_failed`) and the others land.
        del self.out.pending[token]
        assert p.effect is not None
        tasks = self.book.tasks
        for task_id, record in zip(p.ids, p.effect.records, strict=True):
            if task_id in tasks:
                finish = FinishPart(p.shard, task_id=task_id, outcome=OUTCOME_COMPLETED)
                self.out.append(p.shard, (record,), finish)

    def _outcome_failed(
        self,
        token: int,
        p: RetryPart | RearmPart | FinishPart,
        info: ShardInfo,
        error: str,
        permanent: bool,
    ) -> None:
        task = self.book.tasks.get(p.task_id)
        if permanent and task is not None:
            # The task's last record cannot be read back (damaged on disk): retrying cannot
            # help, and the task cannot run without its payload. Dead-letter it with a
            # tombstone that needs no base record, saying why.
            del self.out.pending[token]
            error = f"snerd could not rebuild the task's record: {error}"
            self.out.log("error", f"task {task.task_id}: {error}; dead-lettered")
            self.book.dead_letter_unbased(task, error)
            return
        self._retry_later(token, p, info, error, permanent)

    def _retry_later(
        self, token: int, p: PendingAppend, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        """Outcome and claim records must land: retry the same append later."""
        self.out.log(
            "warning",
            f"{shard_name(p.shard)}: could not write a {p.KIND} record "
            f"({error}); retrying in {self.config.retry_io_us // SECOND} s",
        )
        self.out.retry_appends.push(token, self.node.now.mono + self.config.retry_io_us, 0)
