"""A daemon's brain: one plain object, driven by events, answering with effects.

Theory of operation
-------------------
The node has three inputs: `Node.handle(event, now)` (and `handle_burst`, for events that
arrived together), `Node.on_commit(token, ...)` (an append just made durable, asked straight
after the fsync), and the timer: `Node.wake_in(now)` says when the node next needs a `Tick`.
It never performs I/O: each call returns the effects (`snerd.core.effects`) that the shell
carries out, and the shell reports their outcomes back as events.

`Node` decides little itself. It composes parts that own their state (aioquic's connection
holding its recovery and streams), builds them once, and routes each event to its handler
through one table (`_event_handlers`):

- `Outbox` (`outbox`): the effects of the call, tokens, append merging, pending appends;
- `Tenure` (`tenure`): membership rounds, claims, locks, probes, the lease, step-down;
- `Replay` (`replay`): a claimed shard's log read back into state;
- `TaskBook` (`tasks`): the task index, its queues and the task lifecycle;
- `Intake` (`intake`): SDK lines and commands;
- `Outcomes` (`outcomes`): what a commit or a failure of each kind of append means;
- `InboxIngest` (`inbox`), `Compaction` (`compaction`).

What stays here: the call's frame (`_begin`, `_end`), the phase machine below (the drain and
the release included), the one table of timers that both `wake_in` and the tick read
(`timers`: each deadline's owner says when it is due and what firing it does), the read-only
views the shells use, and `invariants()`, which calls each part's.

A node goes through four phases::

    STARTING --(every owned shard loaded)--> RUNNING --(DrainRequested)--> DRAINING --> STOPPED

While STARTING it reads membership.json, claims shards, locks them and replays their logs;
SDK commands that arrive meanwhile are kept in order and handled once it runs (upstream simply
left them in the pipe). Every task it knows lives in `TaskBook.tasks`, a payload-free index;
the payload stays in the log and is read by the shell when an `Execute` needs it.

A task moves through the states below, and only along the edges of `TRANSITIONS`; any other move
is a bug and raises (TigerBeetle-style assertions are kept on)::

    ENQUEUING   -> WAITING | READY | BLOCKED      enqueue record durable (else: forgotten)
    ENQUEUING   -> DISPATCHING                     ready at once and a worker slot is free: the
                                                   dispatch record goes in the same append
    BLOCKED     -> READY | WAITING                 every parent finished
    BLOCKED     -> FINISHING                       a parent was dead-lettered (fail-through)
    WAITING     -> READY                           its time came (execute_at, retry backoff)
    READY       -> PARKED                          no handler registered / rate window full
    PARKED      -> READY                           handler registered / window has room
    READY       -> DISPATCHING                     a worker slot is free; dispatch record written
    DISPATCHING -> RUNNING                         dispatch record durable; Execute sent
    DISPATCHING -> WAITING                         dispatch record failed (retried a bit later)
    DISPATCHING -> READY                           a drain began before it was sent
    RUNNING     -> FINISHING                       result / timeout / webhook outcome
    FINISHING   -> WAITING | READY                 retry record durable (or cron re-armed)
    FINISHING   -> (gone)                          completion or dead-letter record durable

Durability rule: nothing is told to the SDK before the record that makes it true is durable. An
`ack` follows the enqueue record's commit; an `execute` follows the dispatch record's commit, so
after a crash the log tells which attempts may have run (crash re-executions) and the rate
windows can be rebuilt exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.node.compaction import Compaction
from snerd.core.node.control import Control
from snerd.core.node.inbox import InboxIngest
from snerd.core.node.intake import Intake
from snerd.core.node.model import (
    ACTIVE,
    DRAINING,
    FENCING,
    LOADING,
    LOCKING,
    NODE_RUNNING,
    PAUSED,
    PROBING,
    SECOND,
    STARTING,
    STOPPED,
    UNOWNED,
    NodeConfig,
    NodePhase,
    ShardInfo,
    Task,
    require,
)
from snerd.core.node.outbox import DispatchRun, Outbox
from snerd.core.node.outcomes import Outcomes
from snerd.core.node.parents import Parents
from snerd.core.node.replay import Replay
from snerd.core.node.schedules import Schedules
from snerd.core.node.tasks import TaskBook
from snerd.core.node.tenure import Tenure
from snerd.core.node.verdicts import Verdicts
from snerd.core.ownership import (
    ShardPhase,
    shard_name,
    without_claims,
)
from snerd.core.timefmt import format_rfc3339

__all__ = ["Node", "Timer"]


@dataclass(frozen=True, slots=True)
class Timer:
    """One deadline of the node, in `Node.timers`."""

    name: str
    #: `due` is on the wall clock (task times) rather than the monotonic one.
    wall: bool
    #: When the node next needs a tick for it (µs); None: not armed.
    due: Callable[[], int | None]
    #: Does what is due at `now` (checking for itself); None: acted on elsewhere.
    fire: Callable[[ev.Now], None] | None


class Node:
    """The decisions of one daemon. See the module docstring."""

    def __init__(self, config: NodeConfig) -> None:
        assert config.max_workers >= 1
        self.config = config
        self.phase = STARTING
        self.shards: dict[int, ShardInfo] = {}
        #: The effects of the current call and the appends in flight.
        self.outbox = Outbox(self.shards)
        #: Inbox files: reading those of owned shards, writing this node's own.
        self.inbox = InboxIngest(self)
        self.compaction = Compaction(self)
        self.tenure = Tenure(self)
        #: Every live task, its queues and its lifecycle.
        self.book = TaskBook(self)
        #: Children waiting on parents, and the watch of parents held elsewhere.
        self.parents = Parents(self)
        #: Enqueues with dedupe through inboxes, waiting for their owner's decision.
        self.verdicts = Verdicts(self)
        #: The named schedules of the shards this node owns.
        self.schedules = Schedules(self)
        #: Cancel, retry and pause, and the pause marks of owned shards.
        self.control = Control(self)
        self.replay = Replay(self)
        self.intake = Intake(self)
        self.outcomes = Outcomes(self)
        #: `format_rfc3339` of the wall time `_now_text_wall` (`wall_text`).
        self._now_text_wall = -1
        self._now_text = ""
        self.started_mono: int | None = None
        self.drain_deadline_mono: int | None = None
        #: The drain is over and claims are to be handed back; `releasing`: that write is out.
        self.released = False
        self.releasing = False
        self.input_closed = False
        self.stats = {
            "total_enqueued": 0,
            "total_executed": 0,
            "total_failed": 0,
            "total_dlq": 0,
            "total_deduplicated": 0,
        }
        self.now = ev.Now(wall=0, mono=0)
        #: The clock reading of the last tick (`_on_time`), for `invariants`.
        self._ticked: ev.Now | None = None
        self.handlers = self._event_handlers()
        self.timers = self._timers()
        self._fires = tuple(t.fire for t in self.timers if t.fire is not None)

    # ------------------------------------------------------------------ public API

    def _begin(self, now: ev.Now) -> None:
        """What every call starts with: the clock reading, and the lease checked before any
        event is handled (a node past its lease acts for no shard, whatever came in)."""
        assert not self.outbox.out
        self.now = now
        if self.started_mono is None:
            self.started_mono = now.mono
        if self.tenure.lease_over(now):
            self.tenure.lease_ran_out()

    def handle(self, event: ev.Event, now: ev.Now) -> list[fx.Effect]:
        """Feed one event; return the effects to carry out, in order."""
        self._begin(now)
        handler = self.handlers.get(type(event))
        if handler is None:
            raise TypeError(f"Node cannot handle {type(event).__name__}")
        handler(event)
        self._on_time()
        return self._end()

    def handle_burst(
        self, events: deque[ev.Event], now: ev.Now, limit: int = 64
    ) -> list[fx.Effect]:
        """Feed up to `limit` events that arrived together (a `LinesReceived` counts as one per
        line, and is taken whole), taken from the left of `events`; return the effects of all
        of them, in order.

        The same as `handle` for each in turn, except that the time-driven work (`_on_time`:
        filling free worker slots, due tasks, timeouts, leases, compaction) runs once, after
        the last of them, at `now`: a burst of lines costs one dispatch pass instead of one per
        line. (A task that finds a slot free as it arrives is dispatched with its
        enqueue record, before later lines of the burst are read.) Stops after an
        event that stopped the node (the rest stay in `events`, as the shell stops there too).
        """
        self._begin(now)
        handlers = self.handlers
        popleft = events.popleft
        taken = 0
        while events and taken < limit:
            event = popleft()
            kind = type(event)
            handler = handlers.get(kind)
            if handler is None:
                raise TypeError(f"Node cannot handle {kind.__name__}")
            handler(event)
            taken += len(event.lines) if isinstance(event, _LINES_RECEIVED) else 1
            if self.phase is STOPPED:
                break
        self._on_time()
        return self._end()

    def _end(self) -> list[fx.Effect]:
        """What every call ends with: the effects handed over (`Outbox.take`)."""
        return self.outbox.take()

    def wake_in(self, now: ev.Now) -> int | None:
        """Microseconds until the node next needs a `Tick` (None: only events will wake it):
        the earliest deadline of `timers`."""
        if self.phase is STOPPED:
            return None
        mono, wall = now.mono, now.wall
        best: int | None = None
        for timer in self.timers:
            at = timer.due()
            if at is not None:
                left = at - (wall if timer.wall else mono)
                if best is None or left < best:
                    best = left
        return None if best is None else max(0, best)

    def invariants(self) -> None:
        """Check that the node's state is whole, part by part (TigerBeetle's `invariants()`):
        raises `AssertionError` naming the first thing found broken. For tests and the
        simulator, after any call; it walks every task, so the daemon does not call it."""
        require(isinstance(self.phase, NodePhase), f"phase {self.phase!r}")
        require(len(self._fires) == sum(t.fire is not None for t in self.timers), "timer fires")
        self.outbox.invariants()
        self.book.invariants()
        self.parents.invariants()
        self.verdicts.invariants()
        self.schedules.invariants()
        self.control.invariants()
        self.tenure.invariants()
        self.inbox.invariants()
        if self.phase is STOPPED:
            return
        for shard, info in self.shards.items():
            require(isinstance(info.phase, ShardPhase), f"shard {shard}: phase {info.phase!r}")
            # (Its completed tasks are some of its history: a count, cheap at every step.)
            require(len(info.completed_at) <= len(info.history), f"shard {shard}: completed_at")
            require(
                len(info.completed_at) + len(info.ended) == len(info.history),
                f"shard {shard}: ended",
            )
        # No timer the last tick fires was still due at that tick (what came due since waits
        # for the next one).
        ticked = self._ticked
        if ticked is None:
            return
        mono, wall = ticked.mono, ticked.wall
        for timer in self.timers:
            at = timer.due()
            if timer.fire is not None and at is not None:
                require(at > (wall if timer.wall else mono), f"timer {timer.name!r} due, not fired")

    def on_commit(
        self, token: int, now: ev.Now, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> list[fx.Effect]:
        """What may be carried out the moment the append `token` is durable (at `offsets`),
        before the burst that handles its `AppendCommitted` (`Outcomes.on_commit` says which
        answers go early). No I/O."""
        return self.outcomes.on_commit(token, now, offsets, lengths)

    @property
    def owned_shards(self) -> list[int]:
        # A list, not a generator, for `sorted`: the simulator asks after every event.
        active = ACTIVE
        return sorted([s for s, i in self.shards.items() if i.phase is active])

    # Read-only views for the shells (the simulator's checks read them after every event).

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Read-only view for the shells: every live task by id (`TaskBook.tasks`); the
        simulator checks their record locations after each load and compaction."""
        return self.book.tasks

    @property
    def lease_deadline_mono(self) -> int | None:
        """Read-only view for the shells: until when (mono) this node acts for its shards, as
        its last committed renewal says (`Tenure.lease_deadline_mono`); None: no lease."""
        return self.tenure.lease_deadline_mono

    @property
    def dead_nodes(self) -> Mapping[str, int]:
        """Read-only view for the shells: the nodes this one has proven gone by their shard's
        lock, with when (mono) (`Tenure.dead_nodes`)."""
        return self.tenure.dead_nodes

    def waiting_types(self) -> list[str]:
        """Task types with queued tasks but no registered handler."""
        return sorted(t for t, q in self.book.parked_by_type.items() if len(q))

    def _event_handlers(self) -> dict[type[Any], Callable[[Any], None]]:
        """The handler of each kind of event (and SDK command), bound to this node and its
        parts: `handle` looks an event's type up here; anything not listed raises."""
        return {
            ev.Started: self.tenure.on_started,
            ev.Tick: self._on_tick,
            ev.LineReceived: self.intake.on_line,
            ev.LinesReceived: self.intake.on_lines,
            ev.DrainRequested: self._on_drain,
            ev.MembershipRead: self.tenure.on_membership_read,
            ev.MembershipWritten: self.tenure.on_membership_written,
            ev.MembershipWriteFailed: self.tenure.on_membership_write_failed,
            ev.MembershipUnusable: self.tenure.on_membership_unusable,
            ev.LockAcquired: self.tenure.on_lock_acquired,
            ev.LockBusy: self.tenure.on_lock_busy,
            ev.LockLost: self.tenure.on_lock_lost,
            ev.ShardUnusable: self.tenure.on_shard_unusable,
            ev.LogRecordsRead: self.replay.on_log_records,
            ev.AppendCommitted: self.outcomes.on_append_committed,
            ev.AppendFailed: self.outcomes.on_append_failed,
            ev.Compacted: self.compaction.on_compacted,
            ev.CompactionFailed: self.compaction.on_compaction_failed,
            ev.WebhookFinished: self.intake.on_webhook,
            ev.CompactionRequested: self.compaction.on_compaction_requested,
            ev.PayloadUnreadable: self.intake.on_payload_unreadable,
            ev.InboxRead: self.inbox.on_inbox_read,
            ev.QueueScanned: self.parents.on_scanned,
            ev.LogTailRead: self.verdicts.on_log_tail,
            ev.InboxProgress: self.inbox.on_inbox_progress,
            proto.Register: self.intake.on_register,
            proto.Enqueue: self.intake.on_enqueue,
            proto.EnqueueBatch: self.intake.on_enqueue_batch,
            proto.Result: self.intake.on_result,
            proto.Progress: self.intake.on_progress,
            proto.StatsRequested: self.intake.on_stats,
            proto.Schedule: self.schedules.on_schedule,
            proto.Unschedule: self.schedules.on_schedule,
            proto.Cancel: self.control.on_command,
            proto.Requeue: self.control.on_command,
            proto.Pause: self.control.on_command,
            proto.Sweep: self.control.on_command,
            proto.GetTask: self.control.on_get,
            ev.TaskRead: self.control.on_task_read,
            ev.RecordRead: self.control.on_record_read,
        }

    # ------------------------------------------------------------------ helpers

    def wall_text(self) -> str:
        """`format_rfc3339` of the current wall time, made once per clock reading (a burst's
        records share it)."""
        wall = self.now.wall
        if wall != self._now_text_wall:
            self._now_text_wall = wall
            self._now_text = format_rfc3339(wall)
        return self._now_text

    # ------------------------------------------------------------------ phases

    def maybe_running(self) -> None:
        if self.phase is not STARTING:
            return
        if (
            self.tenure.membership_busy
            or self.tenure.lock_proofs
            or any(i.phase in (LOCKING, LOADING, FENCING, PROBING) for i in self.shards.values())
        ):
            return
        self.phase = NODE_RUNNING
        self.tenure.announce_membership()
        owned = self.owned_shards
        if owned:
            self.outbox.log(
                "info",
                f"owning {', '.join(shard_name(s) for s in owned)}; "
                f"{len(self.book.tasks)} live task(s) recovered",
            )
        held, self.intake.held_commands = self.intake.held_commands, []
        for command in held:
            self.handlers[type(command)](command)
        assert not self.intake.held_commands

    def _on_time(self) -> None:
        """The tick: everything that depends only on time and free slots; runs after every
        event. Each timer does what is due, in the order of `timers`; then free worker slots
        are filled, a drain moves on, and compaction is checked."""
        if self.phase is STOPPED:
            return
        now = self._ticked = self.now
        for fire in self._fires:
            fire(now)
        if self.phase is NODE_RUNNING:
            self.book.dispatch()
        if self.phase is DRAINING:
            self._drain_progress()
        self.compaction.maybe_compact()

    def _timers(self) -> tuple[Timer, ...]:
        """Every deadline the node keeps, once: `wake_in` reads each one's `due`, and the tick
        (`_on_time`) calls each one's `fire`, in this order."""
        inbox, book, tenure, outbox = self.inbox, self.book, self.tenure, self.outbox
        parents, verdicts, schedules = self.parents, self.verdicts, self.schedules
        return (
            Timer("inbox poll", False, inbox.poll_due, inbox.poll_fire),
            Timer("inbox check", False, inbox.check_due, inbox.check_fire),
            Timer("append retry", False, outbox.retry_due_at, outbox.retry_fire),
            Timer("dispatch hold", False, book.dispatch_holds_due, book.dispatch_holds_fire),
            Timer("lock retry", False, tenure.lock_retry_due, tenure.lock_retry_fire),
            Timer("renewal", False, tenure.renew_due, tenure.renew_fire),
            Timer("hard timeout", False, book.timeouts_due, book.timeouts_fire),
            Timer("due task", True, book.due_at, book.due_fire),
            Timer("rate window", True, book.group_wake_at, book.group_wake_fire),
            Timer("schedule tick", True, schedules.tick_due, schedules.tick_fire),
            Timer("parent scan", False, parents.scan_due, parents.scan_fire),
            Timer("verdict poll", False, verdicts.poll_due, verdicts.poll_fire),
            Timer("verdict wait", False, verdicts.deadline_due, verdicts.deadline_fire),
            Timer("command wait", False, self.control.deferred_due, self.control.deferred_fire),
            Timer("lock probe", False, tenure.probe_due, tenure.probe_fire),
            # Deadlines acted on elsewhere, which only need the node woken at them: the lease
            # (checked by `_begin` before every event), the drain's timeout and its wait for
            # the inboxes (`_drain_progress`, at every tick while draining).
            Timer("lease", False, tenure.lease_due, None),
            Timer("drain timeout", False, self._drain_due, None),
            Timer("drain inbox wait", False, inbox.drain_wait_due, None),
        )

    def _drain_due(self) -> int | None:
        return self.drain_deadline_mono

    # ------------------------------------------------------------------ drain

    def _on_drain(self, event: ev.DrainRequested) -> None:
        if self.phase in (DRAINING, STOPPED):
            # Already draining (a signal): stdin closing now means no result can arrive any
            # more (the SDK is gone, killed in its own warm shutdown, say): stop waiting.
            if event.input_closed and self.phase is DRAINING:
                self.input_closed = True
            return
        if self.phase is STARTING:
            # Commands that came before the drain request are answered first, as upstream
            # answered lines sent before EOF: the drain starts once the shards are loaded.
            self.intake.held_commands.append(event)
            self.drain_before_start()  # (unless no round lands: then it stops now)
            return
        self.outbox.log(
            "info",
            f"draining ({event.reason}): no new work; {len(self.book.inflight)} task(s) in flight get "
            f"up to {self.config.drain_timeout_us // SECOND} s",
        )
        self.phase = DRAINING
        self.drain_deadline_mono = self.now.mono + self.config.drain_timeout_us
        # No more enqueues: every inbox file of this node is closed, to be removed once read.
        for segment in self.inbox.current.values():
            segment.closed = True
        self.inbox.current.clear()
        self.inbox.drain_until_mono = self.now.mono + min(
            self.config.inbox_drain_wait_us, self.config.drain_timeout_us
        )
        self.inbox.check_at_mono = None
        self.input_closed = event.input_closed

    def _drain_progress(self) -> None:
        if self.released:
            return
        assert self.drain_deadline_mono is not None
        late = self.now.mono >= self.drain_deadline_mono
        waiting_for = [
            t
            for t in self.book.inflight
            if not self.input_closed or self.book.tasks[t].webhook_url is not None
        ]
        busy = (
            bool(waiting_for)
            or any(type(p) is not DispatchRun for p in self.outbox.pending_parts())
            or self.inbox.drain_pending()
            or self.verdicts.pending()
        )
        if busy and not late:
            return
        if self.book.inflight:
            why = "drain timeout" if late else "no result can arrive (stdin closed)"
            self.outbox.log(
                "warning",
                f"{why}: {len(self.book.inflight)} task(s) still running will run again "
                "on the next owner",
            )
        self.released = True
        self.drain_deadline_mono = None  # handled: it must not wake the node again
        if self.tenure.doc is None:
            self.finish_release()
            return
        # Even holding no shard now (a lease that ran out during the drain), claims and the
        # heartbeat in membership.json may still name this node: remove them, so others take
        # over at once instead of waiting for them to lapse.
        if not self.tenure.membership_busy:
            self.tenure.renew_at_mono = None
            self.tenure.read_membership()

    def release(self, doc: dict[str, Any], expected: int | None) -> None:
        # Stop acting for every shard before the write that frees them (see `_mark_give_backs`).
        for shard in sorted(self.shards):
            self.tenure.step_down(shard, "handed over on drain", level="info", handing_over=True)
        self.releasing = True
        self.tenure.membership_busy = True
        self.outbox.emit(
            fx.WriteMembership(
                doc=without_claims(doc, node_id=self.config.node_id), expected_version=expected
            )
        )

    def drain_before_start(self) -> bool:
        """A drain came while starting, and no membership round has landed yet (the last one
        failed, and is retried): stop now rather than wait for membership.json to come back,
        since SIGTERM and stdin EOF must end the daemon whatever state the file is in. Nothing
        was claimed (no round landed), so there is nothing to hand over. True when stopped."""
        if not (
            self.phase is STARTING
            and self.tenure.doc is None
            and self.tenure.membership_trouble is not None
            and not self.tenure.membership_busy
        ):
            return False
        drain = next(
            (c for c in self.intake.held_commands if isinstance(c, ev.DrainRequested)), None
        )
        if drain is None:
            return False
        self.outbox.log(
            "warning",
            f"stopping ({drain.reason}) before this daemon could start: membership.json was "
            "never read and updated"
            + (f" ({self.tenure.membership_trouble})" if self.tenure.membership_trouble else ""),
        )
        self.stop_before_start(0)
        return True

    def stop_before_start(self, code: int) -> None:
        """Stop a node whose first membership round never landed: it claimed nothing, and
        holds no lock but a probe's. Commands held meanwhile are answered as during a drain
        (an enqueue is refused: not enqueued)."""
        self.phase = DRAINING
        held, self.intake.held_commands = self.intake.held_commands, []
        for command in held:
            if not isinstance(command, ev.DrainRequested):
                self.handlers[type(command)](command)
        self.released = True
        self.finish_release(code)

    def finish_release(self, code: int = 0) -> None:
        for shard, info in self.shards.items():
            self.tenure.lock_hold_over(shard, info, drained=False)  # released, or left to lapse
            if (
                info.phase not in (UNOWNED, LOCKING, PAUSED)
                or shard in self.tenure.lock_proofs  # locked, its claim never written
            ):
                self.outbox.emit(fx.Unlock(shard=shard))
            info.phase = UNOWNED
        self.tenure.lock_proofs.clear()
        self.phase = STOPPED
        self.tenure.renew_at_mono = None
        self.outbox.log("info", "Shutdown complete.")
        self.outbox.emit(fx.Exit(code=code))

    def _on_tick(self, event: ev.Tick) -> None:
        return


_LINES_RECEIVED = ev.LinesReceived
