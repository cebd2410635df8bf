"""A daemon's brain: one plain object, driven by events, answering with effects.

Theory of operation
-------------------
`Node.handle(event, now)` is the only entry point. It never performs I/O: it returns a list of
effects (`snerd.core.effects`) that the shell carries out, and the shell reports outcomes back
as events. `Node.wake_in(now)` says when the node next needs a `Tick`.

A node goes through four phases::

    STARTING --(every owned shard loaded)--> RUNNING --(DrainRequested)--> DRAINING --> STOPPED

While STARTING it reads membership.json, claims shards, locks them and replays their logs;
SDK commands that arrive meanwhile are kept in order and handled once it runs (upstream simply
left them in the pipe). Every task it knows lives in `self.tasks`, a payload-free index; the
payload stays in the log and is read by the shell when an `Execute` needs it.

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
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson
import xxhash

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core import protocol as proto
from snerd.core.cron import next_fire
from snerd.core.fields import adopt_cron
from snerd.core.node.compaction import Compaction
from snerd.core.node.inbox import InboxIngest
from snerd.core.node.model import (
    ACTIVE,
    BLOCKED,
    CLEARED_ON_SUCCESS,
    DISPATCHING,
    DRAINING,
    ENQUEUING,
    FENCING,
    FINISHING,
    KIND_CLAIM,
    KIND_DISPATCH,
    LOADING,
    LOCKING,
    NODE_RUNNING,
    OUTCOME_COMPLETED,
    OUTCOME_DEAD,
    PARKED,
    PAUSED,
    PROBING,
    READY,
    RUNNING,
    SECOND,
    STARTING,
    STOPPED,
    TRANSITIONS,
    UNOWNED,
    WAITING,
    InboxSegment,
    InFlight,
    LockProof,
    NodeConfig,
    ShardInfo,
    Task,
    TaskState,
    new_ack_enqueued,
    new_append,
    new_based_record,
    new_execute,
    new_location,
    new_record,
    queue_in,
    route_shard,
)
from snerd.core.node.outbox import Outbox, PendingAppend, finish_pending
from snerd.core.ownership import (
    MAX_COUNT,
    Observer,
    claim_epoch,
    claim_owner,
    claim_signature,
    claimable,
    give_back,
    initial_doc,
    live_foreign,
    lock_names_claim,
    owned_by,
    plan_claims,
    proof_room,
    shard_name,
    with_claims,
    with_heartbeat,
    without_claims,
)
from snerd.core.rate_limit import RateWindows
from snerd.core.ready_queue import DueQueue, ReadyQueue
from snerd.core.records import task_problem
from snerd.core.retry import attempts_allowed, retry_delay_us
from snerd.core.shardlog import ShardFold
from snerd.core.timefmt import format_rfc3339, parse_rfc3339

__all__ = ["Node"]

#: `Node._line`'s default: the line is not parsed yet.
_UNPARSED = object()


class Node:
    """The decisions of one daemon. See the module docstring."""

    def __init__(self, config: NodeConfig) -> None:
        assert config.max_workers >= 1
        self.config = config
        self.phase = STARTING
        self.doc: dict[str, Any] | None = None
        #: Whether `doc` names another node as a shard's owner (`live_foreign`): worked out
        #: once per document, not on every `wake_in`.
        self.doc_names_others = False
        #: The last membership read found a live heartbeat of another node.
        self.peers_live = False
        self.shards: dict[int, ShardInfo] = {}
        #: The effects of the current call and the appends in flight.
        self.outbox = Outbox(self.shards)
        #: Inbox files: reading those of owned shards, writing this node's own.
        self.inbox = InboxIngest(self)
        self.compaction = Compaction(self)
        self.tasks: dict[str, Task] = {}
        self.registered: set[str] = set()
        self.inflight: dict[str, InFlight] = {}
        #: Some flight may have a deadline (set with it; cleared by `_on_time` when none has).
        self.timed_flights = False
        self.pool_busy: dict[str, int] = {}
        self.ready: dict[str, ReadyQueue[str]] = {}
        self.due: DueQueue[str] = DueQueue()
        #: Tasks waiting for a handler, by type.
        self.parked_by_type: dict[str, ReadyQueue[str]] = {}
        #: Tasks waiting for room in their rate window, by group.
        self.parked_by_group: dict[str, ReadyQueue[str]] = {}
        self.group_wake: DueQueue[str] = DueQueue()
        self.windows = RateWindows()
        #: The live tasks of each dedupe fingerprint, in the order they came (`_pending_twin`).
        #: Usually one, but two can share it: one with a rate-limit group routes by its group,
        #: so two owners may each take one in, and a node taking both shards over has both.
        self.fingerprints: dict[str, dict[str, None]] = {}
        #: Children waiting on parents (trigger_after_ids), by parent id.
        self.children: dict[str, set[str]] = {}
        #: `format_rfc3339` of the wall time `_now_text_wall` (`_wall_text`).
        self._now_text_wall = -1
        self._now_text = ""
        self.held_commands: list[ev.Event] = []
        self.seq = 0
        self.started_mono: int | None = None
        self.renew_at_mono: int | None = None
        self.membership_busy = False
        #: A renewal came due while a membership operation was out: do it when that ends.
        self.renew_after_busy = False
        #: Shards whose lock a probe took while another node's claim named it (`LockProof`).
        #: The lock stays held until the claim is rewritten as ours, or the proof fails.
        self.lock_proofs: dict[int, LockProof] = {}
        #: Nodes whose process is gone, proven by their shard's lock (node id -> when, mono):
        #: no longer counted among the live nodes for fair shares, so their shards are not
        #: handed back to them while their heartbeat still looks fresh.
        self.dead_nodes: dict[str, int] = {}
        #: When to try other nodes' shard locks next (only where flock proves liveness).
        self.probe_at_mono: int | None = None
        #: Shards this node's cap left free at its last round, said once (`_say_left_free`).
        self.left_free_said: set[int] = set()
        #: What made the last membership round fail, logged once (`_membership_trouble`),
        #: and whether its end is to be said too; None: the last round landed.
        self.membership_trouble: str | None = None
        self.membership_trouble_said = False
        #: Claims and heartbeats seen in membership.json, timed on this node's monotonic clock.
        self.observer = Observer()
        #: When the membership round in flight started (its read was issued).
        self.round_started_mono: int | None = None
        #: This node acts for its shards only until then: the start of its last renewal known
        #: to have committed, plus the lease (DESIGN §4.4). None: it holds no lease.
        self.lease_deadline_mono: int | None = None
        #: Ready tasks of shards being given back (not dispatched here any more), by shard.
        self.parked_by_shard: dict[int, ReadyQueue[str]] = {}
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
        self.handlers = self._event_handlers()

    # ------------------------------------------------------------------ public API

    def _begin(self, now: ev.Now) -> None:
        """What every call starts with: the clock reading, and the lease checked before any
        event is handled (a node past its lease acts for no shard, whatever came in)."""
        assert not self.outbox.out
        self.now = now
        if self.started_mono is None:
            self.started_mono = now.mono
        if self._lease_over(now):
            self._lease_ran_out()

    def _lease_over(self, now: ev.Now) -> bool:
        """No renewal committed within the lease: past it, the node acts for no shard."""
        return self.lease_deadline_mono is not None and now.mono >= self.lease_deadline_mono

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
        """Microseconds until the node next needs a `Tick` (None: only events will wake it)."""
        candidates: list[int] = []
        if self.phase is STOPPED:
            return None
        nd = self.due.next_due()
        if nd is not None:
            candidates.append(nd - now.wall)
        gw = self.group_wake.next_due()
        if gw is not None:
            candidates.append(gw - now.wall)
        ra = self.outbox.retry_appends.next_due()
        if ra is not None:
            candidates.append(ra - now.mono)
        if self.timed_flights:
            for flight in self.inflight.values():
                if flight.deadline_mono is not None:
                    candidates.append(flight.deadline_mono - now.mono)
        if self.renew_at_mono is not None:
            candidates.append(self.renew_at_mono - now.mono)
        if self.probe_at_mono is not None and self.phase is NODE_RUNNING and self.doc_names_others:
            candidates.append(self.probe_at_mono - now.mono)
        if self.lease_deadline_mono is not None:
            candidates.append(self.lease_deadline_mono - now.mono)
        if self.drain_deadline_mono is not None:
            candidates.append(self.drain_deadline_mono - now.mono)
        if (
            self.inbox.poll_at_mono is not None
            and not self.inbox.busy
            and self.phase is NODE_RUNNING
        ):
            candidates.append(self.inbox.poll_at_mono - now.mono)
        if self.inbox.check_at_mono is not None and self.inbox.segments and not self.inbox.checking:
            candidates.append(self.inbox.check_at_mono - now.mono)
        if self.inbox.drain_until_mono is not None and self.inbox.drain_pending():
            candidates.append(self.inbox.drain_until_mono - now.mono)
        for info in self.shards.values():
            if info.retry_lock_at_mono is not None:
                candidates.append(info.retry_lock_at_mono - now.mono)
            if info.hold_dispatch_until_mono is not None:
                candidates.append(info.hold_dispatch_until_mono - now.mono)
        if not candidates:
            return None
        return max(0, min(candidates))

    @property
    def owned_shards(self) -> list[int]:
        # A list, not a generator, for `sorted`: the simulator asks after every event.
        active = ACTIVE
        return sorted([s for s, i in self.shards.items() if i.phase is active])

    def waiting_types(self) -> list[str]:
        """Task types with queued tasks but no registered handler."""
        return sorted(t for t, q in self.parked_by_type.items() if len(q))

    def _event_handlers(self) -> dict[type[Any], Callable[[Any], None]]:
        """The handler of each kind of event (and SDK command), bound to this node and its
        parts: `handle` looks an event's type up here; anything not listed raises."""
        return {
            ev.Started: self._on_started,
            ev.Tick: self._on_tick,
            ev.LineReceived: self._on_line,
            ev.LinesReceived: self._on_lines,
            ev.DrainRequested: self._on_drain,
            ev.MembershipRead: self._on_membership_read,
            ev.MembershipWritten: self._on_membership_written,
            ev.MembershipWriteFailed: self._on_membership_write_failed,
            ev.MembershipUnusable: self._on_membership_unusable,
            ev.LockAcquired: self._on_lock_acquired,
            ev.LockBusy: self._on_lock_busy,
            ev.LockLost: self._on_lock_lost,
            ev.ShardUnusable: self._on_shard_unusable,
            ev.LogRecordsRead: self._on_log_records,
            ev.AppendCommitted: self._on_append_committed,
            ev.AppendFailed: self._on_append_failed,
            ev.Compacted: self.compaction.on_compacted,
            ev.CompactionFailed: self.compaction.on_compaction_failed,
            ev.WebhookFinished: self._on_webhook,
            ev.CompactionRequested: self.compaction.on_compaction_requested,
            ev.PayloadUnreadable: self._on_payload_unreadable,
            ev.InboxRead: self.inbox.on_inbox_read,
            ev.InboxProgress: self.inbox.on_inbox_progress,
            proto.Register: self._on_register,
            proto.Enqueue: self._on_enqueue,
            proto.Result: self._on_result,
            proto.Progress: self._on_progress,
            proto.StatsRequested: self._on_stats,
        }

    # ------------------------------------------------------------------ helpers

    def _shard_count(self) -> int:
        """The queue's shard count, as membership.json last said (1 before it was read)."""
        return int(self.doc.get("shards", 1)) if self.doc is not None else 1

    def _wall_text(self) -> str:
        """`format_rfc3339` of the current wall time, made once per clock reading (a burst's
        records share it)."""
        wall = self.now.wall
        if wall != self._now_text_wall:
            self._now_text_wall = wall
            self._now_text = format_rfc3339(wall)
        return self._now_text

    def _move(self, task: Task, new: TaskState) -> None:
        if (task.state, new) not in TRANSITIONS:
            raise AssertionError(f"task {task.task_id}: {task.state.value} -> {new.value}")
        task.state = new

    def meta(self, shard: int) -> dict[str, Any]:
        return {"snerdNode": self.config.node_id, "snerdEpoch": self.shards[shard].epoch}

    def _pool_of(self, name: str | None) -> str:
        if name is not None and name in self.config.pools:
            return name
        return "default"

    def _pool_limit(self, pool: str) -> int:
        return min(self.config.pools.get(pool, self.config.max_workers), self.config.max_workers)

    # ------------------------------------------------------------------ startup and ownership

    def _read_membership(self) -> None:
        """Start a membership round: read, then (in `_on_membership_read`) write claims,
        renewals, give-backs and this node's heartbeat. A renewal's lease counts from here."""
        self.membership_busy = True
        self.round_started_mono = self.now.mono
        self.outbox.emit(fx.ReadMembership())

    def _on_started(self, event: ev.Started) -> None:
        self._read_membership()

    def _on_membership_read(self, event: ev.MembershipRead) -> None:
        self.membership_busy = False
        if self.phase is STOPPED:
            return
        doc = event.doc
        if doc is None:
            doc = initial_doc(queue=self.config.queue, shards=self.config.new_queue_shards)
            expected: int | None = None
        else:
            expected = int(doc.get("version", 0))
        now = self.now
        self.observer.observe(doc, now.mono)
        self._unlock_handed_over(doc)
        self._confirm_probes(doc)
        if self.phase is DRAINING and self.released:
            self._release(doc, expected)
            return
        config = self.config.ownership
        node_id = self.config.node_id
        mine = set(owned_by(doc, node_id))
        # A shard we think we hold but membership.json gives to someone else: step down.
        for shard, info in self.shards.items():
            if info.phase not in (UNOWNED, PROBING) and shard not in mine:
                self._step_down(shard, "its claim in membership.json now names another owner")
        live = self.observer.live_nodes(node_id=node_id, mono_us=now.mono, config=config)
        if self.dead_nodes:
            # Proven dead: not live, whatever their heartbeat says (and no longer written).
            # Forgotten once the heartbeat would have lapsed anyway (ids are never reused).
            forget = 2 * (config.ttl_us + config.skew_margin_us)
            for dead, since in list(self.dead_nodes.items()):
                if now.mono - since > forget:
                    del self.dead_nodes[dead]
            live = [n for n in live if n not in self.dead_nodes]
        self.peers_live = len(live) > 1  # (`live` names this node too)
        if self.peers_live:
            self.inbox.poll_soon()  # one may be writing to our inboxes now
        releases: list[int] = []
        if self.phase is DRAINING:
            # Renewals go on during a drain (upstream let leases lapse), but nothing new is
            # claimed.
            wanted = sorted(s for s, i in self.shards.items() if i.phase not in (UNOWNED, PROBING))
        else:
            candidates = claimable(
                doc,
                node_id=node_id,
                wall_us=now.wall,
                config=config,
                proven_dead=self._proven_dead(),
                observer=self.observer,
                mono_us=now.mono,
            )
            # A shard whose files cannot be used is neither claimed nor kept (`ShardUnusable`).
            candidates = [s for s in candidates if not self._unusable(s)]
            plan = plan_claims(
                doc,
                node_id=node_id,
                candidates=candidates,
                proofs=self.lock_proofs,
                live=len(live),
                config=config,
            )
            wanted = plan.wanted
            for shard in plan.proofs_dropped:
                # Proven dead, but beyond this node's cap: the lock goes back for another.
                del self.lock_proofs[shard]
                self.outbox.emit(fx.Unlock(shard=shard))
            self._say_left_free(plan.left_free)
            self._mark_give_backs(give_back(doc, node_id=node_id, live=live, config=config))
            releases = [s for s in wanted if self._ready_to_give_back(s)]
            releases += [s for s in sorted(mine) if self._unusable(s)]
            wanted = [s for s in wanted if s not in releases]
            # Stop acting for a shard before the write that frees it: once that write lands,
            # another node may claim it at once, before this node hears back.
            for shard in releases:
                self._step_down(
                    shard, "handed over to even out the shares", level="info", handing_over=True
                )
            if self.config.lock_proves_liveness:
                self._probe(doc, wanted)
        if not wanted and self.phase is STARTING:
            self.outbox.log(
                "warning",
                "every shard of this queue is claimed by a live daemon; this daemon waits "
                "and claims shards as their leases lapse or as the others give shares back",
            )
        # A shard this node stepped down from is claimed anew (a new epoch), not renewed: its
        # lock file still names the tenure that ended (`LockProof`), and fencing keeps the
        # two tenures apart.
        anew = [s for s in wanted if s in mine and self._stepped_down(s)]
        new_doc = with_claims(
            doc, node_id=node_id, shards=wanted, wall_us=now.wall, config=config, anew=anew
        )
        if releases:
            new_doc = without_claims(new_doc, node_id=node_id, shards=releases)
        new_doc = with_heartbeat(
            new_doc,
            node_id=node_id,
            wall_us=now.wall,
            live=live,
            types=sorted(self.registered),
            max_shards=config.max_shards,
        )
        new_doc["version"] = (expected or 0) + 1
        self.membership_busy = True
        self.outbox.emit(fx.WriteMembership(doc=new_doc, expected_version=expected))

    def _say_left_free(self, shards: list[int]) -> None:
        """Say once why claimable shards stay free: this node's cap (`ClaimPlan.left_free`).
        Said again only for a shard that was claimed meanwhile and is left free anew."""
        new = [s for s in shards if s not in self.left_free_said]
        self.left_free_said = set(shards)
        if not new:
            return
        names = ", ".join(shard_name(s) for s in new)
        self.outbox.log(
            "warning",
            f"{names} left free: this daemon holds its cap of {self.config.ownership.max_shards} "
            "(SNERD_MAX_SHARDS); raise the cap or start another daemon to run "
            + ("them" if len(new) > 1 else "it"),
        )

    def _mark_give_backs(self, count: int) -> None:
        """Start handing over `count` more shards (the highest numbered active ones)."""
        giving = sum(1 for i in self.shards.values() if i.giving_back)
        cap = self.config.ownership.max_shards
        held = sum(1 for i in self.shards.values() if i.phase is ACTIVE)
        why = (
            f"above this daemon's cap of {cap} (SNERD_MAX_SHARDS)"
            if cap is not None and held > cap
            else "above this daemon's fair share"
        )
        for shard in sorted(self.shards, reverse=True):
            if giving >= count:
                return
            info = self.shards[shard]
            if info.phase is ACTIVE and not info.giving_back:
                info.giving_back = True
                info.giving_back_since_mono = self.now.mono
                giving += 1
                self.outbox.log(
                    "info",
                    f"{shard_name(shard)}: {why}; handing it over once its attempts in flight end",
                )

    def _ready_to_give_back(self, shard: int) -> bool:
        info = self.shards.get(shard)
        if info is None or not info.giving_back:
            return False
        if self.now.mono >= info.giving_back_since_mono + self.config.drain_timeout_us:
            return True
        return not (
            info.appends_in_flight
            or info.compacting
            or any(self.tasks[t].shard == shard for t in self.inflight)
        )

    def _probe(self, doc: dict[str, Any], wanted: list[int]) -> None:
        """Try the lock of each shard another node claims: getting it proves that node dead.
        No more than this node's cap leaves room for (`proof_room`)."""
        room = proof_room(
            doc,
            node_id=self.config.node_id,
            wanted=wanted,
            proofs=[*self.lock_proofs, *(s for s, i in self.shards.items() if i.phase is PROBING)],
            config=self.config.ownership,
        )
        for shard in live_foreign(doc, node_id=self.config.node_id):
            if room is not None and room <= 0:
                return
            if shard in wanted or shard in self.lock_proofs:
                continue
            info = self.shards.setdefault(shard, ShardInfo())
            # A lock this node still holds after stepping down proves nothing about another.
            if info.phase is UNOWNED and not (
                info.unlock_when_drained or info.unlock_when_unclaimed
            ):
                info.phase = PROBING
                info.probed_doc = doc
                self.outbox.emit(fx.TryLock(shard=shard, owner=self.config.node_id, probe=True))
                if room is not None:
                    room -= 1

    def _on_membership_written(self, event: ev.MembershipWritten) -> None:
        self.membership_busy = False
        if self.membership_trouble is not None:
            if self.membership_trouble_said:
                self.outbox.log("info", "membership.json read and updated again")
            self.membership_trouble = None
        self.doc = event.doc
        self.doc_names_others = bool(live_foreign(event.doc, node_id=self.config.node_id))
        now = self.now
        self._unlock_handed_over(event.doc)
        if self.releasing:
            self._finish_release()
            return
        if self.released:
            # A renewal landed after the drain finished: now write the release itself.
            self._read_membership()
            return
        self.renew_at_mono = now.mono + self.config.ownership.renew_interval_us
        # The lease of every claim this write renewed or made counts from the round's start.
        ours = owned_by(event.doc, self.config.node_id)
        if ours and self.round_started_mono is not None:
            self.lease_deadline_mono = self.round_started_mono + self.config.ownership.ttl_us
        elif not ours:
            self.lease_deadline_mono = None
        if self.lock_proofs or self.renew_after_busy:
            self.renew_at_mono = now.mono  # a takeover or a renewal is waiting
            self.renew_after_busy = False
        changed = False
        for shard in owned_by(event.doc, self.config.node_id):
            info = self.shards.setdefault(shard, ShardInfo())
            proof = self.lock_proofs.pop(shard, None)  # ours now: the lock is held for that
            if proof is not None and proof.confirmed:
                # Taken over: the claim we wrote replaced the one read unwritten since the
                # lock came free (the write's version check says so).
                self.dead_nodes[proof.owner] = now.mono
                self.outbox.log(
                    "info",
                    f"{shard_name(shard)}: its owner's process is gone (its lock was free under "
                    f"{proof.owner}'s claim); taken over without waiting for the lease",
                )
            if info.phase is UNOWNED:
                epoch = claim_epoch(event.doc, shard)
                if epoch == info.lock_epoch:
                    # A renewal issued before this node stepped down from the shard: that
                    # tenure is over; the next round claims the shard anew.
                    self.renew_at_mono = now.mono
                    continue
                info.epoch = info.lock_epoch = epoch
                info.phase = LOCKING
                # A lock still held from the last tenure is taken up as it is: a deferred
                # Unlock must not fire between this TryLock and its answer.
                info.unlock_when_drained = info.unlock_when_unclaimed = False
                self.outbox.emit(fx.TryLock(shard=shard, owner=self.config.node_id, epoch=epoch))
                changed = True
        if not changed:
            self._maybe_running()

    def _stepped_down(self, shard: int) -> bool:
        info = self.shards.get(shard)
        return info is not None and info.phase is UNOWNED

    def _proven_dead(self) -> frozenset[int]:
        return frozenset(s for s, proof in self.lock_proofs.items() if proof.confirmed)

    def _confirm_probes(self, doc: dict[str, Any]) -> None:
        """Check each lock proof against `doc`: the claim still there, unwritten since,
        confirms it; anything else ends it."""
        for shard, proof in list(self.lock_proofs.items()):
            if claim_signature(doc, shard) == proof.signature:
                proof.confirmed = True
            else:
                # Handed over, renewed or claimed anew since the probe's read: the free lock
                # proves nothing. The shard is claimable like any other.
                del self.lock_proofs[shard]
                self.outbox.emit(fx.Unlock(shard=shard))

    def _unlock_handed_over(self, doc: dict[str, Any]) -> None:
        """Give up the locks of shards handed over whose claim `doc` no longer gives us."""
        for shard, info in self.shards.items():
            if info.unlock_when_unclaimed and claim_owner(doc, shard) != self.config.node_id:
                self._lock_hold_over(shard, info, drained=False)

    def _on_membership_write_failed(self, event: ev.MembershipWriteFailed) -> None:
        self.membership_busy = False
        if self.released:
            # We tried to hand our shards over and could not: the leases lapse on their own.
            self.outbox.log(
                "warning", f"membership.json not updated ({event.error}) while stopping"
            )
            self._finish_release()
            return
        # A conflict (another writer came first: `doc` is what is there now) is routine with
        # several daemons; an I/O error is not, and its end is said too.
        self._membership_trouble(
            event.error,
            f"membership.json not updated ({event.error}); retrying",
            lasting=event.doc is None,
        )
        if self._drain_before_start():
            return
        self._retry_membership()

    def _on_membership_unusable(self, event: ev.MembershipUnusable) -> None:
        """membership.json is not a membership document (`check_membership`). At start,
        before any round landed, this node has claimed nothing: it refuses to start (exit 2)
        rather than wait for a human. Later, it keeps acting for what it holds until its lease
        runs out (no renewal can commit meanwhile) and reads the file again until it is
        fixed."""
        self.membership_busy = False
        if self.released:
            self.outbox.log(
                "warning", f"{event.problem}; its claims are left to lapse while stopping"
            )
            self._finish_release()
            return
        if self.phase is STARTING and self.doc is None:
            self.outbox.log(
                "error",
                f"{event.problem}; this daemon cannot start on it: fix or restore the file "
                "(`snerdmq validate DIR` reports what is wrong)",
            )
            self._stop_before_start(2)
            return
        ttl = self.config.ownership.ttl_us // SECOND
        self._membership_trouble(
            event.problem,
            f"{event.problem}; this daemon keeps acting for the shards it holds until its "
            f"lease runs out ({ttl} s after its last renewal), claims nothing, and reads the "
            "file again until it is fixed",
            lasting=True,
        )
        self._retry_membership()

    def _membership_trouble(self, what: str, message: str, *, lasting: bool) -> None:
        """Log a failed membership round once per kind of failure (a read retried every
        `retry_io_us` must not flood stderr); `lasting`: say so when a round lands again."""
        if what == self.membership_trouble:
            return
        self.membership_trouble = what
        self.membership_trouble_said = lasting
        self.outbox.log("warning" if lasting else "info", message)

    def _retry_membership(self) -> None:
        self.renew_after_busy = False
        self.renew_at_mono = self.now.mono + self.config.retry_io_us

    def _on_lock_acquired(self, event: ev.LockAcquired) -> None:
        info = self.shards[event.shard]
        if info.phase is PROBING:
            # The lock was free: evidence that the claimant's process is gone, if the claimant
            # held it under this claim and the claim stays unwritten (`LockProof`).
            info.phase = UNOWNED
            doc, info.probed_doc = info.probed_doc, None
            assert doc is not None
            owner = claim_owner(doc, event.shard)
            assert owner is not None
            if not lock_names_claim(event.previous, doc, event.shard):
                # The claimant never held this lock under this claim (it is about to take it,
                # retries it while the owner before it finishes, or claimed the shard again
                # after giving it up): a free lock says nothing of it.
                self.outbox.emit(fx.Unlock(shard=event.shard))
                self._maybe_running()
                return
            self.lock_proofs[event.shard] = LockProof(
                owner=owner, signature=claim_signature(doc, event.shard)
            )
            self._renew(force=True)  # a read confirms it (`_confirm_probes`)
            return
        if info.phase not in (LOCKING, PAUSED):
            # Claim withdrawn meanwhile: give the lock straight back.
            self.outbox.emit(fx.Unlock(shard=event.shard))
            return
        info.retry_lock_at_mono = None
        # Held again: a deferred Unlock is moot.
        info.unlock_when_drained = info.unlock_when_unclaimed = False
        self._load(event.shard, info)

    def _load(self, shard: int, info: ShardInfo) -> None:
        """Replay the shard's log (`LOADING`) into a fresh fold."""
        info.phase = LOADING
        info.fold = ShardFold(keep_payloads=False, fence=self.config.fence)
        info.log_epoch = 0
        if info.appends_in_flight:
            # Appends from before this node last stepped down (or after its claim) are still
            # on their way (the shell writes in order, maybe after an Unlock): read the log
            # once they are in it, or the reload would miss them and they would surface
            # later, unknown.
            info.read_when_drained = True
            return
        self.outbox.emit(fx.ReadLog(shard=shard))

    def _on_lock_busy(self, event: ev.LockBusy) -> None:
        info = self.shards[event.shard]
        if info.phase is PROBING:
            info.phase = UNOWNED  # its owner is alive
            info.probed_doc = None
            self._maybe_running()
            return
        if info.phase not in (LOCKING, PAUSED):
            return  # stepped down while the TryLock was out: nothing to retry
        if info.phase is LOCKING:
            self.outbox.log(
                "warning",
                f"{shard_name(event.shard)} is claimed by this daemon but its lock is held by "
                "another process (a daemon still running on this directory?); the shard stays "
                "paused and the lock is retried",
            )
        info.phase = PAUSED
        info.retry_lock_at_mono = self.now.mono + self.config.retry_io_us
        self._maybe_running()

    def _on_lock_lost(self, event: ev.LockLost) -> None:
        self._step_down(event.shard, f"its lock failed: {event.error}")

    def _on_shard_unusable(self, event: ev.ShardUnusable) -> None:
        """Bad files on disk: stop acting for the shard, give its claim back at the next round
        and leave it unclaimed for a while; the daemon goes on with its other shards (and
        becomes ready without this one)."""
        info = self.shards.get(event.shard)
        if info is None:
            return
        info.unusable_until_mono = self.now.mono + self.config.retry_unusable_us
        self._step_down(
            event.shard,
            f"its files cannot be used: {event.error}; it is left unclaimed and tried again in "
            f"{self.config.retry_unusable_us // SECOND} s (`snerdmq fsck` lists what it found)",
        )
        self._maybe_running()

    def _unusable(self, shard: int) -> bool:
        info = self.shards.get(shard)
        until = None if info is None else info.unusable_until_mono
        return until is not None and self.now.mono < until

    def _lease_ran_out(self) -> None:
        """No renewal committed within the lease: stop acting for every shard at once, whatever
        the shell is doing (a hung write must not extend a lease, DESIGN §4.4). The claims
        still name this node; the next round that commits takes them up again."""
        self.lease_deadline_mono = None
        for shard, info in self.shards.items():
            if info.phase not in (UNOWNED, PROBING):
                self._step_down(shard, "its lease ran out before a renewal committed")

    def _step_down(
        self, shard: int, why: str, level: str = "error", *, handing_over: bool = False
    ) -> None:
        """Stop acting for `shard` now. `handing_over`: a write removing our claim follows, and
        the lock is kept until it lands (`unlock_when_unclaimed`)."""
        info = self.shards.get(shard)
        if info is None or info.phase in (UNOWNED, PROBING):
            return
        self.outbox.log(level, f"{shard_name(shard)}: this daemon stops acting for it: {why}")
        was_locked = info.phase not in (LOCKING, PAUSED)
        info.phase = UNOWNED
        info.tenure += 1
        info.read_when_drained = False
        info.reloading = False
        info.retry_lock_at_mono = None
        info.giving_back = False
        info.hold_dispatch_until_mono = None
        info.inbox_done.clear()
        info.inbox_taken.clear()
        info.inbox_locs.clear()
        info.inbox_marked.clear()
        self.parked_by_shard.pop(shard, None)
        # Enqueues not yet committed will never be acked by this node: say so now (their
        # records may still land; the next owner finds them).
        for p in self.outbox.pending_parts():
            if p.shard == shard and p.kind in ("enqueue", "enqueues") and not p.answered:
                p.answered = True
                message = proto.failed_to_enqueue(
                    f"{shard_name(shard)} changed owner before the enqueue was confirmed; "
                    "it may or may not be enqueued"
                )
                answer = p.extra["ids"] if p.kind == "enqueues" else [p.task_id]
                for task_id in [*answer, *p.dedupe_waiters]:
                    self.outbox.send(proto.error(task_id, message))
        for task_id in [t.task_id for t in self.tasks.values() if t.shard == shard]:
            self._forget(task_id)
        # Appends held back by a compaction still running are never made: they belong to this
        # tenure (a compaction ends with them otherwise, `_compaction_over`).
        for effect in info.backlog:
            self.outbox.pending.pop(effect.token, None)
        info.backlog = []
        if was_locked:
            # The shell may write appends in flight after an Unlock: keep the lock until they
            # are in the log, so the next owner, who needs the lock, reads them before its
            # claim.
            info.unlock_when_drained = bool(info.appends_in_flight)
            info.unlock_when_unclaimed = handing_over
            if not (info.unlock_when_drained or info.unlock_when_unclaimed):
                self.outbox.emit(fx.Unlock(shard=shard))
        self._announce_membership()

    def _lock_hold_over(self, shard: int, info: ShardInfo, *, drained: bool) -> None:
        """What a deferred Unlock waited for is over (`drained`: the appends in flight, else
        the write removing our claim): unlock once nothing else holds it back."""
        if not (info.unlock_when_drained or info.unlock_when_unclaimed):
            return
        if drained:
            info.unlock_when_drained = False
        else:
            info.unlock_when_unclaimed = False
        if not (info.unlock_when_drained or info.unlock_when_unclaimed):
            self.outbox.emit(fx.Unlock(shard=shard))

    def _claimed(self, shard: int, info: ShardInfo, loc: fx.Location) -> None:
        """Our claim (at `loc`) fences the shard: it is ours to act for."""
        info.claim_loc = loc
        info.phase = ACTIVE
        unrunnable, info.unrunnable = info.unrunnable, []
        for task_id, why, based in unrunnable:
            task = self.tasks.get(task_id)
            if task is not None and task.state is ENQUEUING:
                self._move(task, FINISHING)
                if based:  # the tombstone keeps the record, payload and all
                    self._finish(task, OUTCOME_DEAD, why)
                else:
                    self._dead_letter_unbased(task, why)
        if self.phase is STARTING:
            self._maybe_running()
        else:
            self._announce_membership()

    def _reload(self, shard: int, info: ShardInfo) -> None:
        """Our claim landed behind records another writer appended after we read the log (a
        stale owner's write, made late: paused after deciding it, on a filesystem whose lock
        did not stop us). They precede our fence, so every reader takes them: we must know
        them too. Forget what the replay built and read the log again; our claim is in it now,
        and it writes no new one (`_finish_replay`)."""
        self.outbox.log(
            "warning",
            f"{shard_name(shard)}: another writer appended to tasks.log between our reading it "
            "and our claim; reading it again",
        )
        for task_id in [t.task_id for t in self.tasks.values() if t.shard == shard]:
            self._forget(task_id)
        self.parked_by_shard.pop(shard, None)
        info.history.clear()
        info.window_records.clear()
        info.claim_loc = None
        info.reloading = True
        self._load(shard, info)

    def appends_drained(self, shard: int, info: ShardInfo) -> None:
        """Every append issued to `shard` has landed or failed: do what waited for that."""
        self._lock_hold_over(shard, info, drained=True)
        if info.read_when_drained:
            info.read_when_drained = False
            if info.phase is LOADING:
                self.outbox.emit(fx.ReadLog(shard=shard))

    def _forget(self, task_id: str) -> None:
        task = self.tasks.pop(task_id)
        self._unqueue(task)
        flight = self.inflight.pop(task_id, None)
        if flight is not None:
            self.pool_busy[flight.pool] -= 1
        self._drop_fingerprint(task)

    def add_fingerprint(self, task: Task) -> None:
        if task.payload_hash is not None:
            self.fingerprints.setdefault(task.payload_hash, {})[task.task_id] = None

    def _drop_fingerprint(self, task: Task) -> None:
        """`task` is no longer live: its fingerprint's other live tasks stay known."""
        if task.payload_hash is None:
            return
        ids = self.fingerprints.get(task.payload_hash)
        if ids is not None:
            ids.pop(task.task_id, None)
            if not ids:
                del self.fingerprints[task.payload_hash]

    def _unqueue(self, task: Task) -> None:
        self.due.discard(task.task_id)
        for q in (
            self.ready.get(task.pool),
            self.parked_by_type.get(task.task_type),
            self.parked_by_group.get(task.group or ""),
            self.parked_by_shard.get(task.shard),
        ):
            if q is not None:
                q.discard(task.task_id)

    def _renew(self, force: bool = False) -> None:
        if self.membership_busy:
            # Another membership operation is out: renew right after it (no timer meanwhile,
            # or the node would be woken again and again for a renewal it cannot start).
            self.renew_at_mono = None
            self.renew_after_busy = True
            return
        self.renew_at_mono = None
        self.renew_after_busy = False
        self._read_membership()

    def _maybe_running(self) -> None:
        if self.phase is not STARTING:
            return
        if (
            self.membership_busy
            or self.lock_proofs
            or any(i.phase in (LOCKING, LOADING, FENCING, PROBING) for i in self.shards.values())
        ):
            return
        self.phase = NODE_RUNNING
        self._announce_membership()
        owned = self.owned_shards
        if owned:
            self.outbox.log(
                "info",
                f"owning {', '.join(shard_name(s) for s in owned)}; "
                f"{len(self.tasks)} live task(s) recovered",
            )
        held, self.held_commands = self.held_commands, []
        for command in held:
            self.handlers[type(command)](command)
        assert not self.held_commands

    def _announce_membership(self) -> None:
        if self.doc is None or self.phase is STARTING:
            return
        self.outbox.send(
            proto.membership(
                self.config.queue if self.doc.get("queue") is None else str(self.doc["queue"]),
                int(self.doc.get("shards", 0)),
                self.owned_shards,
                int(self.doc.get("version", 0)),
            )
        )

    # ------------------------------------------------------------------ replay

    def _on_log_records(self, event: ev.LogRecordsRead) -> None:
        info = self.shards[event.shard]
        if info.phase is not LOADING:
            return
        for offset, reason in event.corrupt:
            info.corrupt_lines += 1
            self.outbox.log(
                "warning",
                f"{shard_name(event.shard)}/tasks/tasks.log: skipped a corrupt line at byte "
                f"{offset} ({reason}); run `snerdmq fsck` for a report",
            )
        assert info.fold is not None
        info.fold.add_all(event.records)
        if event.final:
            info.size = info.loaded_size = event.size
            self._finish_replay(event.shard, info)

    def _finish_replay(self, shard: int, info: ShardInfo) -> None:
        """Turn the folded log (`snerd.core.shardlog`, the one fold the CLI uses too) into
        this node's state, then fence the shard with a claim record of our epoch."""
        now = self.now
        fold = info.fold
        assert fold is not None
        info.fold = None

        def loc(record: ev.LogRecord) -> fx.Location:
            return fx.Location(shard, record.offset, record.length)

        info.loaded_records = fold.records
        info.log_epoch = fold.log_epoch
        info.claim_loc = loc(fold.claim) if fold.claim is not None else None
        info.next_seq = fold.next_seq
        info.inbox_done = dict(fold.inbox)
        info.inbox_taken = dict(fold.inbox)
        info.inbox_locs = {node: loc(record) for node, record in fold.inbox_records.items()}
        for task_id, record in list(fold.finished.items())[-self.config.history_limit :]:
            info.history.append((task_id, loc(record)))
        for group, at, record in fold.windows:
            self.windows.restore(group, [at])
            info.window_records.append((at, loc(record)))
        in_flight = fold.in_flight()
        info.unrunnable = []
        # Enqueue order (snerdSeq), which compaction keeps: FIFO survives restarts.
        for task_id, record in fold.live_in_order():
            if task_id in self.tasks:
                self.outbox.log(
                    "warning",
                    f"task {task_id} is live in two shards; keeping the one in "
                    f"{shard_name(self.tasks[task_id].shard)}",
                )
                continue
            why = task_problem(record.fields)
            if why is not None:
                # A record no enqueue would have taken (an older version's, or written by
                # hand): the task cannot run, so it ends as a dead letter saying why, once the
                # shard is ours; it is live until then (its id taken, its children waiting).
                self.outbox.log(
                    "warning",
                    f"{shard_name(shard)}/tasks/tasks.log: {why} (at byte {record.offset}); "
                    "it is dead-lettered",
                )
                self.seq += 1
                self.tasks[task_id] = _unrunnable_task(shard, record.fields, loc(record), self.seq)
                based = type(record.fields.get("taskData")) is str
                info.unrunnable.append((task_id, why, based))
                continue
            task = self.task_from_record(shard, record.fields, loc(record))
            if task is None:
                self.outbox.log(
                    "warning", f"task {task_id}: unreadable record in {shard_name(shard)}"
                )
                continue
            if task_id in in_flight:
                # Dispatched, never resolved: it may have run. Run it again with the same attempt
                # number: a crash re-execution does not use up an attempt.
                task.attempt = in_flight[task_id]
                task.dispatch_loc = loc(fold.dispatch[task_id])
            self.tasks[task_id] = task
            self.add_fingerprint(task)
            self._schedule(task, now)
        for task in self.tasks.values():
            if task.state is BLOCKED:
                self._check_blocked(task)
        # Fence: our first record in this log is a claim with our epoch.
        info.phase = FENCING
        # Our epoch comes from our claim; should the log already hold a newer one, or this one
        # claimed by another node (membership.json lost or restored from a backup), go past it
        # so fencing still holds. Our own claim of this epoch (the shard taken up again after a
        # lease ran out) keeps it: membership.json names this epoch, and the next claimant
        # bumps from there.
        fence = fold.fence_claim
        fence_node = fence.fields.get("node") if fence is not None else None
        if info.reloading:
            info.reloading = False
            if (
                fence is not None
                and fence_node == self.config.node_id
                and (info.log_epoch == info.epoch)
            ):
                self._claimed(shard, info, loc(fence))  # still the last claim: ours
                return
        if info.log_epoch > info.epoch or (
            info.log_epoch == info.epoch and fence_node != self.config.node_id
        ):
            # (At most the largest counter a record may hold: a log with a claim of that epoch,
            # which no owner reaches by counting, is fenced at it, not past what readers take.)
            info.epoch = min(info.log_epoch + 1, MAX_COUNT)
        claim = fx.NewRecord(
            fields={
                "snerdKind": KIND_CLAIM,
                "epoch": info.epoch,
                "node": self.config.node_id,
                "at": format_rfc3339(now.wall),
                **self.meta(shard),
            }
        )
        self.outbox.append(shard, [claim], PendingAppend(kind="claim", shard=shard))

    def task_from_record(
        self, shard: int, f: dict[str, Any], loc: fx.Location | None
    ) -> Task | None:
        """The task of its latest record, read from a log or an inbox and found runnable by
        the record rule (`snerd.core.records.task_problem`): each value has the type and
        range the task runs with. (A `null` is an absent key there, and an empty group, pool,
        cron or webhook URL none.)"""
        try:
            task_id = f["taskId"]
            task_type = f["taskType"]
            retry_count = f.get("retryCount") or 0
            max_retries = f.get("maxRetries") or 0
            ready = max(
                _parse_time(f.get("executeAt"), 0),
                _parse_time(f.get("retryAfterTime"), 0),
            )
            cron = f.get("cronExpression") or None
            if cron is not None:
                # Upstream's 7-field form is read without its year.
                cron = adopt_cron("cronExpression", cron)
        except (KeyError, ValueError):  # (a record the rule was not asked about)
            return None
        if cron is None and f.get("executeAt") == f.get("retryAfterTime") is not None:
            # Enqueued without `execute_at` (both times are the enqueue's, as no retry or cron
            # tick has moved one): due at once, whatever this node's clock says of the other
            # writer's (an inbox record) or of an earlier wall clock (a replay after a step).
            ready = 0
        self.seq += 1
        urgency = f.get("urgencyScore")
        return Task(
            task_id=task_id,
            task_type=task_type,
            shard=shard,
            seq=self.seq,
            state=ENQUEUING,
            retry_count=retry_count,
            max_retries=max_retries,
            retry_after_hours=float(f.get("retryAfterHours") or 0.0),
            ready_at_us=ready,
            urgency=float(urgency) if isinstance(urgency, int | float) else 0.0,
            pool=self._pool_of(f.get("pool") or None),
            group=f.get("rateLimitGroup") or None,
            max_per_minute=f.get("maxPerMinute"),
            payload_hash=f.get("payloadHash"),
            cron=cron,
            webhook_url=f.get("webhookUrl") or None,
            max_execution_seconds=f.get("maxExecutionSeconds"),
            trigger_after_ids=tuple(f.get("triggerAfterIds") or ()),
            loc=loc,
            attempt=retry_count + 1,
            last_error=f.get("LastErrorObj"),
        )

    # ------------------------------------------------------------------ SDK commands

    def _hold_or(self, command: ev.Event) -> bool:
        """While starting, keep commands in arrival order; True when the command was held."""
        if self.phase is STARTING:
            self.held_commands.append(command)
            return True
        return False

    def _on_line(self, event: ev.LineReceived) -> None:
        if event.oversize:
            self.outbox.send(
                proto.error(
                    proto.sniff_task_id(event.line),
                    f"Invalid JSON: line of {event.oversize} bytes exceeds the daemon's limit "
                    "(SNERD_MAX_LINE_BYTES); keep payloads in files and send a reference",
                )
            )
            return
        self._lines((event.line,))

    def _on_lines(self, event: ev.LinesReceived) -> None:
        self._lines(event.lines)

    def _lines(self, lines: Iterable[bytes]) -> None:
        """Lines from the SDK, each taken in turn as `_line` takes it, with the commonest one,
        a plain enqueue (`proto.plain_enqueue`: the five required fields, every optional one
        absent or null), decided here in one loop while running: what `_on_enqueue` does for
        it, without building the `Enqueue`, its record joining the run of plain enqueues to
        its shard (`_append_run`, a list extended in place while no other line comes
        between). The commonest result, a success of a running attempt, is decided here too
        (`_plain_success`). A plain enqueue or result this loop cannot decide alone (an
        enqueue's id pending, its shard not ours: the inbox, or a task that might run at once;
        a failure) goes to its handler with the command built from the fields already taken;
        every other line goes to `_line`. After either, nothing this loop holds is trusted.
        Blank lines are skipped."""
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        plain_of = proto.plain_enqueue
        result_of = proto.plain_result
        max_line = proto.DEFAULT_MAX_LINE_BYTES
        tasks = self.tasks
        registered = self.registered
        infos = self.shards
        stats = self.stats
        node_id = self.config.node_id
        #: Set up at the first plain enqueue; cleared by any other line.
        shards = 0
        now_text = ""
        runs_free: bool | None = None  # a worker slot free and no ready task (`_runs_at_once`)
        #: shard -> the records, task ids and pending of the run of plain enqueues open there.
        runs: dict[int, tuple[list[fx.NewRecord], list[str], PendingAppend]] = {}
        for line in lines:
            try:
                doc = loads(line)
            except decode_error:
                if proto.is_blank_line(line):
                    continue  # skipped without an answer, as upstream does
                doc = _NOT_JSON
            # A line plainly valid but not decided here: its command, for the long way.
            command: proto.Enqueue | proto.Result | None = None
            if type(doc) is dict and self.phase is NODE_RUNNING and len(line) <= max_line:
                action = doc.get("action")
                if action == "result":
                    result = result_of(doc)
                    if result is not None:
                        if self._plain_success(result):
                            runs_free = None  # (a worker slot came free)
                            continue
                        command = proto.result_command(result)
                plain = plain_of(doc) if action == "enqueue" else None
                if plain is not None and plain[0] not in tasks:
                    task_id, task_type, task_data, max_retries, hours = plain
                    if task_type in registered and runs_free is None:
                        runs_free = len(self.inflight) < self.config.max_workers and not any(
                            self.ready.values()
                        )
                    # (One that might run at once, `_runs_at_once`, goes the long way.)
                    if not (task_type in registered and runs_free):
                        if not shards:
                            shards = self._shard_count()
                            now_text = self._wall_text()
                        shard = route_shard(task_id, shards) if shards != 1 else 0
                        info = infos.get(shard)
                        if info is not None and info.phase is ACTIVE:
                            seq = info.next_seq
                            info.next_seq = seq + 1
                            self.seq += 1
                            # The keys and their order of `_enqueue_fields` for a plain enqueue.
                            record = new_record(
                                {
                                    "taskId": task_id,
                                    "retryCount": 0,
                                    "maxRetries": max_retries,
                                    "retryAfterHours": hours,
                                    "retryAfterTime": now_text,
                                    "taskData": task_data,
                                    "taskType": task_type,
                                    "executeAt": now_text,
                                    "snerdNode": node_id,
                                    "snerdEpoch": info.epoch,
                                    "snerdSeq": seq,
                                }
                            )
                            tasks[task_id] = Task(
                                task_id,  # task_id
                                task_type,  # task_type
                                shard,  # shard
                                self.seq,  # seq
                                ENQUEUING,  # state
                                0,  # retry_count
                                max_retries,  # max_retries
                                hours,  # retry_after_hours
                                0,  # ready_at_us: at once (see `_enqueue_fields`)
                                0.0,  # urgency
                                "default",  # pool (`_pool_of(None)`)
                                None,  # group
                                None,  # max_per_minute
                                None,  # payload_hash
                                None,  # cron
                                None,  # webhook_url
                                None,  # max_execution_seconds
                                (),  # trigger_after_ids
                                None,  # loc
                                1,  # attempt
                            )
                            stats["total_enqueued"] += 1
                            run = runs.get(shard)
                            if run is not None:
                                run[0].append(record)
                                run[1].append(task_id)
                                run[2].count += 1
                            else:
                                self.outbox.append_run(shard, info, record, task_id, "enqueues")
                                merged = self.outbox.open_appends.get(shard)
                                if merged is not None and merged.records is not None:
                                    last = merged.last
                                    if last is not None and last.kind == "enqueues":
                                        ids = last.extra["ids"]
                                        if ids[-1] is task_id:
                                            runs[shard] = (merged.records, ids, last)
                            continue
                if plain is not None:
                    command = proto.enqueue_command(plain)
            if command is not None:
                # The long way without parsing the line again (`_line` would get the same).
                self.handlers[type(command)](command)
            else:
                self._line(line, doc)
            shards, runs_free = 0, None
            runs.clear()
            if self.phase is STOPPED:
                return

    def _line(self, line: bytes, doc: Any = _UNPARSED) -> None:
        """One line, parsed (`doc`: what `orjson.loads` gave, or `_NOT_JSON`) or not, the
        long way: a command, or an error message naming what is wrong."""
        if doc is _UNPARSED:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                doc = _NOT_JSON
        try:
            if doc is _NOT_JSON or len(line) > proto.DEFAULT_MAX_LINE_BYTES:
                command = proto.parse_line(line)  # (it words the error)
            else:
                command = proto.parse_document(doc)
        except proto.ProtocolError as err:
            self.outbox.send(proto.error(err.task_id, err.message))
            return
        self.handlers[type(command)](command)

    def _on_register(self, cmd: proto.Register) -> None:
        if self._hold_or(cmd):
            return
        if (
            cmd.task_type not in self.registered
            and len(self.registered) >= proto.MAX_REGISTERED_TYPES
        ):
            # Each registered type is listed in membership.json, rewritten at every renewal.
            self.outbox.send(proto.error(None, proto.too_many_task_types(cmd.task_type)))
            return
        self.registered.add(cmd.task_type)
        self.outbox.send(proto.ack_registered(cmd.task_type))
        parked = self.parked_by_type.pop(cmd.task_type, None)
        while parked:
            task = self.tasks[parked.pop()]
            self._move(task, READY)
            self._push_ready(task)

    def _on_enqueue(self, cmd: proto.Enqueue) -> None:
        if self.phase is not NODE_RUNNING:
            if not self._hold_or(cmd):
                self.outbox.send(proto.error(cmd.task_id, proto.SHUTTING_DOWN))
            return
        existing = self.tasks.get(cmd.task_id)
        if existing is not None:
            self.outbox.send(
                proto.error(
                    cmd.task_id,
                    proto.failed_to_enqueue(
                        f"task_id {cmd.task_id} is already pending ({existing.state.value}); "
                        "a task id can be reused once its task has finished"
                    ),
                )
            )
            return
        payload_hash = None
        if cmd.auto_dedupe:
            payload_hash = xxhash.xxh64_hexdigest((cmd.task_type + cmd.task_data).encode())
            # Upstream wrote the digest without zero padding.
            payload_hash = payload_hash.lstrip("0") or "0"
            original = self.pending_twin(payload_hash)
            if original is not None:
                self.stats["total_enqueued"] += 1
                self.stats["total_deduplicated"] += 1
                self._ack_duplicate(cmd.task_id, original)
                return
        shards = self._shard_count()
        key = cmd.rate_limit_group or payload_hash or cmd.task_id
        shard = route_shard(key, shards) if shards != 1 else 0  # x % 1 == 0: skip the hash
        info = self.shards.get(shard)
        if info is None or info.phase is not ACTIVE:
            # Another daemon owns the shard (or none does yet, or ours is still loading): the
            # task goes into this node's inbox for it, which the owner ingests.
            self._enqueue_to_inbox(cmd, shard, payload_hash)
            return
        if cmd.trigger_after_ids:
            cycle = self.cycle(cmd.task_id, cmd.trigger_after_ids)
            if cycle is not None:
                self.outbox.send(
                    proto.error(
                        cmd.task_id,
                        proto.failed_to_enqueue(f"Cycle detected involving task {cycle}"),
                    )
                )
                return
        fields, ready_at = self._enqueue_fields(cmd, payload_hash)
        fields["snerdNode"] = self.config.node_id
        fields["snerdEpoch"] = info.epoch
        fields["snerdSeq"] = info.next_seq
        info.next_seq += 1
        self.seq += 1
        # Positional, in field order: with 19 keywords the call costs about 2.6 us, 0.5 us so.
        task = Task(
            cmd.task_id,  # task_id
            cmd.task_type,  # task_type
            shard,  # shard
            self.seq,  # seq
            ENQUEUING,  # state
            0,  # retry_count
            cmd.max_retries,  # max_retries
            cmd.retry_after_hours,  # retry_after_hours
            ready_at,  # ready_at_us
            cmd.urgency_score,  # urgency
            self._pool_of(cmd.pool),  # pool
            cmd.rate_limit_group if cmd.max_per_minute is not None else None,  # group
            cmd.max_per_minute,  # max_per_minute
            payload_hash,  # payload_hash
            cmd.cron,  # cron
            cmd.webhook_url,  # webhook_url
            cmd.max_execution_seconds,  # max_execution_seconds
            cmd.trigger_after_ids,  # trigger_after_ids
            None,  # loc
            1,  # attempt
        )
        self.tasks[cmd.task_id] = task
        self.add_fingerprint(task)
        self.stats["total_enqueued"] += 1
        records = [new_record(fields)]
        if self._runs_at_once(task):
            # Its first attempt starts now: the dispatch record shares the enqueue record's
            # append (one commit, one fsync instead of two in a row); the ack and the
            # `execute` both follow that commit (`_on_append_committed`).
            records.append(new_record(self._begin_attempt(task, task.pool)))
        self.outbox.append(shard, records, PendingAppend("enqueue", shard, cmd.task_id))

    def _enqueue_fields(
        self, cmd: proto.Enqueue, payload_hash: str | None
    ) -> tuple[dict[str, Any], int]:
        """The task record of a new enqueue, without snerd's node, epoch and sequence keys,
        and when it is due (µs): 0 without `execute_at` or `cron`, so it is ready as soon as
        its record is durable even if the wall clock is stepped back meanwhile (its record's
        `executeAt` says now, as upstream's does)."""
        now = self.now
        execute_at = cmd.execute_at_us
        if execute_at is None and cmd.cron is not None:
            execute_at = next_fire(cmd.cron, now.wall)
        ready_at = 0 if execute_at is None else execute_at
        if execute_at is None:
            execute_at = now.wall
        # Upstream's keys in upstream's order, optional ones only when set; built in one pass
        # (this is the per-enqueue hot path).
        now_text = self._wall_text()
        fields: dict[str, Any] = {
            "taskId": cmd.task_id,
            "retryCount": 0,
            "maxRetries": cmd.max_retries,
            "retryAfterHours": cmd.retry_after_hours,
            "retryAfterTime": now_text,
            "taskData": cmd.task_data,
            "taskType": cmd.task_type,
        }
        if cmd.rate_limit_group is not None:
            fields["rateLimitGroup"] = cmd.rate_limit_group
        if cmd.max_per_minute is not None:
            fields["maxPerMinute"] = cmd.max_per_minute
        if cmd.auto_dedupe:
            fields["autoDedupe"] = True
        if cmd.urgency_score:
            fields["urgencyScore"] = cmd.urgency_score
        if payload_hash is not None:
            fields["payloadHash"] = payload_hash
        fields["executeAt"] = now_text if execute_at == now.wall else format_rfc3339(execute_at)
        if cmd.pool is not None:
            fields["pool"] = cmd.pool
        if cmd.trigger_after_ids:
            fields["triggerAfterIds"] = list(cmd.trigger_after_ids)
        if cmd.cron is not None:
            fields["cronExpression"] = cmd.cron
        if cmd.webhook_url is not None:
            fields["webhookUrl"] = cmd.webhook_url
        if cmd.max_execution_seconds is not None:
            fields["maxExecutionSeconds"] = cmd.max_execution_seconds
        return fields, ready_at

    def _enqueue_to_inbox(self, cmd: proto.Enqueue, shard: int, payload_hash: str | None) -> None:
        """Write an enqueue for a shard this node does not own into its own inbox for that
        shard; acked once durable. The owner checks what only it can (a pending task with the
        same id, a duplicate payload, dependencies) when it ingests the record."""
        fields, _ = self._enqueue_fields(cmd, payload_hash)
        fields["snerdNode"] = self.config.node_id
        segment = self.inbox.segment(shard)
        segment.in_flight += 1
        token = self.outbox.next_token()
        self.outbox.pending[token] = PendingAppend(
            kind="inbox", shard=shard, task_id=cmd.task_id, extra={"segment": segment}
        )
        self.stats["total_enqueued"] += 1
        self.outbox.emit(
            fx.AppendInbox(
                token=token, shard=shard, segment=segment.name, records=(new_record(fields),)
            )
        )

    def _runs_at_once(self, task: Task) -> bool:
        """True when a task being enqueued would be dispatched as soon as its enqueue record
        commits anyway: ready now, no parents, no rate limit, a handler registered (not a
        webhook), a free slot in its pool, and no ready task waiting for a slot (those go first
        by urgency, in `_dispatch`)."""
        return (
            self.phase is NODE_RUNNING
            and not task.trigger_after_ids
            and task.ready_at_us <= self.now.wall
            and task.webhook_url is None
            and task.group is None
            and task.task_type in self.registered
            and len(self.inflight) < self.config.max_workers
            and self.pool_busy.get(task.pool, 0) < self._pool_limit(task.pool)
            and not any(self.ready.values())
            and not self.shards[task.shard].giving_back
            and self.shards[task.shard].hold_dispatch_until_mono is None
        )

    def pending_twin(self, payload_hash: str) -> Task | None:
        """The oldest live task with this dedupe fingerprint, if any (an enqueue's, or an inbox
        record's being ingested: both are dropped as its duplicates)."""
        for task_id in self.fingerprints.get(payload_hash, ()):
            return self.tasks[task_id]
        return None

    def _ack_duplicate(self, task_id: str, original: Task) -> None:
        # Until the original's enqueue record is durable (it has no location yet: ENQUEUING,
        # or DISPATCHING with its dispatch record in the same append), the duplicate's ack
        # waits for it: acked now, it would be lost with the original in a crash.
        if original.loc is None:
            for p in self.outbox.pending_parts():
                if p.kind == "enqueue" and p.task_id == original.task_id:
                    p.dedupe_waiters.append(task_id)
                    return
        self.outbox.send(proto.ack_enqueued(task_id, original.shard, deduplicated=True))

    def cycle(self, task_id: str, parents: Iterable[str]) -> str | None:
        """A task id on a dependency cycle through `task_id`, or None."""
        seen: set[str] = set()
        stack = list(parents)
        while stack:
            parent = stack.pop()
            if parent == task_id:
                return task_id
            if parent in seen:
                continue
            seen.add(parent)
            task = self.tasks.get(parent)
            if task is not None:
                stack.extend(task.trigger_after_ids)
        return None

    def _on_result(self, cmd: proto.Result) -> None:
        if self._hold_or(cmd):
            return
        task = self._result_task(cmd.task_id, cmd.attempt)
        if task is None:
            self.outbox.send(proto.error(cmd.task_id, proto.unknown_result(cmd.task_id)))
            return
        self._attempt_ended(task, cmd.success, cmd.error_msg or "Unknown error")

    def _result_task(self, task_id: str, attempt: int | None) -> Task | None:
        """The task a result is for: running, in the attempt named (if one is); None when
        there is none (unknown, finished, or that attempt timed out)."""
        flight = self.inflight.get(task_id)
        task = self.tasks.get(task_id)
        if (
            flight is None
            or task is None
            or task.state is not RUNNING
            or (attempt is not None and attempt != flight.attempt)
        ):
            return None
        return task

    def _plain_success(self, result: proto.PlainResult) -> bool:
        """`_on_result` for the commonest result, a success of a running attempt of a task
        that is not a cron task, without building the `Result` (`_lines`); False, having done
        nothing, for any other result: `_on_result` takes it. A success writes only a
        tombstone, which goes to the call's lazy append, so the line loop's open run of plain
        enqueues stays whole; a cron task's re-arm record would land inside that run."""
        task_id, success, _, attempt = result
        task = self._result_task(task_id, attempt) if success else None
        if task is None or task.cron is not None:
            return False
        self._attempt_ended(task, True, "")
        return True

    def _on_payload_unreadable(self, event: ev.PayloadUnreadable) -> None:
        flight = self.inflight.get(event.task_id)
        task = self.tasks.get(event.task_id)
        if flight is None or task is None or task.state is not RUNNING:
            # A dead-letter notice that could not be read: nothing left to decide.
            self.outbox.log(
                "error", f"task {event.task_id}: cannot read its record ({event.error})"
            )
            return
        if flight.attempt != event.attempt:
            return
        # A failed attempt, so the task's retry and dead-letter rules apply instead of it
        # hanging forever; a record that stays unreadable dead-letters it (`_on_append_failed`).
        self._attempt_ended(task, False, f"snerd could not read the task's payload: {event.error}")

    def _attempt_ended(self, task: Task, ok: bool, error: str) -> None:
        """The outcome of a running attempt, from the SDK or from a webhook."""
        self.stats["total_executed"] += 1
        if ok:
            self._succeeded(task)
        else:
            self.stats["total_failed"] += 1
            self._failed(task, error)

    def _on_progress(self, cmd: proto.Progress) -> None:
        # Progress is a pass-through stream; it is not persisted (upstream does the same).
        self.outbox.send(proto.progress(cmd.task_id, cmd.data))

    def _on_stats(self, cmd: proto.StatsRequested) -> None:
        if self._hold_or(cmd):
            return
        depth: dict[int, int] = {s: 0 for s in self.owned_shards}
        for task in self.tasks.values():
            depth[task.shard] = depth.get(task.shard, 0) + 1
        message = proto.stats(
            total_enqueued=self.stats["total_enqueued"],
            total_executed=self.stats["total_executed"],
            total_failed=self.stats["total_failed"],
            total_dlq=self.stats["total_dlq"],
            queue_depth=len(self.tasks),
            uptime_secs=(self.now.mono - (self.started_mono or self.now.mono)) // SECOND,
            per_shard=depth,
            # snerd's additions, which old SDKs ignore.
            extra={
                "in_flight": len(self.inflight),
                "total_deduplicated": self.stats["total_deduplicated"],
                "waiting_types": self.waiting_types(),
                "node": self.config.node_id,
            },
        )
        self.outbox.send(message)

    def _on_webhook(self, event: ev.WebhookFinished) -> None:
        if event.notification:
            if not event.ok:
                self.outbox.log(
                    "warning",
                    f"task {event.task_id}: dead-letter webhook failed: {event.error}",
                )
            return
        flight = self.inflight.get(event.task_id)
        task = self.tasks.get(event.task_id)
        if flight is None or task is None or flight.attempt != event.attempt:
            return
        self._attempt_ended(task, event.ok, event.error or "Webhook failed")

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, task: Task, now: ev.Now) -> None:
        """Put a task whose record is durable where it belongs: blocked, waiting or ready."""
        if task.trigger_after_ids and any(p in self.tasks for p in task.trigger_after_ids):
            self._move(task, BLOCKED)
            for parent in task.trigger_after_ids:
                self.children.setdefault(parent, set()).add(task.task_id)
            return
        if task.ready_at_us > now.wall:
            self._move(task, WAITING)
            self.due.push(task.task_id, task.ready_at_us, task.seq)
            return
        self._move(task, READY)
        if task.webhook_url is None and task.task_type not in self.registered:
            self._park_by_type(task)
            return
        self._push_ready(task)

    def _park_by_type(self, task: Task) -> None:
        """A ready task with no handler here: `_dispatch` would only pop it to park it; park
        it now, in the same queue with the same order keys (`_on_register` makes it ready
        again)."""
        self._move(task, PARKED)
        queue_in(self.parked_by_type, task.task_type).push(task.task_id, task.urgency, task.seq)

    def _push_ready(self, task: Task) -> None:
        assert task.state is READY
        queue_in(self.ready, task.pool).push(task.task_id, task.urgency, task.seq)

    def _check_blocked(self, task: Task) -> None:
        if any(p in self.tasks for p in task.trigger_after_ids):
            for parent in task.trigger_after_ids:
                if parent in self.tasks:
                    self.children.setdefault(parent, set()).add(task.task_id)
            return
        if task.ready_at_us > self.now.wall:
            self._move(task, WAITING)
            self.due.push(task.task_id, task.ready_at_us, task.seq)
        else:
            self._move(task, READY)
            self._push_ready(task)

    def _on_time(self) -> None:
        """Everything that depends only on time and free slots; runs after every event."""
        now = self.now
        if self.phase is STOPPED:
            return
        if (
            not self.inbox.busy
            and self.phase is NODE_RUNNING
            and (self.inbox.poll_at_mono is None or now.mono >= self.inbox.poll_at_mono)
        ):
            self.inbox.read()
        if (
            not self.inbox.checking
            and self.inbox.segments
            and (self.inbox.check_at_mono is None or now.mono >= self.inbox.check_at_mono)
        ):
            self.inbox.check()
        # Appends that failed and are due for another try.
        self.outbox.retry_due(now.mono)
        # Locks to retry, and shards whose dispatch hold ends.
        for shard, info in self.shards.items():
            until = info.hold_dispatch_until_mono
            if until is not None and now.mono >= until:
                info.hold_dispatch_until_mono = None
                parked = self.parked_by_shard.get(shard)
                while parked and not info.giving_back:
                    task = self.tasks[parked.pop()]
                    self._move(task, READY)
                    self._push_ready(task)
            if info.retry_lock_at_mono is not None and now.mono >= info.retry_lock_at_mono:
                info.retry_lock_at_mono = None
                if info.phase is PAUSED:
                    self.outbox.emit(
                        fx.TryLock(shard=shard, owner=self.config.node_id, epoch=info.lock_epoch)
                    )
        # Leases.
        if self.renew_at_mono is not None and now.mono >= self.renew_at_mono:
            self._renew()
        # Hard timeouts. `timed_flights` spares the scan of every flight on every event when
        # no attempt has a deadline (the common case); it is cleared when a scan finds none.
        timed = (
            [f for f in self.inflight.values() if f.deadline_mono is not None]
            if self.timed_flights
            else []
        )
        if self.timed_flights and not timed:
            self.timed_flights = False
        for flight in timed:
            assert flight.deadline_mono is not None
            if now.mono >= flight.deadline_mono:
                task = self.tasks[flight.task_id]
                if task.state is RUNNING:
                    self.stats["total_failed"] += 1
                    self._failed(task, proto.timed_out(task.max_execution_seconds or 0))
        # Delayed tasks and retries whose time came.
        for task_id in self.due.pop_due(now.wall):
            task = self.tasks[task_id]
            self._move(task, READY)
            self._push_ready(task)
        # Rate windows with room again.
        for group in self.group_wake.pop_due(now.wall):
            parked = self.parked_by_group.get(group)
            while parked:
                task = self.tasks[parked.pop()]
                self._move(task, READY)
                self._push_ready(task)
        if (
            self.config.lock_proves_liveness
            and self.phase is NODE_RUNNING
            and self.doc is not None
            and (self.probe_at_mono is None or now.mono >= self.probe_at_mono)
        ):
            self.probe_at_mono = now.mono + self.config.probe_interval_us
            if not self.membership_busy:
                self._probe(self.doc, [])
        if self.phase is NODE_RUNNING:
            self._dispatch()
        if self.phase is DRAINING:
            self._drain_progress()
        self.compaction.maybe_compact()

    def _dispatch(self) -> None:
        """Fill free worker slots, best task first (highest urgency, then enqueue order)."""
        ready = self.ready
        tasks = self.tasks
        while True:
            free = self.config.max_workers - len(self.inflight)
            if free <= 0:
                return
            if len(ready) == 1:
                # One pool (the usual case): its head is the best task, nothing to compare;
                # as many as it has room for are taken at once.
                ((pool, queue),) = ready.items()
                free = min(free, self._pool_limit(pool) - self.pool_busy.get(pool, 0))
                if not queue or free <= 0:
                    return
                for task_id in queue.pop_many(free):
                    self._offer(tasks[task_id], pool)
                continue
            best: tuple[float, int, str] | None = None
            for pool, queue in ready.items():
                if not queue or self.pool_busy.get(pool, 0) >= self._pool_limit(pool):
                    continue
                head = queue.peek()
                assert head is not None
                t = tasks[head]
                key = (-t.urgency, t.seq, pool)
                if best is None or key < best:
                    best = key
            if best is None:
                return
            pool = best[2]
            self._offer(tasks[ready[pool].pop()], pool)

    def _offer(self, task: Task, pool: str) -> None:
        """A task taken from the ready queue of `pool`, which has a free slot: its attempt
        starts, or it is parked (its shard holds dispatch or is being given back, no handler
        here takes its type, its rate window is full)."""
        info = self.shards[task.shard]
        if info.giving_back or info.hold_dispatch_until_mono is not None:
            self._move(task, PARKED)
            queue_in(self.parked_by_shard, task.shard).push(task.task_id, task.urgency, task.seq)
            return
        if task.webhook_url is None and task.task_type not in self.registered:
            self._park_by_type(task)
            return
        if task.group is not None and task.max_per_minute is not None:
            now = self.now
            if not self.windows.allows(task.group, task.max_per_minute, now.wall):
                self._move(task, PARKED)
                queue_in(self.parked_by_group, task.group).push(
                    task.task_id, task.urgency, task.seq
                )
                wake = self.windows.next_allowed_us(task.group, task.max_per_minute, now.wall)
                if task.group not in self.group_wake:
                    self.group_wake.push(task.group, wake, 0)
                return
            self.windows.record(task.group, now.wall)
        self._start_attempt(task, pool)

    def _start_attempt(self, task: Task, pool: str) -> None:
        fields = self._begin_attempt(task, pool)
        shard = task.shard
        self.outbox.append_run(
            shard, self.shards[shard], new_record(fields), task.task_id, "dispatches"
        )

    def _begin_attempt(self, task: Task, pool: str) -> dict[str, Any]:
        """Take a worker slot for the task's next attempt (-> DISPATCHING); return the fields
        of its dispatch record."""
        self._move(task, DISPATCHING)
        if task.attempt <= task.retry_count:
            task.attempt = task.retry_count + 1
        self.inflight[task.task_id] = InFlight(task.task_id, task.attempt, pool, None)
        self.pool_busy[pool] = self.pool_busy.get(pool, 0) + 1
        fields: dict[str, Any] = {
            "snerdKind": KIND_DISPATCH,
            "task": task.task_id,
            "attempt": task.attempt,
            "at": self._wall_text(),
        }
        if task.group is not None:
            fields["group"] = task.group
        # (`_meta`, set key by key: one dispatch record per attempt.)
        fields["snerdNode"] = self.config.node_id
        fields["snerdEpoch"] = self.shards[task.shard].epoch
        return fields

    def _begin_execution(self, task: Task) -> None:
        now = self.now
        flight = self.inflight[task.task_id]
        self._move(task, RUNNING)
        assert task.loc is not None
        if task.webhook_url is not None:
            timeout = float(task.max_execution_seconds or self.config.webhook_timeout_s)
            self._call_webhook(task, task.webhook_url, task.loc, "Execute", timeout)
            return
        if task.max_execution_seconds is not None:
            flight.deadline_mono = now.mono + task.max_execution_seconds * SECOND
            self.timed_flights = True
        self.outbox.emit(
            new_execute(
                task.task_id, task.task_type, task.attempt, task.loc, task.max_execution_seconds
            )
        )

    def _call_webhook(
        self, task: Task, url: str, loc: fx.Location, event: str, timeout: float
    ) -> None:
        self.outbox.emit(
            fx.CallWebhook(
                task_id=task.task_id,
                task_type=task.task_type,
                attempt=task.attempt,
                url=url,
                location=loc,
                event=event,
                timeout_seconds=timeout,
            )
        )

    # ------------------------------------------------------------------ outcomes

    def _end_flight(self, task: Task) -> None:
        flight = self.inflight.pop(task.task_id)
        self.pool_busy[flight.pool] -= 1
        self._move(task, FINISHING)

    def _succeeded(self, task: Task) -> None:
        now = self.now
        self._end_flight(task)
        assert task.loc is not None
        nxt = None
        if task.cron is not None:
            try:
                nxt = next_fire(task.cron, now.wall)
            except ValueError as exc:  # no fire time before year 9999 (a wall clock that far)
                self.outbox.log("warning", f"task {task.task_id}: not re-armed: {exc}; it is done")
        if nxt is not None:
            # Re-arm: same id, errors cleared, next tick strictly after now (missed ticks skipped).
            fields = {
                "retryCount": 0,
                "retryAfterTime": format_rfc3339(now.wall),
                "executeAt": format_rfc3339(nxt),
                **self.meta(task.shard),
            }
            record = fx.NewRecord(
                fields=fields, base=task.loc, remove=("LastErrorObj", "LastJobError", "deletedAt")
            )
            self.outbox.append(
                task.shard,
                [record],
                PendingAppend(
                    kind="rearm", shard=task.shard, task_id=task.task_id, extra={"ready_at": nxt}
                ),
            )
            return
        self._complete(task)

    def _failed(self, task: Task, error: str) -> None:
        now = self.now
        self._end_flight(task)
        task.last_error = error
        if task.attempt < attempts_allowed(task.max_retries):
            delay = retry_delay_us(
                retry_after_hours=task.retry_after_hours,
                failures=task.attempt,
                policy=self.config.backoff,
                jitter_seed=self.config.jitter_seed,
                task_id=task.task_id,
            )
            fields = {
                "retryCount": task.attempt,
                "retryAfterTime": format_rfc3339(now.wall + delay),
                "LastErrorObj": error,
                "LastJobError": {"error": error, "retry_worthy": True},
                **self.meta(task.shard),
            }
            self.outbox.append(
                task.shard,
                [fx.NewRecord(fields=fields, base=task.loc)],
                PendingAppend(
                    kind="retry",
                    shard=task.shard,
                    task_id=task.task_id,
                    extra={"ready_at": now.wall + delay},
                ),
            )
            return
        self._finish(task, OUTCOME_DEAD, error)

    def _dead_letter_unbased(self, task: Task, error: str) -> None:
        """Dead-letter `task` with a tombstone that needs no base record (its own is damaged,
        or holds no payload to keep)."""
        fields = {
            "taskId": task.task_id,
            "taskType": task.task_type,
            "retryCount": task.attempt,
            "maxRetries": task.max_retries,
            "deletedAt": format_rfc3339(self.now.wall),
            "snerdOutcome": OUTCOME_DEAD,
            "LastErrorObj": error,
            "LastJobError": {"error": error, "retry_worthy": False},
            **self.meta(task.shard),
        }
        self.outbox.append(
            task.shard,
            [fx.NewRecord(fields=fields)],
            finish_pending(task.shard, task.task_id, OUTCOME_DEAD, error),
        )

    def _finish(self, task: Task, outcome: str, error: str | None) -> None:
        """Write the tombstone that ends a task (completed or dead-lettered)."""
        if outcome == OUTCOME_COMPLETED:
            self._complete(task)
            return
        shard = task.shard
        fields = self._tombstone_fields(task, task.attempt, outcome)
        if error is not None:
            fields["LastErrorObj"] = error
            fields["LastJobError"] = {"error": error, "retry_worthy": False}
        self.outbox.append(
            shard,
            [new_based_record(fields, task.loc, ())],
            finish_pending(shard, task.task_id, outcome, error),
        )

    def _complete(self, task: Task) -> None:
        """Write the tombstone of a task that succeeded. Success clears the error (upstream
        kept it, so dashboards showed "failed"). The tombstones of tasks completed together
        are one run ("finishes": one pending for them all, each committed as a "finish" of its
        own would be)."""
        shard = task.shard
        info = self.shards[shard]
        fields = self._tombstone_fields(task, task.retry_count, OUTCOME_COMPLETED)
        record = new_based_record(fields, task.loc, CLEARED_ON_SUCCESS)
        self.outbox.append_run(shard, info, record, task.task_id, "finishes")

    def _tombstone_fields(self, task: Task, retry_count: int, outcome: str) -> dict[str, Any]:
        return {
            "retryCount": retry_count,
            "deletedAt": self._wall_text(),
            "snerdOutcome": outcome,
            "snerdNode": self.config.node_id,  # (`_meta`, key by key: one per task)
            "snerdEpoch": self.shards[task.shard].epoch,
        }

    # ------------------------------------------------------------------ append outcomes

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
        p = self.outbox.pending.get(token)
        if p is None or p.answered:
            return []
        if p.kind == "inbox":
            p.answered = True
            return [new_ack_enqueued([p.task_id or ""], p.shard)]
        if self._lease_over(now):
            return []
        if p.kind == "enqueue":
            task = self.tasks.get(p.task_id or "")
            if (
                task is None
                or task.state is not DISPATCHING
                or p.dedupe_waiters
                or task.webhook_url is not None
                or self.phase is not NODE_RUNNING
            ):
                return []
            assert not self.outbox.out
            self.now = now
            p.answered = True
            self._enqueue_landed(p, task, offsets, lengths)
            out, self.outbox.out = self.outbox.out, []
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
        tasks = self.tasks
        acked = [task_id for run in runs for task_id in run.extra["ids"]]
        if not acked or not all(task_id in tasks for task_id in acked):
            return []
        for run in runs:
            run.answered = True
        return [new_ack_enqueued(acked, p.shard)]

    def _on_append_committed(self, event: ev.AppendCommitted) -> None:
        p = self.outbox.pending.pop(event.token)
        if p.kind == "inbox":
            segment: InboxSegment = p.extra["segment"]
            segment.in_flight -= 1
            segment.end = max(segment.end, event.offsets[-1] + event.lengths[-1])
            if not p.answered:  # (else acked as it committed, `on_commit`)
                self.outbox.send(proto.ack_enqueued(p.task_id or "", p.shard))
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.appends_drained(p.shard, info)
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
            tasks = self.tasks
            dispatches = p.kind == "dispatches"
            for i, task_id in enumerate(p.extra["ids"]):
                task = tasks.get(task_id)
                if task is not None:
                    loc = new_location(p.shard, offsets[i], lengths[i])
                    if dispatches:
                        self._dispatch_committed(task, info, loc)
                    else:
                        self._finished(task, OUTCOME_COMPLETED, None, loc)
            return
        loc = new_location(p.shard, offsets[0], lengths[0])
        if p.kind == "ingest":
            self._ingested(p, offsets, lengths, info)
            return
        if p.kind == "claim":
            if offsets[0] > info.loaded_size:
                self._reload(p.shard, info)
                return
            self._claimed(p.shard, info, loc)
            return
        task = self.tasks.get(p.task_id or "")
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
            if task.ready_at_us > self.now.wall:
                self._move(task, WAITING)
                self.due.push(task.task_id, task.ready_at_us, task.seq)
            else:
                self._move(task, READY)
                self._push_ready(task)
        elif p.kind == "finish":
            self._finished(task, p.extra["outcome"], p.extra["error"], loc)

    def _enqueue_landed(
        self, p: PendingAppend, task: Task, offsets: tuple[int, ...], lengths: tuple[int, ...]
    ) -> None:
        """An "enqueue" part is in the log: ack it (and the duplicates waiting on it), then
        schedule its task or, dispatched with its record, start the attempt."""
        task.loc = new_location(p.shard, offsets[0], lengths[0])
        self.outbox.emit(new_ack_enqueued([task.task_id], task.shard))
        for dup in p.dedupe_waiters:
            self.outbox.send(proto.ack_enqueued(dup, task.shard, deduplicated=True))
        if task.state is DISPATCHING:
            # Dispatched with its enqueue record (`_runs_at_once`): that record is second.
            task.dispatch_loc = new_location(p.shard, offsets[1], lengths[1])
            if self.phase is DRAINING:
                self._end_flight_unsent(task)  # not sent yet: it runs elsewhere
                return
            self._begin_execution(task)
            return
        self._schedule(task, self.now)

    def _dispatch_committed(self, task: Task, info: ShardInfo, loc: fx.Location) -> None:
        """The dispatch record of `task`'s attempt is in the log: the attempt starts."""
        task.dispatch_loc = loc
        if task.group is not None:
            info.window_records.append((self.now.wall, loc))
        if self.phase is DRAINING and task.state is DISPATCHING:
            # Not sent yet, and we are draining: give the slot back; it runs elsewhere.
            self._end_flight_unsent(task)
            return
        self._begin_execution(task)

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
        tasks = self.tasks
        registered = self.registered
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
                self._move(task, READY)  # (its check: a task is ENQUEUING until now)
            # ENQUEUING -> READY (-> PARKED): the moves `_move` allows, made directly.
            if task.task_type in registered:
                task.state = READY
                target = queue_in(self.ready, task.pool)
            else:
                task.state = PARKED
                target = queue_in(self.parked_by_type, task.task_type)
            if target is not queue or task.urgency != urgency:
                if queue is not None and keys:
                    queue.push_run(keys, seqs, urgency)
                queue, urgency, keys, seqs = target, task.urgency, [], []
            keys.append(task_id)
            seqs.append(task.seq)
        if queue is not None and keys:
            queue.push_run(keys, seqs, urgency)
        if acked and ack:
            self.outbox.emit(new_ack_enqueued(acked, shard))

    def _ingested(
        self, p: PendingAppend, offsets: tuple[int, ...], lengths: tuple[int, ...], info: ShardInfo
    ) -> None:
        """An ingest append landed: its tasks are enqueued here, the inbox read that far."""
        ids: list[str | None] = p.extra["tasks"]
        for i, task_id in enumerate(ids):
            task = self.tasks.get(task_id) if task_id is not None else None
            if task is None or task.loc is not None or task.state is not ENQUEUING:
                continue
            task.loc = new_location(p.shard, offsets[i], lengths[i])
            self._schedule(task, self.now)
        node: str = p.extra["node"]
        end: int = p.extra["end"]
        if end >= info.inbox_done.get(node, -1):
            info.inbox_done[node] = end
            info.inbox_locs[node] = new_location(p.shard, offsets[len(ids)], lengths[len(ids)])

    def _end_flight_unsent(self, task: Task, delay_us: int = 0) -> None:
        """Give back the slot of an attempt that was never sent (its dispatch record is moot)."""
        flight = self.inflight.pop(task.task_id)
        self.pool_busy[flight.pool] -= 1
        if delay_us:
            self._move(task, WAITING)
            self.due.push(task.task_id, self.now.wall + delay_us, task.seq)
        else:
            self._move(task, READY)
            self._push_ready(task)

    def _finished(self, task: Task, outcome: str, error: str | None, loc: fx.Location) -> None:
        info = self.shards[task.shard]
        del self.tasks[task.task_id]
        self._drop_fingerprint(task)
        info.history.append((task.task_id, loc))
        while len(info.history) > self.config.history_limit:
            info.history.popleft()
        if outcome == OUTCOME_DEAD:
            self.stats["total_dlq"] += 1
            if task.webhook_url is not None:
                self._call_webhook(
                    task, task.webhook_url, loc, "MaxRetriesReached", self.config.webhook_timeout_s
                )
            elif task.task_type in self.registered:
                self.outbox.emit(
                    fx.DeliverDeadLetter(
                        task_id=task.task_id,
                        task_type=task.task_type,
                        location=loc,
                        error=error or "",
                    )
                )
        # Children waiting on this task.
        children = self.children.pop(task.task_id, None)
        for child_id in sorted(children) if children else ():
            child = self.tasks.get(child_id)
            if child is None or child.state is not BLOCKED:
                continue
            if outcome == OUTCOME_DEAD:
                child.attempt = child.retry_count + 1
                self._move(child, FINISHING)
                self._finish(child, OUTCOME_DEAD, f"blocked_by_failed_parent: {task.task_id}")
            else:
                self._check_blocked(child)

    def _on_append_failed(self, event: ev.AppendFailed) -> None:
        p = self.outbox.pending[event.token]
        if p.kind == "inbox":
            # Whatever of the write reached the file stays there (an inbox is never cut: its
            # reader may have taken it already), so the owner may still run the task. Later
            # enqueues go to a new segment.
            del self.outbox.pending[event.token]
            failed: InboxSegment = p.extra["segment"]
            failed.in_flight -= 1
            failed.failed = True
            self.stats["total_enqueued"] -= 1
            message = proto.failed_to_enqueue(
                f"{event.error} (writing this daemon's inbox for {shard_name(p.shard)}; "
                "it may or may not be enqueued)"
            )
            self.outbox.send(proto.error(p.task_id, message))
            return
        info = self.shards[p.shard]
        info.appends_in_flight -= 1
        if not info.appends_in_flight:
            self.appends_drained(p.shard, info)
        if p.tenure != info.tenure:
            del self.outbox.pending[event.token]  # from an earlier tenure: nothing to retry or say
            return
        if p.kind != "group":
            self._part_failed(event.token, p, info, event.error, event.permanent)
            return
        # Merged appends: each part fails as an append of its own (under a token of its own,
        # which a retry then uses); or, when the shell names the one record it could not
        # build, that record's part fails and the others, of which nothing was written, are
        # issued again as one new append.
        del self.outbox.pending[event.token]
        assert p.effect is not None
        records = p.effect.records
        bad = event.record
        again: list[tuple[PendingAppend, tuple[fx.NewRecord, ...]]] = []
        at = 0
        for part in p.extra["parts"]:
            end = at + part.count
            if part.tenure == info.tenure:  # (an earlier part may have stepped the node down)
                if bad is None or at <= bad < end:
                    token = self.outbox.next_token()
                    part.effect = new_append(token, p.shard, records[at:end], p.effect.lazy)
                    self.outbox.pending[token] = part
                    self._part_failed(token, part, info, event.error, event.permanent)
                else:
                    again.append((part, records[at:end]))
            at = end
        # A failed part handled after them may have stepped the node down from the shard.
        again = [(part, recs) for part, recs in again if part.tenure == info.tenure]
        if again:
            self.outbox.reissue(info, p.shard, again, lazy=p.effect.lazy)

    def _part_failed(
        self, token: int, p: PendingAppend, info: ShardInfo, error: str, permanent: bool
    ) -> None:
        """The records of one append (or of one part of merged ones) did not reach the log;
        `p` is pending under `token`."""
        if p.kind == "ingest":
            # Nothing of it is in the log: forget its tasks and read the inbox again from
            # where the log says (after a pause, not in a loop on a full disk).
            del self.outbox.pending[token]
            for task_id in p.extra["tasks"]:
                task = self.tasks.get(task_id) if task_id is not None else None
                if task is not None and task.loc is None and task.state is ENQUEUING:
                    self._forget(task_id)
            node = p.extra["node"]
            info.inbox_taken[node] = info.inbox_done.get(node, 0)
            self.outbox.log(
                "warning",
                f"{shard_name(p.shard)}: could not ingest {node}'s inbox ({error}); "
                f"trying again in {self.config.retry_io_us // SECOND} s",
            )
            self.inbox.poll_at_mono = max(
                self.inbox.poll_at_mono or 0, self.now.mono + self.config.retry_io_us
            )
            return
        if p.kind == "enqueues":
            del self.outbox.pending[token]
            if p.answered:
                return
            message = proto.failed_to_enqueue(error)
            for task_id in p.extra["ids"]:
                dropped = self.tasks.pop(task_id, None)
                if dropped is not None:
                    self._drop_fingerprint(dropped)
                self.stats["total_enqueued"] -= 1
                self.outbox.send(proto.error(task_id, message))
            return
        if p.kind == "enqueue":
            del self.outbox.pending[token]
            if p.answered:
                return
            task = self.tasks.pop(p.task_id or "", None)
            flight = self.inflight.pop(p.task_id or "", None)
            if flight is not None:  # dispatched with its enqueue record: give the slot back
                self.pool_busy[flight.pool] -= 1
            self.stats["total_enqueued"] -= 1
            if task is not None:
                self._drop_fingerprint(task)
            message = proto.failed_to_enqueue(error)
            self.outbox.send(proto.error(p.task_id, message))
            for dup in p.dedupe_waiters:
                self.outbox.send(proto.error(dup, message))
            return
        if p.kind == "dispatches":
            del self.outbox.pending[token]
            for task_id in p.extra["ids"]:
                self.outbox.log("warning", f"task {task_id}: dispatch record not written ({error})")
                task = self.tasks.get(task_id)
                if task is not None and task.state is DISPATCHING:
                    # Try again later rather than spin on a full disk; the task keeps its place
                    # by urgency, and nothing else is dispatched from the shard meanwhile (a
                    # newer, less urgent task must not overtake it).
                    if info.hold_dispatch_until_mono is None:
                        info.hold_dispatch_until_mono = self.now.mono + self.config.retry_io_us
                    self._end_flight_unsent(task)
            return
        if p.kind == "finishes" and permanent:
            # One tombstone's base could not be read back (the shell wrote none of them): each
            # goes again as a "finish" of its own, so that one fails alone (and is
            # dead-lettered, below) and the others land.
            del self.outbox.pending[token]
            assert p.effect is not None
            for task_id, record in zip(p.extra["ids"], p.effect.records, strict=True):
                if task_id in self.tasks:
                    self.outbox.append(
                        p.shard,
                        (record,),
                        finish_pending(p.shard, task_id, OUTCOME_COMPLETED, None),
                    )
            return
        task = self.tasks.get(p.task_id or "")
        if permanent and task is not None and p.kind in ("retry", "rearm", "finish"):
            # The task's last record cannot be read back (damaged on disk): retrying cannot
            # help, and the task cannot run without its payload. Dead-letter it with a
            # tombstone that needs no base record, saying why.
            del self.outbox.pending[token]
            error = f"snerd could not rebuild the task's record: {error}"
            self.outbox.log("error", f"task {task.task_id}: {error}; dead-lettered")
            self._dead_letter_unbased(task, error)
            return
        # Outcome and claim records must land: retry the same append later.
        self.outbox.log(
            "warning",
            f"{shard_name(p.shard)}: could not write a {p.kind} record "
            f"({error}); retrying in {self.config.retry_io_us // SECOND} s",
        )
        self.outbox.retry_appends.push(token, self.now.mono + self.config.retry_io_us, 0)

    # ------------------------------------------------------------------ drain

    def _on_drain(self, event: ev.DrainRequested) -> None:
        if self.phase in (DRAINING, STOPPED):
            return
        if self.phase is STARTING:
            # Commands that came before the drain request are answered first, as upstream
            # answered lines sent before EOF: the drain starts once the shards are loaded.
            self.held_commands.append(event)
            self._drain_before_start()  # (unless no round lands: then it stops now)
            return
        self.outbox.log(
            "info",
            f"draining ({event.reason}): no new work; {len(self.inflight)} task(s) in flight get "
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
            for t in self.inflight
            if not self.input_closed or self.tasks[t].webhook_url is not None
        ]
        busy = (
            bool(waiting_for)
            or any(p.kind != "dispatches" for p in self.outbox.pending_parts())
            or self.inbox.drain_pending()
        )
        if busy and not late:
            return
        if self.inflight:
            why = "drain timeout" if late else "no result can arrive (stdin closed)"
            self.outbox.log(
                "warning",
                f"{why}: {len(self.inflight)} task(s) still running will run again "
                "on the next owner",
            )
        self.released = True
        self.drain_deadline_mono = None  # handled: it must not wake the node again
        if self.doc is None:
            self._finish_release()
            return
        # Even holding no shard now (a lease that ran out during the drain), claims and the
        # heartbeat in membership.json may still name this node: remove them, so others take
        # over at once instead of waiting for them to lapse.
        if not self.membership_busy:
            self.renew_at_mono = None
            self._read_membership()

    def _release(self, doc: dict[str, Any], expected: int | None) -> None:
        # Stop acting for every shard before the write that frees them (see `_mark_give_backs`).
        for shard in sorted(self.shards):
            self._step_down(shard, "handed over on drain", level="info", handing_over=True)
        self.releasing = True
        self.membership_busy = True
        self.outbox.emit(
            fx.WriteMembership(
                doc=without_claims(doc, node_id=self.config.node_id), expected_version=expected
            )
        )

    def _drain_before_start(self) -> bool:
        """A drain came while starting, and no membership round has landed yet (the last one
        failed, and is retried): stop now rather than wait for membership.json to come back,
        since SIGTERM and stdin EOF must end the daemon whatever state the file is in. Nothing
        was claimed (no round landed), so there is nothing to hand over. True when stopped."""
        if not (
            self.phase is STARTING
            and self.doc is None
            and self.membership_trouble is not None
            and not self.membership_busy
        ):
            return False
        drain = next((c for c in self.held_commands if isinstance(c, ev.DrainRequested)), None)
        if drain is None:
            return False
        self.outbox.log(
            "warning",
            f"stopping ({drain.reason}) before this daemon could start: membership.json was "
            "never read and updated"
            + (f" ({self.membership_trouble})" if self.membership_trouble else ""),
        )
        self._stop_before_start(0)
        return True

    def _stop_before_start(self, code: int) -> None:
        """Stop a node whose first membership round never landed: it claimed nothing, and
        holds no lock but a probe's. Commands held meanwhile are answered as during a drain
        (an enqueue is refused: not enqueued)."""
        self.phase = DRAINING
        held, self.held_commands = self.held_commands, []
        for command in held:
            if not isinstance(command, ev.DrainRequested):
                self.handlers[type(command)](command)
        self.released = True
        self._finish_release(code)

    def _finish_release(self, code: int = 0) -> None:
        for shard, info in self.shards.items():
            self._lock_hold_over(shard, info, drained=False)  # released, or left to lapse
            if (
                info.phase not in (UNOWNED, LOCKING, PAUSED)
                or shard in self.lock_proofs  # locked, its claim never written
            ):
                self.outbox.emit(fx.Unlock(shard=shard))
            info.phase = UNOWNED
        self.lock_proofs.clear()
        self.phase = STOPPED
        self.renew_at_mono = None
        self.outbox.log("info", "Shutdown complete.")
        self.outbox.emit(fx.Exit(code=code))

    # ------------------------------------------------------------------ compaction

    def _on_tick(self, event: ev.Tick) -> None:
        return

    # ------------------------------------------------------------------ inboxes


def _unrunnable_task(shard: int, f: dict[str, Any], loc: fx.Location, seq: int) -> Task:
    """The task of a record it cannot run with (`task_problem`), to dead-letter: only what
    the tombstone keeps of it (its base is the record) and where that record is."""
    task_type = f.get("taskType")
    retry_count = f.get("retryCount")
    if type(retry_count) is not int or retry_count < 0:
        retry_count = 0
    return Task(
        task_id=f["taskId"],
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
        # The tombstone counts the attempts made (`_finish`): those that failed before, none now.
        attempt=retry_count,
        last_error=None,
    )


def _parse_time(value: Any, default: int) -> int:
    if not isinstance(value, str):
        return default
    return parse_rfc3339(value)


_T = TypeVar("_T")
_K = TypeVar("_K")


#: The kinds of part an append acked as it commits may hold (`Node.on_commit`).
_EARLY_ACK_KINDS = frozenset({"enqueues", "dispatches", "finishes"})
#: `_on_line`: a line `orjson` could not decode (no JSON value is this object).
_NOT_JSON = object()
_LINES_RECEIVED = ev.LinesReceived
