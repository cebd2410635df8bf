"""An in-memory shell for driving `snerd.core.node.Node` in unit tests (h11's ConnectionPair idea).

It carries out every effect against plain Python structures — logs are bytearrays of real
encoded records, membership is a dict, locks are a set — and feeds the outcomes back as events,
so tests go through the node's public API only. Time is a number the test moves.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

import orjson

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node import Node, NodeConfig
from snerd.core.ownership import LockText
from snerd.core.records import CorruptRecord, decode_line_at, encode_record, merge_base, scan
from snerd.core.story import Found, pick_story
from snerd.core.watch import pick, pick_marks, resume_at

SECOND = 1_000_000
T0 = 1_800_000_000 * SECOND  # a wall-clock origin in 2027


def _rest(data: bytes, end: int | None) -> int:
    """What a scan whose chunk of `data` ended at `end` (None: no chunk) left unread, of the
    complete lines (0: it read to the end)."""
    last = data.rfind(b"\n") + 1
    return 0 if end is None or end >= last else len(data) - end


class FakeShell:
    def __init__(self, config: NodeConfig | None = None, *, disk: dict[str, Any] | None = None):
        self.config = config or NodeConfig(node_id="test-node@pid-1-aa")
        #: Shared "disk", so a second FakeShell can restart on the same data.
        self.disk = disk if disk is not None else {"logs": {}, "membership": None, "locks": {}}
        #: Inbox files: (shard, segment) -> bytes; their `.read` hints: (shard, segment) -> int.
        self.disk.setdefault("inboxes", {})
        self.disk.setdefault("inbox_hints", {})
        #: What each shard's lock file says: the node that took the lock last, its epoch, and
        #: whether it let the lock go itself.
        self.disk.setdefault("lock_files", {})
        self.node = Node(self.config)
        self.wall = T0
        self.mono = 5 * SECOND
        self.sent: list[dict[str, Any]] = []
        self.executed: list[fx.Execute] = []
        self.webhooks: list[fx.CallWebhook] = []
        self.stopped: list[fx.StopAttempt] = []
        #: Every membership read the node asked for (with the locks it asked to touch).
        self.membership_reads: list[fx.ReadMembership] = []
        self.dead_letters: list[fx.DeliverDeadLetter] = []
        self.logs_out: list[tuple[str, str]] = []
        self.exit_code: int | None = None
        self.disk_full = False
        #: Fail appends whose base record is damaged, as the shell does (permanently).
        self.fail_bases = False
        #: Fail every membership read and write (an unreachable or vanished directory).
        self.fail_membership = False
        #: Appends held back (not yet committed) when `hold_appends` is on.
        self.hold_appends = False
        self.held: deque[fx.Append | fx.AppendInbox] = deque()
        #: Send the acks the node lets go as an append commits (`Node.on_commit`), as
        #: the daemon does; off: every ack comes from the burst that handles the commit.
        self.early_acks = True
        #: Appends committed while carrying out a call's effects, whose acks the node may let
        #: go once they are all carried out (as the daemon commits at the end of a burst).
        self.committing: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        #: Inbox appends held back too (`hold_appends` is for tasks.log).
        self.hold_inbox = False
        #: Compactions held back (not yet run) when `hold_compaction` is on.
        self.hold_compaction = False
        self.held_compactions: deque[fx.Compact] = deque()
        #: Membership writes held back (not yet carried out) when `hold_membership` is on.
        self.hold_membership = False
        self.held_membership: deque[fx.WriteMembership] = deque()
        self.queue: deque[ev.Event] = deque()
        #: `ReadInbox` effects carried out (looks at the inboxes).
        self.inbox_reads = 0
        #: `ScanQueue` effects carried out (looks at the queue's files for watched parents).
        self.scans = 0
        #: `ReadLogTail` effects carried out (looks at a shard's log for verdicts).
        self.log_tail_reads = 0

    # -------------------------------------------------------------- driving

    def now(self) -> ev.Now:
        return ev.Now(wall=self.wall, mono=self.mono)

    def feed(self, event: ev.Event) -> None:
        self.queue.append(event)
        self._pump()

    def _pump(self) -> None:
        while self.queue:
            e = self.queue.popleft()
            for effect in fx.lazy_last(self.node.handle(e, self.now())):
                self._do(effect)
            self._ack_committed()
            self.node.invariants()  # after every call, as the simulator may

    def _ack_committed(self) -> None:
        """Carry out what the node lets go for the appends just committed (`Node.on_commit`)."""
        committing, self.committing = self.committing, []
        for token, offsets, lengths in committing:
            for effect in self.node.on_commit(token, self.now(), offsets, lengths):
                self._do(effect)

    def acks_on_commit(
        self, append: fx.Append | fx.AppendInbox, now: ev.Now | None = None
    ) -> list[str]:
        """The task ids `Node.on_commit` acks for the held `append` (committed now, at made-up
        offsets), and nothing else it returns."""
        offsets = tuple(range(len(append.records)))
        lengths = (1,) * len(offsets)
        effects = self.node.on_commit(append.token, now or self.now(), offsets, lengths)
        assert all(isinstance(e, fx.AckEnqueued) for e in effects)
        return [t for e in effects if isinstance(e, fx.AckEnqueued) for t in e.task_ids]

    def start(self) -> None:
        self.feed(ev.Started())

    def line(self, message: dict[str, Any] | bytes) -> None:
        raw = message if isinstance(message, bytes) else orjson.dumps(message)
        self.feed(ev.LineReceived(line=raw))

    def burst(self, events: list[ev.Event]) -> list[fx.Effect]:
        """Feed `events` as one burst (`Node.handle_burst`, as the daemon feeds what arrived
        together), carry out its effects and what follows; returns the burst's effects."""
        effects = self.node.handle_burst(deque(events), self.now(), len(events))
        for effect in fx.lazy_last(effects):
            self._do(effect)
        self._ack_committed()
        self.node.invariants()
        self._pump()
        return effects

    def advance(self, seconds: float) -> None:
        """Move both clocks, waking the node at each deadline it asked for on the way."""
        target_wall = self.wall + int(seconds * SECOND)
        target_mono = self.mono + int(seconds * SECOND)
        while True:
            wait = self.node.wake_in(self.now())
            if wait is None or self.mono + wait > target_mono:
                break
            self.wall += wait
            self.mono += wait
            self.feed(ev.Tick())
            if wait == 0 and self.node.wake_in(self.now()) == 0:
                break
        self.wall, self.mono = target_wall, target_mono
        self.feed(ev.Tick())

    def release_compactions(self) -> None:
        self.hold_compaction = False
        while self.held_compactions:
            self._do(self.held_compactions.popleft())
        self._pump()

    def release_membership(self) -> None:
        """Carry out the held membership writes."""
        self.hold_membership = False
        while self.held_membership:
            self._do(self.held_membership.popleft())
        self._pump()

    def release_held(self) -> None:
        """Carry out the held appends: they fail if the disk is full now."""
        while self.held:
            effect = self.held.popleft()
            if self.disk_full:
                self.queue.append(ev.AppendFailed(token=effect.token, error="No space left"))
            elif isinstance(effect, fx.AppendInbox):
                self._commit_inbox(effect)
            else:
                self._commit(effect)
        self._ack_committed()
        self._pump()

    # -------------------------------------------------------------- shortcuts

    def enqueue(self, task_id: str, task_type: str = "t", data: Any = None, **extra: Any) -> None:
        msg = {
            "action": "enqueue",
            "task_id": task_id,
            "task_type": task_type,
            "task_data": orjson.dumps(data if data is not None else {"id": task_id}).decode(),
            "max_retries": extra.pop("max_retries", 0),
            "retry_after_hours": extra.pop("retry_after_hours", 0.0),
        }
        msg.update(extra)
        self.line(msg)

    def result(self, task_id: str, ok: bool = True, error: str | None = None) -> None:
        msg: dict[str, Any] = {
            "action": "result",
            "task_id": task_id,
            "status": "success" if ok else "error",
        }
        if error is not None:
            msg["error_msg"] = error
        self.line(msg)

    def register(self, task_type: str = "t") -> None:
        self.line({"action": "register", "task_type": task_type})

    def messages(self, action: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("action") == action]

    def executed_ids(self) -> list[str]:
        return [e.task_id for e in self.executed]

    def log_records(self, shard: int = 0) -> list[dict[str, Any]]:
        data = bytes(self.disk["logs"].get(shard, b""))
        return [record.fields for record in scan(data).records]  # corrupt lines skipped

    # -------------------------------------------------------------- effects

    def _do(self, effect: fx.Effect) -> None:
        if isinstance(effect, fx.ReadMembership):
            self.membership_reads.append(effect)
        if isinstance(effect, fx.Send):
            self.sent.append(effect.message)
        elif isinstance(effect, fx.AckEnqueued):
            self.sent += [proto.ack_enqueued(t, effect.shard) for t in effect.task_ids]
        elif isinstance(effect, fx.Log):
            self.logs_out.append((effect.level, effect.message))
        elif isinstance(effect, fx.Execute):
            self.executed.append(effect)
        elif isinstance(effect, fx.CallWebhook):
            self.webhooks.append(effect)
        elif isinstance(effect, fx.DeliverDeadLetter):
            self.dead_letters.append(effect)
        elif isinstance(effect, fx.Exit):
            self.exit_code = effect.code
        elif (isinstance(effect, fx.ReadMembership) and self.fail_membership) or (
            isinstance(effect, fx.WriteMembership) and self.fail_membership
        ):
            self.queue.append(ev.MembershipWriteFailed(doc=None, error="No such file"))
        elif isinstance(effect, fx.ReadMembership):
            self.queue.append(ev.MembershipRead(doc=self.disk["membership"]))
        elif isinstance(effect, fx.WriteMembership) and self.hold_membership:
            self.held_membership.append(effect)
        elif isinstance(effect, fx.WriteMembership):
            current = self.disk["membership"]
            # (An absent version counts as 0, as `snerd.io.membership.update_membership` reads it.)
            version = None if current is None else current.get("version", 0)
            if version != effect.expected_version:
                self.queue.append(ev.MembershipWriteFailed(doc=current, error="changed"))
            else:
                self.disk["membership"] = effect.doc
                self.queue.append(ev.MembershipWritten(doc=effect.doc))
        elif isinstance(effect, fx.TryLock):
            holder = self.disk["locks"].get(effect.shard)
            if holder is None or holder == effect.owner:
                # The lock file names its last holder and the epoch of its claim (the shell
                # writes them on taking the lock; a probe writes nothing).
                text = self.disk["lock_files"].get(effect.shard, LockText())
                self.disk["locks"][effect.shard] = effect.owner
                if not effect.probe:
                    self.disk["lock_files"][effect.shard] = LockText(
                        owner=effect.owner, epoch=effect.epoch
                    )
                self.queue.append(ev.LockAcquired(shard=effect.shard, previous=text))
            else:
                self.queue.append(ev.LockBusy(shard=effect.shard))
        elif isinstance(effect, fx.Unlock):
            if self.disk["locks"].get(effect.shard) == self.config.node_id:
                del self.disk["locks"][effect.shard]
                text = self.disk["lock_files"].get(effect.shard)
                if text is not None and text.owner == self.config.node_id:
                    # The shell marks the file released before it unlocks (a crash does not).
                    self.disk["lock_files"][effect.shard] = replace(text, released=True)
        elif isinstance(effect, fx.ReadLog):
            data = bytes(self.disk["logs"].get(effect.shard, b""))
            result = scan(data)
            records = tuple(result.records)
            corrupt = tuple(result.corrupt)
            self.queue.append(
                ev.LogRecordsRead(
                    shard=effect.shard, records=records, corrupt=corrupt, final=True, size=len(data)
                )
            )
        elif isinstance(effect, fx.Append):
            if self.disk_full:
                self.queue.append(ev.AppendFailed(token=effect.token, error="No space left"))
            elif self.hold_appends:
                self.held.append(effect)
            else:
                self._commit(effect)
        elif isinstance(effect, fx.AppendInbox):
            if self.disk_full:
                self.queue.append(ev.AppendFailed(token=effect.token, error="No space left"))
            elif self.hold_inbox:
                self.held.append(effect)
            else:
                self._commit_inbox(effect)
        elif isinstance(effect, fx.MarkInboxRead):
            self.disk["inbox_hints"][(effect.shard, effect.segment)] = effect.offset
        elif isinstance(effect, fx.RemoveInbox):
            self.disk["inboxes"].pop((effect.shard, effect.segment), None)
            self.disk["inbox_hints"].pop((effect.shard, effect.segment), None)
        elif isinstance(effect, fx.CheckInboxes):
            found = []
            for key in effect.segments:
                data = self.disk["inboxes"].get(key)
                found.append(
                    (*key, self.disk["inbox_hints"].get(key), None if data is None else len(data))
                )
            self.queue.append(ev.InboxProgress(segments=tuple(found)))
        elif isinstance(effect, fx.ReadInbox):
            self.inbox_reads += 1
            chunks = []
            present = tuple(
                (shard, tuple(sorted(n for s, n in self.disk["inboxes"] if s == shard)))
                for shard in effect.offsets
            )
            for (shard, node), data in sorted(self.disk["inboxes"].items()):
                if shard not in effect.offsets:
                    continue
                start = effect.offsets[shard].get(node, 0)
                end = bytes(data).rfind(b"\n", start, start + effect.max_bytes) + 1
                if end <= start:
                    continue
                result = scan(bytes(data[start:end]), base_offset=start)
                chunks.append(
                    ev.InboxChunk(
                        shard=shard,
                        node=node,
                        start=start,
                        end=end,
                        records=tuple(result.records),
                        corrupt=tuple(result.corrupt),
                    )
                )
            self.queue.append(ev.InboxRead(chunks=tuple(chunks), present=present))
        elif isinstance(effect, fx.ReadLogTail):
            self.log_tail_reads += 1
            self.queue.append(self._read_log_tail(effect))
        elif isinstance(effect, fx.ScanQueue):
            self.scans += 1
            self.queue.append(self._scan_queue(effect))
        elif isinstance(effect, fx.ReadTask):
            self.queue.append(self._read_task(effect))
        elif isinstance(effect, fx.StopAttempt):
            self.stopped.append(effect)
        elif isinstance(effect, fx.ReadRecord):
            loc = effect.location
            src = self.disk["logs"][loc.shard][loc.offset : loc.offset + loc.length]
            try:
                fields = decode_line_at(bytes(src), f"shard {loc.shard}:{loc.offset}")
            except CorruptRecord as exc:
                self.queue.append(ev.RecordRead(token=effect.token, error=str(exc)))
            else:
                self.queue.append(ev.RecordRead(token=effect.token, fields=fields))
        elif isinstance(effect, fx.Compact) and self.hold_compaction:
            self.held_compactions.append(effect)
        elif isinstance(effect, fx.Compact):
            log = bytes(self.disk["logs"].get(effect.shard, b""))
            new = bytearray()
            offsets, lengths = [], []
            for r in effect.keep:
                offsets.append(len(new))
                lengths.append(r.length)
                new += log[r.offset : r.offset + r.length]
            self.disk["logs"][effect.shard] = new
            generation = self.disk.setdefault("generations", {})
            generation[effect.shard] = generation.get(effect.shard, 1) + 1
            self.queue.append(
                ev.Compacted(
                    token=effect.token,
                    shard=effect.shard,
                    offsets=tuple(offsets),
                    lengths=tuple(lengths),
                    size=len(new),
                )
            )
        else:
            raise AssertionError(f"unexpected effect {effect!r}")

    def _read_log_tail(self, effect: fx.ReadLogTail) -> ev.LogTailRead:
        """What the daemon's shell does for a `ReadLogTail`: the shard's log (its identity is
        its compaction generation) from the offset given, through `pick_marks`."""
        identity = self.disk.get("generations", {}).get(effect.shard, 1)
        data = bytes(self.disk["logs"].get(effect.shard, b""))
        start = resume_at((effect.identity, effect.offset), identity, len(data))
        end = data.rfind(b"\n", start, start + effect.max_bytes) + 1 or start
        marks = pick_marks(data[start:end], start, effect.writers)
        return ev.LogTailRead(
            shard=effect.shard,
            identity=identity,
            start=start,
            end=end,
            size=len(data),
            records=tuple(marks),
        )

    def _scan_queue(self, effect: fx.ScanQueue) -> ev.QueueScanned:
        """What the daemon's shell does for a `ScanQueue`: every shard's log (its identity is
        its compaction generation) and inbox files, each from the offset known for it, through
        `pick`."""
        files: list[tuple[int, str, int, bytes]] = []
        generations = self.disk.get("generations", {})
        for shard in range(effect.shards):
            if shard in self.disk["logs"]:
                log = bytes(self.disk["logs"][shard])
                files.append((shard, "", generations.get(shard, 1), log))
            for (s, segment), data in sorted(self.disk["inboxes"].items()):
                if s == shard:
                    files.append((shard, segment, 1, bytes(data)))
        chunks = []
        for shard, segment, identity, data in files:
            known = effect.known.get((shard, segment))
            start = resume_at(known, identity, len(data))
            end = data.rfind(b"\n", start, start + effect.max_bytes) + 1
            if end <= start:
                continue
            records, corrupt, _ = pick(data[start:end], start, effect.ids)
            chunks.append(
                ev.ScanChunk(
                    shard=shard,
                    segment=segment,
                    identity=identity,
                    start=start,
                    end=end,
                    records=tuple(records),
                    corrupt=tuple(corrupt),
                )
            )
        ends = {(c.shard, c.segment): c.end for c in chunks}
        return ev.QueueScanned(
            chunks=tuple(chunks),
            files=tuple(
                (shard, seg, ident, _rest(data, ends.get((shard, seg))))
                for shard, seg, ident, data in files
            ),
        )

    def _read_task(self, effect: fx.ReadTask) -> ev.TaskRead:
        """What `snerd.io.scan.read_task` does, on this disk."""
        out: list[Found] = []
        for shard in range(effect.shards):
            files = [("log", bytes(self.disk["logs"].get(shard, b"")))]
            files += [
                (seg, bytes(data))
                for (s, seg), data in sorted(self.disk["inboxes"].items())
                if s == shard
            ]
            for source, data in files:
                picked, _ = pick_story(data, 0, effect.task_id)
                out += [Found(shard, source, r.offset, r.fields) for r in picked]
        return ev.TaskRead(token=effect.token, task_id=effect.task_id, found=tuple(out))

    def _build(self, record: fx.NewRecord) -> dict[str, Any]:
        """The line a record stands for, by the core's rule (`records.merge_base`)."""
        loc = record.base
        if loc is None:
            return dict(record.fields)
        src = self.disk["logs"][loc.shard][loc.offset : loc.offset + loc.length]
        base = decode_line_at(bytes(src), f"shard {loc.shard}:{loc.offset}+{loc.length}")
        return merge_base(base, record)

    def _commit(self, effect: fx.Append) -> None:
        log = self.disk["logs"].setdefault(effect.shard, bytearray())
        if self.fail_bases:
            for index, record in enumerate(effect.records):
                if record.base is None:
                    continue
                try:
                    self._build(record)
                except ValueError as exc:
                    self.queue.append(
                        ev.AppendFailed(
                            token=effect.token, error=str(exc), permanent=True, record=index
                        )
                    )
                    return
        offsets, lengths = [], []
        for record in effect.records:
            line = encode_record(self._build(record))
            offsets.append(len(log))
            lengths.append(len(line))
            log += line
        if self.early_acks:
            self.committing.append((effect.token, tuple(offsets), tuple(lengths)))
        self.queue.append(
            ev.AppendCommitted(token=effect.token, offsets=tuple(offsets), lengths=tuple(lengths))
        )

    def _commit_inbox(self, effect: fx.AppendInbox) -> None:
        log = self.disk["logs"].get(effect.shard)
        log_identity = self.disk.get("generations", {}).get(effect.shard, 1) if log else 0
        log_size = len(log) if log else 0
        inbox = self.disk["inboxes"].setdefault((effect.shard, effect.segment), bytearray())
        offsets, lengths = [], []
        for record in effect.records:
            line = encode_record(record.fields)
            offsets.append(len(inbox))
            lengths.append(len(line))
            inbox += line
        if self.early_acks:
            self.committing.append((effect.token, tuple(offsets), tuple(lengths)))
        self.queue.append(
            ev.AppendCommitted(
                token=effect.token,
                offsets=tuple(offsets),
                lengths=tuple(lengths),
                log_identity=log_identity,
                log_size=log_size,
            )
        )

    def payload(self, loc: fx.Location) -> str:
        src = self.disk["logs"][loc.shard][loc.offset : loc.offset + loc.length]
        data = decode_line_at(bytes(src), f"shard {loc.shard}:{loc.offset}")["taskData"]
        assert isinstance(data, str)
        return data
