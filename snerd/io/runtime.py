"""The trio loop that runs a `snerd.core.node.Node`: it executes effects and feeds back events.

Owns: the event queue, the timer, and the mapping of each effect onto real I/O (the
group-commit log, membership.json, shard locks, payload reads, webhooks). The clock readings
are `snerd.io.clock`'s, the cache of recent records `snerd.io.recent`'s. It must never
decide anything about the queue: every `if` here is about I/O (did the write fail, is the fd
gone), never about tasks.

Shape: one driver task takes every queued event in turn, hands it to the node, and carries out
the effects. Effects that finish later (appends, log reads, membership, webhooks) post their
outcome back onto the queue. Work is batched: all events waiting at a moment are handled before
the peer's output is flushed, so a burst of enqueues costs one wake-up, one write to stdout and
(through the group-commit log) one fsync.

Why this module stays above 800 lines: the driver, the burst loop and the effect executors
share one state (the node, the event deque, the burst's outbox, the parked driver, the peer's
flush) and the executors are one table (`_EFFECTS`) over it; `_Outgoing`, a commit's way back
into the node, reads the same state. What has a state of its own lives beside it: the clock
(`snerd.io.clock`), the recent-records cache (`snerd.io.recent`), the log, membership, inbox,
queue-scan and webhook modules.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from snerd.config import Settings
from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node import Node, NodePhase
from snerd.core.ownership import LockText
from snerd.core.schema import TASK_DATA
from snerd.core.slots import slot_constructor
from snerd.io import log as logio
from snerd.io.clock import Clock
from snerd.io.files import RefusedFile
from snerd.io.inbox import (
    inbox_path,
    inbox_progress,
    log_identity_and_size,
    mark_read,
    read_inboxes,
    read_log_tail,
    remove_inbox,
)
from snerd.io.membership import (
    LOST_LOCK_ERRNOS,
    MembershipConflict,
    MembershipInvalid,
    ShardLocks,
    read_membership,
    update_membership,
    withdraw_claims,
)
from snerd.io.recent import RecentRecords
from snerd.io.scan import read_task, scan_queue
from snerd.io.webhook import WebhookCaller

__all__ = ["Clock", "Peer", "Runtime"]


class Peer(Protocol):
    """Where protocol messages go: the SDK over stdout, or the embedded engine's handlers."""

    def deliver(self, message: dict[str, Any]) -> None:
        """Take one message. Must not block; the runtime flushes with `flush`."""

    async def flush(self) -> None:
        """Push out whatever `deliver` buffered."""

    def log(self, level: str, message: str) -> None:
        """One human log line."""


_new_committed = slot_constructor(ev.AppendCommitted, "token", "offsets", "lengths")
_LINES_RECEIVED = ev.LinesReceived


class Runtime:
    """Runs one node on one data directory until it exits."""

    def __init__(
        self,
        directory: Path,
        settings: Settings,
        peer: Peer,
        *,
        clock: Clock | None = None,
        sync_helper: bool = False,
    ) -> None:
        self.directory = directory
        self.settings = settings
        self.peer = peer
        #: fsync the logs in a helper process (`GroupCommitLog(sync_helper=)`): the daemon
        #: does; an engine embedded in an application does not start processes of its own.
        self._sync_helper = sync_helper
        self.clock = clock or Clock(settings.clock_offset_s)
        self.node = Node(settings.node)
        self.locks = ShardLocks(directory)
        self.events: deque[ev.Event] = deque()
        #: The driver task while it waits for events (`_park`), else None.
        self._parked: trio.lowlevel.Task | None = None
        #: When the driver next wants a `Tick` (trio clock, seconds; None: no deadline), and
        #: when the timer task is armed for. See `_timer`.
        self._deadline: float | None = None
        self._timer_at: float | None = None
        self._timer_task: trio.lowlevel.Task | None = None
        #: Log path per shard (built once; `log_path` is on the path of every append).
        self._log_paths: dict[int, str] = {}
        #: Appends built while handling a burst of events, handed to the log together at its
        #: end (`_process`): per file, one job holding the lines of all of them (one lock
        #: round with the writer thread per burst, one log job and one callback per file), and
        #: how many records that is.
        self._outbox: dict[str, _Outgoing] = {}
        self._outbox_records = 0
        #: Jobs handed to the log whose outcome has not come back (`settled`).
        self._appends_out = 0
        #: `_process` is running (it is not re-entered), and an error it raised outside the
        #: driver (in `pump`), re-raised by the driver.
        self._processing = False
        self._failure: BaseException | None = None
        #: The peer's synchronous flush, if it has one (`StdioPeer.flush_nowait`): `pump` is
        #: used only then.
        self._flush_nowait: Callable[[], None] | None = getattr(peer, "flush_nowait", None)
        #: The peer's way to take lines already framed, if it has one (`StdioPeer`).
        self._deliver_lines: Callable[[bytes], None] | None = getattr(
            peer, "deliver_lines", None
        )
        self._exit_code: int | None = None
        #: The runtime ended without the node's drain (`_abandon`): nothing reaches the node.
        self._abandoned = False
        self._nursery: trio.Nursery | None = None
        self._log: logio.GroupCommitLog | None = None
        self._recent: RecentRecords | None = None
        self._webhooks: WebhookCaller | None = None
        #: Set once the node has taken every shard it could at start (for tests and the CLI).
        self.ready = trio.Event()
        #: The holder last reported for each shard whose lock was busy (reported on change).
        self._busy_holders: dict[int, str] = {}
        #: Files written through `AppendInbox`: read by another process while written, so a
        #: failed write is never cut off them (see `GroupCommitLog(never_cut=)`).
        self._never_cut: set[str] = set()

    # -------------------------------------------------------------- feeding events

    def submit(self, event: ev.Event) -> None:
        """Queue an event for the node (call from the trio thread)."""
        self.events.append(event)
        if self._parked is not None and not self._processing:
            self._unpark()

    def submit_many(self, events: list[ev.Event]) -> None:
        self.events.extend(events)
        if self._parked is not None:
            self._unpark()

    def feed(self, events: list[ev.Event]) -> None:
        """Queue events and handle them now, in the caller's task (the stdin reader): no task
        switch to the driver between a line arriving and its append reaching the log writer."""
        self.events.extend(events)
        self.pump()

    def pump(self) -> None:
        """Handle every queued event now and push out the messages (call from the trio thread;
        no await). Used where events arrive in a burst — stdin, the log writer's results — so
        that a line is answered without waiting for the driver's turn; the driver still runs
        for timers and for events from other tasks. An error is re-raised by the driver."""
        if self._flush_nowait is None:
            # A peer that flushes only asynchronously (the embedded engine): leave it all to
            # the driver, which awaits the flush.
            if self.events and self._parked is not None:
                self._unpark()
            return
        if self._processing or self._log is None or self._exit_code is not None or self._abandoned:
            return
        try:
            self._process()
        except BaseException as exc:
            self._failure = exc
            if self._parked is not None:
                self._unpark()
            return
        # The messages first (the acks wait for nothing else), then the driver's deadline.
        self._flush_nowait()
        if self._parked is not None:
            if self._exit_code is not None:
                self._unpark()
            else:
                # What was handled may have moved the node's next deadline earlier.
                self._set_deadline(self.node.wake_in(self.clock.now()))

    def settled(self) -> bool:
        """Whether this runtime waits only for its clock or a new event: none queued or being
        handled, the driver parked until its next deadline, every append handed to the log
        back, and no I/O task of its own running (log, membership and inbox reads, queue
        scans, webhooks: the timer is the only task left). Under a clock that moves only when
        told (`snerd.testing`), nothing more happens here until it moves or an event comes."""
        nursery = self._nursery
        return (
            self._parked is not None
            and not self.events
            and not self._processing
            and not self._appends_out
            and nursery is not None
            and len(nursery.child_tasks) <= 1
        )

    def log_path(self, shard: int) -> str:
        path = self._log_paths.get(shard)
        if path is None:
            path = os.path.join(self.directory, f"shard-{shard}", "tasks", "tasks.log")
            self._log_paths[shard] = path
        return path

    # -------------------------------------------------------------- the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until the node exits; returns its exit code."""
        self.directory.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery, logio.GroupCommitLog(
            self.settings.fsync,
            interval_ms=self.settings.fsync_interval_ms,
            on_background_error=self._background_error,
            after_deliver=self.pump,
            never_cut=self._never_cut.__contains__,
            sync_helper=self._sync_helper,
            root=self.directory,
        ) as log:
            self._nursery = nursery
            self._log = log
            self._recent = RecentRecords(log.reader, self.settings.recent_bytes)
            self._webhooks = WebhookCaller()
            nursery.start_soon(self._timer)
            task_status.started()
            self.submit(ev.Started())
            try:
                await self._drive()
            finally:
                if self._exit_code is None:
                    self._abandon()
                self.locks.unlock_all()
                await self._webhooks.aclose()
                nursery.cancel_scope.cancel()
        assert self._exit_code is not None
        return self._exit_code

    def _abandon(self) -> None:
        """The runtime ends without the node's drain: an exception unwinds it, or its caller
        cancelled it. From here the node acts for nothing (nothing reaches it: `pump` and the
        driver are done), so it is as gone as a killed process, and is left so that a
        successor takes its shards at once rather than after their leases: its claims and
        heartbeat withdrawn from membership.json as a drain leaves them (`withdraw_claims`),
        then its locks let go unmarked (`ShardLocks.abandon_all`), which is enough where a
        free lock proves its holder gone should the withdrawal fail. The withdrawal comes
        first: until it lands the locks keep a claimant paused. Synchronous: nothing else of
        this runtime runs meanwhile, and it waits `WITHDRAW_WAIT_S` at most."""
        self._abandoned = True
        node_id = self.node.config.node_id
        try:
            if withdraw_claims(self.directory, node_id):
                self.peer.log(
                    "warning",
                    "ending without a drain: this daemon's claims are withdrawn from "
                    "membership.json, for other daemons to take its shards at once",
                )
        except Exception as exc:  # (ending anyway: the locks must go all the same)
            self.peer.log(
                "warning",
                f"ending without a drain: this daemon's claims could not be withdrawn from "
                f"membership.json ({exc}); they lapse with their leases (at once where a free "
                "lock proves this process gone)",
            )
        self.locks.abandon_all()

    async def _drive(self) -> None:
        # Waiting costs no trio.Event and no cancel scope per wait: the driver parks itself
        # (`_park`) and `submit` reschedules it; deadlines are kept by the `_timer` task, which
        # re-arms only when the deadline moves earlier (docs/architecture.md, "Why the shell works
        # in bursts": per-message task switches, not Python, are what limit the daemon).
        node = self.node
        events = self.events
        now = self.clock.now
        while self._exit_code is None:
            if self._failure is not None:
                raise self._failure
            if not events:
                wait = node.wake_in(now())
                if wait is None or wait > 0:
                    self._set_deadline(wait)
                    await self._park()
                else:
                    await trio.lowlevel.checkpoint()
                if self._failure is not None:
                    raise self._failure
                if not events and self._exit_code is None:
                    events.append(ev.Tick())
            self._process()
            await self.peer.flush()

    def _process(self) -> None:
        """Hand every queued event to the node in turn and carry out the effects; then give
        the burst's appends to the log writer at once."""
        node = self.node
        events = self.events
        now = self.clock.now
        handle_burst = node.handle_burst
        table = _EFFECTS
        log = self._log
        flush = self._flush_nowait
        self._processing = True
        try:
            while events and self._exit_code is None:
                # Up to EVENT_BURST events per clock reading and per dispatch pass
                # (`Node.handle_burst`); their effects are carried out in order after them,
                # the lazy appends (success tombstones) last.
                others, lazy = fx.split_lazy(handle_burst(events, now(), EVENT_BURST))
                for effect in others:
                    table[type(effect)](self, effect)
                if lazy:
                    # What gates a message (dispatch records: `execute`s) goes to the writer
                    # now, before the tombstones are built: its fsync overlaps that work, and
                    # the `execute`s do not wait for the tombstones' bytes to be synced too.
                    # A few records stay for the end of the burst with the tombstones: one
                    # fsync, committed in this thread when the writer is idle (below), is
                    # quicker for them than two thread hand-offs.
                    if self._outbox_records > _INLINE_RECORDS:
                        self._submit_appends()
                    for effect in lazy:
                        self._append(effect)
                if self._outbox_records >= _OUTBOX_BURST:
                    self._submit_appends()  # keep the writer busy during a long burst
                if events and log is not None:
                    # More to handle: first the commits that came meanwhile, and out with
                    # what is ready, so acks and `execute`s whose records are durable do not
                    # wait for the end of a long run of lines. Their events go before the
                    # lines still queued, as if they had been read before them (only lines:
                    # outcomes of the log stay in the order it gave them).
                    queued = len(events)
                    log.poll_helper()
                    if len(events) > queued and all(
                        type(e) is _LINES_RECEIVED for e in itertools.islice(events, queued)
                    ):
                        events.rotate(len(events) - queued)
                    if flush is not None:
                        flush()
                if (
                    not events
                    and 0 < self._outbox_records <= _INLINE_RECORDS
                    and self._exit_code is None
                ):
                    # The end of a small burst (a lone enqueue, a result): if the writer is
                    # idle, commit here, sparing the two thread hand-offs; the outcomes come
                    # back as events, handled by this same loop. Big bursts go to the writer,
                    # which overlaps their fsync with handling the next burst.
                    self._submit_appends(inline=True)
        finally:
            self._processing = False
            if self._outbox:
                self._submit_appends()
        if node.phase is not NodePhase.STARTING and not self.ready.is_set():
            self.ready.set()

    def _submit_appends(self, *, inline: bool = False) -> None:
        assert self._log is not None
        outbox, self._outbox = self._outbox, {}
        self._outbox_records = 0
        self._appends_out += len(outbox)
        self._log.submit_many(
            [(path, out.lines, out.done) for path, out in outbox.items()], inline=inline
        )

    async def _park(self) -> None:
        """Wait until `submit` (or the timer) reschedules the driver."""
        self._parked = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._parked = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _unpark(self) -> None:
        task, self._parked = self._parked, None
        assert task is not None
        trio.lowlevel.reschedule(task)

    def _set_deadline(self, wait_us: int | None) -> None:
        if wait_us is None:
            self._deadline = None
            return
        deadline = trio.current_time() + wait_us / 1_000_000
        self._deadline = deadline
        timer = self._timer_task
        if timer is not None and (self._timer_at is None or deadline < self._timer_at):
            # The timer sleeps until a later time (or forever): wake it to re-arm.
            self._timer_task = None
            trio.lowlevel.reschedule(timer)

    async def _timer(self) -> None:
        """Submit a `Tick` when the driver's deadline passes while it waits. Armed for
        `_deadline` as it was when the timer last looked; a deadline that moved later only
        costs one early `Tick` (the driver then waits again), one that moved earlier re-arms
        the timer (`_set_deadline`)."""

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._timer_task = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            at = self._timer_at = self._deadline
            self._timer_task = trio.lowlevel.current_task()
            if at is None:
                await trio.lowlevel.wait_task_rescheduled(abort)
                continue
            with trio.move_on_at(at):
                await trio.lowlevel.wait_task_rescheduled(abort)
            if trio.current_time() >= at:
                if self._deadline == at:
                    self._deadline = None  # consumed: the driver sets the next one
                if self._parked is not None:
                    self.submit(ev.Tick())

    # -------------------------------------------------------------- effects

    def _execute(self, effect: fx.Effect) -> None:
        handler = _EFFECTS[type(effect)]
        handler(self, effect)

    def _send(self, effect: fx.Send) -> None:
        self.peer.deliver(effect.message)

    def _ack_enqueued(self, effect: fx.AckEnqueued) -> None:
        if self._deliver_lines is not None:
            self._deliver_lines(proto.ack_lines(effect.task_ids, effect.shard))
            return
        for task_id in effect.task_ids:
            self.peer.deliver(proto.ack_enqueued(task_id, effect.shard))

    def _log_line(self, effect: fx.Log) -> None:
        self.peer.log(effect.level, effect.message)

    def _exit(self, effect: fx.Exit) -> None:
        self._exit_code = effect.code

    def _read_payload(self, location: fx.Location) -> str:
        assert self._recent is not None
        record = self._recent.read_record(
            self.log_path(location.shard), location.offset, location.length
        )
        data = record.get(TASK_DATA)
        return data if isinstance(data, str) else ""

    # Per-task effects (`_execute_task`, `_dead_letter`, `_webhook`) catch every Exception, not
    # only the I/O errors they expect: what one task carries (a record from an older version,
    # or written by hand) must fail that task, never the daemon — the task would still be in
    # the log, and every daemon that takes the shard over would die of it in turn.

    def _execute_task(self, effect: fx.Execute) -> None:
        try:
            data = self._read_payload(effect.location)
        except Exception as exc:
            self._payload_unreadable(effect.task_id, effect.attempt, exc)
            return
        try:
            self.peer.deliver(
                proto.execute(
                    effect.task_id,
                    effect.task_type,
                    data,
                    effect.max_execution_seconds,
                    effect.attempt,
                )
            )
        except Exception as exc:
            self._payload_unreadable(effect.task_id, effect.attempt, exc, "cannot send it")

    def _payload_unreadable(
        self, task_id: str, attempt: int, exc: Exception, what: str | None = None
    ) -> None:
        """Fail the attempt whose task could not be read (or sent): the core retries it, and
        dead-letters it with this reason in the end."""
        error = str(exc) if isinstance(exc, OSError | ValueError) else _unexpected(exc)
        self.submit(
            ev.PayloadUnreadable(
                task_id=task_id, attempt=attempt, error=f"{what}: {error}" if what else error
            )
        )

    def _stop_attempt(self, effect: fx.StopAttempt) -> None:
        self.peer.deliver(proto.stop_attempt(effect.task_id, effect.attempt))

    def _read_record(self, effect: fx.ReadRecord) -> None:
        loc = effect.location
        try:
            assert self._recent is not None
            fields = self._recent.read_record(self.log_path(loc.shard), loc.offset, loc.length)
        except Exception as exc:  # one task's record: it fails that command, never the daemon
            why = str(exc) if isinstance(exc, OSError | ValueError) else _unexpected(exc)
            self.submit(ev.RecordRead(token=effect.token, error=why))
            return
        self.submit(ev.RecordRead(token=effect.token, fields=fields))

    def _dead_letter(self, effect: fx.DeliverDeadLetter) -> None:
        try:
            data = self._read_payload(effect.location)
        except Exception as exc:
            why = str(exc) if isinstance(exc, OSError | ValueError) else _unexpected(exc)
            self.peer.log("error", f"task {effect.task_id}: cannot read its payload ({why})")
            data = ""
        try:
            message = proto.max_retries_reached(effect.task_id, effect.task_type, data)
            message["error"] = effect.error
            self.peer.deliver(message)
        except Exception as exc:
            self.peer.log(
                "error", f"task {effect.task_id}: cannot send its dead letter ({_unexpected(exc)})"
            )

    def _append(self, effect: fx.Append | fx.AppendInbox) -> None:
        inbox = isinstance(effect, fx.AppendInbox)
        if isinstance(effect, fx.AppendInbox):
            path = inbox_path(self.directory, effect.shard, effect.segment)
            self._never_cut.add(path)
        else:
            path = self.log_path(effect.shard)
        records = effect.records
        lines: list[bytes] = []
        try:
            logio.materialize(records, self.log_path, self._recent, out=lines)
        except (OSError, ValueError, TypeError) as exc:
            # OSError: the base could not be read (try again later); ValueError, TypeError: a
            # damaged base record, orjson.JSONEncodeError (trying again cannot help). The
            # record is named: the others of a merged append go again without it.
            self.submit(
                ev.AppendFailed(
                    token=effect.token,
                    error=f"cannot build record: {exc}",
                    permanent=not isinstance(exc, OSError),
                    record=len(lines),
                )
            )
            return
        out = self._outbox.get(path)
        if out is None:
            out = self._outbox[path] = _Outgoing(self, path, inbox)
        if inbox and effect.note_log and out.log_before is None:  # type: ignore[union-attr]
            # (Before any line of this file's job is written: they go together, at submit.)
            out.log_before = log_identity_and_size(self.log_path(effect.shard))
        out.add(effect.token, lines, records)
        self._outbox_records += len(lines)

    def _read_inbox(self, effect: fx.ReadInbox) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._read_inbox_task, effect)

    async def _read_inbox_task(self, effect: fx.ReadInbox) -> None:
        try:
            chunks, errors, present = await trio.to_thread.run_sync(
                read_inboxes, self.directory, effect.offsets, effect.max_bytes
            )
        except OSError as exc:  # (per-file errors are reported in `errors`)
            chunks, errors, present = [], [(s, _describe(exc)) for s in effect.offsets], []
        self.submit(
            ev.InboxRead(chunks=tuple(chunks), errors=tuple(errors), present=tuple(present))
        )

    def _read_log_tail(self, effect: fx.ReadLogTail) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._read_log_tail_task, effect)

    async def _read_log_tail_task(self, effect: fx.ReadLogTail) -> None:
        read = await trio.to_thread.run_sync(read_log_tail, self.directory, effect)
        self.submit(read)

    def _scan_queue(self, effect: fx.ScanQueue) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._scan_queue_task, effect)

    async def _scan_queue_task(self, effect: fx.ScanQueue) -> None:
        try:
            scanned = await trio.to_thread.run_sync(scan_queue, self.directory, effect)
        except OSError as exc:  # (per-file errors are reported in `errors`)
            scanned = ev.QueueScanned(chunks=(), files=(), errors=((0, _describe(exc)),))
        self.submit(scanned)

    def _read_task(self, effect: fx.ReadTask) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._read_task_task, effect)

    async def _read_task_task(self, effect: fx.ReadTask) -> None:
        errors: list[str] = []
        try:
            found = await trio.to_thread.run_sync(
                read_task, self.directory, effect.shards, effect.task_id, errors
            )
        except Exception as exc:  # one lookup fails, never the daemon
            found, errors = [], [_describe(exc) if isinstance(exc, OSError) else _unexpected(exc)]
        read = ev.TaskRead(
            token=effect.token, task_id=effect.task_id, found=tuple(found), errors=tuple(errors)
        )
        self.submit(read)

    def _inbox_chore(self, effect: fx.MarkInboxRead | fx.RemoveInbox) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._inbox_chore_task, effect)

    async def _inbox_chore_task(self, effect: fx.MarkInboxRead | fx.RemoveInbox) -> None:
        try:
            if isinstance(effect, fx.MarkInboxRead):
                await trio.to_thread.run_sync(
                    mark_read, self.directory, effect.shard, effect.segment, effect.offset
                )
            else:
                await trio.to_thread.run_sync(
                    remove_inbox, self.directory, effect.shard, effect.segment
                )
        except OSError as exc:
            self.peer.log(
                "warning",
                f"shard-{effect.shard}/inbox/{effect.segment}: clean-up step failed "
                f"({_describe(exc)}); it is tried again later",
            )

    def _check_inboxes(self, effect: fx.CheckInboxes) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._check_inboxes_task, effect)

    async def _check_inboxes_task(self, effect: fx.CheckInboxes) -> None:
        found = await trio.to_thread.run_sync(inbox_progress, self.directory, effect.segments)
        self.submit(ev.InboxProgress(segments=tuple(found)))

    def _compact(self, effect: fx.Compact) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._compact_task, effect)

    def _background_error(self, path: str, exc: OSError) -> None:
        self.peer.log(
            "error",
            f"{path}: a background fsync failed ({_describe(exc)}); records acknowledged in "
            "the last SNERD_FSYNC_INTERVAL_MS may be lost on power failure",
        )

    async def _compact_task(self, effect: fx.Compact) -> None:
        assert self._log is not None and self._recent is not None
        path = self.log_path(effect.shard)
        try:
            extra = logio.materialize(effect.extra, self.log_path, self._recent)
            result = await self._log.compact(path, effect.keep, extra)
        except (OSError, ValueError) as exc:
            self._recent.forget(path)  # the records may have moved
            error = _describe(exc) if isinstance(exc, OSError) else str(exc)
            self.submit(ev.CompactionFailed(token=effect.token, shard=effect.shard, error=error))
            return
        # The queued tasks' records are in the new file at new offsets: keep them remembered
        # there (the tasks are read back soon: their `execute`, their outcome record).
        self._recent.moved(path, effect.keep, result.offsets)
        self.submit(
            ev.Compacted(
                token=effect.token,
                shard=effect.shard,
                offsets=tuple(result.offsets),
                lengths=tuple(result.lengths),
                size=result.size,
            )
        )

    def _read_log(self, effect: fx.ReadLog) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._read_log_task, effect.shard)

    async def _read_log_task(self, shard: int) -> None:
        path = self.log_path(shard)
        # The log is read afresh (the shard was just locked, maybe after another owner had it
        # and compacted it): forget any descriptor and remembered lines of the file as it was.
        assert self._log is not None and self._recent is not None
        # The writer's descriptor too: had another owner compacted the log since this daemon
        # last wrote it, that descriptor would point at the replaced (unlinked) file, and
        # appends through it would be acknowledged but never be in tasks.log.
        await self._log.close_file(path)
        self._log.reader.invalidate(path)
        self._recent.forget(path)

        def read() -> list[ev.Event]:
            out: list[ev.Event] = []
            repair = logio.recover_log(path, root=self.directory)
            where = f"shard-{shard}/tasks/tasks.log"
            if repair.restored:
                self.peer.log(
                    "warning",
                    f"{where}: the last record (at byte {repair.at}) had lost its newline; it "
                    "is a whole record, so it is kept and the newline written back",
                )
            elif repair.cut:
                why = f": {repair.reason}" if repair.reason else ""
                self.peer.log(
                    "warning",
                    f"{where}: cut a torn last line of {repair.cut} bytes at byte {repair.at} "
                    f"(no whole record{why}; a crash mid-append, never acknowledged)",
                )
            end = 0
            for chunk in logio.read_log(path, root=self.directory):
                end = chunk.end
                out.append(
                    ev.LogRecordsRead(
                        shard=shard, records=tuple(chunk.records), corrupt=tuple(chunk.corrupt)
                    )
                )
            out.append(ev.LogRecordsRead(shard=shard, records=(), final=True, size=end))
            return out

        try:
            events = await trio.to_thread.run_sync(read)
        except (RefusedFile, PermissionError) as exc:
            # Bad files on disk, not a lost lock: the shard is left alone for a while.
            self.submit(ev.ShardUnusable(shard=shard, error=str(exc)))
            return
        except OSError as exc:
            self.submit(ev.LockLost(shard=shard, error=f"cannot read tasks.log: {_describe(exc)}"))
            return
        self.submit_many(events)

    def _read_membership(self, effect: fx.ReadMembership) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._read_membership_task, effect.touch)

    async def _read_membership_task(self, touch: tuple[int, ...]) -> None:
        # First the locks the node asks to touch (a renewal point: a lock lost on a network
        # filesystem surfaces as an error now, not at the next append).
        lost: list[ev.Event] = []
        for shard in touch:
            # The Unlock of a shard given up meanwhile may run while the write is out: the fd
            # is reserved so that it is closed only after it (never reused under the write).
            reserved = self.locks.begin_touch(shard, self.node.config.node_id)
            if reserved is None:
                continue
            try:
                await trio.to_thread.run_sync(self.locks.touch_reserved, *reserved)
            except OSError as exc:
                if exc.errno in LOST_LOCK_ERRNOS and shard in self.locks.fds:
                    lost.append(ev.LockLost(shard=shard, error=_describe(exc)))
            finally:
                self.locks.end_touch(shard)
        try:
            doc = await trio.to_thread.run_sync(read_membership, self.directory)
        except MembershipInvalid as exc:
            self.submit_many(lost)
            self.submit(ev.MembershipUnusable(problem=str(exc)))
            return
        except (OSError, ValueError) as exc:
            # (The node says it, once: the read is retried until it succeeds.)
            self.submit_many(lost)
            self.submit(ev.MembershipWriteFailed(doc=None, error=f"cannot read it: {exc}"))
            return
        self.submit_many(lost)
        self.submit(ev.MembershipRead(doc=doc))

    def _write_membership(self, effect: fx.WriteMembership) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._write_membership_task, effect)

    async def _write_membership_task(self, effect: fx.WriteMembership) -> None:
        try:
            doc = await trio.to_thread.run_sync(
                update_membership, self.directory, effect.doc, effect.expected_version
            )
        except MembershipConflict as exc:
            self.submit(ev.MembershipWriteFailed(doc=exc.doc, error="changed meanwhile"))
            return
        except MembershipInvalid as exc:  # (what is there now, read under the lock)
            self.submit(ev.MembershipUnusable(problem=str(exc)))
            return
        except (OSError, ValueError) as exc:
            self.submit(ev.MembershipWriteFailed(doc=None, error=str(exc)))
            return
        self.submit(ev.MembershipWritten(doc=doc))

    def _try_lock(self, effect: fx.TryLock) -> None:
        try:
            held = self.locks.try_lock(
                effect.shard, effect.owner, effect.epoch, probe=effect.probe
            )
        except (RefusedFile, PermissionError) as exc:
            if not effect.probe:
                self.submit(ev.ShardUnusable(shard=effect.shard, error=str(exc)))
                return
            held = False  # a probe only learns nothing about the claimant
        except OSError as exc:
            self.peer.log("error", f"shard-{effect.shard}: cannot open its lock: {exc}")
            held = False
        if held:
            self._busy_holders.pop(effect.shard, None)
            previous = self.locks.previous.pop(effect.shard, LockText())
            self.submit(ev.LockAcquired(shard=effect.shard, previous=previous))
        else:
            holder = self.locks.holder(effect.shard)
            if self._busy_holders.get(effect.shard) != holder:  # say it once per holder
                self._busy_holders[effect.shard] = holder
                self.peer.log("info", f"shard-{effect.shard}/.lock is held by: {holder}")
            self.submit(ev.LockBusy(shard=effect.shard))

    def _unlock(self, effect: fx.Unlock) -> None:
        self.locks.unlock(effect.shard)

    def _webhook(self, effect: fx.CallWebhook) -> None:
        assert self._nursery is not None and self._webhooks is not None
        try:
            data = self._read_payload(effect.location)
        except Exception as exc:
            self._payload_unreadable(effect.task_id, effect.attempt, exc)
            return
        self._nursery.start_soon(self._webhook_task, effect, data)

    async def _webhook_task(self, effect: fx.CallWebhook, data: str) -> None:
        """One webhook call, in the runtime's nursery: nothing but cancellation may escape it
        (an exception here would cancel the nursery, and so the daemon)."""
        assert self._webhooks is not None
        try:
            ok, error = await self._webhooks.call(
                url=effect.url,
                event=effect.event,
                task_id=effect.task_id,
                task_type=effect.task_type,
                data=data,
                timeout_s=effect.timeout_seconds,
            )
        except Exception as exc:  # `call` already turns its failures into outcomes
            ok, error = False, f"Webhook request failed: {_unexpected(exc)}"
        self.submit(
            ev.WebhookFinished(
                task_id=effect.task_id,
                attempt=effect.attempt,
                ok=ok,
                error=error,
                notification=effect.event != "Execute",
            )
        )


class _Outgoing:
    """The appends of one burst to one file, handed to the log as one job (its lines in
    order). The log commits a file's share of a batch as a whole (one write, one fsync; on
    error every append of it fails), so one job per file changes no outcome; the callback
    hands each append its own offsets as an `AppendCommitted`, in order, or fails each."""

    __slots__ = ("inbox", "lines", "log_before", "path", "records", "runtime", "tokens")

    def __init__(self, runtime: Runtime, path: str, inbox: bool) -> None:
        self.runtime = runtime
        self.path = path
        #: Inbox records are never read back by location: not remembered.
        self.inbox = inbox
        self.lines: list[bytes] = []
        #: (token, number of lines) per append, and every record, in order.
        self.tokens: list[tuple[int, int]] = []
        self.records: list[fx.NewRecord] = []
        #: An inbox whose appends note the shard's log: its identity and size before them.
        self.log_before: tuple[int, int] | None = None

    def add(self, token: int, lines: list[bytes], records: tuple[fx.NewRecord, ...]) -> None:
        self.tokens.append((token, len(lines)))
        self.lines += lines
        self.records += records

    def done(self, result: logio.AppendOutcome) -> None:
        runtime = self.runtime
        runtime._appends_out -= 1
        if isinstance(result, OSError):
            if not self.inbox:
                recent = runtime._recent
                assert recent is not None
                recent.append_failed(self.path)
            error = _describe(result)
            for token, _ in self.tokens:
                runtime.submit(ev.AppendFailed(token=token, error=error))
            return
        lines = self.lines
        if not self.inbox:
            recent = runtime._recent
            assert recent is not None
            recent.remember(self.path, result, lines, self.records)
        lengths = tuple(map(len, lines))
        tokens = self.tokens
        if self.log_before is not None:
            identity, size = self.log_before
            committed = []
            at = 0
            for token, n in tokens:
                end = at + n
                committed.append(
                    ev.AppendCommitted(
                        token=token,
                        offsets=result[at:end],
                        lengths=lengths[at:end],
                        log_identity=identity,
                        log_size=size,
                    )
                )
                at = end
        elif len(tokens) == 1:
            committed = [_new_committed(tokens[0][0], result, lengths)]
        else:
            committed = []
            at = 0
            for token, n in tokens:
                end = at + n
                committed.append(_new_committed(token, result[at:end], lengths[at:end]))
                at = end
        flush = runtime._flush_nowait
        if flush is not None:
            # What the node lets go at once (`Node.on_commit`: acks, an `execute` whose
            # payload `_recent` now holds) leaves before the burst that handles the commit.
            node = runtime.node
            now = runtime.clock.now()
            sent = False
            for event in committed:
                for effect in node.on_commit(event.token, now, event.offsets, event.lengths):
                    _EFFECTS[type(effect)](runtime, effect)
                    sent = True
            if sent:
                flush()
        runtime.events.extend(committed)
        if runtime._parked is not None and not runtime._processing:
            runtime._unpark()



def _unexpected(exc: BaseException) -> str:
    """An exception no rule foresaw, as a task's error: its class (its text may quote the bad
    data at length), and a pointer for whoever reads the dead letter."""
    return f"snerd failed on this task's data ({type(exc).__name__}); please report it"


def _describe(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "No space left on device (os error 28)"
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


#: Records handed to the log at once while a long run of events is still being handled: a
#: burst's worth (`EVENT_BURST` lines make as many records or more), so the first burst's
#: fsync runs while the next ones are handled, and their acks go out between bursts
#: (`GroupCommitLog.poll_helper`) instead of after the whole run.
_OUTBOX_BURST = 64
#: Events handed to the node at once (one clock reading, one `_on_time` pass for all); a
#: `LinesReceived` counts one per line (`Node.handle_burst`), and stdin's carry at most this many.
EVENT_BURST = 64
#: A burst that ends with at most this many records to append commits them in the trio thread
#: when the log writer is idle (`GroupCommitLog.submit_many(inline=True)`).
_INLINE_RECORDS = 16

_EFFECTS: dict[type[Any], Callable[[Runtime, Any], None]] = {
    fx.Send: Runtime._send,
    fx.AckEnqueued: Runtime._ack_enqueued,
    fx.Log: Runtime._log_line,
    fx.Exit: Runtime._exit,
    fx.Execute: Runtime._execute_task,
    fx.DeliverDeadLetter: Runtime._dead_letter,
    fx.Append: Runtime._append,
    fx.AppendInbox: Runtime._append,
    fx.ReadInbox: Runtime._read_inbox,
    fx.ReadLogTail: Runtime._read_log_tail,
    fx.MarkInboxRead: Runtime._inbox_chore,
    fx.RemoveInbox: Runtime._inbox_chore,
    fx.CheckInboxes: Runtime._check_inboxes,
    fx.ScanQueue: Runtime._scan_queue,
    fx.Compact: Runtime._compact,
    fx.ReadLog: Runtime._read_log,
    fx.ReadMembership: Runtime._read_membership,
    fx.WriteMembership: Runtime._write_membership,
    fx.TryLock: Runtime._try_lock,
    fx.Unlock: Runtime._unlock,
    fx.CallWebhook: Runtime._webhook,
    fx.StopAttempt: Runtime._stop_attempt,
    fx.ReadRecord: Runtime._read_record,
    fx.ReadTask: Runtime._read_task,
}
