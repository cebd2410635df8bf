"""The simulated shell: what `snerd.io.runtime` does with each effect, against `sim.fs`.

The shell carries out a node's effects a moment after the node decided them and answers each
with the event the real shell would send: a filesystem call's outcome after an I/O latency
drawn per call, on one of the process's lanes ("log": the group-commit writer thread; "meta":
membership, locks and reads), where calls complete in order. `_EFFECTS` maps every effect type
to the one method that carries it out, as the daemon's own table does (`snerd.io.runtime`); an
effect without an entry is a bug in the simulator, and stops the run.

The shell also keeps what the history needs to say about files. An append is in its file from
the moment its `write(2)` is issued, and durable only once its fsync returns, so records are
listed in file order once they and every append before them are resolved (durable, lost in a
crash, or in a file a compaction replaced); inbox records as they become durable. It knows the
lock files' text, and which part of each log a process read at its last load (a compaction
copies what its compactor read).

It drives the node only through its public API (`on_commit`) and reads what else it needs to
record through `sim.node_view`. Where the daemon's rule for a record lives in the core
(`records.merge_base`, `records.scan_tail`), the shell calls it rather than keeping a copy.
It is one module because it is one vocabulary: twenty effect types, the writer thread's
batching, and the file-order bookkeeping the append, compaction and crash paths share.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from heapq import heappush
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from sim.fs import InboxKey, SimFS
from sim.node_view import claim_epoch
from sim.process import APPEND_DONE, APPEND_ISSUE, CARRY_OUT, DELIVER, MEMBERSHIP_DONE, Proc
from sim.settings import uniform
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.control import decided_in
from snerd.core.ownership import LockText, owned_by
from snerd.core.records import (
    CorruptRecord,
    decode_line_at,
    encode_record,
    merge_base,
    scan,
    scan_tail,
)
from snerd.core.schema import SNERD_EPOCH, TASK_DATA, TASK_ID
from snerd.core.slots import slot_constructor
from snerd.core.story import Found, pick_story
from snerd.core.watch import ends_a_task, pick, pick_marks, resume_at

if TYPE_CHECKING:
    from sim.world import World

__all__ = ["Shell"]

_APPEND_INBOX = fx.AppendInbox
#: Constructors of the commonest events, without the frozen dataclasses' `__init__`.
_inbox_read = slot_constructor(ev.InboxRead, "chunks", "present")
_append_committed = slot_constructor(ev.AppendCommitted, "token", "offsets", "lengths")
_membership_read = slot_constructor(ev.MembershipRead, "doc")


@dataclass(slots=True)
class _Append:
    """An append issued by a process's writer thread, until its fsync returns."""

    token: int
    shard: int
    seq: int
    records: list[dict[str, Any]]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    t_issue: int
    epoch: int
    error: str | None
    handle: Any = None
    #: An append to the process's own inbox file of `shard` (`fx.AppendInbox`).
    inbox: bool = False
    #: When the node handed it to its writer thread (at or before `t_issue`).
    t_queued: int = 0
    #: An inbox append that notes the shard's log (`note_log`): its identity and size before.
    log_before: tuple[int, int] | None = None


class Shell:
    """The shell of every process of one world (what it does depends on the process's state,
    which the world keeps)."""

    def __init__(self, world: World, fs: SimFS, rng_io: random.Random) -> None:
        self.world = world
        self.s = world.s
        self.fs = fs
        self.rng_io = rng_io
        #: What each `shard-N/.lock` file says: the node id of the process that took it last,
        #: the epoch of the claim it took it under, and whether it let it go itself.
        self.lock_files: dict[int, LockText] = {}
        #: Shard-log appends issued and not yet recorded: seq -> (handle, append, writer name).
        self._handles: dict[int, tuple[Any, _Append, str]] = {}
        #: Appends issued to each shard's log, in file order, not yet recorded.
        self._order: dict[int, deque[int]] = {}
        #: Resolved appends: seq -> when durable (None: lost, or in a replaced file).
        self._resolved: dict[int, int | None] = {}
        #: How much of a shard's log a process read at its last load.
        self._loaded: dict[tuple[str, int], int] = {}
        #: Inbox appends not yet durable: seq -> (handle, append, writer name).
        self._inbox_handles: dict[int, tuple[Any, _Append, str]] = {}

    # ------------------------------------------------------------------ plumbing

    def _io_latency(self, lo: int, hi: int) -> int:
        s, rng = self.s, self.rng_io
        if s.slow_io_prob and not self.world.liveness and rng.random() < s.slow_io_prob:
            return uniform(rng, hi, max(hi, s.slow_io_max_us))
        return lo + int(rng.random() * (hi - lo + 1)) if hi > lo else lo  # _uniform inline

    def _io_done_at(self, proc: Proc, lo: int, hi: int, lane: str = "meta") -> int:
        """When an I/O call of `proc` issued now completes: calls on one lane complete in
        order."""
        lanes = proc.lanes
        at = self.world.t + self._io_latency(lo, hi)
        if at < lanes[lane]:
            at = lanes[lane]
        lanes[lane] = at
        return at

    def carry_out(self, proc: Proc, effects: list[fx.Effect]) -> None:
        """Carry out `effects` of `proc` in order, the lazy ones last (`fx.lazy_last`); a
        paused process's wait for it to resume."""
        if proc.state == "paused":
            proc.waiting.append((CARRY_OUT, effects))
            return
        table = _EFFECTS
        for effect in fx.lazy_last(effects):
            handler = table.get(type(effect))
            if handler is None:
                raise AssertionError(f"the simulated shell has no handler for {effect!r}")
            handler(self, proc, effect)

    def answer(self, proc: Proc, event: ev.Event, lo: int, hi: int, lane: str = "meta") -> None:
        """Answer `proc` with `event` when a call on `lane` issued now completes (its latency
        drawn from `lo` to `hi` µs, or longer with slow I/O)."""
        # `_io_done_at` and `_io_latency` written out (an answer per meta call), and the
        # world's `at`.
        s, rng, world = self.s, self.rng_io, self.world
        if s.slow_io_prob and not world.liveness and rng.random() < s.slow_io_prob:
            at = world.t + uniform(rng, hi, max(hi, s.slow_io_max_us))
        else:
            at = world.t + lo + int(rng.random() * (hi - lo + 1))  # `uniform` inline (hi > lo)
        lanes = proc.lanes
        if at < lanes[lane]:
            at = lanes[lane]
        lanes[lane] = at
        world.seq += 1
        heappush(world.queue, (at, world.seq, DELIVER, proc.index, proc.inc, event))

    # ------------------------------------------------------------------ the effects

    def _send(self, proc: Proc, effect: fx.Send) -> None:
        msg = effect.message
        if self.world.commands.answered(proc, msg):
            return  # (the answer to a job-control command, recorded by `sim.commands`)
        task = msg.get("task_id")
        if not isinstance(task, str) or task not in proc.outstanding:
            return
        action = msg.get("action")
        if action == "ack":
            shard = msg.get("shard")
            number = (
                int(shard[6:]) if isinstance(shard, str) and shard.startswith("shard-") else None
            )
            undecided = "deduplicated" in msg and msg["deduplicated"] is None
            twin = msg.get("duplicate_of")
            self._acked(
                proc,
                task,
                number,
                bool(msg.get("deduplicated")),
                undecided,
                twin if isinstance(twin, str) else None,
            )
        elif action == "error":
            del proc.outstanding[task]
            self.world.record({"kind": "enqueue", "phase": "fail", "task": task, "node": proc.name})

    def _ack_enqueued(self, proc: Proc, effect: fx.AckEnqueued) -> None:
        outstanding = proc.outstanding
        for task in effect.task_ids:
            if task in outstanding:
                self._acked(proc, task, effect.shard, False)

    def _acked(
        self,
        proc: Proc,
        task: str,
        shard: int | None,
        deduplicated: bool,
        undecided: bool = False,
        duplicate_of: str | None = None,
    ) -> None:
        del proc.outstanding[task]
        entry: dict[str, Any] = {"kind": "enqueue", "phase": "ok", "task": task}
        entry["node"] = proc.name
        if shard is not None:
            entry["shard"] = shard
        if deduplicated:
            entry["deduplicated"] = True
            if duplicate_of is not None:
                entry["duplicate_of"] = duplicate_of
        if undecided:
            entry["undecided"] = True
        self.world.record(entry)

    def _log(self, proc: Proc, effect: fx.Log) -> None:
        if effect.level == "error":
            self.world.counters["node_errors"] += 1

    def _read_record(self, proc: Proc, effect: fx.ReadRecord) -> None:
        """What `snerd.io.runtime` does: the record at the location, read back whole."""
        loc = effect.location
        raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
        try:
            fields_ = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
        except CorruptRecord as exc:
            read = ev.RecordRead(token=effect.token, error=str(exc))
        else:
            read = ev.RecordRead(token=effect.token, fields=fields_)
        self.answer(proc, read, 200, 2_000)

    def _read_task(self, proc: Proc, effect: fx.ReadTask) -> None:
        """What `snerd.io.scan.read_task` does: every record of the task in every shard's log
        and inbox files, through `snerd.core.story.pick_story`."""
        fs = self.fs
        found: list[Found] = []
        for shard in range(effect.shards):
            keys: list[tuple[str, InboxKey | int]] = [("log", shard)]
            keys += [(key.node, key) for key in fs.inboxes(shard)]
            for source, key in keys:
                if fs.identity(key) is None:
                    continue
                data = fs.read_range(key, 0, fs.log_size(key))
                records, _ = pick_story(data, 0, effect.task_id)
                found += [Found(shard, source, r.offset, r.fields) for r in records]
        read = ev.TaskRead(token=effect.token, task_id=effect.task_id, found=tuple(found))
        self.answer(proc, read, 1_000, 10_000)

    def _stop_attempt(self, proc: Proc, effect: fx.StopAttempt) -> None:
        """Recorded; the simulated handler runs on and its result, if it comes, is one the
        node drops (a stopped attempt's)."""
        self.world.record(
            {"kind": "stop", "task": effect.task_id, "attempt": effect.attempt, "node": proc.name}
        )

    def _execute(self, proc: Proc, effect: fx.Execute) -> None:
        loc = effect.location
        raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
        problem = None
        try:
            fields_ = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
        except CorruptRecord as exc:
            problem = f"from an unreadable record at shard-{loc.shard}@{loc.offset} ({exc})"
        else:
            if fields_.get(TASK_ID) != effect.task_id:
                problem = (
                    f"but its location shard-{loc.shard}@{loc.offset} holds "
                    f"{fields_.get(TASK_ID)!r}"
                )
        if problem is not None:
            if loc.shard in self.world.believed(proc):
                # Its owner's index points at the wrong bytes: a bug in the node.
                self.world.violation(
                    f"t={self.world.t}: {proc.name} executes {effect.task_id} {problem}"
                )
                return
            # Decided while it owned the shard, carried out after its lease ran out (paused
            # in between), when the next owner may have compacted the log: the shell finds
            # the payload unreadable and says so, as `snerd.io.runtime` does.
            self.answer(
                proc,
                ev.PayloadUnreadable(task_id=effect.task_id, attempt=effect.attempt, error=problem),
                100,
                1_000,
                "log",
            )
            return
        self.world.counters["executions"] += 1
        self.world.record(
            {
                "kind": "execute",
                "task": effect.task_id,
                "attempt": effect.attempt,
                "node": proc.name,
                "shard": loc.shard,
                "epoch": claim_epoch(proc.node, loc.shard),
            }
        )
        self.world.workload.run_handler(proc, effect)

    def _dead_letter(self, proc: Proc, effect: fx.DeliverDeadLetter) -> None:
        self.world.record({"kind": "dead_letter", "task": effect.task_id, "node": proc.name})

    def _webhook(self, proc: Proc, effect: fx.CallWebhook) -> None:
        done = ev.WebhookFinished(task_id=effect.task_id, attempt=effect.attempt, ok=True)
        self.answer(proc, done, 1_000, 10_000)

    def _exit(self, proc: Proc, effect: fx.Exit) -> None:
        self.world.down(proc, crashed=False)

    def _read_membership(self, proc: Proc, effect: fx.ReadMembership) -> None:
        # The locks the node asks to touch first (a renewal point: a lock lost with an error
        # surfaces here, as in snerd.io.runtime).
        for shard in effect.touch:
            error = self.fs.touch_lock(proc.pid, shard)
            if error is not None:
                self.answer(proc, ev.LockLost(shard=shard, error=error), 100, 1_000)
        if self.world.t < proc.unreachable_until:
            failed = ev.MembershipWriteFailed(doc=None, error="membership.json unreachable")
            self.answer(proc, failed, 500, 5_000)
            return
        self.answer(proc, _membership_read(self.fs.read_membership()), 500, 5_000)

    def _write_membership(self, proc: Proc, effect: fx.WriteMembership) -> None:
        s, world = self.s, self.world
        faults = not world.liveness
        r1, r2 = self.rng_io.random(), self.rng_io.random()
        fail_before = faults and (r1 < s.membership_fail_prob or world.t < proc.unreachable_until)
        fail_after = faults and not fail_before and r2 < s.membership_unknown_prob
        # The write lands when it completes (a late renewal lands late), judged then against
        # the version it expects.
        at = self._io_done_at(proc, 1_000, 10_000)
        world.at(at, MEMBERSHIP_DONE, proc.index, proc.inc, (effect, fail_before, fail_after))

    def membership_done(
        self, proc: Proc, effect: fx.WriteMembership, before: bool, after: bool
    ) -> None:
        """A membership write of `proc` lands now (`before`, `after`: whether it fails before or
        after it takes effect, drawn when it was issued), and the node hears how it went."""
        out = self.fs.write_membership(
            proc.pid, effect.doc, effect.expected_version, fail_before=before, fail_after=after
        )
        event: ev.Event
        if out.ok:
            assert out.doc is not None
            event = ev.MembershipWritten(doc=out.doc)
            if self.s.max_shards is not None:
                self.world.check_cap(proc, "is given by its claims", owned_by(out.doc, proc.name))
        else:
            event = ev.MembershipWriteFailed(doc=out.doc, error=out.error or "failed")
        self.world.deliver(proc, event)

    def _try_lock(self, proc: Proc, effect: fx.TryLock) -> None:
        shard = effect.shard
        event: ev.Event
        if self.fs.try_lock(proc.pid, shard):
            # The shell reads what the lock file says, then writes its own node id and epoch
            # into it (a probe writes nothing).
            text = self.lock_files.get(shard, LockText())
            if not effect.probe:
                self.lock_files[shard] = LockText(owner=effect.owner, epoch=effect.epoch)
            event = ev.LockAcquired(shard=shard, previous=text)
        else:
            event = ev.LockBusy(shard=shard)
        self.answer(proc, event, 100, 1_000)

    def _unlock(self, proc: Proc, effect: fx.Unlock) -> None:
        shard = effect.shard
        text = self.lock_files.get(shard)
        if text is not None and text.owner == proc.name and proc.pid in self.fs.holders(shard):
            # The shell marks the lock file released before it unlocks (a crash does not).
            self.lock_files[shard] = replace(text, released=True)
        self.fs.unlock(proc.pid, shard)

    def _read_log(self, proc: Proc, effect: fx.ReadLog) -> None:
        shard = effect.shard
        # The shell reopens the log for writing (another owner may have compacted it) and cuts
        # a torn last line before anything is appended after it.
        self.fs.close_log(proc.pid, shard)
        data = self.fs.read_log(shard)
        if data and not data.endswith(b"\n"):
            # The core's rule for a last line (`scan_tail`, as `snerd.io.log.repair_tail`
            # applies it): a whole record that lost only its newline gets it back and is kept;
            # anything else is a torn write, cut.
            cut = data.rfind(b"\n") + 1
            if scan_tail(data[cut:], offset=cut).records:
                if self.fs.restore_newline(proc.pid, shard):
                    data += b"\n"
            elif self.fs.truncate_log(proc.pid, shard, cut):
                data = data[:cut]
        result = scan(data)
        self._loaded[(proc.pid, shard)] = result.end
        read = ev.LogRecordsRead(
            shard=shard,
            records=tuple(result.records),
            corrupt=tuple(result.corrupt),
            final=True,
            size=result.end,
        )
        self.answer(proc, read, 1_000, 5_000)

    def _build(self, record: fx.NewRecord) -> dict[str, Any]:
        """The line a record stands for, by the core's rule (`records.merge_base`)."""
        loc = record.base
        if loc is None:
            return dict(record.fields)
        raw = self.fs.read_range(loc.shard, loc.offset, loc.length)
        base = decode_line_at(raw, f"shard {loc.shard}:{loc.offset}+{loc.length}")
        return merge_base(base, record)

    def _append(self, proc: Proc, effect: fx.Append | fx.AppendInbox) -> None:
        """`fx.Append` to the shard's log, or `fx.AppendInbox` to the process's own inbox file
        of the shard: one group-commit writer thread serves both, as in `snerd.io.runtime`."""
        built: list[dict[str, Any]] = []
        try:
            for r in effect.records:
                # `_build` inline for the usual record without a base.
                built.append(dict(r.fields) if r.base is None else self._build(r))
        except CorruptRecord as exc:
            failed = ev.AppendFailed(
                token=effect.token, error=str(exc), permanent=True, record=len(built)
            )
            self.answer(proc, failed, 100, 1_000, "log")
            return
        lines = list(map(encode_record, built))
        # The shell's group-commit writer thread writes appends in order, one batch after
        # another: when it is still busy, this write(2) happens later (after an Unlock the
        # node emitted meanwhile, say), and the fsync after it.
        start, done_at = self._log_batch(proc)
        t = self.world.t
        if start > t:
            self.world.at(
                start, APPEND_ISSUE, proc.index, proc.inc, (effect, built, lines, done_at, t)
            )
            return
        self.issue_append(proc, effect, built, lines, done_at, t)

    def _log_batch(self, proc: Proc) -> tuple[int, int]:
        """When the writer thread writes an append handed to it now, and when its fsync
        returns. An idle writer starts at once. A busy one takes every append queued meanwhile
        as its next batch (one write and one fsync per file, as `snerd.io.log.GroupCommitLog`
        does), so appends waiting behind a slow fsync share the next batch's latency instead of
        each adding its own."""
        t = self.world.t
        batch = proc.log_batch
        if batch[0] > t and batch[1] == proc.lanes["log"]:
            return batch  # the next batch has not started: join it
        start = max(t, proc.lanes["log"])
        done_at = start + self._io_latency(100, 2_000)
        proc.lanes["log"] = done_at
        proc.log_batch = (start, done_at)
        return start, done_at

    def issue_append(
        self,
        proc: Proc,
        effect: fx.Append | fx.AppendInbox,
        built: list[dict[str, Any]],
        lines: list[bytes],
        done_at: int,
        queued: int,
    ) -> None:
        """The writer thread of `proc` writes `effect`'s lines now; their fsync returns at
        `done_at` (`queued`: when the node handed the append over)."""
        fs = self.fs
        enospc = fs.disk_full
        inbox = type(effect) is _APPEND_INBOX
        shard = effect.shard
        key: InboxKey | int = shard
        short = skip = 0
        log_before = None
        if inbox:
            assert isinstance(effect, fx.AppendInbox)
            key = InboxKey(effect.shard, effect.segment)
            if effect.note_log:
                log_before = (fs.identity(shard) or 0, fs.log_size(shard))
        # A write never glues a record onto a line its writer did not finish: the shell starts
        # it with a newline when the file does not end with one (`GroupCommitLog._write_share`
        # looks whenever the file is not the size it left it). For an inbox that is a short
        # write's bytes (the shell never cuts a failed write off an inbox, its reader may have
        # read it); for a shard log, a crashed owner's torn write a stale owner appends after.
        size = fs.log_size(key)
        if size and fs.read_range(key, size - 1, 1) != b"\n":
            skip = 1
        if inbox and enospc and self.rng_io.random() < 0.5:
            short = uniform(self.rng_io, 1, skip + sum(map(len, lines)) - 1)
        if len(lines) == 1:
            data = lines[0]
            lengths: tuple[int, ...] = (len(data),)
        else:
            data = b"".join(lines)
            lengths = tuple(map(len, lines))
        if skip:
            data = b"\n" + data
        handle = fs.append(proc.pid, key, data, enospc=enospc, short=short)
        offsets = tuple(accumulate(lengths[:-1], initial=handle.offset + skip))
        error = handle.error
        seq = handle.seq
        pending = _Append(
            effect.token,  # token
            shard,
            seq,
            built,  # records
            offsets,
            lengths,
            self.world.t,  # t_issue
            claim_epoch(proc.node, shard),  # epoch
            error,
            handle,
            inbox,
            queued,  # t_queued
            log_before,
        )
        if error is None:
            if inbox:
                self._inbox_handles[seq] = (handle, pending, proc.name)
            else:
                self._handles[seq] = (handle, pending, proc.name)
                order = self._order.get(shard)
                if order is None:
                    order = self._order[shard] = deque()
                order.append(seq)
        world = self.world
        world.seq += 1
        heappush(world.queue, (done_at, world.seq, APPEND_DONE, proc.index, proc.inc, pending))

    def append_done(self, proc: Proc, pending: _Append) -> None:
        """The fsync of `pending` returned, or its write failed: the node hears it, after what
        `Node.on_commit` lets go at once."""
        if pending.error is not None:
            self.world.deliver(proc, ev.AppendFailed(token=pending.token, error=pending.error))
            return
        handle = pending.handle
        fs = self.fs
        self._made_durable(pending.inbox, pending.shard, fs.complete_append(handle))
        status = fs.status(handle)
        if status == "durable" or status == "replaced":
            # fsync returned: the shell reports success even for a replaced file (it cannot
            # know); the checkers see whether the record is in the log. First what the node
            # lets go at once (`Node.on_commit`: acks, an `execute`); a paused shell's come
            # from the burst that handles the commit when it resumes.
            if proc.state == "running":
                effects = proc.node.on_commit(
                    pending.token, proc.clock.now(self.world.t), pending.offsets, pending.lengths
                )
                if effects:
                    self.carry_out(proc, effects)
            if pending.log_before is not None:
                identity, size = pending.log_before
                committed = ev.AppendCommitted(
                    token=pending.token,
                    offsets=pending.offsets,
                    lengths=pending.lengths,
                    log_identity=identity,
                    log_size=size,
                )
            else:
                committed = _append_committed(pending.token, pending.offsets, pending.lengths)
            self.world.deliver(proc, committed)

    def _record_inbox(self, pending: _Append, name: str) -> None:
        """Record the records of a durable inbox append (their writer is the inbox's node)."""
        for fields_, offset in zip(pending.records, pending.offsets, strict=True):
            self.world.record(
                {
                    "kind": "inbox_record",
                    "shard": pending.shard,
                    "node": name,
                    "offset": offset,
                    "fields": _history_fields(fields_),
                    "t_issue": pending.t_issue,
                    "t_durable": self.world.t,
                }
            )

    def _read_inbox(self, proc: Proc, effect: fx.ReadInbox) -> None:
        """What `snerd.io.inbox.read_inboxes` does: every inbox file of each shard asked for,
        from the offset given for its writer (0 if none) to its last complete line, at most
        about `max_bytes` (but at least one line) per file; a line without its newline (a write
        in progress, a torn tail) is left alone. Readers see pending bytes as well as durable
        ones. One `InboxRead` answers it, after an I/O latency on the "meta" lane."""
        fs = self.fs
        present, grown = fs.inbox_poll(effect.offsets)
        chunks: list[ev.InboxChunk] = []
        for shard, key, start, size in grown:
            data = fs.read_range(key, start, size - start)
            end = data.rfind(b"\n", 0, effect.max_bytes) + 1
            if not end:
                end = data.find(b"\n") + 1  # one line longer than max_bytes
                if not end:
                    continue
            result = scan(data[:end], base_offset=start)
            chunks.append(
                ev.InboxChunk(
                    shard=shard,
                    node=key.node,
                    start=start,
                    end=start + end,
                    records=tuple(result.records),
                    corrupt=tuple(result.corrupt),
                )
            )
        self.world.counters["inbox_reads"] += 1
        read = _inbox_read(tuple(chunks), present)
        self.answer(proc, read, 500, 5_000)

    def _scan_queue(self, proc: Proc, effect: fx.ScanQueue) -> None:
        """What the daemon's shell does for a `ScanQueue` (the task watch): each shard's log
        and inbox files, each from the offset `known` gives when the file's identity (its
        inode) is the one given there, else from 0, to its last complete line and at most
        about `max_bytes` (but at least one line), through `snerd.core.watch.pick`. Readers
        see pending bytes as well as durable ones. One `QueueScanned` answers it, after an I/O
        latency on the "meta" lane."""
        fs = self.fs
        chunks: list[ev.ScanChunk] = []
        files: list[tuple[int, str, int, int]] = []
        for shard in range(effect.shards):
            keys: list[tuple[str, InboxKey | int]] = [("", shard)]
            keys += [(key.node, key) for key in fs.inboxes(shard)]
            for segment, key in keys:
                identity = fs.identity(key)
                if identity is None:
                    continue  # no log yet
                size = fs.log_size(key)
                known = effect.known.get((shard, segment))
                start = resume_at(known, identity, size)
                chunk = self._scan_file(key, (shard, segment, identity), start, size, effect)
                rest = 0
                if chunk is not None:
                    chunks.append(chunk)
                    if ends_a_task(list(chunk.records)):
                        self.reader_fsync(key)
                    tail = fs.read_range(key, chunk.end, size - chunk.end)
                    if b"\n" in tail:
                        rest = size - chunk.end  # the read stopped at `max_bytes`
                files.append((shard, segment, identity, rest))
        self.world.counters["queue_scans"] += 1
        self.answer(proc, ev.QueueScanned(chunks=tuple(chunks), files=tuple(files)), 500, 5_000)

    def _scan_file(
        self,
        key: InboxKey | int,
        name: tuple[int, str, int],
        start: int,
        size: int,
        effect: fx.ScanQueue,
    ) -> ev.ScanChunk | None:
        """The complete lines of one file (`name`: its shard, segment and identity) from
        `start`, picked; None when there is no complete line past `start`."""
        if start >= size:
            return None
        data = self.fs.read_range(key, start, size - start)
        end = data.rfind(b"\n", 0, effect.max_bytes) + 1
        if not end:
            end = data.find(b"\n") + 1  # one line longer than max_bytes
            if not end:
                return None
        records, corrupt, _ = pick(data[:end], start, effect.ids)
        shard, segment, identity = name
        return ev.ScanChunk(
            shard=shard,
            segment=segment,
            identity=identity,
            start=start,
            end=start + end,
            records=tuple(records),
            corrupt=tuple(corrupt),
        )

    def reader_fsync(self, key: InboxKey | int) -> None:
        """A reader's fsync(2) of a file makes every writer's pending appends to it durable:
        recorded as durable now, as their writers' fsyncs would have when they returned."""
        done = self.fs.sync_file(key)
        if done:
            self.world.counters["reader_fsyncs"] += 1
            inbox = isinstance(key, InboxKey)
            self._made_durable(inbox, key.shard if isinstance(key, InboxKey) else key, done)

    def _made_durable(self, inbox: bool, shard: int, done: tuple[Any, ...]) -> None:
        """Appends an fsync (their writer's, or a reader's) made durable, recorded now. One
        writer per inbox file, and its appends are durable in issue order: each is recorded as
        it becomes durable (`inbox_record`), which is its file order too."""
        if inbox:
            for handle in done:
                entry = self._inbox_handles.pop(handle.seq, None)
                if entry is not None:
                    self._record_inbox(entry[1], entry[2])
            return
        fs, handles, resolved, t = self.fs, self._handles, self._resolved, self.world.t
        for handle in done:
            if handle.seq in handles and handle.seq not in resolved:
                resolved[handle.seq] = t if fs.status(handle) == "durable" else None
        self._flush_records(shard)

    def _read_log_tail(self, proc: Proc, effect: fx.ReadLogTail) -> None:
        """What `snerd.io.inbox.read_log_tail` does: the shard's log from the offset given
        (from 0 when its identity, the inode, is another now), to its last complete line, at
        most about `max_bytes` (but at least one line), through `pick_marks`. Readers see
        pending bytes as well as durable ones. After an I/O latency on the "meta" lane."""
        fs = self.fs
        key = effect.shard
        identity = fs.identity(key)
        if identity is None:
            self.answer(proc, ev.LogTailRead(shard=effect.shard), 500, 5_000)
            return
        size = fs.log_size(key)
        start = resume_at((effect.identity, effect.offset), identity, size)
        data = fs.read_range(key, start, size - start)
        end = data.rfind(b"\n", 0, effect.max_bytes) + 1 or data.find(b"\n") + 1
        marks = pick_marks(data[:end], start, effect.writers)
        if decided_in(marks):
            self.reader_fsync(key)
        read = ev.LogTailRead(
            shard=effect.shard,
            identity=identity,
            start=start,
            end=start + end,
            size=size,
            records=tuple(marks),
        )
        self.answer(proc, read, 500, 5_000)

    def _mark_inbox_read(self, proc: Proc, effect: fx.MarkInboxRead) -> None:
        # A hint for the writer's clean-up; a failure (ENOSPC) is only logged by the shell.
        self.fs.write_hint(InboxKey(effect.shard, effect.segment), effect.offset)

    def _check_inboxes(self, proc: Proc, effect: fx.CheckInboxes) -> None:
        fs = self.fs
        found = []
        for shard, segment in effect.segments:
            key = InboxKey(shard, segment)
            exists = key in fs.inboxes(shard)
            found.append((shard, segment, fs.read_hint(key), fs.log_size(key) if exists else None))
        self.answer(proc, ev.InboxProgress(segments=tuple(found)), 500, 5_000)

    def _remove_inbox(self, proc: Proc, effect: fx.RemoveInbox) -> None:
        self.fs.remove_inbox(InboxKey(effect.shard, effect.segment))

    def _flush_records(self, shard: int) -> None:
        """Record, in file order, the records of `shard` whose append and every append before
        it in the file are resolved (durable, or lost in a crash, or in a replaced file).

        Readers judge fencing in file order, and a write is in the file from the moment it is
        issued, so the history lists records in that order; each carries when it became
        durable (`t_durable`), and only durable ones are listed."""
        order = self._order.get(shard)
        while order and order[0] in self._resolved:
            seq = order.popleft()
            durable_at = self._resolved.pop(seq)
            _, pending, name = self._handles.pop(seq)
            if durable_at is None:
                continue
            for fields_ in pending.records:
                epoch = fields_.get(SNERD_EPOCH)
                self.world.record(
                    {
                        "kind": "record",
                        "shard": pending.shard,
                        "node": name,
                        "epoch": epoch if isinstance(epoch, int) else pending.epoch,
                        "fields": _history_fields(fields_),
                        "t_issue": pending.t_issue,
                        "t_queued": pending.t_queued,
                        "t_durable": durable_at,
                    }
                )

    def _compact(self, proc: Proc, effect: fx.Compact) -> None:
        data = self.fs.read_log(effect.shard)
        parts: list[bytes] = []
        offsets, lengths, at = [], [], 0
        for keep in effect.keep:
            chunk = data[keep.offset : keep.offset + keep.length]
            parts.append(chunk)
            offsets.append(at)
            lengths.append(len(chunk))
            at += len(chunk)
        for record in effect.extra:
            line = encode_record(self._build(record))
            parts.append(line)
            offsets.append(at)
            lengths.append(len(line))
            at += len(line)
        # Appends of other writers still pending in the log being replaced: those the
        # compactor read when it loaded the shard, or whose bytes it copies, are part of the
        # log's history from now on (read and acted on, or copied and fsynced by it); the
        # rest never reach the log.
        copied = []
        loaded = self._loaded.get((proc.pid, effect.shard), 0)
        for seq in self._order.get(effect.shard, ()):
            handle = self._handles[seq][0]
            if seq not in self._resolved and self.fs.in_current_log(handle):
                end = handle.offset + handle.length
                if end <= loaded or any(
                    k.offset <= handle.offset and end <= k.offset + k.length for k in effect.keep
                ):
                    copied.append(seq)
        error = self.fs.replace_log(proc.pid, effect.shard, b"".join(parts))
        if error is None and copied:
            for seq in copied:
                self._resolved[seq] = self.world.t
            self._flush_records(effect.shard)
        event: ev.Event
        if error is not None:
            event = ev.CompactionFailed(token=effect.token, shard=effect.shard, error=error)
        else:
            event = ev.Compacted(
                token=effect.token,
                shard=effect.shard,
                offsets=tuple(offsets),
                lengths=tuple(lengths),
                size=at,
            )
        self.answer(proc, event, 1_000, 10_000, "log")

    # ------------------------------------------------------------------ a crash

    def crashed(self, proc: Proc) -> None:
        """`proc` crashed (the filesystem has already lost or torn its pending writes): its
        appends are resolved, and those now in the log for every reader recorded."""
        t = self.world.t
        for seq, (handle, pending, _) in self._handles.items():
            if (
                handle.pid == proc.pid
                and seq not in self._resolved
                and self.fs.status(handle) != "pending"
            ):
                # Whole records in a torn append's prefix are in the log for every reader
                # (a merged append's first tombstone, say): they count as written now,
                # the rest of the append as lost.
                kept = self._torn_records_read(handle, pending)
                if kept:
                    pending.records[:] = kept
                    self._resolved[seq] = t
                else:
                    self._resolved[seq] = None
        for shard in list(self._order):
            self._flush_records(shard)
        for seq in [s for s, e in self._inbox_handles.items() if e[0].pid == proc.pid]:
            del self._inbox_handles[seq]  # lost with the process (or torn: never whole)

    def _torn_records_read(self, handle: Any, pending: _Append) -> list[dict[str, Any]]:
        """The records of a torn append that readers of the log parse, judged by `scan`, the
        readers' own rule, on the file from the start of the line its first record is on (as
        `_read_log` reads it), not by a rule of the world's.

        After a dropped append's hole the first record is glued to zeros: `scan` reports the
        line corrupt yet salvages a task record at its end (a tombstone, say), so whether it
        counts depends on what it is, not only on what precedes it. The record the tear cut
        is not one, unless readers take it whole.
        """
        kept_end = handle.offset + self.fs.kept_prefix(handle)
        at = pending.offsets[0]
        if kept_end <= at:
            return []
        data = self.fs.read_log(handle.key)
        start = data.rfind(b"\n", 0, at) + 1
        # `at_eof`: a record the tear left whole but for its newline, at the end of the file,
        # is read too (the next owner writes the newline back, `_read_log`, and a writer
        # before it starts its write on a new line, `issue_append`).
        found = {r.offset for r in scan(data[start:], base_offset=start, at_eof=True).records}
        return [
            record
            for record, offset in zip(pending.records, pending.offsets, strict=True)
            if offset < kept_end and offset in found
        ]


#: Every effect the core emits, and the method of the shell that carries it out.
_EFFECTS: dict[type[Any], Callable[[Shell, Proc, Any], None]] = {
    fx.Send: Shell._send,
    fx.AckEnqueued: Shell._ack_enqueued,
    fx.Log: Shell._log,
    fx.Execute: Shell._execute,
    fx.DeliverDeadLetter: Shell._dead_letter,
    fx.CallWebhook: Shell._webhook,
    fx.Exit: Shell._exit,
    fx.ReadMembership: Shell._read_membership,
    fx.WriteMembership: Shell._write_membership,
    fx.TryLock: Shell._try_lock,
    fx.Unlock: Shell._unlock,
    fx.ReadLog: Shell._read_log,
    fx.Append: Shell._append,
    fx.AppendInbox: Shell._append,
    fx.ReadInbox: Shell._read_inbox,
    fx.ScanQueue: Shell._scan_queue,
    fx.ReadLogTail: Shell._read_log_tail,
    fx.MarkInboxRead: Shell._mark_inbox_read,
    fx.CheckInboxes: Shell._check_inboxes,
    fx.RemoveInbox: Shell._remove_inbox,
    fx.Compact: Shell._compact,
    fx.ReadRecord: Shell._read_record,
    fx.ReadTask: Shell._read_task,
    fx.StopAttempt: Shell._stop_attempt,
}


def _history_fields(fields_: dict[str, Any]) -> dict[str, Any]:
    """A record's fields for the history, without the payload (the checkers never read it)."""
    if TASK_DATA in fields_:
        fields_ = dict(fields_)
        del fields_[TASK_DATA]
    return fields_
