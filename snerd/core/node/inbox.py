"""Inbox files: the tasks other nodes enqueue into the shards this node owns, and this node's
own inbox files for the shards it does not.

`InboxIngest` owns the polling of the inboxes of owned shards (when to read next, the read in
flight, the errors said once), their ingestion into a shard's log (`ingest`: the tasks of a
chunk and an `inbox` record saying how far the writer's file is taken, in one append), and this
node's own segments (`segment`: the file the next enqueue for a shard goes to; `check`: which
closed ones their owner has ingested, to remove). How far each writer's file is ingested is
per shard, in `ShardInfo.inbox_*`, which the replay and the step-down also set.

It never routes an enqueue (`snerd.core.node.node` decides which go to an inbox) and never
reads or writes a file itself: it emits `ReadInbox`, `CheckInboxes`, `RemoveInbox` and
`MarkInboxRead`, and the shell answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.control import answer_entry
from snerd.core.dedupe import FINISHED
from snerd.core.node.model import (
    ACTIVE,
    DRAINING,
    ENQUEUING,
    NODE_RUNNING,
    SECOND,
    InboxSegment,
    ShardInfo,
    inbox_segment_name,
    ingested,
    new_location,
    new_record,
    require,
)
from snerd.core.node.outbox import InboxPart, IngestPart
from snerd.core.ownership import shard_name
from snerd.core.records import CHECKSUM_KEY, task_problem
from snerd.core.schema import (
    AUTO_DEDUPE,
    DROP_AT,
    DROP_ERROR,
    DROP_OF,
    DROP_TASK,
    INBOX_ANSWERS,
    INBOX_DROPPED,
    INBOX_FROM,
    INBOX_NODE,
    INBOX_OFFSET,
    KIND_COMMAND,
    KIND_INBOX,
    KIND_SCHEDULE,
    PAYLOAD_HASH,
    SNERD_EPOCH,
    SNERD_KIND,
    SNERD_NODE,
    SNERD_SEQ,
    SNERD_UNIQUE_UNTIL,
    SNERD_VIA,
    TASK_ID,
)

if TYPE_CHECKING:
    from snerd.core.node.node import Node

__all__ = ["InboxIngest"]


class InboxIngest:
    """Inbox polling, ingestion and this node's own inbox segments (see the module
    docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.shards = node.shards
        self.out = node.outbox
        #: When to read the inboxes of owned shards next; a `ReadInbox` is out.
        self.poll_at_mono: int | None = None
        self.busy = False
        #: The errors the last inbox read met, (shard, text): each is said once, until a read
        #: no longer meets it (a link snerd refuses to follow stays until an operator removes
        #: it, and polls are frequent).
        self.errors: set[tuple[int, str]] = set()
        #: This node's own inbox files not removed yet, by (shard, name); the one appends go
        #: to, per shard; the next segment number per shard; when to check closed ones next.
        self.segments: dict[tuple[int, str], InboxSegment] = {}
        self.current: dict[int, InboxSegment] = {}
        self.next_segment: dict[int, int] = {}
        self.check_at_mono: int | None = None
        self.checking = False
        self.drain_until_mono: int | None = None
        #: When to tell the writers next how far their inboxes are ingested (`.read` hints).
        self.mark_at_mono = 0

    # -- timers (`Node.timers`)

    def invariants(self) -> None:
        """This node's own segments: the current one of each shard is open and known; none
        has a negative count in flight. Each writer's file is taken at least as far as it is
        durably ingested."""
        for shard, segment in self.current.items():
            require(segment.shard == shard, f"inbox segment {segment.name} filed under {shard}")
            require(not segment.closed, f"closed inbox segment {segment.name} still current")
            require(self.segments.get((shard, segment.name)) is segment, "current segment unknown")
        for (shard, name), segment in self.segments.items():
            require((segment.shard, segment.name) == (shard, name), f"inbox {name}: misfiled")
            require(segment.in_flight >= 0, f"inbox {name}: appends in flight < 0")
        for shard, info in self.shards.items():
            for writer, done in info.inbox_done.items():
                taken = info.inbox_taken.get(writer, 0)
                require(taken >= done, f"shard {shard}: {writer}'s inbox taken below what is done")

    def poll_due(self) -> int | None:
        """When the next look at the owned shards' inboxes is due (mono); None while one is
        out or the node is not running."""
        at = self.poll_at_mono
        if at is None or self.busy or self.node.phase is not NODE_RUNNING:
            return None
        return at

    def poll_fire(self, now: ev.Now) -> None:
        at = self.poll_at_mono
        if not self.busy and self.node.phase is NODE_RUNNING and (at is None or now.mono >= at):
            self.read()

    def check_due(self) -> int | None:
        """When to ask next how far this node's closed inbox files are ingested (mono)."""
        at = self.check_at_mono
        if at is None or not self.segments or self.checking:
            return None
        return at

    def check_fire(self, now: ev.Now) -> None:
        at = self.check_at_mono
        if not self.checking and self.segments and (at is None or now.mono >= at):
            self.check()

    def drain_wait_due(self) -> int | None:
        """Until when (mono) a drain waits for this node's inbox files to be ingested; the
        drain's progress reads it (`drain_pending`)."""
        at = self.drain_until_mono
        return at if at is not None and self.drain_pending() else None

    # -- polling and ingestion

    def read(self) -> None:
        """Look for tasks other nodes (or this one, while a shard was loading) wrote into the
        inboxes of the shards this node owns."""
        offsets = {
            shard: dict(info.inbox_taken)
            for shard, info in self.shards.items()
            if info.phase is ACTIVE and not info.giving_back
        }
        if not offsets:
            self.poll_at_mono = None  # polled again once a shard is ours
            return
        self.busy = True
        self.out.emit(fx.ReadInbox(offsets=offsets, max_bytes=self.config.inbox_read_bytes))

    def poll_interval(self, found: bool) -> int:
        """How long until the next look at the inboxes, `found` saying whether this one found
        any inbox file. Every `inbox_poll_us` while another node may be writing to them: the
        last membership read found another node's heartbeat live (`peers_live`), or a file
        is there (another node's, a dead one's not yet ingested, or this node's own from
        while a shard was loading). Otherwise every `inbox_idle_poll_us`: a lone daemon does
        not list its folders ten times a second (each look is a thread hop, and on a
        distributed filesystem a directory listing per shard). A node that joins is seen at
        the next membership read (`Tenure.on_membership_read` then looks sooner), so its first
        inbox tasks wait at most `inbox_idle_poll_us` for ingestion."""
        if found or self.node.tenure.peers_live:
            return self.config.inbox_poll_us
        return max(self.config.inbox_poll_us, self.config.inbox_idle_poll_us)

    def poll_soon(self) -> None:
        """Bring the next look at the inboxes to `inbox_poll_us` from now at the latest."""
        at = self.node.now.mono + self.config.inbox_poll_us
        if self.poll_at_mono is not None and self.poll_at_mono > at:
            self.poll_at_mono = at

    def on_inbox_read(self, event: ev.InboxRead) -> None:
        self.busy = False
        found = bool(event.chunks) or any(names for _, names in event.present)
        self.poll_at_mono = self.node.now.mono + self.poll_interval(found)
        errors = set(event.errors)
        for shard, error in event.errors:
            if (shard, error) not in self.errors:
                self.out.log(
                    "warning",
                    f"{shard_name(shard)}: cannot read its inbox: {error} (said once until "
                    "it changes; the inbox is tried again at every poll)",
                )
        self.errors = errors
        for shard, names in event.present:
            # A file gone from the folder was removed by its writer, which does so only once
            # it was ingested in full (per this shard's log): its offset is of no more use.
            info = self.shards.get(shard)
            if info is None:
                continue
            for name in [n for n in info.inbox_done if n not in names]:
                if info.inbox_taken.get(name) == info.inbox_done[name]:
                    del info.inbox_done[name], info.inbox_taken[name]
                    info.inbox_locs.pop(name, None)
                    info.inbox_marked.pop(name, None)
        for chunk in event.chunks:
            self.ingest(chunk)
        if self.node.now.mono >= self.mark_at_mono:
            # The writers remove their closed files once they see them ingested in full.
            self.mark_at_mono = self.node.now.mono + self.config.inbox_check_us
            for shard, info in self.shards.items():
                for name, done in info.inbox_done.items():
                    if info.inbox_marked.get(name) != done:
                        info.inbox_marked[name] = done
                        self.out.emit(fx.MarkInboxRead(shard=shard, segment=name, offset=done))

    def check(self) -> None:
        """Ask how far the owners have ingested this node's closed inbox files."""
        now = self.node.now.mono
        draining = self.node.phase is DRAINING
        self.check_at_mono = now + (
            self.config.inbox_poll_us if draining else self.config.inbox_check_us
        )
        segments = tuple(key for key, s in self.segments.items() if s.closed and not s.in_flight)
        if segments:
            self.checking = True
            self.out.emit(fx.CheckInboxes(segments=segments))

    def on_inbox_progress(self, event: ev.InboxProgress) -> None:
        self.checking = False
        for shard, name, read, size in event.segments:
            segment = self.segments.get((shard, name))
            if segment is None or not segment.closed or segment.in_flight:
                continue
            if size is None:
                del self.segments[(shard, name)]  # gone already
            elif size == 0 or ingested(read, size):
                # All of it is ingested (a failed write's partial line, which the owner never
                # reads past, keeps a file from ever getting here).
                del self.segments[(shard, name)]
                self.out.emit(fx.RemoveInbox(shard=shard, segment=name))

    def drain_pending(self) -> bool:
        """A drain still waits for this node's inbox files to be ingested and removed."""
        until = self.drain_until_mono
        return until is not None and self.node.now.mono < until and bool(self.segments)

    def ingest(self, chunk: ev.InboxChunk) -> None:
        """Enqueue the tasks of one inbox chunk into the shard's log, followed by an `inbox`
        record saying how far the writer's file is now ingested; all in one append."""
        info = self.shards.get(chunk.shard)
        if (
            info is None
            or self.node.phase is not NODE_RUNNING
            or info.phase is not ACTIVE
            or info.giving_back
            or chunk.start != info.inbox_taken.get(chunk.node, 0)
        ):
            return  # read for an ownership or a position that has changed since: read again
        if info.inbox_done.get(chunk.node, 0) != chunk.start:
            # An ingest of this file is still in flight: one at a time. Were this chunk's
            # ingest to commit after that one failed, its `inbox` record would say the file
            # is read past the failed chunk, whose tasks (acked by their writer) would be
            # lost, here and on every replay. Read again once that one has landed.
            return
        where = f"{shard_name(chunk.shard)}/inbox/{chunk.node}.log"
        records: list[fx.NewRecord] = []
        ids: list[str | None] = []
        taken: set[str] = set()
        dropped: list[dict[str, Any]] = []
        answers: list[dict[str, Any]] = []
        end = chunk.end
        for record in chunk.records:
            if self._waits_at_ingest(record.fields, taken, chunk.shard):
                # What it would be dropped against is not in the log yet: dropped now, this
                # record (acked by its writer) would be lost if that append failed and this
                # one landed. The file is taken up to it; the rest is read again later.
                end = record.offset
                break
            if record.fields.get(SNERD_KIND) == KIND_COMMAND:
                # A cancel, retry or pause another daemon took: its records (a tombstone, a
                # task put back, a pause) join this ingest's append; its answer, the mark.
                answer = self.node.control.ingest(record.fields, chunk.shard)
                if isinstance(answer, str):
                    self.out.log("warning", f"{where}: byte {record.offset}: {answer}; skipped")
                else:
                    answers.append(answer_entry(record.offset, answer))
                continue
            task_id = self._ingest_one(chunk, record, info, where, dropped)
            if task_id is None:
                continue
            ids.append(task_id)
            taken.add(task_id)
            records.append(new_record(record.fields))
        for offset, reason in chunk.corrupt:
            if offset < end:
                self.out.log(
                    "warning", f"{where}: skipped a corrupt line at byte {offset} ({reason})"
                )
        if end == chunk.start:
            return
        mark: dict[str, Any] = {
            SNERD_KIND: KIND_INBOX,
            INBOX_NODE: chunk.node,
            INBOX_OFFSET: end,
            INBOX_FROM: chunk.start,
        }
        if dropped:
            mark[INBOX_DROPPED] = [d for d in dropped if d[DROP_AT] < end]
        if answers:
            mark[INBOX_ANSWERS] = answers
        records.append(new_record({**mark, **self.node.tenure.meta(chunk.shard)}))
        info.inbox_taken[chunk.node] = end
        self.out.append(
            chunk.shard,
            records,
            IngestPart(chunk.shard, tasks=ids, writer=chunk.node, end=end),
        )

    def _waits_at_ingest(self, fields: dict[str, Any], taken: set[str], shard: int) -> bool:
        """An inbox record that `_ingest_one` would drop only against live tasks whose records
        are not in the log yet (an enqueue in flight, another ingest): the task with its id,
        or every live task with its dedupe fingerprint. Those taken in by the same ingest do
        not count: its records land together. Or a command `Control` cannot decide yet."""
        if fields.get(SNERD_KIND) == KIND_COMMAND:
            return self.node.control.waits_at_ingest(fields, shard)
        task_id = fields.get(TASK_ID)
        same = self.node.book.tasks.get(task_id) if isinstance(task_id, str) else None
        if same is not None:
            return same.loc is None and same.task_id not in taken
        payload_hash = fields.get(PAYLOAD_HASH)
        if not fields.get(AUTO_DEDUPE) or not isinstance(payload_hash, str):
            return False
        twins = self.node.book.fingerprints.get(payload_hash, {})
        return bool(twins) and all(
            self.node.book.tasks[t].loc is None and t not in taken for t in twins
        )

    def _ingest_one(
        self,
        chunk: ev.InboxChunk,
        record: ev.LogRecord,
        info: ShardInfo,
        where: str,
        dropped: list[dict[str, Any]],
    ) -> str | None:
        """Take one inbox record in as a new task of the shard (its fields rewritten in place
        to be this node's record); None when it is dropped, with the reason logged and, for a
        task record, added to `dropped` (the `inbox` record tells its writer, which may be
        waiting to answer the enqueue: `snerd.core.node.verdicts`)."""
        f = record.fields
        task_id = f.get(TASK_ID)
        if f.get(SNERD_KIND) == KIND_SCHEDULE:
            # A declaration another daemon took for a schedule of this shard: its record, if
            # anything changed, joins this ingest's append (one write: both land or neither).
            why = self.node.schedules.ingest(f, chunk.shard)
            if why is not None:
                self.out.log("warning", f"{where}: byte {record.offset}: {why}; skipped")
            return None
        if f.get(SNERD_KIND) is not None or not isinstance(task_id, str):
            self.out.log("warning", f"{where}: byte {record.offset} is not a task record; skipped")
            return None

        def refuse(error: str) -> None:
            dropped.append({DROP_TASK: task_id, DROP_AT: record.offset, DROP_ERROR: error})

        existing = self.node.book.tasks.get(task_id)
        if existing is not None:
            self.out.log(
                "warning",
                f"task {task_id} from {where} dropped: a task with that id is already pending",
            )
            refuse(proto.already_pending(task_id, existing.state.value))
            return None
        why = task_problem(f)
        if why is not None:
            # Its writer took no such enqueue: a line written by hand (or by an older version).
            self.out.log("warning", f"{where}: {why} (at byte {record.offset}); skipped")
            refuse(proto.failed_to_enqueue(why))
            return None
        payload_hash = f.get(PAYLOAD_HASH)
        original = (
            self.node.book.twin(payload_hash, f.get(SNERD_UNIQUE_UNTIL) or FINISHED)
            if f.get(AUTO_DEDUPE) and isinstance(payload_hash, str)
            else None
        )
        if original is not None:
            self.node.stats["total_deduplicated"] += 1
            self.out.log(
                "info",
                f"task {task_id} from {where} dropped as a duplicate of task {original.task_id}",
            )
            dropped.append({DROP_TASK: task_id, DROP_AT: record.offset, DROP_OF: original.task_id})
            return None
        task = self.node.book.task_from_record(chunk.shard, f, None)
        if task is None:
            self.out.log("warning", f"task {task_id} from {where}: unreadable record; skipped")
            refuse(proto.failed_to_enqueue("its record could not be read"))
            return None
        cycle = (
            self.node.book.cycle(task_id, task.trigger_after_ids)
            if task.trigger_after_ids
            else None
        )
        if cycle is not None:
            self.out.log(
                "error",
                f"task {task_id} from {where} dropped: cycle detected involving task {cycle}",
            )
            refuse(proto.failed_to_enqueue(f"Cycle detected involving task {cycle}"))
            return None
        f.pop(CHECKSUM_KEY, None)
        f[SNERD_NODE] = self.config.node_id
        f[SNERD_EPOCH] = info.epoch
        f[SNERD_SEQ] = info.next_seq
        f[SNERD_VIA] = chunk.node
        info.next_seq += 1
        self.node.book.tasks[task_id] = task
        self.node.book.add_fingerprint(task)
        self.node.stats["total_enqueued"] += 1
        return task_id

    def segment(self, shard: int) -> InboxSegment:
        """The inbox file the next enqueue for `shard` goes to: a new segment once the current
        one is big, or after a write to it failed."""
        current = self.current.get(shard)
        if (
            current is not None
            and not current.failed
            and current.end < self.config.inbox_segment_bytes
        ):
            return current
        if current is not None:
            current.closed = True
        n = self.next_segment.get(shard, 0)
        self.next_segment[shard] = n + 1
        name = inbox_segment_name(self.config.node_id, n)
        segment = self.current[shard] = InboxSegment(shard=shard, name=name)
        self.segments[(shard, name)] = segment
        return segment

    # -- outcomes of the appends this part made (dispatched by `Outcomes`)

    def segment_committed(self, p: InboxPart, end: int) -> None:
        """An enqueue into this node's own inbox file is durable (the file holds `end` bytes
        at least). (`Outcomes` answers it.)"""
        segment = p.segment
        assert segment is not None
        segment.in_flight -= 1
        segment.end = max(segment.end, end)

    def segment_failed(self, p: InboxPart, error: str) -> None:
        """Whatever of the write reached the file stays there (an inbox is never cut: its
        reader may have taken it already), so the owner may still run the task. Later
        enqueues go to a new segment."""
        segment = p.segment
        assert segment is not None
        segment.in_flight -= 1
        segment.failed = True
        where = f"writing this daemon's inbox for {shard_name(p.shard)}"
        if p.schedule:
            message = f"Failed to schedule: {error} ({where}; it may or may not be applied)"
            self.out.send(proto.schedule_error(p.schedule, message))
            return
        self.node.stats["total_enqueued"] -= 1
        message = proto.failed_to_enqueue(f"{error} ({where}; it may or may not be enqueued)")
        self.out.send(proto.error(p.task_id, message))

    def ingest_committed(
        self, p: IngestPart, info: ShardInfo, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        """An ingest append landed: its tasks are enqueued here, the inbox read that far."""
        book = self.node.book
        ids = p.tasks
        for i, task_id in enumerate(ids):
            task = book.tasks.get(task_id) if task_id is not None else None
            if task is None or task.loc is not None or task.state is not ENQUEUING:
                continue
            task.loc = new_location(p.shard, offsets[i], lengths[i])
            book.schedule(task, self.node.now)
        writer, end = p.writer, p.end
        if end >= info.inbox_done.get(writer, -1):
            info.inbox_done[writer] = end
            info.inbox_locs[writer] = new_location(p.shard, offsets[len(ids)], lengths[len(ids)])

    def ingest_failed(
        self, token: int, p: IngestPart, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        """Nothing of it is in the log: forget its tasks and read the inbox again from where
        the log says (after a pause, not in a loop on a full disk)."""
        del self.out.pending[token]
        book = self.node.book
        for task_id in p.tasks:
            task = book.tasks.get(task_id) if task_id is not None else None
            if task is not None and task.loc is None and task.state is ENQUEUING:
                book.forget(task.task_id)
        writer = p.writer
        info.inbox_taken[writer] = info.inbox_done.get(writer, 0)
        self.out.log(
            "warning",
            f"{shard_name(p.shard)}: could not ingest {writer}'s inbox ({error}); "
            f"trying again in {self.config.retry_io_us // SECOND} s",
        )
        self.poll_at_mono = max(
            self.poll_at_mono or 0, self.node.now.mono + self.config.retry_io_us
        )
